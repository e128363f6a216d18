"""Give the host's agent its runtime (a pinned ``cryptography``) before it must decrypt.

The host side is agent/agentruntime.py. This side picks the way in:

* ``online``: the host runs pip itself (short timeouts, pip's cache under
  ``remote_root``);
* ``offline``: this laptop downloads the wheels for the host's platform and Python
  (``pip download --only-binary=:all: --platform … --python-version …``), keeps them
  in ``<home>/wheels/<key>/`` for the next host, uploads them, and the agent unzips
  them (no pip needed on the host);
* ``auto`` (default): online first, offline when the host cannot install online.

``agent.runtime_install`` in the playbook or ``$REMOTEMAC_RUNTIME_INSTALL`` forces
one (the environment variable wins, so a test or a user can force it for any run).
A failure is a :class:`HostEnvironmentError` (exit 6) that names the phase and
quotes pip's last lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from remotemac.agent.protocol import ErrorCode, JsonObject, Op, RuntimeEnsureAnswer
from remotemac.agent.shared import requirements, runtime_key
from remotemac.data.manifest import sha256_file
from remotemac.engine.agentclient import AgentClient, AgentError
from remotemac.engine.bring import upload
from remotemac.engine.pythonsource import HostTags
from remotemac.errors import BadInput, HostDiskFull, HostEnvironmentError, IntegrityError
from remotemac.events import Event, PhaseProgress, Warning

ENV_METHOD = "REMOTEMAC_RUNTIME_INSTALL"
METHODS = ("auto", "online", "offline")
#: the agent's online install gives up after 240 s; leave it room to answer
ENSURE_TIMEOUT_S = 300.0
DOWNLOAD_TIMEOUT_S = 300.0
MARKER = ".complete"

Emit = Callable[[Event], None]


def install_method(setting: str | None = None) -> str:
    """$REMOTEMAC_RUNTIME_INSTALL, else the playbook's setting, else ``auto``."""
    value = os.environ.get(ENV_METHOD) or setting or "auto"
    if value not in METHODS:
        raise BadInput(f"{ENV_METHOD}={value!r}: use one of {', '.join(METHODS)}")
    return value


def pip_download_argv(tags: HostTags, dest: Path) -> list[str]:
    """``pip download`` of the pinned set for another machine's interpreter and platform.

    The full Python version matters: pip checks Requires-Python against it, and
    cryptography excludes 3.9.0 and 3.9.1 (``--python-version 3.9`` means 3.9.0).
    """
    if not tags.platforms:
        raise HostEnvironmentError(
            f"no known wheel platform for the host ({tags.system} {tags.machine}"
            f"{', glibc ' + tags.glibc if tags.glibc else ''})",
            hint="let the host reach a package index (agent.runtime_install: online)",
        )
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "--python-version",
        str(tags.python),
        "--implementation",
        str(tags.implementation),
        "--abi",
        str(tags.abi),
        "--abi",
        "abi3",
        "--abi",
        "none",
    ]
    for plat in tags.platforms:
        argv += ["--platform", plat]
    return argv + ["-d", str(dest), *requirements()]


def fetch_wheels(
    home: Path, tags: HostTags, timeout: float = DOWNLOAD_TIMEOUT_S
) -> tuple[Path, list[dict[str, str]], bool]:
    """(dir, [{name, sha256}], from cache) of the host's wheels, downloaded once per key."""
    cache = home / "wheels" / runtime_key(tags.to_json())
    marker = cache / MARKER
    if marker.is_file():
        try:
            files = json.loads(marker.read_text(encoding="utf-8"))["files"]
            if all((cache / f["name"]).is_file() for f in files):
                return cache, files, True
        except (OSError, ValueError, KeyError, TypeError):
            pass
    tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True, mode=0o700)
    try:
        try:
            res = subprocess.run(
                pip_download_argv(tags, tmp),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise HostEnvironmentError(
                f"downloading the agent runtime's wheels on this laptop took over {timeout:.0f}s",
                hint="check this laptop's access to the package index",
            ) from None
        if res.returncode != 0:
            tail = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()][-4:]
            raise HostEnvironmentError(
                "this laptop could not download the agent runtime's wheels for the host "
                f"({tags.python_tag}, {tags.platforms[0]}): " + " | ".join(tail),
                hint="check this laptop's pip and its access to the package index",
            )
        files = [{"name": p.name, "sha256": sha256_file(p)} for p in sorted(tmp.glob("*.whl"))]
        marker_json = {"files": files, "tags": tags.to_json()}
        (tmp / MARKER).write_text(json.dumps(marker_json), encoding="utf-8")
        shutil.rmtree(cache, ignore_errors=True)
        os.replace(tmp, cache)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cache, files, False


async def ensure_runtime(
    agent: AgentClient,
    *,
    home: Path | None,
    method: str = "auto",
    phase: str = "sync",
    run_id: str = "",
    emit: Emit | None = None,
) -> RuntimeEnsureAnswer:
    """Make the host hold the agent runtime; its answer (``dir``, ``reused``, ``method``,
    ``installed``, ``seconds``). ``home=None`` rules the offline path out."""
    emit = emit or (lambda _e: None)
    host = agent.transport.name
    where = f"{host}: installing the agent runtime (during {phase})"
    first = "offline" if method == "offline" else "online"
    got = tried = await _ensure(agent, {"root": agent.root, "method": first}, where)
    if tried.failed:
        reason = tried.failed + (": " + " | ".join(tried.tail) if tried.tail else "")
        if method == "online" or home is None:
            raise HostEnvironmentError(
                f"{where} with pip on the host failed: {reason}",
                hint="let the host reach the package index, or set agent.runtime_install: "
                "offline (or REMOTEMAC_RUNTIME_INSTALL=offline) so this laptop brings "
                "the wheels",
            )
        if first == "online":
            emit(
                Warning(
                    run_id,
                    code="runtime-offline",
                    message=f"{host} cannot install the agent runtime online ({reason}); "
                    "bringing the wheels from this laptop",
                )
            )
        tags = HostTags.from_json(tried.tags or {})
        got = await _offline(agent, home, tags, where, emit, run_id, phase)
    if not got.reused:
        agent.ledger.append(
            host,
            f"installed {', '.join(got.installed or [])} into "
            f"{got.dir} ({got.method}, "
            f"{got.seconds} s)",
            0,
            op="install-runtime",
        )
        emit(
            PhaseProgress(
                run_id,
                phase=phase,
                done=1,
                total=1,
                unit="runtime",
                detail=f"agent runtime: cryptography {got.cryptography} "
                f"installed {got.method} in {got.seconds} s",
            )
        )
    return got


async def _ensure(agent: AgentClient, request: JsonObject, where: str) -> RuntimeEnsureAnswer:
    try:
        answer = await agent.call(Op.RUNTIME_ENSURE, request, timeout=ENSURE_TIMEOUT_S)
        return RuntimeEnsureAnswer.from_json(answer)
    except HostEnvironmentError as exc:
        if getattr(exc, "code", None) in (ErrorCode.NO_SPACE, ErrorCode.DISK_FULL):
            # the disk, not the interpreter: the run goes on once space is freed
            raise HostDiskFull(f"{where}: {exc.message}") from None
        raise HostEnvironmentError(
            f"{where}: {exc.message}", hint="the host's python3 must be CPython 3.9 or newer"
        ) from None
    except AgentError as exc:
        if exc.code == ErrorCode.INTEGRITY:  # an uploaded wheel arrived damaged
            raise IntegrityError(
                f"{where}: {exc.message}", hint="run again to upload the wheels afresh"
            ) from None
        raise HostEnvironmentError(f"{where}: {exc.message}") from None


async def _offline(
    agent: AgentClient,
    home: Path,
    tags: HostTags,
    where: str,
    emit: Emit,
    run_id: str,
    phase: str,
) -> RuntimeEnsureAnswer:
    started = time.monotonic()
    local, files, cached = await asyncio.to_thread(fetch_wheels, home, tags)
    emit(
        PhaseProgress(
            run_id,
            phase=phase,
            done=0,
            total=len(files),
            unit="wheels",
            detail=f"agent runtime: {len(files)} wheels for {tags.python_tag} "
            f"{tags.platforms[0]} "
            f"{'from the cache in ' + str(local) if cached else 'downloaded'}"
            f" in {time.monotonic() - started:.1f} s",
        )
    )
    remote = f"{agent.root}/runtime/upload-{runtime_key(tags.to_json())}-{os.getpid()}"
    # the one way remotemac brings binary things to a host (engine/bring.py)
    await upload(
        agent,
        [(local / item["name"], item["name"]) for item in files],
        remote,
        emit=emit,
        run_id=run_id,
        phase=phase,
        unit="wheels",
    )
    return await _ensure(
        agent,
        {"root": agent.root, "method": "offline", "wheels_dir": remote, "wheels": files},
        where,
    )
