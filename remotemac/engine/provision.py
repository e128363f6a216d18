"""Provision: the run's directories, the agent, the project code and the venv."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import BringAnswer, JsonObject, Message, Op, PrepareRunAnswer
from remotemac.engine.context import HostBinding, RunContext, expand_root
from remotemac.engine.hostpython import (
    HostPython,
    ensure_python,
    ensure_uv,
    host_tags,
    version_request,
)
from remotemac.engine.phaseresults import (
    Fingerprint,
    Interpreter,
    Probe,
    ProvisionHost,
    SpaceCheck,
)
from remotemac.engine.pincheck import check_pin, pins
from remotemac.engine.projectfiles import project_upload
from remotemac.engine.runtime import install_method
from remotemac.errors import BadInput, HostEnvironmentError
from remotemac.events import PhaseProgress

#: seconds between progress events while the environment is built
TICK_S = 5.0
#: a project tar up to this size is sent inside the extract call (base64 in its JSON)
INLINE_PROJECT_MAX = 4 << 20


@dataclass
class VenvAnswer(Message):
    """The agent's ``ensure_venv`` answer: the venv and the interpreter it was made from."""

    venv_python: str = ""
    env_dir: str = ""
    reused: bool | None = None
    interpreter: str | None = None
    version: str | None = None
    interpreter_is_venv: bool | None = None
    parent_site: list[str] | None = None
    installer: str | None = None

    def described(self, brought: HostPython | None) -> JsonObject:
        """Provision's ``interpreter``: which Python the venv was made from, and what
        remotemac brought for it."""
        out: JsonObject = {
            "interpreter": self.interpreter,
            "version": self.version,
            "interpreter_is_venv": self.interpreter_is_venv,
            "parent_site": self.parent_site,
            "installer": self.installer,
        }
        if brought is not None:
            out["brought"] = brought.as_brought()
        return out


@dataclass(frozen=True)
class ProjectRevision:
    """The project's git commit and whether its work tree has uncommitted changes."""

    git_commit: str | None
    dirty: bool | None

    def to_json(self) -> JsonObject:
        return {"git_commit": self.git_commit, "dirty": self.dirty}

    @classmethod
    def from_json(cls, data: JsonObject) -> ProjectRevision:
        return cls(data["git_commit"], data["dirty"])


def env_key(system_site: bool, requirements: bytes | None) -> str:
    """The laptop's half of a venv's cache key: options and the requirements' bytes.

    The host adds the other half, the identity of the interpreter the name resolves
    to (real path, version, prefix), so ``python3`` from two different venvs never
    shares an environment.
    """
    digest = hashlib.sha256(f"{system_site}\0".encode())
    digest.update(requirements or b"")
    return digest.hexdigest()[:16]


async def provision_host(
    ctx: RunContext,
    binding: HostBinding,
    check_space: Callable[[ProvisionHost], Awaitable[JsonObject]],
) -> ProvisionHost:
    """The pipeline's provision phase for one host: claim the root, install the agent,
    prepare the run dir, upload the project, make the environment and probe it, take
    its fingerprint and ``check_space`` (engine/storage.py, which provision may not
    import: the pipeline hands it in) at once."""
    pb = ctx.playbook
    transport = binding.transport
    transport.warm_up()  # the SFTP session opens while the root is claimed
    root, given = await _claim_root(ctx, binding)
    ctx.journal.record_created(transport.name, "agent", await binding.agent.install(), ctx.run_id)
    upload = project_upload(pb)  # the dataset stays out: it only travels encrypted
    archive = upload.archive()
    request: JsonObject = {"root": root, "run_id": ctx.run_id}
    if len(archive) <= INLINE_PROJECT_MAX:
        # a small project travels in the call that makes the run dir: one round trip
        request["project"] = {"data_b64": base64.b64encode(archive).decode("ascii")}
    prepared = PrepareRunAnswer.from_json(await binding.agent.call(Op.PREPARE_RUN, request))
    binding.run_dir = prepared.run_dir
    ctx.journal.record_created(transport.name, "run", binding.run_dir, ctx.run_id)

    if prepared.extracted is None:  # a larger project (or an agent that took none)
        await _upload_project(ctx, binding, prepared, archive)
    _project_progress(ctx, upload, archive)
    files = upload.files
    env = pb.environment
    venv_python, venv, brought, req_bytes = await _environment(ctx, binding, root, prepared)
    # cached per environment key on the host: the probe reruns only when it changed
    # inside the venv (its identity is the key), else in the run's own dir: never loose in
    # a directory cleanup only empties of what carries remotemac's marker
    cache = (
        f"{venv.env_dir}/.remotemac-freeze.json"
        if env.venv
        else f"{binding.run_dir}/cache/freeze.json"
    )
    # the probe, the fingerprint and the space check in flight at once (three calls
    # one after another waited three round trips)
    answers: dict[str, JsonObject] = {}

    async def ask(name: str, call: Awaitable[JsonObject]) -> None:
        answers[name] = await call

    from remotemac.engine.pullstream import run_all

    space_for = ProvisionHost(root=root, run_dir=binding.run_dir, venv_python=venv_python)
    await run_all(
        [
            ask(
                "probe", binding.agent.call(Op.FREEZE_ENV, {"python": venv_python, "cache": cache})
            ),
            ask("fingerprint", binding.agent.call(Op.ENV_FINGERPRINT, {"python": venv_python})),
            ask("space", check_space(space_for)),
        ]
    )
    return ProvisionHost(
        root=root,
        root_as_given=given,
        root_id=binding.agent.root_id,
        run_dir=binding.run_dir,
        paths=prepared.paths,
        venv_python=venv_python,
        venv_reused=venv.reused,
        probe=Probe.from_json(answers["probe"]),
        fingerprint=Fingerprint.from_json(answers["fingerprint"]),
        space=SpaceCheck.from_json(answers["space"]),
        interpreter=Interpreter.from_json(venv.described(brought)),
        project_files=len(files),
        project_bytes=len(archive),
        lock_hash=hashlib.sha256(req_bytes).hexdigest() if req_bytes else None,
    )


async def _claim_root(ctx: RunContext, binding: HostBinding) -> tuple[str, str]:
    """The host's root for this run, claimed and journaled: (as resolved, as given)."""
    pb = ctx.playbook
    transport = binding.transport
    if binding.key == "local" and pb.host != "local":
        root = str(ctx.home / "local-host")
    elif pb.remote_root == "~" or pb.remote_root.startswith("~/"):
        root = expand_root(pb.remote_root, await transport.home())
    else:  # an absolute root needs no $HOME: one exec channel fewer
        root = pb.remote_root
    binding.root = root
    binding.agent.root = root
    # listed before anything is written, so cleanup finds the root even when the
    # run dies in provision (issue 15, item 11)
    ctx.journal.record_created(transport.name, "root", root, ctx.run_id)
    try:
        # the claim's channel goes on as the resident agent when the agent is installed
        await binding.agent.claim(ctx.run_id, then_resident=True)
    except BadInput:
        # refused before a byte was written (the user's dir, the home): never
        # remotemac's, so no cleanup of this host should list it as "not removed"
        ctx.journal.record_removed(transport.name, "root", root)
        raise
    given = root
    real = binding.agent.real_root or root
    if real != root:
        # below a symlinked dir (/tmp -> /private/tmp on a Mac): every later call uses
        # the real path the host resolved once; the journal lists the dir by that name
        ctx.journal.record_created(transport.name, "root", real, ctx.run_id)
        ctx.journal.record_removed(transport.name, "root", root)
        root = binding.root = binding.agent.root = real
    return root, given


async def _upload_project(
    ctx: RunContext, binding: HostBinding, prepared: PrepareRunAnswer, archive: bytes
) -> None:
    """The project's tar extracted into the run's project dir (when prepare_run did not)."""
    request: JsonObject = {"dest": prepared.paths["project"]}
    if len(archive) <= INLINE_PROJECT_MAX:
        # a small project travels in the call itself: no SFTP put (open, write, close)
        request["data_b64"] = base64.b64encode(archive).decode("ascii")
    else:
        remote_tar = f"{binding.run_dir}/tmp/project.tar"
        with tempfile.NamedTemporaryFile(suffix=".tar") as tmp:
            tmp.write(archive)
            tmp.flush()
            await binding.transport.put(tmp.name, remote_tar)
        request["archive"] = remote_tar
    await binding.agent.call(Op.EXTRACT_PROJECT, request)


def _project_progress(ctx: RunContext, upload: Any, archive: bytes) -> None:
    """The provision's progress line for the project: its files, the dataset left out."""
    ctx.emit(
        PhaseProgress(
            ctx.run_id,
            phase="provision",
            done=len(archive),
            total=len(archive),
            detail=f"{len(upload.files)} project files"
            + (
                f" ({len(upload.left_out)} dataset files left out: sent encrypted)"
                if upload.left_out
                else ""
            ),
        )
    )


async def _environment(
    ctx: RunContext, binding: HostBinding, root: str, prepared: PrepareRunAnswer
) -> tuple[str, VenvAnswer, HostPython | None, bytes | None]:
    """The workload's venv (or the plain interpreter): (its python, the agent's venv
    answer, what was brought to the host, the requirements' bytes)."""
    pb = ctx.playbook
    transport = binding.transport
    env = pb.environment
    req_bytes = None
    req_remote = None
    if env.requirements:
        req_bytes = (pb.project_dir() / env.requirements).read_bytes()
        req_remote = f"{prepared.paths['project']}/{env.requirements}"
    venv_python = env.python
    venv = VenvAnswer()
    key = env_key(env.system_site_packages, req_bytes)
    brought = None
    if env.venv:
        workload_python, brought, uv = await _tools(ctx, binding, req_bytes, env.requirements)
        installer = "uv" if uv else "pip"
        what = f", installing {env.requirements} with {installer}" if req_bytes else ""
        request = {
            "root": root,
            "key": key,
            "python": workload_python,
            "system_site_packages": env.system_site_packages,
            "requirements": req_remote,
            "uv": uv.exe if uv else None,
        }
        answer = await _with_ticker(
            ctx,
            f"environment from {(brought and brought.label) or env.python}{what}"
            + (f" ({_pins_text(req_bytes)})" if req_bytes else ""),
            binding.agent.call(Op.ENSURE_VENV, request, timeout=3600),
        )
        venv = VenvAnswer.from_json(answer)
        venv_python = venv.venv_python
        ctx.journal.record_created(transport.name, "venv", venv.env_dir, ctx.run_id)
    return venv_python, venv, brought, req_bytes


async def _tools(
    ctx: RunContext, binding: HostBinding, req_bytes: bytes | None, req_name: str | None
) -> tuple[str | None, HostPython | None, BringAnswer | None]:
    """(interpreter for the venv, what was brought for it, uv or None): a version request
    is matched on the host or brought (engine/hostpython.py); a pinned torch without a
    wheel for that Python stops here, in one line, before pip's resolver would."""
    pb, agent, host = ctx.playbook, binding.agent, binding.transport.name
    method = install_method(pb.agent.runtime_install)
    python: str | None = pb.environment.python
    brought = None
    if version_request(pb.environment.python) is not None:
        got = await ensure_python(
            agent,
            pb.environment.python,
            home=ctx.home,
            method=method,
            emit=ctx.emit,
            run_id=ctx.run_id,
        )
        python = got.python
        if got.dir:
            brought = got
            ctx.journal.record_created(host, "runtime", got.dir, ctx.run_id)
        if req_bytes:
            tags = await host_tags(agent)
            for name, version in pins(req_bytes):
                verdict = await asyncio.to_thread(
                    check_pin, ctx.home, name, version, got.version, tags
                )
                if verdict.ok is False:
                    raise HostEnvironmentError(
                        f"{host}: {req_name} pins {verdict.line}",
                        hint="set environment.python to a version it has, e.g. "
                        f'"{verdict.pythons[-1] if verdict.pythons else "3.11"}"',
                    )
    uv = None
    if req_bytes:
        uv = await ensure_uv(agent, home=ctx.home, method=method, emit=ctx.emit, run_id=ctx.run_id)
        if uv is not None and uv.dir:
            ctx.journal.record_created(host, "runtime", uv.dir, ctx.run_id)
    return python, brought, uv


def _pins_text(req_bytes: bytes) -> str:
    lines = [
        ln.strip()
        for ln in req_bytes.decode("utf-8", "replace").splitlines()
        if ln.strip() and not ln.lstrip().startswith(("#", "-"))
    ]
    return ", ".join(lines[:4]) + (f" and {len(lines) - 4} more" if len(lines) > 4 else "")


async def _with_ticker(ctx: RunContext, detail: str, call: Any) -> Any:
    """Await ``call`` with a progress event every few seconds: what is being installed
    and for how long (a torch environment takes minutes)."""
    started = time.monotonic()
    task = asyncio.ensure_future(call)

    def tick() -> None:
        ctx.emit(
            PhaseProgress(
                ctx.run_id,
                phase="provision",
                done=0,
                total=None,
                unit="files",
                detail=f"{detail}: {time.monotonic() - started:.0f} s",
            )
        )

    tick()
    while True:
        done, _ = await asyncio.wait({task}, timeout=TICK_S)
        if done:
            return task.result()
        tick()


def project_revision(project_dir: Path) -> ProjectRevision:
    """The project's git commit and whether the work tree has uncommitted changes."""
    import subprocess

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(  # stdin: never the terminal a TUI draws on
                ["git", "-C", str(project_dir), *args],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return ProjectRevision(None, None)
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".")
    return ProjectRevision(commit, bool(status))


def resolve_device(device: str, probe: Probe) -> str:
    """``auto`` → mps, else cuda, else cpu, by what the host's torch can do."""
    if device != "auto":
        return device
    if probe.mps_available:
        return "mps"
    if probe.cuda_available:
        return "cuda"
    return "cpu"
