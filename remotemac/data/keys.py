"""Per-run data keys, kept only on the local machine under ``<home>/keys``.

Why: the dataset is encrypted with a random 32-byte key that never touches the
host's disk. Destroying the local copy after the run ("crypto-shredding") makes any
ciphertext left on the rented Mac unreadable even if its cleanup failed. The key file
is 0600 in a 0700 directory, like an ssh private key, and a looser file is refused.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path

from remotemac.errors import BadInput, IntegrityError

KEY_LEN = 32
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def key_path(home: Path | str, run_id: str) -> Path:
    """Where the key of ``run_id`` lives; the run id is checked so it cannot name a path."""
    if not _RUN_ID.match(run_id) or ".." in run_id:
        raise BadInput(f"run id {run_id!r} is not valid (letters, digits, '.', '_', '-' only)")
    return Path(home) / "keys" / f"{run_id}.key"


def new_data_key(home: Path | str, run_id: str) -> bytes:
    """Make and store a fresh random key for ``run_id``; never overwrites an existing one.

    Overwriting would orphan data already encrypted under the old key, so an
    existing key is an error; a resumed run calls :func:`load_data_key`.
    """
    path = key_path(home, run_id)
    _ensure_private_dir(path.parent)
    key = os.urandom(KEY_LEN)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    except FileExistsError:
        raise BadInput(
            f"a data key for run {run_id} already exists at {path}",
            hint="resume that run, or remove the key with `remotemac cleanup` first",
        ) from None
    try:
        os.fchmod(fd, 0o600)
        _write_all(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(path.parent)
    return key


def load_data_key(home: Path | str, run_id: str) -> bytes:
    """Read the key of ``run_id``; a missing, loose or damaged key is an integrity error."""
    path = key_path(home, run_id)
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        raise IntegrityError(
            f"data key for run {run_id} is gone ({path}); it was destroyed by wipe or never made",
            hint="the run's encrypted data cannot be read; start a new run to sync again",
        ) from None
    except OSError as exc:
        raise IntegrityError(f"cannot open data key {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IntegrityError(f"data key {path} is not a regular file")
        if info.st_mode & 0o077:
            raise IntegrityError(
                f"data key {path} is readable by others (mode {stat.S_IMODE(info.st_mode):o})",
                hint=f"run `chmod 600 {path}` if you trust it, or start a new run",
            )
        key = os.read(fd, KEY_LEN + 1)
    finally:
        os.close(fd)
    if len(key) != KEY_LEN:
        raise IntegrityError(f"data key {path} is damaged ({len(key)} bytes, expected {KEY_LEN})")
    return key


def destroy_data_key(home: Path | str, run_id: str) -> bool:
    """Overwrite the key with random bytes, fsync, then unlink; False if it was not there.

    The overwrite defeats a later read of the same blocks on simple filesystems; on
    copy-on-write filesystems and SSDs old blocks may survive, which is why the key
    is also never copied anywhere else.
    """
    path = key_path(home, run_id)
    try:
        fd = os.open(path, os.O_WRONLY | _NOFOLLOW)
    except FileNotFoundError:
        return False
    try:
        size = max(os.fstat(fd).st_size, KEY_LEN)
        _write_all(fd, os.urandom(size))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(path)
    _fsync_dir(path.parent)
    return True


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _ensure_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise IntegrityError(f"key directory {path} is not a plain directory")
    os.chmod(path, 0o700)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
