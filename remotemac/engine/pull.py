"""Pull results from the host, verified, and never outside ``--out``.

The agent lists the output directory with sizes and sha256. Every name is
validated before anything is written (no absolute paths, no ``..``, no links,
no device files); each file lands under a temporary name and is renamed into
place only when its checksum matches, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath
from typing import Any

from remotemac.engine.context import RunContext, Side
from remotemac.errors import IntegrityError, UnsafePath
from remotemac.events import PhaseProgress


def safe_relpath(name: str) -> PurePosixPath:
    """A host-sent name as a relative path, or UnsafePath."""
    if not name or "\x00" in name or "\\" in name:
        raise UnsafePath(f"refusing result name {name!r}: empty, NUL or backslash")
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts or "//" in name or name.startswith("/"):
        raise UnsafePath(f"refusing result name {name!r}: absolute or climbs with '..'")
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
    listing = await binding.agent.call("list_outputs", {"dir": remote_dir})
    dest_root = (ctx.out_dir / "results" / side.label).resolve()
    dest_root.mkdir(parents=True, exist_ok=True)
    files, skipped = [], []
    total = sum(e["size"] for e in listing["entries"] if e["kind"] == "file")
    done = 0
    for entry in listing["entries"]:
        rel = safe_relpath(entry["path"])
        if entry["kind"] == "dir":
            continue
        if entry["kind"] != "file":
            skipped.append({"path": entry["path"], "why": f"{entry['kind']} not pulled"})
            continue
        dest = dest_root.joinpath(*rel.parts)
        # the parents must be real directories inside dest_root: no link can lead out
        parent = dest.parent
        parent.mkdir(parents=True, exist_ok=True)
        real_parent = Path(os.path.realpath(parent))
        if real_parent != dest_root and dest_root not in real_parent.parents:
            raise UnsafePath(f"refusing result {entry['path']!r}: would land outside {dest_root}")
        tmp = parent / f".{dest.name}.part"
        if tmp.is_symlink() or dest.is_symlink():
            raise UnsafePath(f"refusing result {entry['path']!r}: a link is in the way locally")
        await binding.transport.get(f"{remote_dir}/{entry['path']}", str(tmp))
        digest = _sha256(tmp)
        if digest != entry["sha256"] or tmp.stat().st_size != entry["size"]:
            tmp.unlink(missing_ok=True)
            raise IntegrityError(f"{binding.transport.name}: result {entry['path']} failed its "
                                 f"checksum after transfer (expected {entry['sha256'][:12]}…, "
                                 f"got {digest[:12]}…)")
        os.replace(tmp, dest)
        done += entry["size"]
        files.append({"path": str(rel), "size": entry["size"], "sha256": digest})
        ctx.emit(PhaseProgress(ctx.run_id, phase="pull", done=done, total=total,
                               detail=f"{side.label}/{rel}"))
    evidence = await fetch_evidence(ctx, side, run_dir)
    return {"dir": str(dest_root), "files": files, "skipped": skipped, "evidence": evidence}


async def fetch_evidence(ctx: RunContext, side: Side, run_dir: str) -> list[str]:
    """Copy the harness's observations and the memory samples next to the local log."""
    binding = ctx.host_for(side)
    fetched = []
    for remote, name in ((f"{run_dir}/status/{side.label}.obs.json", f"{side.label}.obs.json"),
                         (f"{run_dir}/logs/{side.label}.metrics.jsonl",
                          f"{side.label}.metrics.jsonl"),
                         (f"{run_dir}/logs/{side.label}.rss.jsonl", f"{side.label}.rss.jsonl")):
        if await binding.transport.stat(remote) is None:
            continue
        dest = ctx.out_dir / "logs" / name
        await binding.transport.get(remote, str(dest))
        fetched.append(name)
    return fetched
