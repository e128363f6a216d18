"""The workload's venv, built right from whatever interpreter the playbook names.

Why this is more than ``python -m venv``: the interpreter a user names is often
itself a venv's python (an activated venv on the laptop for host ``local``, a
pyenv or Homebrew python on a Mac). ``--system-site-packages`` from a venv's
python sees the *base* interpreter's site-packages, not the venv's, so a torch
installed in the user's venv vanished from the workload's environment. Here the
interpreter is asked who it is (real path, version, prefix, whether it is a venv),
the cache key covers that identity, and a venv made from a venv gets the parent's
site-packages through a ``.pth`` file, after its own.

Standard library only, Python 3.9: runs on the host's OS python.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import List, Optional

from . import safefs
from .agentruntime import install_lock
from .hostagent import AgentError, inventory_add, owned_dir, root_marker
from .protocol import JsonObject

PARENT_PTH = "_remotemac_parent_site.pth"
READY = ".remotemac-ready"
PIP_TAIL_LINES = 6

_IDENTITY_CODE = (
    "import json, os, sys, sysconfig; p = sysconfig.get_paths(); "
    "print(json.dumps({'executable': sys.executable, "
    "'real': os.path.realpath(sys.executable), 'version': sys.version.split()[0], "
    "'prefix': sys.prefix, 'base_prefix': getattr(sys, 'base_prefix', sys.prefix), "
    "'purelib': p.get('purelib'), 'platlib': p.get('platlib')}))"
)


@dataclass(frozen=True)
class InterpreterIdentity:
    """Who an interpreter really is (its own answer to ``_IDENTITY_CODE``), and where
    it was found on the host's PATH."""

    found: str
    real: str
    version: str
    prefix: str
    base_prefix: str
    executable: Optional[str] = None
    purelib: Optional[str] = None
    platlib: Optional[str] = None

    @property
    def in_venv(self) -> bool:
        return os.path.realpath(self.prefix) != os.path.realpath(self.base_prefix)

    @classmethod
    def from_json(cls, found: str, data: JsonObject) -> "InterpreterIdentity":
        return cls(
            found=found,
            real=data["real"],
            version=data["version"],
            prefix=data["prefix"],
            base_prefix=data["base_prefix"],
            executable=data.get("executable"),
            purelib=data.get("purelib"),
            platlib=data.get("platlib"),
        )


@dataclass(frozen=True)
class VenvRequest:
    """An ``ensure_venv`` request: the laptop's ``key`` (requirements, options), the
    interpreter named, and a brought ``uv`` when there is one."""

    root: str
    key: str
    python: str = "python3"
    requirements: Optional[str] = None
    system_site_packages: bool = False
    uv: Optional[str] = None

    @classmethod
    def from_json(cls, req: JsonObject) -> "VenvRequest":
        return cls(
            root=req["root"],
            key=req["key"],
            python=req.get("python") or "python3",
            requirements=req.get("requirements") or None,
            system_site_packages=bool(req.get("system_site_packages")),
            uv=req.get("uv") or None,
        )


@dataclass
class VenvAnswer:
    """What ``ensure_venv`` answers; its first fields (with ``installer`` and ``key``) are
    also the venv's ready file."""

    interpreter: str
    version: str
    interpreter_is_venv: bool
    key: str
    installer: Optional[str] = None
    venv_python: str = ""
    env_dir: str = ""
    reused: bool = False
    seconds: float = 0.0
    parent_site: Optional[List[str]] = None

    def ready_json(self) -> JsonObject:
        out: JsonObject = {
            "interpreter": self.interpreter,
            "version": self.version,
            "interpreter_is_venv": self.interpreter_is_venv,
        }
        if self.installer is not None:
            out["installer"] = self.installer
        out["key"] = self.key
        return out

    def to_json(self) -> JsonObject:
        out = self.ready_json()
        del out["key"]
        out.update(venv_python=self.venv_python, env_dir=self.env_dir, reused=self.reused)
        if self.parent_site is None:  # reused: the ready file's venv as it was
            out.update(seconds=self.seconds, key=self.key)
        else:
            out.update(key=self.key, parent_site=self.parent_site, seconds=self.seconds)
        return out


def interpreter_identity(python: str) -> InterpreterIdentity:
    """Ask ``python`` (a name on PATH or a path) who it really is."""
    found = shutil.which(python)
    if not found:
        raise AgentError(
            "interpreter %r not found on the host's PATH (install it, or set "
            "environment.python to one that exists, e.g. python3)" % python,
            "no-python",
        )
    res = subprocess.run(
        [found, "-I", "-c", _IDENTITY_CODE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    if res.returncode != 0:
        tail = res.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise AgentError("interpreter %s does not start: %s" % (found, " ".join(tail)), "no-python")
    return InterpreterIdentity.from_json(found, json.loads(res.stdout.decode("utf-8", "replace")))


def venv_key(base_key: str, ident: InterpreterIdentity) -> str:
    """The env dir's name: the laptop's key (requirements, options) + the interpreter's identity."""
    digest = hashlib.sha256(base_key.encode())
    for value in (ident.real, ident.version, ident.prefix):
        digest.update(b"\0" + str(value).encode())
    return digest.hexdigest()[:16]


def _site_dirs(python: str) -> list[str]:
    res = subprocess.run(
        [python, "-I", "-c", _IDENTITY_CODE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        timeout=60,
    )
    if res.returncode != 0:
        raise AgentError("new venv's python does not start", "env-failed")
    paths = json.loads(res.stdout.decode())
    return sorted({paths["purelib"], paths["platlib"]})


def link_parent_site(venv_python: str, ident: InterpreterIdentity) -> list[str]:
    """Let a venv made from a venv's python see that venv's packages, after its own."""
    parents = [
        p for p in sorted({ident.purelib or "", ident.platlib or ""}) if p and os.path.isdir(p)
    ]
    own = _site_dirs(venv_python)
    with open(os.path.join(own[0], PARENT_PTH), "w") as fh:
        fh.write("".join(p + "\n" for p in parents))
    return parents


def run_pip(argv: list[str], cache_dir: str) -> None:
    """pip with its cache under remote_root; a failure is one line with pip's last lines."""
    env = dict(os.environ)
    env["PIP_CACHE_DIR"] = cache_dir
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    if res.returncode != 0:
        lines = [ln for ln in res.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
        raise AgentError(
            "pip install failed (exit %d): %s"
            % (res.returncode, " | ".join(ln.strip() for ln in lines[-PIP_TAIL_LINES:])),
            "env-failed",
        )


def _run_checked(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    if res.returncode != 0:
        tail = res.stdout.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise AgentError(
            "%s failed (exit %d): %s" % (what, res.returncode, " | ".join(tail)), "env-failed"
        )


def _build_with_pip(
    req: VenvRequest, ident: InterpreterIdentity, env_dir: str, python: str
) -> None:
    argv = [ident.found, "-m", "venv"]
    if req.system_site_packages:
        argv.append("--system-site-packages")
    if not req.requirements:
        argv.append("--without-pip")
    argv.append(env_dir)
    _run_checked(argv, "venv creation from %s" % ident.found)
    inventory_add(req.root, "venv", env_dir)
    if req.requirements:
        # pip's cache sits with the runtime's (marked as remotemac's, removed by cleanup)
        run_pip(
            [
                python,
                "-m",
                "pip",
                "install",
                "--progress-bar",
                "off",
                "-q",
                "-r",
                req.requirements,
            ],
            _owned_cache(req.root, "pip-cache"),
        )


def _owned_cache(root: str, name: str) -> str:
    cache = os.path.join(root, "runtime", name)
    os.makedirs(cache, mode=0o700, exist_ok=True)
    if safefs.marker_of(cache) is None:
        safefs.mark_dir(cache, {"kind": "runtime"})
    inventory_add(root, "runtime", cache)
    return cache


def uv_index_args(environ: dict[str, str]) -> list[str]:
    """The host's pip settings (``PIP_FIND_LINKS``, ``PIP_INDEX_URL``,
    ``PIP_EXTRA_INDEX_URL``) as uv options: a host set up for pip builds the same
    environment with uv. uv reads none of them itself."""
    argv: list[str] = []
    for var, flag in (
        ("PIP_FIND_LINKS", "--find-links"),
        ("PIP_INDEX_URL", "--index-url"),
        ("PIP_EXTRA_INDEX_URL", "--extra-index-url"),
    ):
        for value in (environ.get(var) or "").split():
            argv += [flag, value]
    return argv


def _build_with_uv(
    req: VenvRequest, ident: InterpreterIdentity, env_dir: str, python: str, uv: str
) -> None:
    """``uv venv`` + ``uv pip install -r``, uv's cache under the root: on APFS uv clones
    files from its cache (hard links elsewhere), so a second env with the same torch
    costs little disk."""
    env = dict(os.environ)
    env.update(
        UV_CACHE_DIR=_owned_cache(req.root, "uv-cache"),
        UV_NO_PROGRESS="1",
        UV_PYTHON_DOWNLOADS="never",  # the interpreter is the one named, never another
        NO_COLOR="1",
    )
    # the host's own certificate store, as its pip and this agent's downloads use (a
    # proxy's CA there: uv's built-in roots alone fail with 'invalid peer certificate')
    env.setdefault("UV_SYSTEM_CERTS", "1")
    argv = [uv, "venv", "--quiet", "--allow-existing", "--no-config", "--python", ident.found]
    if req.system_site_packages:
        argv.append("--system-site-packages")
    _run_checked(argv + [env_dir], "uv venv from %s" % ident.found, env)
    inventory_add(req.root, "venv", env_dir)
    if req.requirements:
        argv = [uv, "pip", "install", "--no-config", "--python", python]
        argv += uv_index_args(env) + ["-r", req.requirements]
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        if res.returncode != 0:
            lines = [ln for ln in res.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
            raise AgentError(
                "uv pip install failed (exit %d): %s"
                % (res.returncode, " | ".join(ln.strip() for ln in lines[-PIP_TAIL_LINES:])),
                "env-failed",
            )


def op_ensure_venv(request: JsonObject) -> JsonObject:
    """Create or reuse ``envs/<key>``: one venv per (interpreter identity, requirements)."""
    req = VenvRequest.from_json(request)
    root_id = root_marker(req.root).get("root_id")  # claims a new root before writing in it
    ident = interpreter_identity(req.python)
    key = venv_key(req.key, ident)
    env_dir = os.path.join(req.root, "envs", key)
    described = VenvAnswer(
        interpreter=ident.real,
        version=ident.version,
        interpreter_is_venv=ident.in_venv,
        key=key,
        venv_python=os.path.join(env_dir, "bin", "python"),
        env_dir=env_dir,
    )
    os.makedirs(os.path.dirname(env_dir), mode=0o700, exist_ok=True)
    # runs starting together on one host (a fleet, three terminals) build it once
    with install_lock(os.path.dirname(env_dir)):
        return _ensure_locked(req, ident, described, root_id).to_json()


def _ready_installer(ready: str) -> Optional[str]:
    """The installer a ready venv was built with (its ready file; None if unsaid)."""
    try:
        with open(ready) as fh:
            installer = json.load(fh).get("installer")
    except (OSError, ValueError, AttributeError):
        return None
    return installer if isinstance(installer, str) else None


def _ensure_locked(
    req: VenvRequest, ident: InterpreterIdentity, described: VenvAnswer, root_id: Optional[str]
) -> VenvAnswer:
    env_dir, key, python = described.env_dir, described.key, described.venv_python
    root = req.root
    ready = os.path.join(env_dir, READY)
    if os.path.exists(ready) and os.path.exists(python):
        described.reused = True
        # the record says who built it, on the run that reuses it too
        described.installer = _ready_installer(ready)
        return described
    started = time.time()
    if safefs.marker_of(env_dir) is not None:  # a venv that never got ready: ours?
        from . import wipeops

        real_root = os.path.realpath(root)
        not_ours = wipeops.ownership(env_dir, "venv", safefs.marker_of(real_root))
        if not_ours is not None:
            raise AgentError("%s: %s; left alone" % (env_dir, not_ours), "env-failed")
        fate = wipeops.remove_item(real_root, os.path.join(real_root, "envs", key), False)
        if fate.failed:
            raise AgentError(
                "cannot replace the unfinished venv %s: %s" % (env_dir, fate.why),
                "env-failed",
            )
    owned_dir(env_dir, {"kind": "venv", "key": key, "root_id": root_id})
    uv = req.uv
    if uv and not os.access(uv, os.X_OK):
        uv = None  # the brought uv is gone: pip builds it
    described.installer = "uv" if uv else "pip"
    if uv:
        _build_with_uv(req, ident, env_dir, python, uv)
    else:
        _build_with_pip(req, ident, env_dir, python)
    parents: list[str] = []
    if req.system_site_packages and ident.in_venv:
        parents = link_parent_site(python, ident)
    with open(ready, "w") as fh:
        json.dump(described.ready_json(), fh)
    described.parent_site = parents
    described.seconds = round(time.time() - started, 2)
    return described
