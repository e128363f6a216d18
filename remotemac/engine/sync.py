"""Sync: choose the dataset slice, checksum it, encrypt it, send it, verify it on the host.

The slice travels and rests encrypted (unless the playbook says the data is
public and ``encrypt: false``). The data key reaches the host agent on the
channel's stdin only, and the agent decrypts into RAM-backed storage.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from remotemac.engine.context import HostBinding, RunContext
from remotemac.errors import BadInput, IntegrityError
from remotemac.events import PhaseProgress


def choose_slice(ctx: RunContext):
    from remotemac.data.slice import select_slice

    data = ctx.playbook.data
    root = ctx.playbook.data_dir()
    if data is None or root is None:
        return None
    if not root.is_dir():
        raise BadInput(f"data.path: {root} is not a directory")
    return select_slice(
        root, include=list(data.include), exclude=list(data.exclude), max_bytes=data.max_bytes,
        sample_files=data.sample.files if data.sample else None,
        seed=data.sample.seed if data.sample else 0,
        files=list(data.files) if data.files is not None else None,
    )


async def sync_host(ctx: RunContext, binding: HostBinding, provisioned: dict[str, Any]) -> dict[str, Any]:
    from remotemac.data.manifest import build_manifest

    data = ctx.playbook.data
    run_dir = provisioned["run_dir"]
    if data is None:
        return {"data_dir": f"{run_dir}/data", "files": 0, "bytes": 0, "encrypted": False,
                "revision": None}
    selection = choose_slice(ctx)
    root = ctx.playbook.data_dir()
    assert root is not None and selection is not None
    paths = [f.path for f in selection.files]
    manifest = build_manifest(root, paths, cache=ctx.journal)
    (ctx.out_dir / "manifest.json").write_text(manifest.to_json(), encoding="utf-8")
    total = sum(e.size for e in manifest.entries)
    sent = 0
    encrypted = bool(data.encrypt)
    key = None
    if encrypted:
        from remotemac.agent.streamcrypt import encrypt_file
        from remotemac.data.keys import load_data_key, new_data_key

        try:
            key = load_data_key(ctx.home, ctx.run_id)
        except IntegrityError:
            key = new_data_key(ctx.home, ctx.run_id)
    transport = binding.transport
    remote_data = f"{run_dir}/data"
    made_dirs: set[str] = set()
    for entry in manifest.entries:
        parent = f"{remote_data}/{entry.path}".rsplit("/", 1)[0]
        if parent not in made_dirs:
            await transport.makedirs(parent)
            made_dirs.add(parent)
        local = root / entry.path
        if encrypted:
            with tempfile.TemporaryDirectory() as tmp:
                enc = Path(tmp) / "blob"
                encrypt_file(key, entry.path, str(local), str(enc))
                await transport.put(str(enc), f"{remote_data}/{entry.path}.rmenc")
        else:
            await transport.put(str(local), f"{remote_data}/{entry.path}")
        sent += entry.size
        ctx.emit(PhaseProgress(ctx.run_id, phase="sync", done=sent, total=total,
                               detail=entry.path))
    request: dict[str, Any] = {
        "run_dir": run_dir, "run_id": ctx.run_id, "src": remote_data,
        "manifest": [{"path": e.path, "size": e.size, "sha256": e.sha256} for e in manifest.entries],
        "encrypted": encrypted, "ram_bytes": max(total * 2, 64 << 20),
    }
    if key is not None:
        request["key_hex"] = key.hex()
    # decryption needs `cryptography`: the workload's venv may have it, macOS's python3 has not
    answer = await binding.agent.call("prepare_data", request, timeout=3600,
                                      python=provisioned["venv_python"])
    if answer.get("mismatches"):
        bad = answer["mismatches"][0]
        raise IntegrityError(f"{transport.name}: dataset file {bad['path']} failed verification "
                             f"on the host ({bad['why']})")
    if answer.get("ram", {}).get("kind") in ("shm", "ramdisk"):
        ctx.journal.record_created(transport.name, "ramstore", answer["ram"]["path"], ctx.run_id)
    return {
        "data_dir": answer["data_dir"], "files": len(manifest.entries), "bytes": total,
        "encrypted": encrypted, "revision": manifest.root_digest, "ram": answer.get("ram"),
        "selection": [{"path": f.path, "size": f.size, "reason": f.reason} for f in selection.files],
    }
