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

import hashlib
import os
import stat
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from remotemac.engine.agentclient import AgentClient
from remotemac.engine.context import RunContext, Side
from remotemac.errors import IntegrityError, UnsafePath
from remotemac.events import Event, PhaseProgress, Warning
from remotemac.transport.base import Transport

PART = ".rmpart"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_HEX = set("0123456789abcdef")


def safe_relpath(name: str) -> PurePosixPath:
    """A host-sent name as a relative path, or UnsafePath."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise UnsafePath(f"refusing result name {name!r}: empty, NUL or backslash")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "//" in name or name.startswith("/"):
        raise UnsafePath(f"refusing result name {name!r}: absolute or climbs with '..'")
    if any(part in ("", ".") for part in name.split("/")) or any(ord(c) < 32 for c in name):
        raise UnsafePath(f"refusing result name {name!r}: empty part, '.' or control character")
    if name.endswith(PART):
        raise UnsafePath(f"refusing result name {name!r}: clashes with remotemac's partial files")
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


async def pull_side(ctx: RunContext, side: Side, run_dir: str) -> dict[str, Any]:
    binding = ctx.host_for(side)
    out_path = ctx.playbook.outputs.path.strip("/") or "."
    remote_dir = f"{run_dir}/out/{side.label}" + ("" if out_path == "." else f"/{out_path}")
    dest_root = ctx.out_dir / "results" / side.label
    result = await pull_dir(binding.transport, binding.agent, remote_dir, dest_root,
                            emit=ctx.emit, run_id=ctx.run_id, label=side.label)
    result["evidence"] = await fetch_evidence(ctx, side, run_dir)
    return result


async def pull_dir(transport: Transport, agent: AgentClient, remote_dir: str, dest_root: Path, *,
                   emit: Callable[[Event], None] | None = None, run_id: str = "",
                   label: str = "") -> dict[str, Any]:
    """Bring every regular file below ``remote_dir`` into ``dest_root``, verified.

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
    kinds = {e.get("path"): e.get("kind") for e in entries if isinstance(e, dict)}
    files: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    wanted: list[tuple[PurePosixPath, dict[str, Any]]] = []
    for entry in entries:
        name = entry.get("path") if isinstance(entry, dict) else None
        why = _refuse(entry, kinds)
        if why is not None:
            skipped.append({"path": repr(name), "why": why})
            emit(Warning(run_id, message=f"pull {label}: skipped {name!r}: {why}",
                         code="pull-skip"))
            continue
        if entry["kind"] == "file":
            wanted.append((PurePosixPath(entry["path"]), entry))
    total = sum(int(e["size"]) for _, e in wanted)
    progress = _Progress(emit, run_id, total, label)
    checked_dirs: set[str] = set()
    for rel, entry in wanted:
        remote = f"{remote_dir}/{rel}"
        why = await _remote_why(transport, remote_dir, rel, checked_dirs)
        if why is None:
            why = _local_parents(dest_root, rel)
        if why is not None:
            skipped.append({"path": str(rel), "why": why})
            emit(Warning(run_id, message=f"pull {label}: skipped {rel}: {why}", code="pull-skip"))
            continue
        await _fetch(transport, remote, dest_root.joinpath(*rel.parts), entry, progress)
        files.append({"path": str(rel), "size": entry["size"], "sha256": entry["sha256"]})
    progress.flush()
    return {"dir": str(dest_root), "files": files, "skipped": skipped,
            "downloaded": progress.moved}


def _refuse(entry: Any, kinds: dict[Any, Any]) -> str | None:
    """Why a listing entry is not pulled (None: pull it, or it is a directory)."""
    if not isinstance(entry, dict):
        return "malformed listing entry"
    try:
        rel = safe_relpath(entry.get("path"))  # type: ignore[arg-type]
    except UnsafePath as exc:
        return exc.message
    kind = entry.get("kind")
    if kind == "dir":
        return None
    if kind != "file":
        return f"{kind} not pulled (only regular files are)"
    size, sha = entry.get("size"), entry.get("sha256")
    if not isinstance(size, int) or size < 0 or not isinstance(sha, str) or len(sha) != 64 \
            or not set(sha) <= _HEX:
        return "listing gives no valid size and sha256"
    for i in range(1, len(rel.parts)):
        parent = "/".join(rel.parts[:i])
        if kinds.get(parent, "dir") != "dir":
            return f"its parent {parent} is a {kinds[parent]} on the host"
    return None


async def _remote_why(transport: Transport, remote_dir: str, rel: PurePosixPath,
                      checked: set[str]) -> str | None:
    """lstat the host's entry and each parent: a link, FIFO or device is never read."""
    for i in range(1, len(rel.parts)):
        parent = "/".join(rel.parts[:i])
        if parent in checked:
            continue
        st = await transport.stat(f"{remote_dir}/{parent}")
        if st is None or st.kind != "dir":
            return f"its parent {parent} is {'missing' if st is None else 'a ' + st.kind} on the host"
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


async def _fetch(transport: Transport, remote: str, dest: Path, entry: dict[str, Any],
                 progress: _Progress) -> None:
    size, expected = int(entry["size"]), entry["sha256"]
    if dest.exists() and dest.stat().st_size == size and _sha256(dest) == expected:
        progress.skip(size)  # pulled completely by an earlier attempt
        return
    part = dest.parent / f".{dest.name}{PART}"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    with os.fdopen(fd, "r+b") as fh:
        have = os.fstat(fh.fileno()).st_size
        offset = have if have < size else 0
        progress.skip(offset)
        for attempt in (1, 2):
            await transport.download_to(remote, fh, offset, progress=progress.add)
            fh.flush()
            digest = _sha256(part)
            if digest == expected:
                break
            if attempt == 1 and offset > 0:
                offset = 0  # the resumed prefix came from another version: start over once
                continue
            fh.close()
            part.unlink(missing_ok=True)
            raise IntegrityError(f"{transport.name}: result {remote} failed its checksum after "
                                 f"transfer (expected {expected[:12]}…, got {digest[:12]}…)",
                                 hint="the file changed on the host or was damaged; pull again")
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
            self.emit(PhaseProgress(self.run_id, phase="pull", done=self.done, total=self.total,
                                    detail=self.label))


async def fetch_evidence(ctx: RunContext, side: Side, run_dir: str) -> list[str]:
    """Copy the harness's observations and the memory samples next to the local log."""
    binding = ctx.host_for(side)
    fetched = []
    for remote, name in ((f"{run_dir}/status/{side.label}.obs.json", f"{side.label}.obs.json"),
                         (f"{run_dir}/logs/{side.label}.metrics.jsonl",
                          f"{side.label}.metrics.jsonl"),
                         (f"{run_dir}/logs/{side.label}.rss.jsonl", f"{side.label}.rss.jsonl")):
        st = await binding.transport.stat(remote)
        if st is None or st.kind != "file":  # a FIFO or a link there is never read
            continue
        dest = ctx.out_dir / "logs" / name
        await binding.transport.get(remote, str(dest))
        fetched.append(name)
    return fetched
