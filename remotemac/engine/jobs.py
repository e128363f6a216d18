"""Launch a device's job detached on the host, and follow its log to the end.

The log is followed by byte offset: the local ``logs/<label>.log`` is always a
byte-exact copy of the first ``offset`` bytes of the host's log, and the offset
is saved in the journal at least every second. After any interruption the local
file is cut back to the saved offset and reading resumes there, so no line is
lost or repeated, whatever happened in between.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from remotemac.agent.protocol import (
    CACHE_DIRS,
    ENV_DATA,
    ENV_DEVICE,
    ENV_OUTPUT,
    ENV_RUN_ID,
    FINAL_STATES,
    JobState,
    JobStatus,
    JsonObject,
    LaunchAnswer,
    LaunchRequest,
    Message,
    Op,
    StatusRequest,
)
from remotemac.agent.protocol import (
    CACHE_VARS as CACHE_VARS,  # re-exported: the record reads it from here
)
from remotemac.engine.context import RunContext, Side, substitute
from remotemac.engine.phaseresults import Disk, Drill, FollowResult, ProvisionHost, RamStore
from remotemac.engine.phaseresults import Relaunch as RelaunchRecord
from remotemac.errors import HostError, JobLost, TransientHostError
from remotemac.events import ConnectionState, EventBus, LogLine, Metric, PhaseProgress, Warning
from remotemac.phases import Phase, PhaseKey, follow_key
from remotemac.termsafe import has_controls
from remotemac.transport.base import Transport

#: the job's final states (agent/protocol.py: the runner writes them, the agent reads them)
FINAL = FINAL_STATES
#: the line the runner writes into the log when it starts a lost job again
RELAUNCH_MARKER = "=== remotemac: relaunched after the job was lost ({reason}) ==="
# CACHE_VARS (agent/protocol.py): the caches a job's environment points inside the run
# dir (wiped with it); the host's access check reads the same names
SAVE_EVERY_S = 1.0
#: how long the host holds a follow's status call when there is no news (a line, the end)
WAIT_S = 1.0
#: while following, a dropped link is retried at least this often, so the stream
#: resumes within about a second of the link coming back (SSHTransport only)
FOLLOW_RECONNECT_MAX_WAIT_S = 1.0
#: ``run --drill disconnect`` cuts the link once this many lines of the target were seen
DRILL_AFTER_LINES = 20


@dataclass(frozen=True)
class DiskWatch:
    """What the runner watches (the launch's ``disk``): remote_root's volume, through
    the run dir, and the RAM store; it stops the job below ``min_free`` bytes free."""

    root: str
    ram: str | None
    min_free: int

    def to_json(self) -> JsonObject:
        return {
            "paths": {"root": self.root, "ram": self.ram},
            "min_free": self.min_free,
            "warn_free": 2 * self.min_free,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> DiskWatch:
        return cls(root=data["paths"]["root"], ram=data["paths"]["ram"], min_free=data["min_free"])


@dataclass
class Relaunch(Message):
    """A lost job started again (the launch's ``relaunch``; the host keeps it in the
    job's status as ``relaunched``): why, the marker line the runner writes into the
    log, which command ran and when."""

    reason: str | None = None
    marker: str | None = None
    command: str | None = None
    at: float | None = None

    def for_record(self) -> JsonObject:
        """The follow result's ``relaunched``: these four keys, None when unknown."""
        return {
            "reason": self.reason,
            "marker": self.marker,
            "command": self.command,
            "at": self.at,
        }


@dataclass
class RunnerStatus(Message):
    """The job's status file (agent/runner.py writes it) as a ``status`` answer carries
    it: the fields the laptop reads; the rest stays in ``extra``."""

    state: str | None = None
    runner_pid: int | None = None
    started_at: float | None = None
    heartbeat_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    peak_rss_bytes: int | None = None
    reason: str | None = None
    #: the runner's disk figures, handed to the record as they are
    disk: JsonObject | None = None
    disk_warning: str | None = None
    #: the relaunch this job is (a lost job started again), as the launch asked for it
    relaunched: Any = None

    @property
    def relaunch(self) -> Relaunch | None:
        """The relaunch this job is, None when it is not one."""
        if isinstance(self.relaunched, dict):
            return Relaunch.from_json(self.relaunched)
        return None

    @property
    def empty(self) -> bool:
        """No status file yet (the agent answered ``{}``)."""
        return not self.to_json()


@dataclass
class DrillResult:
    """What ``run --drill disconnect`` found: did the job keep running through the cut,
    is the local log complete, how long the reconnect took (or why it was skipped)."""

    kind: str = "disconnect"
    job_kept_running: bool | None = None
    log_complete: bool | None = None
    reconnect_s: float | None = None
    lines_before: int | None = None
    skipped: str | None = None
    dropped: bool | None = None

    #: present only once set (the first four always are)
    OPTIONAL: ClassVar[tuple[str, ...]] = ("lines_before", "skipped", "dropped")

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "kind": self.kind,
            "job_kept_running": self.job_kept_running,
            "log_complete": self.log_complete,
            "reconnect_s": self.reconnect_s,
        }
        for name in self.OPTIONAL:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> DrillResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def job_request(
    ctx: RunContext,
    side: Side,
    device: str,
    prov: ProvisionHost,
    data_dir: str,
    command: str | None = None,
) -> LaunchRequest:
    """The agent's launch request for one side; ``command`` overrides the workload's
    (a relaunch runs ``resume_command``)."""
    pb = ctx.playbook
    run_dir = prov.run_dir
    output_dir = f"{run_dir}/out/{side.label}"
    values = {"device": device, "data_dir": data_dir, "output_dir": output_dir}
    venv_python = prov.venv_python or ""
    venv_bin = os.path.dirname(venv_python) if "/" in venv_python else ""
    env = dict(pb.workload.env)
    env.update(
        {
            ENV_DEVICE: device,
            ENV_DATA: data_dir,
            ENV_OUTPUT: output_dir,
            ENV_RUN_ID: ctx.run_id,
        }
    )
    # caches live in the run dir so that wipe and cleanup remove them too
    env.update({var: f"{run_dir}/cache/{sub}" for var, sub in CACHE_DIRS.items()})
    if venv_bin and pb.environment.venv:
        env["VIRTUAL_ENV"] = os.path.dirname(venv_bin)
    if venv_bin:
        env["PATH"] = venv_bin + ":/usr/local/bin:/opt/homebrew/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    if device == "mps" and pb.workload.fallback == "diagnostic":
        env["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"
    command = substitute(command or pb.workload.command, values)
    return LaunchRequest(
        run_dir=run_dir,
        device=side.label,
        session=side.session(ctx.run_id),
        command=f"mkdir -p {shlex.quote(output_dir)} && {command}",
        metrics_path=f"{run_dir}/logs/{side.label}.rss.jsonl",
        cwd=f"{run_dir}/project",
        env=env,
        timeout=pb.workload.timeout,
        mode="tmux",
        disk=disk_watch(ctx, side, run_dir).to_json(),
        # every Python process of the job that imports torch is observed in-process,
        # whatever the command's shape (see agent/jobsite.py and agent/observer.py)
        # after the job, its own interpreter turns pickled checkpoints the safe loader
        # refuses into tensors on the host (agent/ckptconvert.py)
        convert={
            "python": prov.venv_python,
            "dir": output_dir,
            "patterns": [r.file for r in pb.outputs.compare] or ["**/*"],
        },
        observe={
            "dir": f"{run_dir}/status/{side.label}.observe",
            "obs_path": f"{run_dir}/status/{side.label}.obs.json",
            "device": device,
            "fallback": pb.workload.fallback,
            "interval": 1.0,
            **(
                {"trace": {"steps": pb.workload.trace.steps, "path": trace_path(run_dir, side)}}
                if pb.workload.trace
                else {}
            ),
        },
    )


def trace_path(run_dir: str, side: Side) -> str:
    """Where a side's divergence trace is written on the host: under out/, beside the
    outputs and outside them (not a result to compare), so the wipe takes it with them:
    it holds samples of the data (an embedding's input is token ids). Pulled into the
    local logs/."""
    return f"{run_dir}/out/.trace/{side.label}.trace.jsonl"


def disk_watch(ctx: RunContext, side: Side, run_dir: str) -> DiskWatch:
    """What the runner watches: remote_root's volume (through the run dir) and the RAM store."""
    sync = ctx.result(Phase.SYNC)
    ram = sync.ram(side.host_key) if sync else RamStore()
    return DiskWatch(run_dir, ram.path, int(ctx.playbook.stop_when.min_free_disk))


async def launch(
    ctx: RunContext,
    side: Side,
    request: LaunchRequest,
    next_request: LaunchRequest | None = None,
) -> LaunchAnswer:
    binding = ctx.host_for(side)
    req = request.to_json()
    if next_request is not None:
        req["next"] = next_request.to_json()
    launched = LaunchAnswer.from_json(await binding.agent.call(Op.LAUNCH, req))
    if launched.tmux_hint:
        # an offer, never a silent install: the daemonised runner works without tmux
        ctx.emit(
            Warning(
                ctx.run_id,
                message=f"{binding.transport.name}: {launched.tmux_hint}"
                " (the job runs daemonised meanwhile)",
                code="no-tmux",
            )
        )
    return launched


# ---------------------------------------------------------------- continuity


def count_connection_events(bus: EventBus) -> dict[str, int]:
    """Tally disconnects/reconnects from ConnectionState events into the returned dict."""
    tally = {"disconnects": 0, "reconnects": 0}

    def count(event: object) -> None:
        if isinstance(event, ConnectionState):
            if event.state == "disconnected":
                tally["disconnects"] += 1
            elif event.state == "reconnected":
                tally["reconnects"] += 1

    bus.subscribe(count)
    return tally


def continuity_totals(
    ctx: RunContext, tally: dict[str, int], carried_phases: list[str]
) -> JsonObject:
    """The record's ``continuity``: this process's tally plus what follow phases finished
    by earlier processes counted, and the drill."""
    totals: JsonObject = dict(tally)
    drill = None
    for name, result in ctx.results.items():
        if PhaseKey.group(name) != Phase.FOLLOW or not isinstance(result, FollowResult):
            continue
        if name in carried_phases:
            for key in ("disconnects", "reconnects"):
                totals[key] += int((result.continuity or {}).get(key, 0))
        drill = result.drill or drill
    totals["drill"] = drill or ctx.options.drill
    return totals


class _Drill:
    """``run --drill disconnect``: cut the link once mid-follow and see what survived."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self.result = DrillResult()
        self.t0 = 0.0
        self.runner_pid: int | None = None
        self.pending = False

    async def cut(self, status: RunnerStatus, lines: int) -> None:
        self.result.lines_before = lines
        if not self.transport.has_link():
            self.result.skipped = f"{self.transport.name} has no link to cut"
            return
        self.runner_pid = status.runner_pid
        self.t0 = time.monotonic()
        self.result.dropped = bool(await self.transport.drop_connection())
        self.pending = True

    def link_back(self) -> None:
        """The first operation after the cut succeeded (through a reconnect)."""
        if self.pending and self.result.reconnect_s is None:
            self.result.reconnect_s = round(time.monotonic() - self.t0, 3)

    def saw_status(self, job: JobStatus, status: RunnerStatus) -> None:
        if not self.pending or self.result.job_kept_running is not None:
            return
        self.result.job_kept_running = bool(
            job.state not in (JobState.LOST, JobState.ABSENT)
            and status.runner_pid == self.runner_pid
            and (job.runner_alive or job.final)
        )


async def follow(ctx: RunContext, side: Side, request: LaunchRequest) -> FollowResult:
    """Stream the log from the saved offset until the job's status is final."""
    transport = ctx.host_for(side).transport
    before = transport.link_stats()
    with transport.reconnect_wait_capped(FOLLOW_RECONNECT_MAX_WAIT_S):
        result = await _follow(ctx, side, request)
    result.continuity = transport.link_stats().since(before)
    return result


async def _follow(ctx: RunContext, side: Side, request: LaunchRequest) -> FollowResult:
    return await LogFollower(ctx, side, request).run()


class LogFollower:
    """Follow one job: copy its log line by line, poll its status, until it is over.

    Steps, each a method: read the next chunk of the host's log (riding out link
    drops), write and announce its complete lines, save the offset now and then, ask
    the agent for the job's status (warnings, metrics, a lost job relaunched or
    reported, the drill's cut), and build the phase result at the end.
    """

    def __init__(self, ctx: RunContext, side: Side, request: LaunchRequest) -> None:
        self.ctx, self.side, self.request = ctx, side, request
        self.binding = ctx.host_for(side)
        self.transport = self.binding.transport
        self.remote_log = f"{request.run_dir}/logs/{side.label}.log"
        self.local_log = ctx.out_dir / "logs" / f"{side.label}.log"
        self.offset, self.lines = self._start()
        self.pending = b""  # bytes after the last newline, not written yet
        self.status = RunnerStatus()
        self.poll = ctx.options.follow_poll_s
        self.drill = (
            _Drill(self.transport)
            if ctx.options.drill == "disconnect" and side.role == "target"
            else None
        )
        self.give_up_after = float(self.transport.reconnect_deadline)
        self.last_ok = self.last_save = time.monotonic()
        self.last_status = 0.0
        self.warned: set[str] = set()
        self.relaunched: Relaunch | None = None

    def _start(self) -> tuple[int, int]:
        """Where reading starts (bytes, lines): the journal's saved offset."""
        self.local_log.parent.mkdir(parents=True, exist_ok=True)
        offset, lines = self.ctx.journal.log_offset(self.ctx.run_id, self.side.label)
        # the local copy may hold bytes written after the last saved offset: cut them
        with open(self.local_log, "ab") as fh:
            fh.truncate(offset)
        return offset, lines

    def _sink(self) -> BinaryIO:
        """Where complete lines are written: the local copy of the log."""
        return open(self.local_log, "ab")

    async def run(self) -> FollowResult:
        with self._sink() as out:
            while True:
                started = time.monotonic()
                # the job's status (once a second, or when it is over) and the log's next
                # bytes in one agent call that waits on the host for news: one round trip
                # a poll, answered the moment a line or the end comes (an SFTP read, a
                # status call and a sleep took five round trips and the sleep)
                full = started - self.last_status >= 1.0
                if full:
                    self.last_status = started
                job = await self._ask(full)
                if job is None:
                    continue  # the call failed on a dropping link: try again
                chunk = job.log_bytes()
                self._write_lines(out, chunk)
                now = time.monotonic()
                if now - self.last_save >= SAVE_EVERY_S:
                    self._save_offset()
                    self.last_save = now
                if job.state is not None:  # a whole status: a full ask, or the job is over
                    step = await self._judge(job)
                    if step == "over":
                        break
                    if step == "again":
                        continue
                if not chunk and now - started < self.poll / 2:
                    # a host that did not wait (an older agent's answer): poll as before
                    await asyncio.sleep(self.poll)
            self._write_last_line(out)
        self._save_offset()
        if self.status.empty:
            raise HostError(f"{self.transport.name}: no status for the {self.side.label} job")
        return await self._result()

    def _link_unusable_too_long(self) -> bool:
        return time.monotonic() - self.last_ok > self.give_up_after

    def _link_ok(self) -> None:
        self.last_ok = time.monotonic()

    def _save_offset(self) -> None:
        self.ctx.journal.save_log_offset(self.ctx.run_id, self.side.label, self.offset, self.lines)

    def _emit_line(self, raw: bytes) -> None:
        self.ctx.emit(
            LogLine(
                self.ctx.run_id,
                device=self.side.label,
                line=shown_line(raw),
                offset=self.offset,
            )
        )

    def _write_lines(self, out: BinaryIO, chunk: bytes) -> None:
        """Write and announce every complete line; keep a partial last line pending."""
        if not chunk:
            return
        self.pending += chunk
        cut = self.pending.rfind(b"\n")
        if cut < 0:
            return
        complete, self.pending = self.pending[: cut + 1], self.pending[cut + 1 :]
        out.write(complete)
        out.flush()
        # split on b"\n" only: the offset must advance by the bytes read, and
        # splitlines() also ends lines at "\r" and drops it from "\r\n" (a job
        # printing CRLF or progress bars made the offset lag, re-reading bytes)
        for raw in complete.split(b"\n")[:-1]:
            self.lines += 1
            self._emit_line(raw)
            self.offset += len(raw) + 1

    def _write_last_line(self, out: BinaryIO) -> None:
        """A last line without newline: the job is over, keep it."""
        if not self.pending:
            return
        out.write(self.pending + b"\n")
        self.lines += 1
        self._emit_line(self.pending)
        self.offset += len(self.pending)

    async def _ask(self, full: bool) -> JobStatus | None:
        """The log's bytes after what was read, with the job's whole status when ``full``
        or when it is over; the host answers when there is news or after ``WAIT_S``.
        None: the link failed the call (asked again until it has been unusable for as
        long as a reconnect may take: the job does not care)."""
        request = self.request
        try:
            asked = StatusRequest(
                run_dir=request.run_dir,
                device=self.side.label,
                session=request.session,
                log_from=self.offset + len(self.pending),
                log_only=not full,
                wait_s=WAIT_S,
            )
            answer = await self.binding.agent.call(Op.STATUS, asked.to_json())
        except TransientHostError:
            if self._link_unusable_too_long():
                raise
            await asyncio.sleep(self.poll)
            return None
        self._link_ok()
        if self.drill:
            self.drill.link_back()
        return JobStatus.from_json(answer)

    async def _judge(self, job: JobStatus) -> str:
        """What the job's status says: ``over``, ``again`` (read now) or ``wait``."""
        ctx, side = self.ctx, self.side
        self.status = status = RunnerStatus.from_json(job.file)
        state = job.state
        if self.drill:
            self.drill.saw_status(job, status)
        _warn_once(ctx, side, status, self.warned)
        if status.peak_rss_bytes:
            ctx.emit(
                Metric(
                    ctx.run_id,
                    device=side.label,
                    name="peak_rss_bytes",
                    value=float(status.peak_rss_bytes),
                )
            )
        if job.final and job.log_size <= self.offset + len(self.pending):
            return "over"
        if state == JobState.LOST:
            await self._job_lost(job)
            return "again"  # relaunched (a second loss raises)
        ctx.emit(
            PhaseProgress(
                ctx.run_id,
                phase=follow_key(side.role).name,
                done=self.lines,
                unit="lines",
                detail=state or "",
            )
        )
        drill = self.drill
        if (
            drill
            and not drill.pending
            and drill.result.skipped is None
            and state == "running"
            and self.lines >= DRILL_AFTER_LINES
        ):
            await drill.cut(status, self.lines)
        return "wait"

    async def _job_lost(self, job: JobStatus) -> None:
        """Relaunch a lost job once when the playbook says so; otherwise raise JobLost."""
        self._save_offset()
        status = self.status
        reason = job.lost_reason or "runner gone"
        if may_relaunch(self.ctx, status) and self.relaunched is None:
            self.relaunched = await relaunch(self.ctx, self.side, self.request, reason)
            return
        raise JobLost(
            f"{self.transport.name}: the {self.side.label} job was lost "
            f"({reason}; tmux session gone, no "
            f"heartbeat for {int((job.now or 0) - (status.heartbeat_at or 0))}s)"
            " — was the host rebooted?",
            # as after Ctrl-C: nothing is wiped, the run's data waits on the host
            hint=f"its data stays on the host until `remotemac wipe {self.ctx.run_id}`",
        )

    async def _result(self) -> FollowResult:
        """The follow phase's result for the journal (and the drill's findings)."""
        status = self.status
        result = FollowResult(
            state=status.state,
            exit_code=status.exit_code,
            started_at=status.started_at,
            ended_at=status.ended_at,
            peak_rss_bytes=status.peak_rss_bytes,
            lines=self.lines,
            bytes=self.offset,
            reason=status.reason,
            disk=Disk.from_json(status.disk) if status.disk is not None else None,
            disk_warning=status.disk_warning,
        )
        # the host remembers a relaunch even when this process did not make it (re-attach)
        again = self.relaunched or status.relaunch
        if again:
            result.relaunched = RelaunchRecord.from_json(again.for_record())
        drill = self.drill
        if drill:
            if drill.pending:
                drill.result.log_complete = await log_matches_host(
                    self.ctx, self.side, self.request, self.local_log
                )
            elif drill.result.skipped is None:
                drill.result.skipped = "the job ended before the drill could cut the link"
            result.drill = Drill.from_json(drill.result.to_json())
        return result


def shown_line(raw: bytes) -> str:
    """A log line as a terminal leaves it: what follows its last carriage return (a
    progress bar's last state), without the ``\\r`` of a CRLF ending.

    Only plain text is dropped that way: when what a ``\\r`` would overwrite holds a
    terminal control (a hostile job hiding an escape sequence behind a progress bar),
    the whole line is kept, and the front ends show every control escaped.
    """
    raw = raw[:-1] if raw.endswith(b"\r") else raw
    text = raw.decode("utf-8", "replace")
    overwritten, cr, last = text.rpartition("\r")
    if cr and not has_controls(overwritten.replace("\r", "")):
        return last
    return text


def _warn_once(ctx: RunContext, side: Side, status: RunnerStatus, warned: set[str]) -> None:
    """The runner's low-disk warning as a Warning event, once per job."""
    text = status.disk_warning
    if text and text not in warned:
        warned.add(text)
        ctx.emit(Warning(ctx.run_id, message=f"{side.label} job: {text}", code="low-disk"))


def may_relaunch(ctx: RunContext, status: RunnerStatus) -> bool:
    """``on_lost: relaunch``, and only once: the host's status says if it already was."""
    return ctx.playbook.on_lost == "relaunch" and not status.relaunched


async def relaunch(ctx: RunContext, side: Side, request: LaunchRequest, reason: str) -> Relaunch:
    """Start a lost job again (``resume_command`` if given), appending to the same log.

    The runner writes the marker line into the log when it starts, so the line is
    there exactly once however often this call is retried (a retry finds the job
    running and starts nothing).
    """
    pb = ctx.playbook
    resume = pb.workload.resume_command
    prov = ctx.provision()
    sync = ctx.result(Phase.SYNC)
    data_dir = (sync.data_dir(side.host_key) if sync else None) or request.env.get(ENV_DATA, "")
    device = prov.device(side.role)
    req = job_request(ctx, side, device, prov.hosts[side.host_key], data_dir, command=resume)
    info = Relaunch(
        reason=reason,
        marker=RELAUNCH_MARKER.format(reason=reason),
        command="resume_command" if resume else "command",
        at=time.time(),
    )
    req.relaunch = info.to_json()
    ctx.emit(
        Warning(
            ctx.run_id,
            message=f"the {side.label} job was lost ({reason}); "
            f"relaunching it once through its {info.command} (on_lost: relaunch)",
            code="relaunched",
        )
    )
    await ctx.host_for(side).agent.call(Op.LAUNCH, req.to_json())
    return info


async def log_matches_host(
    ctx: RunContext, side: Side, request: LaunchRequest, local_log: Path
) -> bool:
    """True when the local log is byte-identical to the host's (size and sha256)."""
    binding = ctx.host_for(side)
    listing = await binding.agent.call(Op.LIST_OUTPUTS, {"dir": f"{request.run_dir}/logs"})
    entry = next((e for e in listing.get("entries", []) if e["path"] == f"{side.label}.log"), None)
    if entry is None:
        return False
    data = local_log.read_bytes()
    if len(data) == entry["size"] + 1 and data.endswith(b"\n"):
        data = data[:-1]  # the last line had no newline on the host; we added one
    return len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
