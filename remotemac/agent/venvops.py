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
from typing import Any

from . import safefs
from .agentruntime import install_lock
from .hostagent import AgentError, inventory_add, owned_dir, root_marker

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


def interpreter_identity(python: str) -> dict[str, Any]:
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
    ident = json.loads(res.stdout.decode("utf-8", "replace"))
    ident["found"] = found
    ident["in_venv"] = os.path.realpath(ident["prefix"]) != os.path.realpath(ident["base_prefix"])
    return ident


def venv_key(base_key: str, ident: dict[str, Any]) -> str:
    """The env dir's name: the laptop's key (requirements, options) + the interpreter's identity."""
    digest = hashlib.sha256(base_key.encode())
    for field in ("real", "version", "prefix"):
        digest.update(b"\0" + str(ident.get(field)).encode())
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


def link_parent_site(venv_python: str, ident: dict[str, Any]) -> list[str]:
    """Let a venv made from a venv's python see that venv's packages, after its own."""
    parents = [
        p for p in sorted({ident.get("purelib"), ident.get("platlib")}) if p and os.path.isdir(p)
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
    req: dict[str, Any], root: str, ident: dict[str, Any], env_dir: str, python: str
) -> None:
    argv = [ident["found"], "-m", "venv"]
    if req.get("system_site_packages"):
        argv.append("--system-site-packages")
    if not req.get("requirements"):
        argv.append("--without-pip")
    argv.append(env_dir)
    _run_checked(argv, "venv creation from %s" % ident["found"])
    inventory_add(root, "venv", env_dir)
    if req.get("requirements"):
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
                req["requirements"],
            ],
            _owned_cache(root, "pip-cache"),
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
    req: dict[str, Any], root: str, ident: dict[str, Any], env_dir: str, python: str, uv: str
) -> None:
    """``uv venv`` + ``uv pip install -r``, uv's cache under the root: on APFS uv clones
    files from its cache (hard links elsewhere), so a second env with the same torch
    costs little disk."""
    env = dict(os.environ)
    env.update(
        UV_CACHE_DIR=_owned_cache(root, "uv-cache"),
        UV_NO_PROGRESS="1",
        UV_PYTHON_DOWNLOADS="never",  # the interpreter is the one named, never another
        NO_COLOR="1",
    )
    # the host's own certificate store, as its pip and this agent's downloads use (a
    # proxy's CA there: uv's built-in roots alone fail with 'invalid peer certificate')
    env.setdefault("UV_SYSTEM_CERTS", "1")
    argv = [uv, "venv", "--quiet", "--allow-existing", "--no-config", "--python", ident["found"]]
    if req.get("system_site_packages"):
        argv.append("--system-site-packages")
    _run_checked(argv + [env_dir], "uv venv from %s" % ident["found"], env)
    inventory_add(root, "venv", env_dir)
    if req.get("requirements"):
        argv = [uv, "pip", "install", "--no-config", "--python", python]
        argv += uv_index_args(env) + ["-r", req["requirements"]]
        res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        if res.returncode != 0:
            lines = [ln for ln in res.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
            raise AgentError(
                "uv pip install failed (exit %d): %s"
                % (res.returncode, " | ".join(ln.strip() for ln in lines[-PIP_TAIL_LINES:])),
                "env-failed",
            )


def op_ensure_venv(req: dict[str, Any]) -> dict[str, Any]:
    """Create or reuse ``envs/<key>``: one venv per (interpreter identity, requirements)."""
    root = req["root"]
    root_id = root_marker(root).get("root_id")  # claims a new root before writing in it
    ident = interpreter_identity(req.get("python") or "python3")
    key = venv_key(req["key"], ident)
    env_dir = os.path.join(root, "envs", key)
    python = os.path.join(env_dir, "bin", "python")
    described = {
        "interpreter": ident["real"],
        "version": ident["version"],
        "interpreter_is_venv": ident["in_venv"],
    }
    os.makedirs(os.path.dirname(env_dir), mode=0o700, exist_ok=True)
    # runs starting together on one host (a fleet, three terminals) build it once
    with install_lock(os.path.dirname(env_dir)):
        return _ensure_locked(
            req, root, ident, key, env_dir, python, dict(described, root_id=root_id)
        )


def _ensure_locked(
    req: dict[str, Any],
    root: str,
    ident: dict[str, Any],
    key: str,
    env_dir: str,
    python: str,
    described: dict[str, Any],
) -> dict[str, Any]:
    ready = os.path.join(env_dir, READY)
    if os.path.exists(ready) and os.path.exists(python):
        described.pop("root_id")
        return dict(
            described, venv_python=python, env_dir=env_dir, reused=True, seconds=0.0, key=key
        )
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
    owned_dir(env_dir, {"kind": "venv", "key": key, "root_id": described.pop("root_id")})
    uv = req.get("uv")
    if uv and not os.access(uv, os.X_OK):
        uv = None  # the brought uv is gone: pip builds it
    described["installer"] = "uv" if uv else "pip"
    if uv:
        _build_with_uv(req, root, ident, env_dir, python, uv)
    else:
        _build_with_pip(req, root, ident, env_dir, python)
    parents: list[str] = []
    if req.get("system_site_packages") and ident["in_venv"]:
        parents = link_parent_site(python, ident)
    with open(ready, "w") as fh:
        json.dump(dict(described, key=key), fh)
    return dict(
        described,
        venv_python=python,
        env_dir=env_dir,
        reused=False,
        key=key,
        parent_site=parents,
        seconds=round(time.time() - started, 2),
    )
