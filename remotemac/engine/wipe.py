"""Wipe a run's data on the host, shred its local data key, schedule the dead-man wipe.

What goes: the run's tmux sessions and processes, the plaintext (RAM store
detached), the ciphertext, caches, tmp, and the outputs once they were pulled and
verified (before the pull they stay, listed as remaining with that reason). The
logs, status and project stay until ``cleanup`` (small, and they let
``status``/``logs`` still answer). Destroying the local data key makes any copy
of the ciphertext left anywhere unreadable. Then the agent lists what remains of
the run on the host, and that goes into acceptance.json.

The host side is wipeops.wipe_run_data, the very function the dead-man wipe
runs on the host at ``wipe_deadline`` (scheduled here by :func:`schedule_deadman`).
"""

from __future__ import annotations

import asyncio
import time

from remotemac.agent.protocol import JsonObject, Op
from remotemac.engine.agentanswers import WipeAnswer
from remotemac.engine.context import HostBinding, RunContext
from remotemac.engine.phaseresults import SyncResult, WipeResult
from remotemac.errors import HostError, RemotemacError
from remotemac.phases import Phase

WIPED_SUBDIRS = ("data", "tmp", "cache", "out")
KEPT_SUBDIRS = ["project", "logs", "status"]


def _pulled(ctx: RunContext) -> bool:
    """Outputs are deletable once the pull phase verified them."""
    return Phase.PULL in ctx.results


def left_on_host(ctx: RunContext, key: str, binding: HostBinding, pulled: bool) -> list[str]:
    """What this run still has on a host whose wipe could not run, from the journal."""
    left = [f"{binding.run_dir}/{sub}" for sub in WIPED_SUBDIRS]
    left.append(f"{binding.run_dir} (project, logs, status)")
    synced = ctx.result(Phase.SYNC) or SyncResult()
    sync, ram = synced.host(key), synced.ram(key)
    if ram.path and ram.kind != "tmp":
        left.append(
            f"RAM store {ram.path}" + (f" on {ram.device}" if ram.device else "") + " (plaintext)"
        )
    deadman = sync.deadman
    if deadman is not None and deadman.spec:
        left.append(
            f"dead-man wipe {deadman.label or deadman.pid or ''} ({deadman.spec}), still scheduled"
        )
    left += [f"tmux session {s.session(ctx.run_id)}" for s in ctx.sides if s.host_key == key]
    return left


async def wipe_run(ctx: RunContext) -> WipeResult:
    """Wipe every host of the run, then shred the local data key: always, even when a
    host's wipe cannot run (unreachable, refused), so whatever ciphertext is left there
    is unreadable; the answer then lists exactly what is left on that host."""
    removed: list[str] = []
    remaining: list[str] = []
    errors: list[str] = []
    verified = True
    pulled = _pulled(ctx)
    sync = ctx.result(Phase.SYNC) or SyncResult()
    unreachable = ctx.unreachable
    for key, binding in ctx.hosts.items():
        if not binding.run_dir:
            continue
        name = binding.transport.name
        sessions = [s.session(ctx.run_id) for s in ctx.sides if s.host_key == key]
        ram = sync.host(key).ram
        try:
            if unreachable.get(key):
                raise HostError(unreachable[key])
            answer = await binding.agent.ask(
                Op.WIPE_RUN_DATA,
                {
                    "root": binding.root,
                    "run_id": ctx.run_id,
                    "sessions": sessions,
                    "keep": KEPT_SUBDIRS,
                    "ram": ram.to_json() if ram is not None else None,
                    "wipe_outputs": pulled,
                    "cancel_deadman": True,
                },
                WipeAnswer,
            )
        except (RemotemacError, OSError, asyncio.TimeoutError) as exc:
            line = exc.line() if isinstance(exc, RemotemacError) else f"{type(exc).__name__}: {exc}"
            left = left_on_host(ctx, key, binding, pulled)
            errors.append(f"{name} ({line}); left on {name}: {', '.join(left)}")
            remaining += [f"{name}:{p} (wipe could not run)" for p in left]
            verified = False
            continue
        ctx.ledger.append_steps(name, "wipe_run_data", answer.steps)
        removed += [f"{name}:{p}" for p in answer.removed]
        remaining += [f"{name}:{p}" for p in answer.remaining]
        verified = verified and bool(answer.verified)
        if ram is not None and ram.path:
            ctx.journal.record_removed(name, "ramstore", ram.path)
        for item in answer.removed:
            if item.startswith("deadman:"):
                job = sync.host(key).deadman
                if job is not None and job.spec:
                    ctx.journal.record_removed(name, "deadman", job.spec)
        # an independent look through the transport, not only the agent's word; the
        # lstats in flight at once (one after another they waited four round trips)
        looked = [sub for sub in WIPED_SUBDIRS if sub != "out" or pulled]
        found = await asyncio.gather(
            *(binding.transport.stat(f"{binding.run_dir}/{sub}") for sub in looked)
        )
        for sub, st in zip(looked, found, strict=True):
            if st is not None:
                remaining.append(f"{name}:{binding.run_dir}/{sub} (still there)")
                verified = False
    return _shred_and_sum_up(ctx, removed, remaining, errors, verified, pulled)


def _shred_and_sum_up(
    ctx: RunContext,
    removed: list[str],
    remaining: list[str],
    errors: list[str],
    verified: bool,
    pulled: bool,
) -> WipeResult:
    """Shred the local data key (whatever the hosts' wipes did), then the wipe's result:
    what went, what is left, and for a host the wipe could not reach, what to run."""
    from remotemac.data.keys import destroy_data_key, key_path

    key_destroyed = destroy_data_key(ctx.home, ctx.run_id)
    if key_destroyed:
        removed.append(f"local:data key of {ctx.run_id} (crypto-shredded)")
    if key_path(ctx.home, ctx.run_id).exists():
        remaining.append(f"local:{key_path(ctx.home, ctx.run_id)} (data key still there)")
        verified = False
    summary = wipe_summary(removed, remaining, verified)
    result = WipeResult(
        done=not errors,
        verified=verified,
        removed=removed,
        remaining=remaining,
        key_destroyed=key_destroyed,
        outputs_wiped=pulled,
        summary=summary,
    )
    if errors:
        shred = (
            "the local data key was crypto-shredded, so the ciphertext left there can "
            "no longer be decrypted"
            if key_destroyed or not key_path(ctx.home, ctx.run_id).exists()
            else "the local data key is still there"
        )
        result.error = (
            f"wipe could not run on {'; '.join(errors)}; {shred}; run "
            f"`remotemac wipe {ctx.run_id}` again, or `remotemac cleanup HOST`, "
            "once the host answers"
        )
    return result


async def schedule_deadman(
    ctx: RunContext, binding: HostBinding, launched_at: float | None = None
) -> JsonObject | None:
    """Ask the host to wipe this run's data at ``wipe_deadline`` on its own.

    Called before the dataset is sent, so no byte of data reaches the host
    without its dead-man. Returns the job (method, pid or label, deadline) or
    None when the playbook has no deadline.
    """
    launched = time.time() if launched_at is None else launched_at
    deadline = ctx.playbook.wipe_deadline_at(launched)
    if deadline is None or binding.key != "remote" or not binding.run_dir:
        return None
    sessions = [s.session(ctx.run_id) for s in ctx.sides if s.host_key == binding.key]
    job = await binding.agent.call(
        Op.DEADMAN_SCHEDULE,
        {
            "root": binding.root,
            "run_id": ctx.run_id,
            "deadline": deadline,
            "sessions": sessions,
        },
    )
    ctx.ledger.append_steps(binding.transport.name, "deadman_schedule", job.pop("steps", None))
    ctx.journal.record_created(binding.transport.name, "deadman", job["spec"], ctx.run_id)
    return job


#: what the agent says of a run dir's logs/, project/ and status/: kept on purpose
KEPT = "(kept until cleanup;"


def wipe_summary(removed: list[str], remaining: list[str], verified: bool) -> str:
    """``6 removed, 3 kept until cleanup (logs, project, status)``: what is kept by design
    is not counted with what is left over ("4 remaining" read as data left behind)."""
    kept = [r for r in remaining if KEPT in r]
    left = [r for r in remaining if KEPT not in r]
    parts = [f"{len(removed)} removed"]
    if kept:
        names = ", ".join(r.split(KEPT, 1)[0].strip().rstrip("/").rsplit("/", 1)[-1] for r in kept)
        parts.append(f"{len(kept)} kept until cleanup ({names})")
    if left or not kept:
        parts.append(f"{len(left)} remaining")
    return ", ".join(parts) + ("" if verified else " (not verified)")
