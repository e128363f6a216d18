"""Wipe a run's temporary data on the host, and shred its local data key.

What goes: the plaintext (RAM store), the ciphertext, caches, tmp, and outputs
already pulled and verified. The logs, status and project stay until ``cleanup``
(they are small and let ``status``/``logs`` still answer). Destroying the local
data key makes any copy of the ciphertext left anywhere unreadable.
"""

from __future__ import annotations

from typing import Any

from remotemac.engine.context import RunContext

WIPED_SUBDIRS = ("data", "tmp", "cache", "out")


async def wipe_run(ctx: RunContext) -> dict[str, Any]:
    removed: list[str] = []
    remaining: list[str] = []
    sync = ctx.results.get("sync", {}).get("hosts", {})
    for key, binding in ctx.hosts.items():
        if not binding.run_dir:
            continue
        sessions = [s.session(ctx.run_id) for s in ctx.sides if s.host_key == key]
        ram = (sync.get(key) or {}).get("ram")
        answer = await binding.agent.call("wipe_run", {
            "root": binding.root, "run_id": ctx.run_id, "sessions": sessions,
            "keep": ["project", "logs", "status"], "ram": ram,
        })
        removed += [f"{binding.transport.name}:{p}" for p in answer["removed"]]
        remaining += [f"{binding.transport.name}:{p}" for p in answer["remaining"]]
        if ram and ram.get("path"):
            ctx.journal.record_removed(binding.transport.name, "ramstore", ram["path"])
        for sub in WIPED_SUBDIRS:
            stat = await binding.transport.stat(f"{binding.run_dir}/{sub}")
            if stat is not None:
                remaining.append(f"{binding.transport.name}:{binding.run_dir}/{sub}")
    key_destroyed = False
    try:
        from remotemac.data.keys import destroy_data_key

        key_destroyed = destroy_data_key(ctx.home, ctx.run_id)
    except ImportError:
        pass
    if key_destroyed:
        removed.append(f"local:data key of {ctx.run_id} (crypto-shredded)")
    verified = not any(r.rsplit("/", 1)[-1] in WIPED_SUBDIRS for r in remaining)
    return {"done": True, "verified": verified, "removed": removed, "remaining": remaining,
            "summary": f"{len(removed)} removed, {len(remaining)} remaining"}
