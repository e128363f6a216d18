"""File operations for wipe, cleanup and the dead-man that cannot be turned against the user.

Why a module of its own: the workload runs as the same user as remotemac, inside
directories remotemac will later delete. It can leave a symlink, a hard link to a
file of the user's, a FIFO or a device node where a file was, or swap a directory
for a link between a check and a use. So every destructive operation here:

- works relative to an opened directory (``dir_fd``), opened component by
  component with ``O_NOFOLLOW``: a path is never resolved twice;
- ``lstat``\\ s first and never opens anything that is not a regular file for
  reading or writing (``O_NONBLOCK`` as a belt: a FIFO can never block);
- checks after opening that it opened what it looked at (same device and inode);
- zeroes a file only when it has one link: a hard-linked file is unlinked, so
  the other name (maybe the user's file outside remote_root) keeps its bytes;
- walks trees with an explicit stack (no recursion limit), never following links.

Ownership markers also live here: every directory remotemac creates gets a
``.remotemac-owned`` file (JSON with its kind, root id and run id), written
atomically; wipe and cleanup delete only directories that carry one.

Python 3.9, standard library only.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from .protocol import JsonObject

#: The Mac-shaped test lab only (tests/harness/maclab.py): a Linux host that models a
#: Mac sets this so the agent takes its darwin branches end to end (RAM disk, ps,
#: caffeinate, launchd). Read here, once, because every agent entry point imports this
#: module first; it is the only place the agent reads it. A real host never sets it.
SIMULATE_DARWIN_ENV = "REMOTEMAC_LAB_DARWIN"
if os.environ.get(SIMULATE_DARWIN_ENV) == "1" and sys.platform.startswith("linux"):
    sys.platform = "darwin"

MARKER = ".remotemac-owned"
MARKER_MAX = 64 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
ZERO_BLOCK = b"\0" * (1 << 20)


class NotOurs(Exception):
    """A path is not what remotemac may touch (a link on the way, not a directory)."""


def lstat_at(dir_fd: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def open_subdir(dir_fd: Optional[int], name: str, expect: Optional[os.stat_result] = None) -> int:
    """Open a directory entry without following a link; check it is what ``expect`` saw."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise NotOurs("%s: not a directory of ours (%s)" % (name, exc.strerror or exc)) from None
    if expect is not None:
        got = os.fstat(fd)
        if (got.st_dev, got.st_ino) != (expect.st_dev, expect.st_ino):
            os.close(fd)
            raise NotOurs("%s changed while it was being removed" % name)
    return fd


def open_path(path: str) -> int:
    """Open an absolute directory path one component at a time, never following a link."""
    if not os.path.isabs(path):
        raise NotOurs("%s is not absolute" % path)
    fd = os.open("/", DIR_FLAGS)
    try:
        for part in [p for p in path.split("/") if p]:
            if part in (".", ".."):
                raise NotOurs("%s contains %r" % (path, part))
            child = open_subdir(fd, part)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def names_at(dir_fd: int) -> List[str]:
    return sorted(os.listdir(dir_fd))


def read_regular_at(dir_fd: Optional[int], name: str, limit: int = 1 << 20) -> Optional[bytes]:
    """The bytes of a regular file (at most ``limit``); None for anything else or missing.

    A FIFO, socket or device is never opened; ``O_NONBLOCK`` covers a swap between
    the lstat and the open, and fstat checks again what was opened.
    """
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_json_file(path: str, limit: int = 1 << 22) -> Any:
    """A small JSON file by path, never blocking on a FIFO and never through a final link."""
    raw = read_regular_at(None, path, limit)
    if raw is None:
        return None
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        return None


# ------------------------------------------------------------------ ownership markers


@dataclass(frozen=True)
class Marker:
    """The fields of a ``.remotemac-owned`` file the ownership checks read (the file
    itself stays JSON: wipe, cleanup and the dead-man read it as written)."""

    kind: Optional[str] = None
    run_id: Optional[str] = None
    root_id: Optional[str] = None
    #: the inode of the directory it was written in; None in markers from before that
    dir_ino: Optional[int] = None

    @classmethod
    def from_json(cls, data: JsonObject) -> "Marker":
        return cls(
            kind=data.get("kind"),
            run_id=data.get("run_id"),
            root_id=data.get("root_id"),
            dir_ino=data.get("dir_ino"),
        )

    def bound_to(self, st: os.stat_result) -> bool:
        """Written in the directory ``st`` describes (or from before markers named it)."""
        return self.dir_ino is None or self.dir_ino == st.st_ino

    @classmethod
    def of(cls, path: str) -> "Optional[Marker]":
        """The marker of the directory ``path``; None when it has none (or none readable)."""
        data = marker_of(path)
        return None if data is None else cls.from_json(data)


def write_marker(dir_fd: int, info: JsonObject, exclusive: bool = False) -> JsonObject:
    """Write ``.remotemac-owned`` in the directory ``dir_fd`` atomically (tmp + rename).

    ``exclusive``: never replace a marker already there (two runs claiming a new
    root at once): the tmp file is hard-linked into place, which fails when the
    name exists, and the marker that won is returned.
    """
    # the directory's inode binds the marker to it: a copy of the file elsewhere is no claim
    data = dict(info, created_at=time.time(), pid=os.getpid(), dir_ino=os.fstat(dir_fd).st_ino)
    # pid and thread: the resident agent marks from several threads of one process
    tmp = "%s.tmp-%d-%d" % (MARKER, os.getpid(), threading.get_ident())
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC, 0o600, dir_fd=dir_fd
    )
    try:
        os.write(fd, json.dumps(data).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    if not exclusive:
        os.replace(tmp, MARKER, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return data
    try:
        os.link(tmp, MARKER, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileExistsError:
        return read_marker(dir_fd) or data
    finally:
        os.unlink(tmp, dir_fd=dir_fd)
    return data


def mark_dir(path: str, info: JsonObject) -> JsonObject:
    """Mark ``path`` (an existing directory, no link on the way) as remotemac's."""
    fd = open_path(path)
    try:
        return write_marker(fd, info)
    finally:
        os.close(fd)


def read_marker(dir_fd: int) -> Optional[JsonObject]:
    raw = read_regular_at(dir_fd, MARKER, MARKER_MAX)
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def marker_of(path: str) -> Optional[JsonObject]:
    try:
        fd = open_path(path)
    except (NotOurs, OSError):
        return None
    try:
        return read_marker(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------ sizes and removal


def tree_size_at(parent_fd: int, name: str) -> Tuple[int, int]:
    """(bytes, entries) of ``name`` below ``parent_fd``, links counted as themselves."""
    st = lstat_at(parent_fd, name)
    if st is None:
        return 0, 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size, 1
    total, count = 0, 1
    try:
        stack = [open_subdir(parent_fd, name, st)]
    except NotOurs:
        return 0, 1
    while stack:
        fd = stack.pop()
        try:
            for child in os.listdir(fd):
                cst = lstat_at(fd, child)
                if cst is None:
                    continue
                count += 1
                if stat.S_ISDIR(cst.st_mode):
                    try:
                        stack.append(open_subdir(fd, child, cst))
                    except (NotOurs, OSError):
                        continue
                else:
                    total += cst.st_size
        except OSError:
            pass
        finally:
            os.close(fd)
    return total, count


def zero_file_at(dir_fd: int, name: str, st: os.stat_result) -> str:
    """Overwrite a regular, singly linked file with zeros; the reason when it was not."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_nlink != 1:
        return "hard-linked (%d names): unlinked, not overwritten" % st.st_nlink
    try:
        fd = os.open(name, os.O_WRONLY | _NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        return "cannot open: %s" % (exc.strerror or exc)
    try:
        got = os.fstat(fd)
        if (
            (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino)
            or got.st_nlink != 1
            or not stat.S_ISREG(got.st_mode)
        ):
            return "changed while it was being wiped: unlinked, not overwritten"
        left = got.st_size
        while left > 0:
            left -= os.write(fd, ZERO_BLOCK[: min(left, len(ZERO_BLOCK))])
        os.fsync(fd)
        return ""
    except OSError as exc:
        return "cannot overwrite: %s" % (exc.strerror or exc)
    finally:
        os.close(fd)


@dataclass
class Removal:
    """What removing a tree did: bytes and entries removed, what failed, what was only
    unlinked (``notes``: a hard-linked file is not overwritten)."""

    bytes: int = 0
    entries: int = 0
    failed: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        return {
            "bytes": self.bytes,
            "entries": self.entries,
            "failed": list(self.failed),
            "notes": list(self.notes),
        }


def remove_at(parent_fd: int, name: str, overwrite: bool = False) -> JsonObject:
    """:func:`remove_tree_at` as ``{"bytes", "entries", "failed": [...], "notes": [...]}``
    (the shape wipeops and ramstore read)."""
    return remove_tree_at(parent_fd, name, overwrite).to_json()


def remove_tree_at(parent_fd: int, name: str, overwrite: bool = False) -> Removal:
    """Remove ``name`` below ``parent_fd``: a leaf is unlinked, a directory emptied and
    removed, links never followed. With ``overwrite`` regular files with one link are
    zeroed first."""
    out = Removal()
    st = lstat_at(parent_fd, name)
    if st is None:
        return out
    if not stat.S_ISDIR(st.st_mode):
        _remove_leaf(parent_fd, name, st, overwrite, out, name)
        return out
    try:
        top = open_subdir(parent_fd, name, st)
    except NotOurs as exc:
        out.failed.append("%s: %s" % (name, exc))
        return out
    # frames: [dir fd, names left, parent fd, own name, path for messages]
    stack: List[List[Any]] = [[top, _listing(top, name, out), parent_fd, name, name]]
    while stack:
        frame = stack[-1]
        fd, left, where = frame[0], frame[1], frame[4]
        if left:
            child = left.pop()
            cst = lstat_at(fd, child)
            if cst is None:
                continue
            label = where + "/" + child
            if stat.S_ISDIR(cst.st_mode):
                try:
                    cfd = open_subdir(fd, child, cst)
                except (NotOurs, OSError) as exc:
                    out.failed.append("%s: %s" % (label, exc))
                    continue
                stack.append([cfd, _listing(cfd, label, out), fd, child, label])
            else:
                _remove_leaf(fd, child, cst, overwrite, out, label)
            continue
        stack.pop()
        os.close(fd)
        try:
            os.rmdir(frame[3], dir_fd=frame[2])
            out.entries += 1
        except OSError as exc:
            out.failed.append("%s: %s" % (where, exc.strerror or exc))
    return out


def _listing(fd: int, label: str, out: Removal) -> List[str]:
    try:
        return sorted(os.listdir(fd), reverse=True)
    except OSError as exc:
        out.failed.append("%s: %s" % (label, exc.strerror or exc))
        return []


def _remove_leaf(
    dir_fd: int, name: str, st: os.stat_result, overwrite: bool, out: Removal, label: str
) -> None:
    if overwrite and stat.S_ISREG(st.st_mode):
        why = zero_file_at(dir_fd, name, st)
        if why:
            out.notes.append("%s: %s" % (label, why))
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError as exc:
        out.failed.append("%s: %s" % (label, exc.strerror or exc))
        return
    out.entries += 1
    if stat.S_ISREG(st.st_mode):
        out.bytes += st.st_size


def ensure_owned_dir(path: str, info: JsonObject) -> Tuple[JsonObject, bool]:
    """Make ``path`` (its parent must exist) or adopt it, and return (marker, created).

    An existing directory is ours when its marker names the same kind (and run);
    an empty one without a marker is adopted (marked now); one holding anything
    else is refused with :class:`NotOurs`: remotemac would later delete it.
    """
    parent, name = os.path.split(os.path.normpath(path))
    pfd = open_path(parent)
    try:
        created = False
        try:
            os.mkdir(name, 0o700, dir_fd=pfd)
            created = True
        except FileExistsError:
            pass
        fd = open_subdir(pfd, name)
    finally:
        os.close(pfd)
    try:
        wanted = Marker.from_json(info)
        marker = read_marker(fd)
        if marker is not None:
            _check_bound(path, Marker.from_json(marker), os.fstat(fd))
            _check_marker(path, Marker.from_json(marker), wanted)
            return marker, False
        # the marker itself may appear now: a concurrent claim of the same new root won
        entries = [n for n in os.listdir(fd) if n != MARKER and not n.startswith(MARKER + ".tmp-")]
        if entries:
            shown = ", ".join(sorted(entries)[:3]) + (" …" if len(entries) > 3 else "")
            raise NotOurs(
                "%s holds %d entr%s remotemac did not write (%s)"
                % (path, len(entries), "y" if len(entries) == 1 else "ies", shown)
            )
        marker = write_marker(fd, info, exclusive=True)
        _check_marker(path, Marker.from_json(marker), wanted)
        return marker, created
    finally:
        os.close(fd)


def marker_is_bound(marker: JsonObject, st: os.stat_result) -> bool:
    """Was ``marker`` (a marker file's JSON) written in the directory ``st`` describes?
    A marker from before markers named their directory (no ``dir_ino``) is taken as it is."""
    return Marker.from_json(marker).bound_to(st)


def _check_bound(path: str, marker: Marker, st: os.stat_result) -> None:
    if not marker.bound_to(st):
        raise NotOurs(
            "%s holds a %s marker copied from another directory (it names another "
            "inode): it is not remotemac's" % (path, MARKER)
        )


def _check_marker(path: str, found: Marker, wanted: Marker) -> None:
    """Refuse a directory marked as another kind of remotemac directory, or another run's."""
    if found.kind != wanted.kind or (
        wanted.run_id and wanted.kind != "root" and found.run_id != wanted.run_id
    ):
        raise NotOurs(
            "%s is marked as remotemac's %s %s, not this %s"
            % (path, found.kind, found.run_id or "", wanted.kind)
        )


def write_json_atomic(path: str, data: Any) -> None:
    """Write JSON to ``path`` atomically, never through a planted link (agentutil's)."""
    from .agentutil import write_json_atomic as write

    write(path, data)
