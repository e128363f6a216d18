"""The agent's own runtime: a pinned ``cryptography`` under ``<root>/runtime/<key>/``.

Why: the host as delivered has only the OS ``python3`` (3.9 on macOS) and no
third-party module, but the host-side decryption of the dataset slice needs
AES-GCM, which the standard library lacks. So the agent brings it: on the first
encrypted sync it installs a pinned ``cryptography`` (and its dependencies) into a
directory of its own under ``remote_root``, and the decrypting process imports it
from there and from nowhere else. Neither the workload's venv nor the host's
site-packages is touched or trusted.

Two ways in, chosen by the laptop (engine/runtime.py):

* online: ``python3 -m pip install --target … --only-binary=:all:`` with a short
  network timeout and pip's cache inside ``remote_root``;
* offline: the laptop downloads the wheels for this host's platform and Python
  (``host_tags`` says which), uploads them, and this module installs them by
  unzipping (standard library ``zipfile``; no pip needed on the host). Every
  member is checked (no absolute path, no ``..``, no link) and hashed against the
  wheel's RECORD.

The runtime directory is keyed by a hash of the pinned set, the host's Python
(implementation and major.minor) and its platform tags, built in a temporary
directory and renamed into place with a ``.complete`` marker inside, so a
half-installed runtime is never used. Python 3.9, standard library only; doctor
calls :func:`op_runtime_status` from memory (engine/agentship.py), installing nothing.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import functools
import hashlib
import io
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .protocol import JsonObject, Message
from .shared import (  # noqa: F401  (the names the agent's callers read here)
    MANYLINUX_MIN_MINOR,
    PINS,
    RuntimeInstallError,
    normalise_name,
    parse_wheel_name,
    platform_tags,
    requirements,
    runtime_key,
    supported,
)

MIN_PYTHON = (3, 9)
SUBDIR = "runtime"
MARKER = ".complete"
PIP_CACHE = "pip-cache"
#: pip's per-request network timeout, and the whole online install's
PIP_NET_TIMEOUT_S = 15
PIP_TOTAL_TIMEOUT_S = 240
IMPORT_CHECK = (
    "import sys, os; d = os.path.realpath(sys.argv[1]); sys.path.insert(0, d); "
    "import cryptography; "
    "from cryptography.hazmat.primitives.ciphers.aead import AESGCM; "
    "AESGCM(bytes(32)).encrypt(bytes(12), b'x', None); "
    "f = os.path.realpath(cryptography.__file__); "
    "assert f.startswith(d + os.sep), 'cryptography came from %s' % f; "
    "print(cryptography.__version__)"
)


# ------------------------------------------------------------------ which wheels fit


def _glibc() -> Tuple[int, int]:
    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        text = ""
    found = re.match(r"glibc (\d+)\.(\d+)", text)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def host_tags() -> JsonObject:
    """This interpreter and platform, as the laptop needs them to fetch wheels (the
    tags travel as JSON: shared.runtime_key and shared.supported read them on both sides)."""
    system = platform.system()
    machine = platform.machine()
    mac = platform.mac_ver()[0] if system == "Darwin" else ""
    impl = {"CPython": "cp"}.get(platform.python_implementation(), "other")
    major, minor = sys.version_info[:2]
    return {
        "python": platform.python_version(),
        "python_tag": "%s%d%d" % (impl, major, minor),
        "implementation": impl,
        "abi": "%s%d%d" % (impl, major, minor),
        "system": system.lower(),
        "machine": machine,
        "mac_release": mac,
        "glibc": "%d.%d" % _glibc() if system == "Linux" else "",
        "platforms": platform_tags(system, machine, mac, _glibc()),
        "executable": sys.executable,
    }


def wheel_fits(filename: str, tags: JsonObject) -> bool:
    return bool(parse_wheel_name(filename)[2] & supported(tags))


# ------------------------------------------------------------------ the unzip installer


def check_member(name: str) -> None:
    """Refuse a wheel member that could land outside the target directory."""
    if not name or "\0" in name or "\\" in name:
        raise RuntimeInstallError("wheel member %r: bad name" % name, "bad-wheel")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise RuntimeInstallError("wheel member %r: absolute path" % name, "bad-wheel")
    if ".." in name.split("/"):
        raise RuntimeInstallError("wheel member %r: '..' in path" % name, "bad-wheel")


def _record(zf: zipfile.ZipFile) -> Tuple[str, Dict[str, str]]:
    """(dist-info dir, {member: 'sha256=…'}) from the wheel's RECORD."""
    infos = {n.split("/")[0] for n in zf.namelist() if n.split("/")[0].endswith(".dist-info")}
    if len(infos) != 1:
        raise RuntimeInstallError("wheel has %d .dist-info dirs" % len(infos), "bad-wheel")
    dist_info = infos.pop()
    try:
        text = zf.read(dist_info + "/RECORD").decode("utf-8")
    except KeyError:
        raise RuntimeInstallError("wheel has no RECORD", "bad-wheel") from None
    hashes = {}
    for row in csv.reader(io.StringIO(text)):
        if row:
            hashes[row[0]] = row[1] if len(row) > 1 else ""
    return dist_info, hashes


def _destination(name: str, dist_info: str) -> Optional[str]:
    """Where a member goes relative to the target, or None to skip it
    (``*.data/scripts``, ``headers`` and ``data`` are not needed for imports)."""
    first, _, rest = name.partition("/")
    if first.endswith(".data") and first != dist_info:
        sub, _, inner = rest.partition("/")
        return inner if sub in ("purelib", "platlib") and inner else None
    return name


def install_wheel(path: str, target: str) -> List[str]:
    """Unpack one wheel into ``target`` (a ``--target``-style dir); returns the files written."""
    written = []
    with zipfile.ZipFile(path) as zf:
        dist_info, hashes = _record(zf)
        for info in zf.infolist():
            name = info.filename
            check_member(name)
            mode = (info.external_attr >> 16) & 0o177777
            if stat.S_ISLNK(mode):
                raise RuntimeInstallError("wheel member %r is a symlink" % name, "bad-wheel")
            if name.endswith("/"):
                continue
            signature = name.startswith(dist_info + "/RECORD")
            if name not in hashes and not signature:
                raise RuntimeInstallError(
                    "wheel member %r is not in its RECORD" % name, "bad-wheel"
                )
            rel = _destination(name, dist_info)
            dest = os.path.join(target, *rel.split("/")) if rel else None
            if dest is not None:
                os.makedirs(os.path.dirname(dest), exist_ok=True)
            with (
                zf.open(info) as src,
                open(dest, "xb") if dest is not None else contextlib.nullcontext() as out,
            ):
                digest = hashlib.sha256()
                for block in iter(lambda: src.read(1 << 20), b""):
                    digest.update(block)
                    if out is not None:
                        out.write(block)
            want = hashes.get(name, "")
            if want and not signature:
                algo, _, value = want.partition("=")
                got = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
                if algo != "sha256" or value != got:
                    raise RuntimeInstallError(
                        "wheel member %r does not match its RECORD hash" % name, "bad-wheel"
                    )
            if dest is not None:
                os.chmod(dest, 0o755 if mode & 0o111 else 0o644)
                written.append(rel or "")
    return written


def install_wheels(
    wheels_dir: str, wanted: Iterable[Dict[str, str]], tags: JsonObject, target: str
) -> List[str]:
    """Check each uploaded wheel (sha256, name among the pins, tags fit) and unpack it."""
    pins = {normalise_name(n): v for n, v in PINS}
    seen = set()
    installed = []
    for item in wanted:
        name = os.path.basename(item["name"])
        path = os.path.join(wheels_dir, name)
        with open(path, "rb") as fh:
            sha = hashlib.sha256()
            for block in iter(lambda: fh.read(1 << 20), b""):
                sha.update(block)
        if sha.hexdigest() != item["sha256"]:
            raise RuntimeInstallError(
                "uploaded wheel %s is damaged (sha256 differs)" % name, "integrity"
            )
        dist, version, _ = parse_wheel_name(name)
        if pins.get(dist) != version:
            raise RuntimeInstallError(
                "wheel %s is not in the pinned set %s" % (name, requirements()), "bad-wheel"
            )
        if not wheel_fits(name, tags):
            raise RuntimeInstallError(
                "wheel %s does not fit this host (%s, %s)"
                % (name, tags["python_tag"], ", ".join(tags["platforms"][:3])),
                "bad-wheel",
            )
        install_wheel(path, target)
        seen.add(dist)
        installed.append("%s==%s" % (dist, version))
    missing = sorted(set(pins) - seen)
    if missing:
        raise RuntimeInstallError("no wheel uploaded for %s" % ", ".join(missing), "bad-wheel")
    return installed


# ------------------------------------------------------------------ status and install


def runtime_dir(root: str, tags: JsonObject) -> str:
    return os.path.join(os.path.expanduser(root), SUBDIR, runtime_key(tags))


@dataclass
class RuntimeMarker(Message):
    """``<runtime>/.complete``: what was installed, how, for which interpreter. Written
    last, so a runtime with one is whole; ``extra`` keeps keys a newer agent added."""

    key: str = ""
    method: str = ""
    installed: List[str] = field(default_factory=list)
    cryptography: str = ""
    python: str = ""
    installed_at: float = 0.0


@dataclass(frozen=True)
class RuntimeEnsureRequest:
    """``runtime_ensure``: where, and how (``online`` | ``offline`` with the uploaded
    ``wheels_dir`` and its ``wheels`` [{name, sha256}])."""

    root: str
    method: str = "online"
    wheels_dir: Optional[str] = None
    wheels: List[Dict[str, str]] = field(default_factory=list)

    @classmethod
    def from_json(cls, req: JsonObject) -> "RuntimeEnsureRequest":
        return cls(
            root=os.path.expanduser(req["root"]),
            method=req.get("method") or "online",
            wheels_dir=req.get("wheels_dir") or None,
            wheels=req.get("wheels") or [],
        )


def read_marker(path: str) -> Optional[RuntimeMarker]:
    try:
        with open(os.path.join(path, MARKER)) as fh:
            data = json.load(fh)
        return RuntimeMarker.from_json(data) if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=1)
def _pip_runs() -> bool:
    """Does ``python -m pip`` run under this interpreter? Asked once per agent process:
    a run asks ``runtime_status`` twice (the lock file's pins, then uv), and each probe
    started an interpreter that imports pip (0.25 s of the run's provision)."""
    return (
        subprocess.run(
            [sys.executable, "-m", "pip", "--version"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ).returncode
        == 0
    )


def op_runtime_status(req: JsonObject) -> JsonObject:
    """Is the runtime for this interpreter here? What would installing it take?"""
    tags = host_tags()
    path = runtime_dir(req["root"], tags)
    found = read_marker(path)
    marker = None if found is None else found.to_json()
    return {
        "key": runtime_key(tags),
        "dir": path,
        "present": marker is not None,
        "marker": marker,
        "tags": tags,
        "pins": requirements(),
        "pip": _pip_runs(),
        "python_ok": sys.version_info[:2] >= MIN_PYTHON,
        "wheels_known": bool(tags["platforms"]),
    }


def _pip_install(target: str, cache: str) -> None:
    argv = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--target",
        target,
        "--only-binary=:all:",
        "--no-input",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--no-compile",
        "--timeout",
        str(PIP_NET_TIMEOUT_S),
        "--retries",
        "1",
        "--cache-dir",
        cache,
    ] + requirements()
    try:
        res = subprocess.run(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            timeout=PIP_TOTAL_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeInstallError(
            "pip install took longer than %ds" % PIP_TOTAL_TIMEOUT_S, "online-failed"
        ) from None
    if res.returncode != 0:
        lines = [ln for ln in res.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
        raise RuntimeInstallError(
            "pip install failed (exit %d)" % res.returncode, "online-failed", lines[-4:]
        )


def _verify(target: str) -> str:
    """Import cryptography from ``target`` only, in a fresh interpreter; its version."""
    res = subprocess.run(
        [sys.executable, "-s", "-c", IMPORT_CHECK, target],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    if res.returncode != 0:
        lines = res.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeInstallError(
            "the installed cryptography does not import", "host-env", lines[-3:]
        )
    return res.stdout.decode().strip()


@contextlib.contextmanager
def install_lock(directory: str) -> Any:
    """One installer at a time (fleet runs on one host start together): a lock on the
    ``runtime`` directory itself, so no lock file is left among the runtimes."""
    import fcntl

    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def below_base(base: str, path: str) -> str:
    """``path`` if it lies strictly below ``base`` (uploads stay inside remote_root)."""
    real_base, real = os.path.realpath(base), os.path.realpath(path)
    if not real.startswith(real_base + os.sep):
        raise RuntimeInstallError("refusing %s: not below %s" % (path, base), "unsafe-path")
    return real


def op_runtime_ensure(request: JsonObject) -> JsonObject:
    """Reuse, or install (online with pip, or from uploaded wheels), the runtime.

    Request: ``root``, ``method`` (``online`` | ``offline``), for offline
    ``wheels_dir`` and ``wheels`` ([{name, sha256}]). Answer: ``dir``, ``reused``,
    ``method``, ``installed``, ``seconds``; or, when the online install fails,
    ``{"failed": message, "tail": pip's last lines}`` so the laptop can fall back.
    """
    if sys.version_info[:2] < MIN_PYTHON:
        raise RuntimeInstallError(
            "the host's %s is Python %s; the agent runtime needs 3.9 "
            "or newer" % (sys.executable, platform.python_version())
        )
    req = RuntimeEnsureRequest.from_json(request)
    tags = host_tags()
    root = req.root
    base = os.path.join(root, SUBDIR)
    os.makedirs(base, mode=0o700, exist_ok=True)
    if os.path.islink(base) or not os.path.isdir(base):  # never install through a link
        raise RuntimeInstallError("%s is not a plain directory: refused" % base, "unsafe-path")
    final = runtime_dir(root, tags)
    started = time.time()
    with install_lock(base):
        marker = read_marker(final)
        if marker is not None:
            return dict(marker.to_json(), dir=final, reused=True, seconds=0.0)
        _clear_unfinished(final)
        method = req.method
        if method == "offline" and not req.wheels_dir:
            return {
                "failed": "the wheels must come from the laptop",
                "tail": [],
                "dir": final,
                "tags": tags,
            }
        tmp = "%s.tmp-%d" % (final, os.getpid())
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp, mode=0o700)
        try:
            marker = _install_into(tmp, req, tags)
            from .hostagent import inventory_add

            inventory_add(root, "runtime", final)
            os.rename(tmp, final)
        except RuntimeInstallError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if exc.code == "online-failed":
                return {"failed": str(exc), "tail": exc.tail, "dir": final, "tags": tags}
            raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            if req.wheels_dir:  # the upload served its purpose either way
                shutil.rmtree(below_base(base, req.wheels_dir), ignore_errors=True)
    seconds = round(time.time() - started, 2)
    return dict(marker.to_json(), dir=final, reused=False, seconds=seconds)


def _clear_unfinished(final: str) -> None:
    """A runtime dir that never completed: ours (marked) is removed, anything else there
    is refused (host-env), never replaced."""
    if not os.path.lexists(final):
        return
    from . import safefs

    owner = safefs.Marker.of(final)
    if owner is None or owner.kind != "runtime":
        raise RuntimeInstallError(
            "%s is in the way and is not remotemac's runtime: left "
            "alone (move it, then run again)" % final,
            "host-env",
        )
    shutil.rmtree(final, ignore_errors=True)


def _install_into(tmp: str, req: RuntimeEnsureRequest, tags: JsonObject) -> RuntimeMarker:
    """Install the pinned set into ``tmp`` (pip online, or the uploaded wheels), check
    that cryptography imports from there, write and return its marker."""
    from .hostagent import inventory_add

    root, method = req.root, req.method
    base = os.path.join(root, SUBDIR)
    if method == "online":
        cache = os.path.join(base, PIP_CACHE)
        os.makedirs(cache, mode=0o700, exist_ok=True)
        mark_owned(cache)
        inventory_add(root, "runtime", cache)
        _pip_install(tmp, cache)
        installed = requirements()
    else:
        installed = install_wheels(below_base(base, req.wheels_dir or ""), req.wheels, tags, tmp)
    version = _verify(tmp)
    marker = RuntimeMarker(
        key=runtime_key(tags),
        method=method,
        installed=installed,
        cryptography=version,
        python=tags["python"],
        installed_at=time.time(),
    )
    with open(os.path.join(tmp, MARKER), "w") as fh:
        json.dump(marker.to_json(), fh)
        fh.flush()
        os.fsync(fh.fileno())
    mark_owned(tmp)
    return marker


def mark_owned(path: str) -> None:
    """The ownership marker cleanup looks for: it removes only directories it made."""
    from . import safefs

    if safefs.marker_of(path) is None:
        safefs.mark_dir(path, {"kind": "runtime"})


def activate(path: str) -> Any:
    """Make ``path`` the only source of ``cryptography`` in this process; the module.

    Called by the decrypting process before it imports streamcrypt's cipher.
    """
    real = os.path.realpath(path)
    if read_marker(real) is None:
        raise RuntimeInstallError("the agent runtime %s is missing or incomplete" % path)
    if real not in sys.path:
        sys.path.insert(0, real)
    try:
        import cryptography  # agent-imports: lazy (the agent runtime's venv)
    except ImportError as exc:
        raise RuntimeInstallError(
            "cannot import cryptography from the agent runtime %s: %s" % (path, exc)
        ) from None
    where = os.path.realpath(getattr(cryptography, "__file__", "") or "")
    if not where.startswith(real + os.sep):
        raise RuntimeInstallError(
            "cryptography was imported from %s, not the agent runtime %s" % (where, path)
        )
    return cryptography
