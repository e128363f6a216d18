"""The pipeline: provision → sync → launch/follow each device → pull → compare → record → wipe.

Each phase's result is saved in the journal when it finishes, so ``attach``
(after Ctrl-C, a crash or a laptop reboot) skips what is done and picks up
where the run stopped. Phases only talk to hosts through the Transport and the
agent, and only talk to the user through events.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn

from remotemac.agent.protocol import JsonObject, LaunchAnswer, LaunchRequest
from remotemac.engine.agentclient import DEFAULT_AGENT_PYTHON, AgentClient
from remotemac.engine.context import (
    HostBinding,
    RunContext,
    RunOptions,
    Side,
    assign_labels,
    host_for_key,
    make_sides,
    specialize,
)
from remotemac.engine.failurehints import (
    launch_on_a_full_disk,
    say_how_to_go_on_after_a_full_disk,
    say_what_is_kept,
)
from remotemac.engine.hosts import open_transport
from remotemac.engine.ledger import Ledger
from remotemac.engine.phaseresults import (
    NOT_LAUNCHED,
    Access,
    CompareResult,
    DeadmanJob,
    Fingerprint,
    FollowResult,
    LaunchResult,
    PhaseResult,
    ProvisionResult,
    PulledSide,
    PullResult,
    RecordResult,
    SyncResult,
    WipeResult,
    as_result,
)
from remotemac.engine.pool import TransportPool
from remotemac.engine.runs import remove_made_dirs
from remotemac.errors import (
    EXIT_ACCEPTED,
    EXIT_INTERRUPTED,
    EXIT_REJECTED,
    BadInput,
    HostError,
    JobLost,
    RemotemacError,
    TransientHostError,
)
from remotemac.events import EventBus, PhaseFinished, PhaseStarted, RunFinished
from remotemac.journal import Journal
from remotemac.phases import Phase, PhaseKey, follow_key, launch_key
from remotemac.playbook import Playbook
from remotemac.transport.options import SSHOptions


def phase_keys(ctx: RunContext) -> list[PhaseKey]:
    """Every phase of this run, in order (launch and follow once per side)."""
    keys = [PhaseKey(Phase.PROVISION), PhaseKey(Phase.SYNC)]
    for side in ctx.sides:
        keys += [launch_key(side.role), follow_key(side.role)]
    return keys + [PhaseKey(p) for p in (Phase.PULL, Phase.COMPARE, Phase.RECORD, Phase.WIPE)]


def build_context(
    *,
    run_id: str,
    playbook: Playbook,
    journal: Journal,
    bus: EventBus,
    home: Path,
    out_dir: Path,
    options: RunOptions,
    ssh: SSHOptions | None = None,
    host: str | None = None,
    matrix: dict[str, object] | None = None,
    pool: TransportPool | None = None,
) -> RunContext:
    """``host``/``matrix``: one fleet run's host and variant; ``pool``: shared connections."""
    if host is not None or matrix is not None:
        playbook = specialize(playbook, host=host, matrix=matrix)
    ledger = Ledger(out_dir / "ledger.jsonl")
    ssh = (ssh or SSHOptions()).for_playbook(playbook.connection.reconnect_deadline)
    sides = make_sides(playbook)
    target = next((s for s in sides if s.role == "target"), None)
    if playbook.reproduce and target is not None:
        # the target once more, in a fresh process: launch:reproduce/follow:reproduce
        sides.append(Side("reproduce", target.device, f"{target.label}-reproduce", target.host_key))
    hosts: dict[str, HostBinding] = {}
    for key in sorted({s.host_key for s in sides}):
        spec = host_for_key(playbook, key)
        transport = (
            pool.lease(spec, emit=bus.emit, run_id=run_id)
            if pool is not None
            else open_transport(spec, home, ssh, emit=bus.emit, run_id=run_id)
        )
        # agent.python (and $REMOTEMAC_AGENT_PYTHON) name the target host's interpreter,
        # not the laptop's (a reference run with on: local)
        python = (
            DEFAULT_AGENT_PYTHON
            if key == "local" and playbook.host != "local"
            else playbook.agent.python
        )
        hosts[key] = HostBinding(key, transport, AgentClient(transport, "", ledger, python=python))
    ctx = RunContext(
        run_id=run_id,
        playbook=playbook,
        journal=journal,
        bus=bus,
        home=home,
        out_dir=out_dir,
        options=options,
        hosts=hosts,
        sides=sides,
        ledger=ledger,
        in_fleet=pool is not None,
    )
    # the engine counts link drops itself, so every front end's record has them
    from remotemac.engine.jobs import count_connection_events

    ctx.link_tally = count_connection_events(bus)
    from remotemac.engine.cpuusage import laptop_cpu_s

    ctx.cpu_start = laptop_cpu_s()
    return ctx


async def run_pipeline(ctx: RunContext) -> int:
    """Run (or resume) every phase; returns the exit code of docs/contract.md."""
    owner = ctx.journal.claim_run(ctx.run_id)
    if owner is not None:
        raise BadInput(
            f"run {ctx.run_id} is already being driven by process {owner} on this "
            "machine; stop it first or wait for it to finish"
        )
    try:
        return await _run_pipeline(ctx)
    finally:
        ctx.journal.release_run(ctx.run_id)


def name_phase(exc: RemotemacError, phase: str) -> None:
    """Every error says which phase it happened in (once, however far it travels)."""
    if f"during {phase}" in exc.message:
        return
    if "(during " in exc.message:  # a sub-step named already: "(during sync, finish)"
        exc.message = exc.message.replace("(during ", f"(during {phase}, ", 1)
    else:
        exc.message = f"{exc.message} (during {phase})"
    exc.args = (exc.message,)


NOTHING_STARTED = "nothing was started (no run recorded, no output dir)"


def make_out_dir(out_dir: Path) -> list[Path]:
    """Create ``out_dir`` and its ``logs/``; the directories this call made, deepest first."""
    made = [p for p in (out_dir / "logs", out_dir, *out_dir.parents) if not p.exists()]
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    return made


def forget_unreached(ctx: RunContext, done: dict[str, dict], made: list[Path]) -> bool:
    """A new run whose host was never reached (a typo'd name, a port refused) leaves
    nothing: no journal row (it would be ``latest``, listed, offered as a host) and no
    output directory. A run resumed by ``attach``, or one of a fleet, keeps its row; so
    does a host that answered but refused (a changed key, a login): ``trust`` and retry."""
    if done or ctx.in_fleet:
        return False
    ctx.journal.forget_run(ctx.run_id)
    remove_made_dirs(made)  # the caller removes the dirs it made (the CLI's --out)
    return True


def reference_failed(ctx: RunContext) -> str | None:
    """Why the sides after the reference are not launched: the reference's job did not
    finish (a typo'd script, a timeout, a stop): a target result would be compared with
    nothing, and the rented hours would be spent on a meaningless run."""
    if ctx.side("reference") is None:
        return None
    follow = ctx.follow_result("reference")
    state = follow.state if follow else None
    if follow is None or state in (None, "finished", NOT_LAUNCHED):
        return None
    word = "failed" if state == "failed" else f"ended {state}"
    return f"the reference {word} (exit {follow.exit_code})"


def skip_side(ctx: RunContext, name: str, why: str) -> None:
    """Record ``name`` (launch/follow of a side after the reference) as not launched."""
    result = FollowResult.not_launched(why)
    ctx.journal.start_phase(ctx.run_id, name)
    ctx.finish_result(name, result)
    ctx.emit(PhaseFinished(ctx.run_id, phase=name, skipped=True, detail=result.summary))


def not_accepted_reason(ctx: RunContext) -> str:
    """The run's first stopping condition, or why it is incomplete: the last line says
    why, not only where the record is."""
    record = ctx.result(Phase.RECORD) or RecordResult()
    for cond in record.conditions:
        detail = str(cond.detail or cond.code or "")
        if detail.startswith("reference job ") and reference_failed(ctx):
            # "the reference failed (exit 2): python3: can't open file …"
            rest = detail.partition(": ")[2]
            detail = f"{reference_failed(ctx)}" + (f": {rest}" if rest else "")
        if detail:
            return detail if len(detail) <= 300 else detail[:297] + "..."
    return (ctx.result(Phase.COMPARE) or CompareResult()).summary


def phase_ok(key: PhaseKey, result: JsonObject | PhaseResult) -> bool:
    """Whether phase ``key`` is shown as passed: the result's own rule
    (:meth:`PhaseResult.ok`), for a result in its journal form too."""
    return as_result(key.name, result).ok()


def refuse_wiped_before_the_end(
    run_id: str, done: dict[str, dict], follows: list[str] | None = None
) -> None:
    """A run wiped (by hand, or after a failed pull) before its outputs were pulled cannot
    go on: its data, data key, job and outputs are gone from the host. Going on would
    sync the dataset again and, the wipe being "done", leave it there after the run.
    Once the pull is done, what is left (compare, record) works on the laptop's copy.

    A wipe that kept the outputs (after a failed pull: they were not verified here) is
    no end: when every job had ended (``follows`` all done), the run goes on from the
    pull, and the wipe is taken out of ``done`` so it runs again for the outputs."""
    from remotemac.engine.runs import outputs_kept_by_wipe

    wipe = done.get(Phase.WIPE.value)
    if wipe is None or WipeResult.from_row(wipe).done is False:
        return  # no wipe, or ``wipe: manual`` kept the data
    kept = outputs_kept_by_wipe(done)
    if Phase.PULL.value in done or (
        kept and follows is not None and all(f in done for f in follows)
    ):
        if kept:  # the wipe runs again at the end: for the outputs, verified here by then
            del done[Phase.WIPE.value]
        return
    raise BadInput(
        f"run {run_id} was wiped before it finished: its data, data key and job are "
        "gone from the host, so it cannot be attached",
        hint="start it again: remotemac run PLAYBOOK",
    )


def _names_before_any_byte(ctx: RunContext) -> None:
    """Refuse a slice or project whose names are one file on a Mac before the host is
    touched (remotemac.data.names): both are chosen again, unchanged, by their phases."""
    from remotemac.engine.projectfiles import project_upload
    from remotemac.engine.sync import choose_slice

    choose_slice(ctx)
    project_upload(ctx.playbook)


async def _run_pipeline(ctx: RunContext) -> int:
    done = done_phases(ctx)
    follows = [k.name for k in phase_keys(ctx) if k.phase is Phase.FOLLOW]
    refuse_wiped_before_the_end(ctx.run_id, done, follows)
    made = make_out_dir(ctx.out_dir)
    ctx.journal.set_run_state(ctx.run_id, "running")
    ctx.restore_results(done)
    ctx.carried_phases = list(done)
    current = "connect"
    try:
        if "sync" not in done and Phase.PROVISION not in done:
            _names_before_any_byte(ctx)
        from remotemac.engine.warmimports import warm_imports

        warm_imports()  # the later phases' modules, while the link is made
        await connect_hosts(ctx)
        for key in phase_keys(ctx):
            current = key.name
            if await _step(ctx, key, done):
                return 0  # --detach: the job was launched, attach follows it
    except JobLost as exc:
        return await _after_loss(ctx, exc, current)
    except (KeyboardInterrupt, asyncio.CancelledError):
        ctx.journal.set_run_state(ctx.run_id, "interrupted", exit_code=EXIT_INTERRUPTED)
        raise
    except TransientHostError as exc:
        _after_link_lost(ctx, exc, current, done, made)
    except Exception as exc:  # any exception, ours or not: the journal never says "running"
        await _after_failure(ctx, exc, current)
        raise
    finally:
        await close_hosts(ctx)
    return _finished(ctx)


async def _step(ctx: RunContext, key: PhaseKey, done: dict[str, dict]) -> bool:
    """One phase of the run: carried over when done, skipped when its side cannot run,
    else run and journalled; True when the run stops here (``--detach`` after a launch)."""
    name = key.name
    if name not in done and Phase.PROVISION in done and ctx.drift_checked is None:
        from remotemac.engine.drift import check_drift

        await check_drift(ctx, "re-attach")
    if name in done:
        restore_phase(ctx, key)
        if key.phase is Phase.PROVISION and not all(k.name in done for k in phase_keys(ctx)):
            for binding in ctx.hosts.values():
                await reinstall_agent(ctx, binding)
        ctx.emit(PhaseFinished(ctx.run_id, phase=name, skipped=True, detail="already done"))
        return False
    why_not = reference_failed(ctx) if key.role not in (None, "reference") else None
    if why_not is not None and key.phase in (Phase.LAUNCH, Phase.FOLLOW):
        skip_side(ctx, name, why_not)
        return False
    started = time.monotonic()
    result = await _journalled(ctx, key)
    if result.seconds is None:
        result.seconds = round(time.monotonic() - started, 3)
    ctx.finish_result(name, result)
    ctx.emit(
        PhaseFinished(
            ctx.run_id,
            phase=name,
            ok=result.ok(),
            detail=result.line,
        )
    )
    if ctx.options.detach and key.phase is Phase.LAUNCH:
        ctx.journal.set_run_state(ctx.run_id, "detached")
        ctx.emit(
            RunFinished(
                ctx.run_id,
                verdict="detached",
                exit_code=0,
                out_dir=str(ctx.out_dir),
                detail=f"remotemac attach {ctx.run_id}",
            )
        )
        return True
    return False


async def _journalled(ctx: RunContext, key: PhaseKey) -> PhaseResult:
    """Run the phase's step, started in the journal; a failure or a stop is journalled
    (and named after the phase) before it goes on up."""
    name = key.name
    ctx.emit(PhaseStarted(ctx.run_id, phase=name))
    ctx.journal.start_phase(ctx.run_id, name)
    try:
        return as_result(name, await _PHASES[key.phase](ctx, key))
    except (KeyboardInterrupt, asyncio.CancelledError):
        # Ctrl-C stops this process, not the phase's work on the host: the
        # phase is "interrupted" (attach goes on with it), never "failed"
        ctx.journal.finish_phase(
            ctx.run_id,
            name,
            {"summary": "stopped locally; the host goes on (remotemac attach)"},
            state="interrupted",
        )
        raise
    except BaseException as exc:
        if isinstance(exc, RemotemacError):
            name_phase(exc, name)
        ctx.journal.finish_phase(ctx.run_id, name, {"error": failure_line(exc)}, state="failed")
        if isinstance(exc, RemotemacError):
            ctx.emit(PhaseFinished(ctx.run_id, phase=name, ok=False, detail=exc.message))
        raise


async def _after_loss(ctx: RunContext, exc: JobLost, current: str) -> int:
    """The job vanished from the host: an incomplete record, the run ``lost``."""
    await _record_after_loss(ctx, exc)
    ctx.journal.set_run_state(
        ctx.run_id,
        "lost",
        verdict="incomplete",
        exit_code=exc.exit_code,
        phase=current,
        error=failure_line(exc),
    )
    ctx.emit(
        RunFinished(
            ctx.run_id,
            verdict="incomplete",
            exit_code=exc.exit_code,
            out_dir=str(ctx.out_dir),
            detail=exc.line(),
        )
    )
    return exc.exit_code


def _after_link_lost(
    ctx: RunContext,
    exc: TransientHostError,
    current: str,
    done: dict[str, dict],
    made: list[Path],
) -> NoReturn:
    """A link that stayed down: a host never reached fails the run (a new one is
    forgotten); past the reconnect deadline, the run is left ``detached`` to attach."""
    launched = any(str(name).startswith(Phase.LAUNCH.value) for name in ctx.results)
    if current == "connect" and not launched:
        # never reached (a host name that does not resolve, a port refused) and no
        # job launched: a failed run; nothing keeps running to attach to
        if forget_unreached(ctx, done, made):
            raise HostError(f"{exc.message}; {NOTHING_STARTED}", hint=exc.hint) from exc
        ctx.journal.set_run_state(
            ctx.run_id,
            "failed",
            exit_code=exc.exit_code,
            phase=current,
            error=failure_line(exc),
        )
        raise HostError(exc.message, hint=exc.hint) from exc
    # past the reconnect deadline: stop here, leave the job (and the run) to `attach`
    ctx.journal.set_run_state(ctx.run_id, "detached", exit_code=exc.exit_code)
    running = "the job keeps running on the host; " if launched else ""
    raise TransientHostError(
        exc.message,
        hint=f"{running}when the link is back, resume with: remotemac attach {ctx.run_id}",
    ) from exc


async def _after_failure(ctx: RunContext, exc: Exception, current: str) -> None:
    """A phase failed: the run is ``failed`` in the journal, and the run's data is
    wiped when the job had ended or the host's disk refused the launch."""
    code = exc.exit_code if isinstance(exc, RemotemacError) else EXIT_REJECTED
    error = failure_line(exc)
    if current in WIPE_AFTER_FAILURE:
        error += await _wipe_after_failure(ctx, current)
        say_what_is_kept(ctx, exc, current)
    elif launch_on_a_full_disk(ctx, exc, current):
        error += await _wipe_after_full_disk(ctx, exc, current)
    say_how_to_go_on_after_a_full_disk(ctx, exc)
    ctx.journal.set_run_state(ctx.run_id, "failed", exit_code=code, phase=current, error=error)


def _finished(ctx: RunContext) -> int:
    """Every phase ran: the record's verdict is the run's, and its exit code."""
    record = ctx.result(Phase.RECORD)
    verdict = (record.verdict if record else None) or "incomplete"
    code = EXIT_ACCEPTED if verdict == "accepted" else EXIT_REJECTED
    ctx.journal.set_run_state(ctx.run_id, "finished", verdict=verdict, exit_code=code)
    ctx.emit(
        RunFinished(
            ctx.run_id,
            verdict=verdict,
            exit_code=code,
            out_dir=str(ctx.out_dir),
            detail=str(ctx.out_dir / "acceptance.md"),
            reason="" if verdict == "accepted" else not_accepted_reason(ctx),
        )
    )
    return code


async def reinstall_agent(ctx: RunContext, binding: HostBinding) -> None:
    """The agent again, for a run that goes on: only while its run dir is still on the
    host. A run whose dir ``cleanup`` removed has nothing left there to go on with, and
    installing would re-create ``remote_root/agent/`` without the root's marker (the
    next cleanup then refused that root as "not made by remotemac", for ever)."""
    if binding.run_dir and await binding.transport.stat(binding.run_dir) is None:
        raise BadInput(
            f"run {ctx.run_id}: its dir {binding.run_dir} is gone from "
            f"{binding.transport.name} (cleaned up?): nothing is left there to go on with",
            hint="start it again: remotemac run PLAYBOOK; nothing was written on the host",
        )
    await binding.agent.install()


def _label_sides(ctx: RunContext, devices: dict[str, str]) -> None:
    """Labels by device; the reproduce run is the target's label + ``-reproduce``."""
    assign_labels(ctx.sides, devices)
    target, again = ctx.side("target"), ctx.side("reproduce")
    if target is not None and again is not None:
        again.label = f"{target.label}-reproduce"


def restore_phase(ctx: RunContext, phase: PhaseKey) -> None:
    """Bring back what a finished phase learnt (host paths) for the phases after it."""
    if phase.phase is Phase.PROVISION:
        prov = ctx.provision()
        _label_sides(ctx, prov.devices)
        for key, info in prov.hosts.items():
            binding = ctx.hosts[key]
            binding.root = info.root
            binding.agent.root = info.root
            binding.run_dir = info.run_dir
            binding.agent.root_id = info.root_id


# ---------------------------------------------------------------- phases


async def _provision(ctx: RunContext, _key: PhaseKey) -> ProvisionResult:
    from remotemac.engine.provision import provision_host, resolve_device
    from remotemac.engine.storage import check_space

    hosts = {}
    for key, binding in ctx.hosts.items():
        hosts[key] = await provision_host(
            ctx, binding, functools.partial(check_space, ctx, binding)
        )
    devices = {s.role: resolve_device(s.device, hosts[s.host_key].probe) for s in ctx.sides}
    _label_sides(ctx, devices)
    from remotemac.engine.provision import project_revision

    return ProvisionResult(
        hosts=hosts,
        devices=devices,
        project=project_revision(ctx.playbook.project_dir()).to_json(),
        summary=", ".join(f"{r}={d}" for r, d in devices.items()),
    )


async def _sync(ctx: RunContext, _key: PhaseKey) -> SyncResult:
    from remotemac.engine.sync import sync_host
    from remotemac.engine.wipe import schedule_deadman

    prov = ctx.provision().hosts
    # the dead-man wipe is scheduled before any data is sent (issue 6)
    deadman = {key: await schedule_deadman(ctx, b) for key, b in ctx.hosts.items()}
    hosts = {key: await sync_host(ctx, b, prov[key]) for key, b in ctx.hosts.items()}
    for key, job in deadman.items():
        if job:
            hosts[key].deadman = DeadmanJob.from_json(job)
    first = next(iter(hosts.values()))
    return SyncResult(hosts=hosts, summary=f"{first.files} files, {first.bytes} bytes")


def _requests(ctx: RunContext) -> dict[str, LaunchRequest]:
    from remotemac.engine.jobs import job_request

    prov = ctx.provision()
    data = ctx.result(Phase.SYNC)
    assert data is not None  # launch and follow run after the sync
    return {
        s.role: job_request(
            ctx, s, prov.device(s.role), prov.hosts[s.host_key], data.hosts[s.host_key].data_dir
        )
        for s in ctx.sides
    }


async def _launch(ctx: RunContext, key: PhaseKey) -> LaunchResult:
    from remotemac.engine.jobs import launch

    role = key.role
    side = ctx.side(role) if role else None
    assert role is not None and side is not None
    requests = _requests(ctx)
    nxt = None
    # when the target runs on the same host, the host itself starts it after the reference
    target = ctx.side("target")
    if role == "reference" and target and target.host_key == side.host_key:
        nxt = requests["target"]
    drift = role == "target" and ctx.side("reference") is not None and ctx.drift_checked is None
    if drift or nxt is not None:
        from remotemac.engine.drift import launch_fingerprint

        # the drift check before the target: its host's fingerprint is taken inside the
        # target's launch (by the host's own ``next`` launch when it starts the target),
        # before the job starts, and comes back in the launch answer: a job that changes
        # its environment as it starts is no drift, and the check waits for no call
        asked = nxt if nxt is not None else requests[role]
        asked.fingerprint = launch_fingerprint(ctx, target.host_key if target else side.host_key)
    launched = launch(ctx, side, requests[role], nxt)
    if not drift:
        answer = await launched
    else:
        answer = await _launch_and_check(ctx, side, launched)
    return LaunchResult(
        session=requests[role].session,
        mode=answer.mode,
        already=bool(answer.already_running or answer.already_done),
        access=Access.from_json(answer.access) if answer.access is not None else None,
        summary=requests[role].session,
    )


async def _launch_and_check(
    ctx: RunContext, side: Side, launched: Awaitable[LaunchAnswer]
) -> LaunchAnswer:
    """The target's launch and the drift check before it: the target's host's
    fingerprint from the launch answer, any other host's asked for beside the launch."""
    from remotemac.engine.drift import check_drift, fingerprint
    from remotemac.engine.pullstream import run_all

    answers: list[LaunchAnswer] = []
    taken: dict[str, Fingerprint] = {}
    prov = ctx.provision().hosts

    async def keep() -> None:
        answers.append(await launched)

    async def other(key: str) -> None:
        taken[key] = await fingerprint(ctx, key)

    others = [k for k in ctx.hosts if k != side.host_key and k in prov and prov[k].fingerprint]
    await run_all([keep(), *(other(k) for k in others)])
    answer = answers[0]
    if answer.fingerprint is not None:
        taken[side.host_key] = Fingerprint.from_json(answer.fingerprint)
    # an agent that took none (an older one) leaves the check to a call after the launch
    await check_drift(ctx, "before-target", taken)
    return answer


async def _follow(ctx: RunContext, key: PhaseKey) -> FollowResult:
    from remotemac.engine.jobs import follow

    role = key.role
    side = ctx.side(role) if role else None
    assert role is not None and side is not None
    result = await follow(ctx, side, _requests(ctx)[role])
    result.summary = f"{result.state} (exit {result.exit_code}), {result.lines} lines"
    return result


async def _pull(ctx: RunContext, _key: PhaseKey) -> PullResult:
    from remotemac.engine.pull import pull_sides

    prov = ctx.provision().hosts
    # every side at once, outputs.max_bytes for the whole run reserved at listing time
    pulled = await pull_sides(
        ctx, [(s, prov[s.host_key].run_dir) for s in ctx.sides], ctx.playbook.outputs.max_bytes
    )
    sides = {s.label: p.to_json() for s, p in zip(ctx.sides, pulled, strict=True)}
    count = sum(len(v["files"]) for v in sides.values())
    return PullResult(
        sides={k: PulledSide.from_json(v) for k, v in sides.items()},
        summary=f"{count} files verified",
    )


async def _compare(ctx: RunContext, _key: PhaseKey) -> CompareResult:
    from remotemac.engine.record import compare_results

    return await asyncio.to_thread(compare_results, ctx)


async def _record(ctx: RunContext, _key: PhaseKey) -> RecordResult:
    from remotemac.engine.record import write_acceptance

    trace = ctx.playbook.workload.trace
    if trace is not None and trace.drill:
        from remotemac.engine.drillpass import drill_down  # issue 35: the op drill-down

        await drill_down(ctx)
    return await write_acceptance(ctx)


async def _wipe(ctx: RunContext, _key: PhaseKey) -> WipeResult:
    from remotemac.engine.record import update_record_wipe
    from remotemac.engine.wipe import wipe_run

    if ctx.playbook.wipe == "manual" or ctx.options.keep_data:
        return WipeResult.kept("kept (wipe: manual or --keep-data)")
    result = await wipe_run(ctx)
    update_record_wipe(ctx, result)
    if result.error:  # the key is shredded; the user must hear what is left
        raise HostError(result.error)
    return result


def failure_line(exc: BaseException) -> str:
    """One line for the journal: remotemac's own message, or the exception's type and text,
    secret-looking parts redacted (an error may quote a command line)."""
    from remotemac.engine.ledger import redact

    text = exc.line() if isinstance(exc, RemotemacError) else f"{type(exc).__name__}: {exc}"
    return redact(" ".join(text.split()))[:2000]


#: phases after the job ended: when one fails, the run's data on the host is wiped
#: anyway (its outputs stay when they were not pulled), so a refused pull never
#: leaves the dataset behind
WIPE_AFTER_FAILURE = (Phase.PULL, Phase.COMPARE, Phase.RECORD)


async def _wipe_after_failure(ctx: RunContext, failed: str) -> str:
    """Run the wipe phase after ``failed`` failed; returns a note for the journal's error."""
    if ctx.playbook.wipe == "manual" or ctx.options.keep_data:
        return "; data kept on the host (wipe: manual or --keep-data)"
    ctx.emit(PhaseStarted(ctx.run_id, phase="wipe", detail=f"after the failed {failed}"))
    ctx.journal.start_phase(ctx.run_id, "wipe")
    try:
        result = await _wipe(ctx, PhaseKey(Phase.WIPE))
    except Exception as exc:  # the first failure stays the news
        ctx.journal.finish_phase(ctx.run_id, "wipe", {"error": failure_line(exc)}, state="failed")
        ctx.emit(PhaseFinished(ctx.run_id, phase="wipe", ok=False, detail=failure_line(exc)))
        return f"; the wipe after it failed too: {failure_line(exc)}"
    ctx.finish_result("wipe", result)
    ctx.emit(PhaseFinished(ctx.run_id, phase="wipe", detail=result.summary))
    return f"; wiped after the failure ({result.summary})"


async def _wipe_after_full_disk(ctx: RunContext, exc: Exception, failed: str) -> str:
    """A launch refused by the host's full disk: the run's data (RAM store, decrypted
    slice, data key) must not outlive the run, so the wipe runs now; the outputs of
    the sides that ran, not verified here, stay with the logs (docs/contract.md, "What
    survives a failure"). The sides not run are recorded as not launched, so ``attach``
    goes on from the pull once space is freed, and the message names that command."""
    why = "the host's disk was full at its launch, and the run's data was wiped"
    for key in phase_keys(ctx):
        if key.phase in (Phase.LAUNCH, Phase.FOLLOW) and (
            key.name == failed or key.name not in ctx.results
        ):
            skip_side(ctx, key.name, why)
    note = await _wipe_after_failure(ctx, failed)
    if isinstance(exc, RemotemacError) and Phase.WIPE in ctx.results:
        exc.hint = (
            "the run's data was wiped; its logs and the outputs not verified here are kept "
            f"on the host: free some space there, then get them with remotemac attach "
            f"{ctx.run_id}"
        )
    return note


async def _record_after_loss(ctx: RunContext, exc: JobLost) -> None:
    from remotemac.engine.record import write_acceptance

    try:
        await write_acceptance(ctx, lost=exc.line())
    except Exception as err:  # the loss is the news; a record failure must not hide it
        ctx.ledger.append("local", f"record after loss failed: {err}", None, op="record")


PhaseStep = Callable[[RunContext, PhaseKey], Awaitable[PhaseResult]]

_PHASES: dict[Phase, PhaseStep] = {
    Phase.PROVISION: _provision,
    Phase.SYNC: _sync,
    Phase.LAUNCH: _launch,
    Phase.FOLLOW: _follow,
    Phase.PULL: _pull,
    Phase.COMPARE: _compare,
    Phase.RECORD: _record,
    Phase.WIPE: _wipe,
}


async def connect_hosts(ctx: RunContext, *, unreachable_ok: bool = False) -> None:
    """Open every host's link; ``unreachable_ok``: a host that cannot be reached is noted
    in ``ctx.unreachable`` instead (a wipe shreds the key all the same and says what is
    left there)."""
    for key, binding in ctx.hosts.items():
        try:
            await binding.transport.connect()
        except (HostError, OSError) as exc:
            if not unreachable_ok:
                raise
            ctx.unreachable[key] = exc.line() if isinstance(exc, HostError) else str(exc)


async def close_hosts(ctx: RunContext) -> None:
    """Close every host's agent and link (the job on the host goes on)."""
    for binding in ctx.hosts.values():
        await binding.agent.close()
        await binding.transport.close()


def done_phases(ctx: RunContext) -> dict[str, dict]:
    """The journal's phases of this run that are done, by name, in order."""
    return {
        name: info
        for name, info in ctx.journal.phases(ctx.run_id).items()
        if info["state"] == "done"
    }


async def run_phase(ctx: RunContext, phase: str) -> int:
    """Run one phase of an existing run by hand (``remotemac pull`` / ``wipe``)."""
    run_id, journal = ctx.run_id, ctx.journal
    ctx.restore_results(journal.phases(run_id))
    if Phase.PROVISION not in ctx.results:
        raise BadInput(f"run {run_id} was never provisioned: nothing to {phase}")
    restore_phase(ctx, PhaseKey(Phase.PROVISION))
    try:
        await connect_hosts(ctx, unreachable_ok=phase == "wipe")
        ctx.emit(PhaseStarted(run_id, phase=phase))
        if journal.phase_state(run_id, phase) is None:
            journal.start_phase(run_id, phase)
        try:
            result = await _PHASES[Phase(phase)](ctx, PhaseKey(Phase(phase)))
        except Exception as exc:  # the journal says which phase failed and why
            journal.finish_phase(run_id, phase, {"error": failure_line(exc)}, state="failed")
            raise
        ctx.finish_result(phase, result)
        ctx.emit(PhaseFinished(run_id, phase=phase, detail=result.line))
    finally:
        await close_hosts(ctx)
    return 0
