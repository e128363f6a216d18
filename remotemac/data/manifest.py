"""The checksummed manifest of a dataset slice, and its root digest.

Why: every byte is verified both ways, so the slice is described by the SHA-256 of
each file's plaintext; the agent checks what it decrypted against this list before
the workload starts. The root digest names the exact slice in the acceptance record:

    root_digest = sha256( for each entry, in path order (Unicode code point order,
                          which is also UTF-8 byte order):
                          "<sha256 hex>  <size in decimal>  <path>\\n" encoded as UTF-8 )

It is the dataset revision: two slices have the same digest exactly when they hold
the same paths with the same contents, wherever and whenever they were hashed.
Paths are relative POSIX paths without ``.``/``..`` parts or control characters, so
each line is unambiguous.

Hashing a large slice is slow, so a :class:`HashCache` (the journal implements it)
remembers each file's hash by (path, size, mtime_ns, inode, ctime_ns): an unchanged
file is not read again. The ctime because an edit can put the mtime back (``cp -p``,
``rsync -t``, a tool restoring timestamps) and nothing puts a ctime back; a stale hash
would record a dataset revision the job never saw, and fail the host's check of a file
sent in pieces (the laptop claims the cached hash) on every try.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from remotemac.errors import BadInput, IntegrityError

READ_SIZE = 1 << 20
SCHEMA = "remotemac-manifest/v1"

Progress = Callable[[int, int, str], None]
"""``progress(done_bytes, total_bytes, current_path)`` during :func:`build_manifest`."""


@dataclass(frozen=True)
class ManifestEntry:
    path: str
    size: int
    sha256: str

    def line(self) -> str:
        return f"{self.sha256}  {self.size}  {self.path}\n"


class HashCache(Protocol):
    """Remembers plaintext hashes keyed by what changes when a file changes.

    (size, mtime_ns, inode, ctime_ns): on the laptop's ext4 (or btrfs, xfs) times have
    nanoseconds (stamped from the kernel's tick clock, a few ms apart), so a same-size
    rewrite is missed only within that tick. On a whole-second file system (HFS+, FAT)
    it would be git's "racily clean" case the host guards against (agent/datarecords.py
    SETTLE_NS); no check here: remotemac's laptop is Linux (issue 28 item 7).
    """

    def get(self, path: str, size: int, mtime_ns: int, inode: int, ctime_ns: int) -> str | None: ...

    def put(
        self, path: str, size: int, mtime_ns: int, inode: int, ctime_ns: int, sha256: str
    ) -> None: ...

    def put_many(self, rows: Iterable[tuple[str, int, int, int, int, str]]) -> None:
        """:meth:`put` for each (path, size, mtime_ns, inode, ctime_ns, sha256), at once
        (a sync's thousands of small files: one write, not one each)."""
        ...


class MemoryHashCache:
    """In-process :class:`HashCache` for tests and one-shot runs."""

    def __init__(self) -> None:
        self._data: dict[str, tuple[int, int, int, int, str]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, path: str, size: int, mtime_ns: int, inode: int, ctime_ns: int) -> str | None:
        found = self._data.get(path)
        if found is not None and found[:4] == (size, mtime_ns, inode, ctime_ns):
            self.hits += 1
            return found[4]
        self.misses += 1
        return None

    def put(
        self, path: str, size: int, mtime_ns: int, inode: int, ctime_ns: int, sha256: str
    ) -> None:
        self._data[path] = (size, mtime_ns, inode, ctime_ns, sha256)

    def put_many(self, rows: Iterable[tuple[str, int, int, int, int, str]]) -> None:
        for path, *identity in rows:
            self.put(path, *identity)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Manifest:
    """Entries sorted by path, and their root digest (the dataset revision)."""

    entries: tuple[ManifestEntry, ...]
    root_digest: str

    @classmethod
    def from_entries(cls, entries: Iterable[ManifestEntry], *, checked: bool = False) -> Manifest:
        """``checked``: the caller ran :func:`check_relpath` on every path already (a
        sync's slice, stat'ed path by path), so it is not run a second time here."""
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        seen: set[str] = set()
        for entry in ordered:
            if not checked:
                check_relpath(entry.path)
            if entry.path in seen:
                raise IntegrityError(f"manifest lists {entry.path!r} twice")
            seen.add(entry.path)
        return cls(ordered, root_digest(ordered))

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema": SCHEMA,
                "root_digest": self.root_digest,
                "files": len(self.entries),
                "bytes": self.total_bytes,
                "entries": [
                    {"path": e.path, "size": e.size, "sha256": e.sha256} for e in self.entries
                ],
            },
            indent=1,
        )


def sha256_file(path: Path | str) -> str:
    """The hex SHA-256 of a local file, read in 1 MiB blocks (pulls, wheels, project checks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def root_digest(entries: Iterable[ManifestEntry]) -> str:
    """SHA-256 over the path-sorted entry lines (see the module doc)."""
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.path):
        digest.update(entry.line().encode("utf-8"))
    return digest.hexdigest()


#: an empty, "." or ".." path part; a control character, DEL or a backslash (checked
#: with two regexes: a re-sync checks thousands of paths twice)
_BAD_PART = re.compile(r"(?:^|/)\.{0,2}(?:/|$)")
_BAD_CHAR = re.compile(r"[\x00-\x1f\x7f\\]")


def check_relpath(path: str) -> None:
    """Refuse paths that could escape a directory or make a manifest line ambiguous."""
    if not path or path.startswith("/") or _BAD_PART.search(path) or _BAD_CHAR.search(path):
        raise IntegrityError(f"manifest path {path!r} is not a plain relative path")


def build_manifest(
    root: Path,
    paths: Iterable[str],
    cache: HashCache | None = None,
    progress: Progress | None = None,
) -> Manifest:
    """Hash each file under ``root`` (1 MiB reads), reusing ``cache`` hits.

    Sizes and identity come from ``fstat`` of the open file, and a file whose size
    or mtime changes while it is hashed is an error: the manifest must describe
    exactly the bytes that will be sent.
    """
    root = Path(root)
    rels = sorted(set(paths))
    real_root = root.resolve()
    for rel in rels:
        check_relpath(rel)
        resolved = (root / rel).resolve()
        if real_root not in resolved.parents:
            raise BadInput(f"data file {root / rel} escapes the data root through a symlink")
    total = 0
    for rel in rels:
        try:
            total += (root / rel).stat().st_size
        except OSError as exc:
            raise BadInput(f"cannot read data file {root / rel}: {exc.strerror}") from None
    done = 0
    entries = []
    buf = bytearray(READ_SIZE)
    view = memoryview(buf)
    for rel in rels:
        full = root / rel
        with open(full, "rb") as handle:
            before = os.fstat(handle.fileno())
            if not stat.S_ISREG(before.st_mode):
                raise BadInput(f"data file {full} is not a regular file")
            key = (rel, before.st_size, before.st_mtime_ns, before.st_ino, before.st_ctime_ns)
            sha = cache.get(*key) if cache is not None else None
            if sha is None:
                hasher = hashlib.sha256()
                size = 0
                while True:
                    count = handle.readinto(buf)
                    if not count:
                        break
                    hasher.update(view[:count])
                    size += count
                    if progress is not None:
                        progress(done + size, total, rel)
                after = os.fstat(handle.fileno())
                if (size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
                    raise IntegrityError(
                        f"data file {full} changed while it was hashed",
                        hint="stop whatever writes to the dataset and sync again",
                    )
                sha = hasher.hexdigest()
                if cache is not None:
                    cache.put(*key, sha)
            elif progress is not None:
                progress(done + before.st_size, total, rel)
        done += before.st_size
        entries.append(ManifestEntry(rel, before.st_size, sha))
    return Manifest.from_entries(entries)
