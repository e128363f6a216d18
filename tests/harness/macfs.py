"""A FUSE loopback file system with the name rules of a Mac volume (Simulation).

Why: the Mac-shaped lab host (:mod:`tests.harness.maclab`) must store a dataset the
way a Mac does, or a test over it cannot see what breaks there. From the project's
Mac facts (APFS guide, Apple TN1150 on HFS+) this models:

- case-insensitive, case-preserving names: ``a.csv`` finds ``A.csv``; creating
  ``a.csv`` when ``A.csv`` exists opens ``A.csv``; a rename that changes only the case
  renames the entry;
- names stored and listed in NFD (HFS+: ``os.listdir`` returns NFD even for a file
  created with an NFC name), and matched normalization-insensitively;
- 1-second timestamps (HFS+ dates are whole seconds): every time read back is
  truncated, and ``utimens`` stores whole seconds.

What it does not model: HFS+'s own Unicode 3.2 tables (Python's ``unicodedata`` is
newer), resource forks, extended attributes, hard-link counts across names.

Entries live in a backing directory of this machine, in NFD, one per name. The
daemon runs as root (``allow_other``, ``default_permissions``: the kernel checks
modes) and gives what a caller creates to that caller's uid/gid.

Run: ``python -m tests.harness.macfs BACKING MOUNTPOINT`` (foreground; unmount or
SIGTERM ends it). Needs ``fusepy`` (test extras) and libfuse2.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import unicodedata
from typing import Any

from fuse import FUSE, FuseOSError, Operations, fuse_get_context


def nfd(name: str) -> str:
    return unicodedata.normalize("NFD", name)


def fold(name: str) -> str:
    """The key two names collide under on a case-insensitive, normalization-insensitive volume."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())


def _errno(exc: OSError) -> FuseOSError:
    return FuseOSError(exc.errno or errno.EIO)


class MacFS(Operations):
    """Loopback over ``backing`` with HFS+ name rules (see the module docstring)."""

    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)
        self._lock = threading.Lock()  # name resolution + create/rename are one step

    # -- names ---------------------------------------------------------------------

    def _resolve(self, path: str) -> str:
        """The backing path for ``path``: every component matched case- and
        normalization-insensitively; a missing last component keeps its NFD form."""
        real = self.backing
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            want = nfd(part)
            exact = os.path.join(real, want)
            if os.path.lexists(exact):
                real = exact
                continue
            key = fold(part)
            found = None
            try:
                for entry in os.listdir(real):
                    if fold(entry) == key:
                        found = entry
                        break
            except OSError:
                pass
            real = os.path.join(real, found if found is not None else want)
            if found is None and i < len(parts) - 1:
                return real  # a missing directory: the call fails with ENOENT as it should
        return real

    def _own(self, real: str) -> None:
        uid, gid, _pid = fuse_get_context()
        os.lchown(real, uid, gid)

    # -- attributes ----------------------------------------------------------------

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._resolve(path))
        except OSError as exc:
            raise _errno(exc) from None
        out = {
            key: getattr(st, key)
            for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")
        }
        for key in ("st_atime", "st_mtime", "st_ctime"):
            out[key] = int(getattr(st, key))  # HFS+: whole seconds
        return out

    def access(self, path: str, amode: int) -> int:
        if not os.path.lexists(self._resolve(path)):
            raise FuseOSError(errno.ENOENT)
        return 0

    def chmod(self, path: str, mode: int) -> None:
        try:
            os.chmod(self._resolve(path), mode)
        except OSError as exc:
            raise _errno(exc) from None

    def chown(self, path: str, uid: int, gid: int) -> None:
        try:
            os.lchown(self._resolve(path), uid, gid)
        except OSError as exc:
            raise _errno(exc) from None

    def utimens(self, path: str, times: Any = None) -> None:
        try:
            if times is None:
                os.utime(self._resolve(path), follow_symlinks=False)
            else:
                whole = tuple(int(t) for t in times)
                os.utime(self._resolve(path), whole, follow_symlinks=False)
        except OSError as exc:
            raise _errno(exc) from None

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        try:
            if fh is not None:
                os.ftruncate(fh, length)
            else:
                os.truncate(self._resolve(path), length)
        except OSError as exc:
            raise _errno(exc) from None

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self.backing)
        return {
            key: getattr(st, key)
            for key in (
                "f_bavail",
                "f_bfree",
                "f_blocks",
                "f_bsize",
                "f_favail",
                "f_ffree",
                "f_files",
                "f_flag",
                "f_frsize",
                "f_namemax",
            )
        }

    # -- directories ---------------------------------------------------------------

    def readdir(self, path: str, fh: Any) -> list[str]:
        try:
            return [".", "..", *os.listdir(self._resolve(path))]
        except OSError as exc:
            raise _errno(exc) from None

    def mkdir(self, path: str, mode: int) -> None:
        with self._lock:
            real = self._resolve(path)
            try:
                os.mkdir(real, mode)
                self._own(real)
            except OSError as exc:
                raise _errno(exc) from None

    def rmdir(self, path: str) -> None:
        try:
            os.rmdir(self._resolve(path))
        except OSError as exc:
            raise _errno(exc) from None

    # -- links and names -----------------------------------------------------------

    def readlink(self, path: str) -> str:
        try:
            return os.readlink(self._resolve(path))
        except OSError as exc:
            raise _errno(exc) from None

    def symlink(self, target: str, source: str) -> None:
        with self._lock:
            real = self._resolve(target)
            try:
                os.symlink(source, real)
                self._own(real)
            except OSError as exc:
                raise _errno(exc) from None

    def link(self, target: str, source: str) -> None:
        with self._lock:
            try:
                os.link(self._resolve(source), self._resolve(target))
            except OSError as exc:
                raise _errno(exc) from None

    def unlink(self, path: str) -> None:
        try:
            os.unlink(self._resolve(path))
        except OSError as exc:
            raise _errno(exc) from None

    def rename(self, old: str, new: str) -> None:
        """Replace what ``new`` names (in whatever case it exists) and take ``new``'s case."""
        with self._lock:
            src = self._resolve(old)
            dst = self._resolve(new)
            wanted = os.path.join(os.path.dirname(dst), nfd(os.path.basename(new)))
            try:
                if dst == src:  # a change of case (or of normal form) only
                    os.rename(src, wanted)
                    return
                os.rename(src, dst)
                if dst != wanted:
                    os.rename(dst, wanted)
            except OSError as exc:
                raise _errno(exc) from None

    def mknod(self, path: str, mode: int, dev: int) -> None:
        with self._lock:
            real = self._resolve(path)
            try:
                os.mknod(real, mode, dev)
                self._own(real)
            except OSError as exc:
                raise _errno(exc) from None

    # -- files ---------------------------------------------------------------------

    def open(self, path: str, flags: int) -> int:
        try:
            return os.open(self._resolve(path), flags)
        except OSError as exc:
            raise _errno(exc) from None

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._lock:
            real = self._resolve(path)
            existed = os.path.lexists(real)
            try:
                fd = os.open(real, os.O_RDWR | os.O_CREAT, mode)
            except OSError as exc:
                raise _errno(exc) from None
            if not existed:
                self._own(real)
            return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        try:
            return os.pread(fh, size, offset)
        except OSError as exc:
            raise _errno(exc) from None

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        try:
            return os.pwrite(fh, data, offset)
        except OSError as exc:
            raise _errno(exc) from None

    def flush(self, path: str, fh: int) -> None:
        return None

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        try:
            (os.fdatasync if datasync else os.fsync)(fh)
        except OSError as exc:
            raise _errno(exc) from None


def main(argv: list[str]) -> int:
    backing, mountpoint = argv[:2]
    FUSE(
        MacFS(backing),
        mountpoint,
        foreground=True,
        allow_other=True,
        default_permissions=True,
        big_writes=True,
        fsname="macfs",
        subtype="hfs",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
