"""The drill passes: after the pull, when the two divergence traces name a module call
(the first NaN's, else the first divergence's), run that call alone on each side under
an operator trace (agent/opdrill.py) and pull the op traces beside the traces.

Why a second pass and not the first: which call to drill into is known only once both
sides' traces are compared, on the laptop. Each pass is the side's own job again (its
command, its interpreter, its environment), launched as ``<label>.drill`` so none of
the job's status, log or observation files is touched; the process ends at the call.
The reference's pass runs first and saves the call's input and weights as plain
tensors under the run's ``out/.trace/`` (wiped with the run); the target's loads them
(copied through the laptop when the sides are on two hosts).

A drill that cannot run is a warning, never a failed run: the record then says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import secrets
import time
from pathlib import Path

from remotemac.agent.protocol import FINAL_STATES, JsonObject, LaunchRequest, Op, StatusRequest
from remotemac.engine.context import RunContext, Side
from remotemac.errors import HostError, RemotemacError
from remotemac.events import Warning
from remotemac.phases import Phase
from remotemac.transport.base import Transport

#: the label suffix of a drill pass's job (its status, log and observation files)
SUFFIX = ".drill"
#: how often the laptop asks whether a drill pass ended
POLL_S = 1.0
#: a drill pass runs the job up to one call of its first steps: this is generous
DEFAULT_TIMEOUT_S = 3600.0
#: the most an op trace may be (a summary line per aten op of one module call)
MAX_OP_TRACE = 256 << 20
#: how long a failed copy waits to remove its half-copied file from the target's host
#: (a link that is gone leaves it to the run's wipe: it is under the run's directory)
REMOVE_S = 15.0


async def drill_down(ctx: RunContext) -> None:
    """The drill passes when the pulled traces name a forward call to drill into (the
    pipeline's record step, before the record: record.py reads the op traces); one
    that cannot run is a warning and the record says so."""
    from remotemac.acceptance.divergence import divergence_for, drill_at
    from remotemac.engine.record import trace_tol

    ref, tgt = ctx.side("reference"), ctx.side("target")
    if ref is None or tgt is None:
        return
    logs = ctx.out_dir / "logs"
    found = divergence_for(
        logs / f"{ref.label}.trace.jsonl", logs / f"{tgt.label}.trace.jsonl", trace_tol(ctx)
    )
    at = drill_at(found) if found.traced else None
    if at is None:
        return
    if ctx.result(Phase.WIPE) is not None:  # (a failed pull's wipe, then attach)
        warn(ctx, "the run's data on the host was wiped before the record")
        return
    try:
        why = await drill_passes(ctx, at.to_json())
    except RemotemacError as exc:
        why = exc.line()
    except Exception as exc:  # noqa: BLE001 - a drill that cannot run never fails the run
        why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        warn(ctx, why)


def drill_input(run_dir: str) -> str:
    """Where the reference's pass saves the call's tensors (beside the traces)."""
    return f"{run_dir}/out/.trace/drill-input.pt"


def op_trace_path(run_dir: str, side: Side) -> str:
    return f"{run_dir}/out/.trace/{side.label}.drill.jsonl"


async def drill_passes(ctx: RunContext, at: JsonObject) -> str | None:
    """Run the reference's drill pass, then the target's, and pull both op traces
    into ``logs/``; returns why not when one could not run (None: both ran)."""
    ref, tgt = ctx.side("reference"), ctx.side("target")
    if ref is None or tgt is None:
        return "one side only"
    prov = ctx.provision().hosts
    ref_dir, tgt_dir = prov[ref.host_key].run_dir, prov[tgt.host_key].run_dir
    saved = drill_input(ref_dir)
    why = await _one(ctx, ref, {**at, "save": saved})
    if why is not None:
        return why
    if tgt.host_key != ref.host_key:
        expect = _saved_sha256(ctx, ref)
        saved = await _copy_between(ctx, ref, saved, tgt, drill_input(tgt_dir), expect)
    return await _one(ctx, tgt, {**at, "input": saved})


def _saved_sha256(ctx: RunContext, side: Side) -> str | None:
    """The sha256 of the input the reference's pass saved, from its pulled op trace."""
    from remotemac.acceptance.drill import DrillError, load_drill

    try:
        header, _ = load_drill(ctx.out_dir / "logs" / f"{side.label}.drill.jsonl")
    except (OSError, DrillError):
        return None
    digest = header.get("input_sha256")
    return digest if isinstance(digest, str) else None


async def _one(ctx: RunContext, side: Side, spec: JsonObject) -> str | None:
    from remotemac.engine.jobs import job_request, launch

    prov = ctx.provision()
    host = prov.hosts[side.host_key]
    sync = ctx.result(Phase.SYNC)
    assert sync is not None  # a drill pass runs after the pull
    request = job_request(
        ctx, side, prov.device(side.role), host, sync.hosts[side.host_key].data_dir
    )
    run_dir, label = host.run_dir, side.label + SUFFIX
    out = op_trace_path(run_dir, side)
    observe = dict(request.observe or {})
    observe.pop("trace", None)
    observe.update(
        {
            "dir": f"{run_dir}/status/{label}.observe",
            "obs_path": f"{run_dir}/status/{label}.obs.json",
            "drill": {**spec, "out": out},
        }
    )
    drill = dataclasses.replace(
        request,
        device=label,
        session=request.session + "-drill",
        metrics_path=f"{run_dir}/logs/{label}.rss.jsonl",
        convert=None,
        observe=observe,
        next=None,
    )
    dest = ctx.out_dir / "logs" / f"{side.label}.drill.jsonl"
    dest.unlink(missing_ok=True)  # an earlier attempt's op trace is never taken for this one
    await launch(ctx, side, drill)
    state = await _wait(ctx, side, drill)
    binding = ctx.host_for(side)
    if state not in FINAL_STATES:
        await _stop(ctx, side, drill)
        return f"the {side.role}'s drill pass ended {state}"
    st = await binding.transport.stat(out)
    if st is None or st.kind != "file":
        return f"the {side.role}'s drill pass wrote no op trace (it ended {state})"
    if st.size > MAX_OP_TRACE:
        return f"the {side.role}'s op trace is {st.size} bytes (more than {MAX_OP_TRACE})"
    with open(dest, "wb") as fh:
        await binding.transport.download_to(out, fh, 0, limit=st.size)
    return None


async def _stop(ctx: RunContext, side: Side, request: LaunchRequest) -> None:
    """A pass that did not end in time is stopped: nothing runs on unattended."""
    from remotemac.engine.agentanswers import StopAnswer

    stop = {"run_dir": request.run_dir, "device": request.device, "session": request.session}
    try:
        await ctx.host_for(side).agent.ask(Op.STOP, stop, StopAnswer)
    except RemotemacError as exc:
        warn(ctx, f"the {side.role}'s drill pass could not be stopped: {exc.line()}")


async def _wait(ctx: RunContext, side: Side, request: LaunchRequest) -> str:
    """Ask the host until the pass's job is in a final state (or lost, or too long)."""
    binding = ctx.host_for(side)
    limit = float(request.timeout or DEFAULT_TIMEOUT_S) + 60.0
    started = time.monotonic()
    asked = StatusRequest(run_dir=request.run_dir, device=request.device, session=request.session)
    while True:
        answer = await binding.agent.call(Op.STATUS, asked.to_json())
        state = str(answer.get("state"))
        if state in FINAL_STATES or state in ("lost",):
            return state
        if time.monotonic() - started > limit:
            return "still running after its timeout"
        await asyncio.sleep(POLL_S)


async def _copy_between(
    ctx: RunContext, src: Side, remote: str, dst: Side, to: str, expect: str | None = None
) -> str:
    """The reference's saved input, from its host to the target's, through the laptop:
    bytes only (never loaded here), staged under ``--out`` (nothing is written outside
    it) and removed at once: it holds the model's activations.

    Checked on the way (a drill on other bytes than the reference's would name ops that
    are not the target's doing): the staged file has the size the reference's host
    listed and, when the reference's op trace gave one, its ``input_sha256``. On the
    target's host it lands under a temporary name, renamed once whole, so a copy cut
    half way (the link, a full disk) never leaves a file the target's pass would load;
    the temporary file is removed then (or, the link gone, by the run's wipe: it is
    under the run's directory)."""
    source, target = ctx.host_for(src).transport, ctx.host_for(dst).transport
    st = await source.stat(remote)
    if st is None or st.kind != "file":
        raise HostError(f"the reference's drill input {remote} is not a file")
    cap = ctx.playbook.outputs.max_bytes
    if st.size > cap:
        raise HostError(f"the reference's drill input is {st.size} bytes (outputs.max_bytes)")
    local = ctx.out_dir / ".drill-input.part"
    part = f"{to}.part-{secrets.token_hex(4)}"
    try:
        with open(local, "wb") as fh:
            await source.download_to(remote, fh, 0, limit=st.size)
        got, digest = await asyncio.to_thread(_size_and_sha256, local)
        if got != st.size:
            raise HostError(
                f"the reference's drill input came {got} bytes of {st.size} to the laptop"
            )
        if expect is not None and digest != expect:
            raise HostError(
                f"the reference's drill input came with sha256 {digest[:12]}, "
                f"not the {expect[:12]} its op trace names"
            )
        try:
            await target.put(str(local), part)
            landed = await target.stat(part)
            if landed is None or landed.size != st.size:
                size = None if landed is None else landed.size
                raise HostError(
                    f"the reference's drill input landed as {size} bytes of {st.size} "
                    f"on the {dst.role}'s host"
                )
            await target.exec(["mv", "-f", part, to], check=True)
        except BaseException:
            await _remove(target, part)
            raise
    finally:
        local.unlink(missing_ok=True)
    return to


def _size_and_sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


async def _remove(transport: Transport, path: str) -> None:
    """A half-copied input off the host, if the link lets it soon (else the wipe)."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(transport.exec(["rm", "-f", "--", path]), REMOVE_S)


def warn(ctx: RunContext, why: str) -> None:
    ctx.emit(Warning(ctx.run_id, message=f"drill-down not run: {why}", code="drill-skip"))
