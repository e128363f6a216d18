"""Bring a binary thing to the host: one archive, checked by its sha256, unpacked under the root.

Why one mechanism: the host as delivered lacks three things remotemac needs, and
all three are "a file with a known sha256 that becomes a directory": a relocatable
CPython (python-build-standalone's ``install_only`` ``.tar.gz``, the builds uv
installs), uv itself (its ``py3-none-<platform>`` wheel), and the wheels of the
agent's own runtime (agentruntime.py). Each gets here one of two ways, chosen by
the laptop (engine/bring.py):

* online: this host downloads the URL itself (http/https only, short timeout);
* offline: the laptop downloaded it, uploaded it below ``<root>/runtime``, and
  names the upload.

Either way the bytes are checked against the sha256 the laptop got from the
source's metadata before anything is unpacked, and every member is checked (no
absolute path, no ``..``, no link leaving the tree, no device). The result is
``<root>/runtime/<name>/`` with remotemac's ownership marker (so cleanup removes it
like the runtime) and a ``.complete`` marker written last, listed in the inventory.

Python 3.9, standard library only (no ``tarfile`` filters: 3.9.6 lacks them).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import stat
import subprocess
import tarfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from typing import Optional, Tuple

from .agentruntime import below_base, check_member, install_lock, mark_owned
from .protocol import JsonObject, Message

SUBDIR = "runtime"
MARKER = ".complete"
DOWNLOAD_TIMEOUT_S = 20
FORMATS = ("tar.gz", "zip")


class BringError(Exception):
    """An archive that cannot be used; ``code`` is the agent's error code."""

    def __init__(self, message: str, code: str = "bad-archive"):
        super().__init__(message)
        self.code = code


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: str, want: str, what: str) -> None:
    if sha256_of(path) != (want or "").lower():
        raise BringError("%s is damaged (sha256 differs from its source's)" % what, "integrity")


def download(url: str, dest: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> int:
    """Fetch ``url`` (http/https only: a file:// URL names the laptop's disk) into ``dest``."""
    if not url.startswith(("https://", "http://")):
        raise OSError("not an http(s) URL (a file:// URL names the laptop's disk)")
    written = 0
    with urllib.request.urlopen(url, timeout=timeout) as src, open(dest, "xb") as out:  # noqa: S310
        for block in iter(lambda: src.read(1 << 20), b""):
            out.write(block)
            written += len(block)
    return written


# ------------------------------------------------------------------ unpacking


def unpack_tar(archive: str, dest: str) -> int:
    """Extract a ``.tar.gz`` member by member; refuse anything that could leave ``dest``."""
    count = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            name = member.name[2:] if member.name.startswith("./") else member.name
            name = name.rstrip("/")
            if not name:
                continue
            try:
                check_member(name)
            except Exception as exc:
                raise BringError("archive member %r refused: %s" % (member.name, exc)) from None
            target = os.path.join(dest, *name.split("/"))
            if member.isdir():
                os.makedirs(target, mode=0o755, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if member.issym():
                link = member.linkname
                joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), link))
                if link.startswith("/") or joined == ".." or joined.startswith("../"):
                    raise BringError("archive member %r links outside: %s" % (name, link))
                os.symlink(link, target)
            elif member.islnk():
                check_member(member.linkname)
                source = os.path.join(dest, *member.linkname.split("/"))
                if not os.path.isfile(source) or os.path.islink(source):
                    raise BringError("archive member %r: bad hard link" % name)
                shutil.copy2(source, target)
            elif member.isfile():
                src = tar.extractfile(member)
                if src is None:
                    raise BringError("archive member %r unreadable" % name)
                with src, open(target, "xb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
                os.chmod(target, 0o755 if member.mode & 0o111 else 0o644)
            else:
                raise BringError("archive member %r is a device or fifo: refused" % name)
            count += 1
    return count


def unpack_zip(archive: str, dest: str) -> int:
    """Extract a wheel (a zip) with every member's path checked and no links."""
    count = 0
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            try:
                check_member(info.filename)
            except Exception as exc:
                raise BringError("archive member %r refused: %s" % (info.filename, exc)) from None
            mode = (info.external_attr >> 16) & 0o177777
            if stat.S_ISLNK(mode):
                raise BringError("archive member %r is a symlink" % info.filename)
            target = os.path.join(dest, *info.filename.rstrip("/").split("/"))
            if info.filename.endswith("/"):
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(info) as src, open(target, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(target, 0o755 if mode & 0o111 else 0o644)
            count += 1
    return count


def tree_bytes(top: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


@dataclass(frozen=True)
class BringRequest:
    """``bring``: an archive (``what`` python | uv, ``format`` tar.gz | zip) with its
    sha256, downloaded by the host (``online``, ``url``) or uploaded (``upload``)."""

    root: str
    name: str
    sha256: str
    what: Optional[str] = None
    format: Optional[str] = None
    method: Optional[str] = None
    url: Optional[str] = None
    upload: Optional[str] = None

    @classmethod
    def from_json(cls, req: JsonObject) -> "BringRequest":
        return cls(
            root=os.path.expanduser(req["root"]),
            name=req["name"],
            sha256=req.get("sha256", ""),
            what=req.get("what"),
            format=req.get("format"),
            method=req.get("method"),
            url=req.get("url"),
            upload=req.get("upload") or None,
        )


@dataclass
class BroughtMarker(Message):
    """``<runtime>/<name>/.complete``: the archive unpacked there and what it holds
    (``exe`` relative to the dir, ``version``: absent when nothing was probed)."""

    #: "" defaults: the marker names ``what`` and ``method`` even when the request did not
    what: Optional[str] = ""
    name: str = ""
    sha256: str = ""
    method: Optional[str] = ""
    archive_bytes: int = 0
    bytes: int = 0
    installed_at: float = 0.0
    exe: Optional[str] = None
    version: Optional[str] = None


def _probe(what: str, tmp: str) -> Optional[Tuple[str, str]]:
    """What the unpacked thing is, run from where it lies (a broken build fails here)."""
    if what == "python":
        found = sorted(
            n for n in os.listdir(os.path.join(tmp, "python", "bin")) if n.startswith("python3.")
        )
        exe = os.path.join(tmp, "python", "bin", found[0]) if found else ""
        argv = [exe, "-I", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"]
        rel = os.path.relpath(exe, tmp)
    elif what == "uv":
        found = [os.path.join(d, "uv") for d, _s, files in os.walk(tmp) if "uv" in files]
        exe = found[0] if found else ""
        argv = [exe, "--version"]
        rel = os.path.relpath(exe, tmp) if exe else ""
    else:
        return None
    if not exe:
        raise BringError("the %s archive holds no executable where expected" % what)
    os.chmod(exe, 0o755)
    res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = res.stdout.decode("utf-8", "replace").strip()
    if res.returncode != 0:
        raise BringError("the brought %s does not start: %s" % (what, out[-200:]), "host-env")
    return rel, out.split()[-1] if out else ""


def read_marker(path: str) -> Optional[BroughtMarker]:
    try:
        with open(os.path.join(path, MARKER)) as fh:
            data = json.load(fh)
        return BroughtMarker.from_json(data) if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def op_bring(request: JsonObject) -> JsonObject:
    """Reuse or make ``<root>/runtime/<name>`` from an archive with a known sha256.

    Request: ``root``, ``name``, ``what`` (python | uv), ``format`` (tar.gz | zip),
    ``sha256``, ``method`` (online | offline), ``url`` (online) or ``upload`` (offline,
    a path below ``<root>/runtime``). Answer: ``dir``, ``exe`` (absolute), ``version``,
    ``reused``, ``method``, ``bytes``, ``seconds``; an online download that fails is
    ``{"failed": why}`` so the laptop can bring the archive itself.
    """
    from .hostagent import inventory_add, root_marker

    req = BringRequest.from_json(request)
    root = req.root
    root_marker(root)  # claims a new root before writing in it
    name = os.path.basename(req.name)
    if not name or name != req.name or req.format not in FORMATS:
        raise BringError("bad request: name %r, format %r" % (req.name, req.format))
    base = os.path.join(root, SUBDIR)
    os.makedirs(base, mode=0o700, exist_ok=True)
    if os.path.islink(base) or not os.path.isdir(base):
        raise BringError("%s is not a plain directory: refused" % base, "unsafe-path")
    final = os.path.join(base, name)
    started = time.time()
    upload = below_base(base, req.upload) if req.upload else None
    try:
        with install_lock(base):
            marker = read_marker(final)
            if marker is not None:
                return _answer(final, marker, True, 0.0)
            _clear_unfinished(final)
            tmp = "%s.tmp-%d" % (final, os.getpid())
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp, mode=0o700)
            archive = upload
            try:
                if req.method == "online":
                    archive = tmp + ".download"
                    _remove(archive)
                    try:
                        download(req.url or "", archive)
                    except (OSError, ValueError) as exc:
                        return {"failed": "cannot download %s: %s" % (req.url, exc)}
                if archive is None:
                    return {"failed": "the archive must come from the laptop"}
                marker = _unpack(req, name, archive, tmp)
                inventory_add(root, "runtime", final)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            finally:
                if archive and archive != upload:
                    _remove(archive)
    finally:
        if upload:  # the upload served its purpose either way
            _drop_upload(upload, base)
    return _answer(final, marker, False, round(time.time() - started, 2))


def _clear_unfinished(final: str) -> None:
    """An install that never completed: ours (marked) is removed, anything else there
    is refused (host-env), never replaced."""
    if not os.path.lexists(final):
        return
    from . import safefs

    owner = safefs.Marker.of(final)
    if owner is None or owner.kind != "runtime":
        raise BringError("%s is in the way and is not remotemac's: left alone" % final, "host-env")
    shutil.rmtree(final, ignore_errors=True)


def _unpack(req: BringRequest, name: str, archive: str, tmp: str) -> BroughtMarker:
    """Check the archive's sha256, unpack it into ``tmp``, probe what it holds, write
    and return its marker."""
    check_sha256(archive, req.sha256, req.name)
    size = os.path.getsize(archive)
    (unpack_tar if req.format == "tar.gz" else unpack_zip)(archive, tmp)
    probed = _probe(str(req.what), tmp)
    marker = BroughtMarker(
        what=req.what,
        name=name,
        sha256=req.sha256,
        method=req.method,
        archive_bytes=size,
        bytes=tree_bytes(tmp),
        installed_at=time.time(),
        exe=None if probed is None else probed[0],
        version=None if probed is None else probed[1],
    )
    with open(os.path.join(tmp, MARKER), "w") as fh:
        json.dump(marker.to_json(), fh)
    mark_owned(tmp)
    return marker


def _drop_upload(upload: str, base: str) -> None:
    """Remove an uploaded archive, and the ``upload-*`` dir that was made for it."""
    _remove(upload)
    parent = os.path.dirname(upload)
    if os.path.basename(parent).startswith("upload-") and parent != base:
        with contextlib.suppress(OSError):
            os.rmdir(parent)


def _answer(final: str, marker: BroughtMarker, reused: bool, seconds: float) -> JsonObject:
    exe = os.path.join(final, marker.exe) if marker.exe else None
    return dict(marker.to_json(), dir=final, exe=exe, reused=reused, seconds=seconds)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)
