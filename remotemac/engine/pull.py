"""Pull results from the host: verified, resumable, and never outside ``--out``.

The agent lists the output directory with kinds, sizes and SHA-256. The host is
not trusted: every name is validated (no absolute paths, no ``..``, no NUL or
backslash), every local directory on the way is created by us and checked to be
a real directory (no link can lead out), the host's own entry and its parents
are ``lstat``-ed so a link, FIFO or device there is skipped and never read, and
each file is written to ``.<name>.rmpart`` (opened without following links) and
renamed into place only when its SHA-256 matches. An interrupted pull leaves the
``.rmpart`` file, and the next pull continues from its end; a checksum failure
removes it and ends with exit 5.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from remotemac.data.manifest import sha256_file
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.context import RunContext, Side
from remotemac.errors import IntegrityError, UnsafePath
from remotemac.events import Event, PhaseProgress, Warning
from remotemac.transport.base import Transport

PART = ".rmpart"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_HEX = set("0123456789abcdef")


#: a result's path below the output dir, in bytes, and one component of it: longer
#: names are refused (a 5,000-character name would otherwise fail in mkdir/open)
MAX_NAME_BYTES = 1024
MAX_PART_BYTES = 255
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def shown_name(name: object) -> str:
    """A host-sent name for a message: its repr (controls escaped), cut at 80 characters."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def entry_name(entry: dict[str, Any]) -> bytes | str | None:
    """The entry's name as the host's bytes (``name_hex``), else its ``path`` string.

    Raises UnsafePath for a name too long to consider."""
    raw = entry.get("name_hex")
    if isinstance(raw, str):
        if len(raw) > 2 * MAX_NAME_BYTES:  # refused without decoding all of it
            raise UnsafePath(
                f"refusing result name {shown_name(entry.get('path'))} "
                f"({len(raw) // 2} bytes): too long (at most {MAX_NAME_BYTES} bytes)"
            )
        try:
            return bytes.fromhex(raw)
        except ValueError:
            return None
    if raw is not None:
        return None
    name = entry.get("path")
    return name if isinstance(name, str) else None


def safe_relpath(name: bytes | str | None) -> PurePosixPath:
    """A host-sent name (bytes, or a str from an older agent) as a relative path, or UnsafePath.

    Refused: anything not valid UTF-8, longer than MAX_NAME_BYTES (or a component
    longer than MAX_PART_BYTES), empty, absolute, climbing with ``..``, with a NUL,
    a backslash, a control character or an empty or ``.`` component, or ending
    like remotemac's own partial files.
    """
    if isinstance(name, str):
        try:
            raw = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise UnsafePath(f"refusing result name {shown_name(name)}: not valid UTF-8") from None
    elif isinstance(name, bytes):
        raw = name
    else:
        raise UnsafePath(f"refusing result name {shown_name(name)}: not a name")
    if len(raw) > MAX_NAME_BYTES or any(len(p) > MAX_PART_BYTES for p in raw.split(b"/")):
        raise UnsafePath(
            f"refusing result name {shown_name(raw[:60])} ({len(raw)} bytes): "
            f"too long (at most {MAX_NAME_BYTES} bytes, {MAX_PART_BYTES} a part)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafePath(f"refusing result name {shown_name(raw)}: not valid UTF-8") from None
    if not text or "\x00" in text or "\\" in text:
        raise UnsafePath(f"refusing result name {shown_name(text)}: empty, NUL or backslash")
    path = PurePosixPath(text)
    if path.is_absolute() or ".." in path.parts or "//" in text or text.startswith("/"):
        raise UnsafePath(f"refusing result name {shown_name(text)}: absolute or climbs with '..'")
    if any(part in ("", ".") for part in text.split("/")) or _CONTROL.search(text):
        raise UnsafePath(
            f"refusing result name {shown_name(text)}: empty part, '.' or control character"
        )
    if text.endswith(PART):
        raise UnsafePath(
            f"refusing result name {shown_name(text)}: clashes with remotemac's partial files"
        )
    return path


async def pull_side(
    ctx: RunContext, side: Side, run_dir: str, max_bytes: int | None = None
) -> dict[str, Any]:
    """Pull one side's outputs; ``max_bytes``: what is left of ``outputs.max_bytes``."""
    binding = ctx.host_for(side)
    out_path = ctx.playbook.outputs.path.strip("/") or "."
    remote_dir = f"{run_dir}/out/{side.label}" + ("" if out_path == "." else f"/{out_path}")
    dest_root = ctx.out_dir / "results" / side.label
    result = await pull_dir(
        binding.transport,
        binding.agent,
        remote_dir,
        dest_root,
        emit=ctx.emit,
        run_id=ctx.run_id,
        label=side.label,
        max_bytes=max_bytes,
    )
    result["evidence"] = await fetch_evidence(ctx, side, run_dir)
    return result


class OutputsTooLarge(IntegrityError):
    """The host lists more output than ``outputs.max_bytes`` allows: nothing is pulled."""


async def pull_dir(
    transport: Transport,
    agent: AgentClient,
    remote_dir: str,
    dest_root: Path,
    *,
    emit: Callable[[Event], None] | None = None,
    run_id: str = "",
    label: str = "",
    max_bytes: int | None = None,
) -> dict[str, Any]:
    """Bring every regular file below ``remote_dir`` into ``dest_root``, verified.

    Each file is read up to the size the listing gave, never more; ``max_bytes``
    caps the listed total (OutputsTooLarge, exit 5, before a byte moves).
    Returns ``{"dir", "files": [{path, size, sha256}], "skipped": [{path, why}],
    "downloaded": bytes moved}``. Raises IntegrityError (exit 5) on a checksum failure.
    """
    emit = emit or (lambda _e: None)
    listing = await agent.call("list_outputs", {"dir": remote_dir})
    entries = listing.get("entries") if isinstance(listing, dict) else None
    if not isinstance(entries, list):
        raise IntegrityError(f"{transport.name}: the output listing of {remote_dir} is malformed")
    dest_root.mkdir(parents=True, exist_ok=True)
    root_st = os.lstat(dest_root)
    if not stat.S_ISDIR(root_st.st_mode):
        raise UnsafePath(f"{dest_root} is not a plain directory; refusing to pull into it")
    dest_root = dest_root.resolve()
    named: list[tuple[Any, PurePosixPath | str]] = []  # (entry, its path or why not)
    for entry in entries:
        if not isinstance(entry, dict):
            named.append((entry, "malformed listing entry"))
            continue
        try:
            named.append((entry, safe_relpath(entry_name(entry))))
        except UnsafePath as exc:
            named.append((entry, exc.message))
    kinds = {str(rel): e.get("kind") for e, rel in named if isinstance(rel, PurePosixPath)}
    files: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    wanted: list[tuple[PurePosixPath, dict[str, Any]]] = []

    def skip(name: str, why: str) -> None:
        skipped.append({"path": name, "why": why})
        emit(Warning(run_id, message=f"pull {label}: skipped {name}: {why}", code="pull-skip"))

    for entry, rel in named:
        why = rel if isinstance(rel, str) else _refuse(entry, rel, kinds)
        if why is not None or isinstance(rel, str):
            skip(shown_name(entry.get("path") if isinstance(entry, dict) else entry), why or "")
            continue
        if entry["kind"] == "file":
            wanted.append((rel, entry))
    total = sum(int(e["size"]) for _, e in wanted)
    if max_bytes is not None and total > max_bytes:
        raise OutputsTooLarge(
            f"{transport.name}: {remote_dir} lists {len(wanted)} files, {total} bytes: more "
            f"than the {max_bytes} bytes outputs.max_bytes allows; nothing was pulled",
            hint="raise outputs.max_bytes or narrow outputs.path if that is expected",
        )
    progress = _Progress(emit, run_id, total, label)
    checked_dirs: set[str] = set()
    for rel, entry in wanted:
        remote = f"{remote_dir}/{rel}"
        why = await _remote_why(transport, remote_dir, rel, checked_dirs)
        if why is None:
            why = _local_parents(dest_root, rel)
        if why is None:
            try:
                await _fetch(transport, remote, dest_root.joinpath(*rel.parts), entry, progress)
            except FileNotFoundError:  # listed, then gone (the job or the host removed it)
                why = "gone from the host after it was listed"
            except OSError as exc:
                if exc.errno not in _LOCAL_REFUSALS:
                    raise
                why = f"cannot be written here: {exc.strerror}"
        if why is not None:
            skip(str(rel), why)
            continue
        files.append({"path": str(rel), "size": entry["size"], "sha256": entry["sha256"]})
    progress.flush()
    return {"dir": str(dest_root), "files": files, "skipped": skipped, "downloaded": progress.moved}


#: local errors that mean "this name cannot live here", not "the pull is broken"
_LOCAL_REFUSALS = {
    errno.ENAMETOOLONG,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ELOOP,
    errno.EEXIST,
    errno.EINVAL,
    errno.EILSEQ,
}


def _refuse(entry: dict[str, Any], rel: PurePosixPath, kinds: dict[str, Any]) -> str | None:
    """Why a listing entry with a valid name is not pulled (None: pull it, or a directory)."""
    kind = entry.get("kind")
    if kind == "dir":
        return None
    if kind != "file":
        return f"{shown_name(kind)} not pulled (only regular files are)"
    size, sha = entry.get("size"), entry.get("sha256")
    if (
        not isinstance(size, int)
        or isinstance(size, bool)
        or size < 0
        or not isinstance(sha, str)
        or len(sha) != 64
        or not set(sha) <= _HEX
    ):
        return "listing gives no valid size and sha256"
    for i in range(1, len(rel.parts)):
        parent = "/".join(rel.parts[:i])
        if kinds.get(parent, "dir") != "dir":
            return f"its parent {parent} is a {shown_name(kinds[parent])} on the host"
    return None


async def _remote_why(
    transport: Transport, remote_dir: str, rel: PurePosixPath, checked: set[str]
) -> str | None:
    """lstat the host's entry and each parent: a link, FIFO or device is never read."""
    for i in range(1, len(rel.parts)):
        parent = "/".join(rel.parts[:i])
        if parent in checked:
            continue
        st = await transport.stat(f"{remote_dir}/{parent}")
        if st is None or st.kind != "dir":
            return (
                f"its parent {parent} is {'missing' if st is None else 'a ' + st.kind} on the host"
            )
        checked.add(parent)
    st = await transport.stat(f"{remote_dir}/{rel}")
    if st is None:
        return "gone from the host"
    if st.kind != "file":
        return f"it is a {st.kind} on the host, not a regular file"
    return None


def _local_parents(dest_root: Path, rel: PurePosixPath) -> str | None:
    """Create the local directories of ``rel`` ourselves; refuse anything else in the way."""
    current = dest_root
    for part in rel.parts[:-1]:
        current = current / part
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return f"local {current} is in the way (not a plain directory)"
        except OSError as exc:
            if exc.errno not in _LOCAL_REFUSALS:
                raise
            return f"cannot be written here: {exc.strerror}"
    final = current / rel.parts[-1]
    with_part = final.parent / f".{final.name}{PART}"
    for path in (final, with_part):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            return f"local {path} is in the way (not a regular file)"
    return None


async def _fetch(
    transport: Transport, remote: str, dest: Path, entry: dict[str, Any], progress: _Progress
) -> None:
    size, expected = int(entry["size"]), entry["sha256"]
    if (
        dest.is_file()
        and not dest.is_symlink()
        and dest.stat().st_size == size
        and sha256_file(dest) == expected
    ):
        progress.skip(size)  # pulled completely by an earlier attempt
        return
    part = dest.parent / f".{dest.name}{PART}"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    with os.fdopen(fd, "r+b") as fh:
        have = os.fstat(fh.fileno()).st_size
        offset = have if have < size else 0
        progress.skip(offset)
        for attempt in (1, 2):
            # never more than the listed size: a file that grows or a host that lies
            # ends in a checksum failure, not a full disk
            await transport.download_to(remote, fh, offset, progress=progress.add, limit=size)
            fh.flush()
            digest = sha256_file(part)
            if digest == expected:
                break
            if attempt == 1 and offset > 0:
                offset = 0  # the resumed prefix came from another version: start over once
                continue
            fh.close()
            part.unlink(missing_ok=True)
            raise IntegrityError(
                f"{transport.name}: result {remote} failed its checksum after "
                f"transfer (expected {expected[:12]}…, got {digest[:12]}…)",
                hint="the file changed on the host or was damaged; pull again",
            )
    os.replace(part, dest)


class _Progress:
    def __init__(self, emit: Callable[[Event], None], run_id: str, total: int, label: str) -> None:
        self.emit, self.run_id, self.total, self.label = emit, run_id, total, label
        self.done = 0
        self.moved = 0
        self._last = -1

    def add(self, count: int) -> None:
        self.moved += count
        self.skip(count)

    def skip(self, count: int) -> None:
        self.done += count
        if self.done - self._last >= (4 << 20) or self.done >= self.total:
            self.flush()

    def flush(self) -> None:
        if self.done != self._last:
            self._last = self.done
            self.emit(
                PhaseProgress(
                    self.run_id, phase="pull", done=self.done, total=self.total, detail=self.label
                )
            )


#: the harness's observations and memory samples are small; a bigger one is not read
MAX_EVIDENCE_BYTES = 256 * 1024**2


async def fetch_evidence(ctx: RunContext, side: Side, run_dir: str) -> list[str]:
    """Copy the harness's observations and the memory samples next to the local log.

    Only regular files are read (a FIFO or device there is skipped with a warning:
    opening one would hang), each up to the size its ``lstat`` gave.
    """
    binding = ctx.host_for(side)
    fetched = []
    for remote, name in (
        (f"{run_dir}/status/{side.label}.obs.json", f"{side.label}.obs.json"),
        (f"{run_dir}/logs/{side.label}.metrics.jsonl", f"{side.label}.metrics.jsonl"),
        (f"{run_dir}/logs/{side.label}.rss.jsonl", f"{side.label}.rss.jsonl"),
    ):
        st = await binding.transport.stat(remote)
        if st is None:
            continue
        if st.kind != "file" or st.size > MAX_EVIDENCE_BYTES:
            why = f"a {st.kind}" if st.kind != "file" else f"{st.size} bytes, over the cap"
            ctx.emit(
                Warning(
                    ctx.run_id,
                    message=f"pull {side.label}: {name} not read: it is {why} on the host",
                    code="pull-skip",
                )
            )
            continue
        dest = ctx.out_dir / "logs" / name
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            await binding.transport.download_to(remote, fh, 0, limit=st.size)
        fetched.append(name)
    return fetched
