"""Launch a device's job detached on the host, and follow its log to the end.

The log is followed by byte offset: the local ``logs/<label>.log`` is always a
byte-exact copy of the first ``offset`` bytes of the host's log, and the offset
is saved in the journal at least every second. After any interruption the local
file is cut back to the saved offset and reading resumes there, so no line is
lost or repeated, whatever happened in between.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import time
from pathlib import Path
from typing import Any

from remotemac.engine.context import RunContext, Side, substitute
from remotemac.errors import HostError, JobLost, TransientHostError
from remotemac.events import ConnectionState, EventBus, LogLine, Metric, PhaseProgress, Warning

FINAL = ("finished", "failed", "timeout", "stopped", "storage-limit")
#: the line the runner writes into the log when it starts a lost job again
RELAUNCH_MARKER = "=== remotemac: relaunched after the job was lost ({reason}) ==="
#: the caches a job's environment points inside the run dir (wiped with it)
CACHE_VARS = ("TORCH_HOME", "HF_HOME", "PIP_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR")
SAVE_EVERY_S = 1.0
#: while following, a dropped link is retried at least this often, so the stream
#: resumes within about a second of the link coming back (SSHTransport only)
FOLLOW_RECONNECT_MAX_WAIT_S = 1.0
#: ``run --drill disconnect`` cuts the link once this many lines of the target were seen
DRILL_AFTER_LINES = 20


def job_request(
    ctx: RunContext,
    side: Side,
    device: str,
    prov: dict[str, Any],
    data_dir: str,
    command: str | None = None,
) -> dict[str, Any]:
    """The agent's launch request for one side; ``command`` overrides the workload's
    (a relaunch runs ``resume_command``)."""
    pb = ctx.playbook
    run_dir = prov["run_dir"]
    output_dir = f"{run_dir}/out/{side.label}"
    values = {"device": device, "data_dir": data_dir, "output_dir": output_dir}
    venv_bin = os.path.dirname(prov["venv_python"]) if "/" in prov["venv_python"] else ""
    env = dict(pb.workload.env)
    env.update(
        {
            "REMOTEMAC_DEVICE": device,
            "REMOTEMAC_DATA": data_dir,
            "REMOTEMAC_OUTPUT": output_dir,
            "REMOTEMAC_RUN_ID": ctx.run_id,
            # caches live in the run dir so that wipe and cleanup remove them too
            "TORCH_HOME": f"{run_dir}/cache/torch",
            "HF_HOME": f"{run_dir}/cache/hf",
            "PIP_CACHE_DIR": f"{run_dir}/cache/pip",
            "XDG_CACHE_HOME": f"{run_dir}/cache/xdg",
            "MPLCONFIGDIR": f"{run_dir}/cache/mpl",
        }
    )
    if venv_bin and pb.environment.venv:
        env["VIRTUAL_ENV"] = os.path.dirname(venv_bin)
    if venv_bin:
        env["PATH"] = venv_bin + ":/usr/local/bin:/opt/homebrew/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    if device == "mps" and pb.workload.fallback == "diagnostic":
        env["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"
    command = substitute(command or pb.workload.command, values)
    return {
        "run_dir": run_dir,
        "device": side.label,
        "session": side.session(ctx.run_id),
        "command": f"mkdir -p {shlex.quote(output_dir)} && {command}",
        "metrics_path": f"{run_dir}/logs/{side.label}.rss.jsonl",
        "cwd": f"{run_dir}/project",
        "env": env,
        "timeout": pb.workload.timeout,
        "mode": "tmux",
        "disk": disk_watch(ctx, side, run_dir),
        # every Python process of the job that imports torch is observed in-process,
        # whatever the command's shape (see agent/jobsite.py and agent/observer.py)
        "observe": {
            "dir": f"{run_dir}/status/{side.label}.observe",
            "obs_path": f"{run_dir}/status/{side.label}.obs.json",
            "device": device,
            "fallback": pb.workload.fallback,
            "interval": 1.0,
        },
    }


def disk_watch(ctx: RunContext, side: Side, run_dir: str) -> dict[str, Any]:
    """What the runner watches: remote_root's volume (through the run dir) and the RAM store."""
    ram = ((ctx.results.get("sync") or {}).get("hosts", {}).get(side.host_key) or {}).get("ram")
    min_free = int(ctx.playbook.stop_when.min_free_disk)
    return {
        "paths": {"root": run_dir, "ram": (ram or {}).get("path")},
        "min_free": min_free,
        "warn_free": 2 * min_free,
    }


async def launch(
    ctx: RunContext, side: Side, request: dict[str, Any], next_request: dict[str, Any] | None = None
) -> dict[str, Any]:
    binding = ctx.host_for(side)
    req = dict(request)
    if next_request is not None:
        req["next"] = next_request
    answer = await binding.agent.call("launch", req)
    if answer.get("tmux_hint"):
        # an offer, never a silent install: the daemonised runner works without tmux
        ctx.emit(
            Warning(
                ctx.run_id,
                message=f"{binding.transport.name}: {answer['tmux_hint']}"
                " (the job runs daemonised meanwhile)",
                code="no-tmux",
            )
        )
    return answer


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
) -> dict[str, Any]:
    """This process's tally plus what follow phases finished by earlier processes counted."""
    totals: dict[str, Any] = dict(tally)
    drill = None
    for name in ctx.results:
        if not name.startswith("follow:"):
            continue
        result = ctx.results.get(name) or {}
        if name in carried_phases:
            for key in ("disconnects", "reconnects"):
                totals[key] += int((result.get("continuity") or {}).get(key, 0))
        drill = result.get("drill") or drill
    totals["drill"] = drill or ctx.options.drill
    return totals


class _Drill:
    """``run --drill disconnect``: cut the link once mid-follow and see what survived."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.result: dict[str, Any] = {
            "kind": "disconnect",
            "job_kept_running": None,
            "log_complete": None,
            "reconnect_s": None,
        }
        self.t0 = 0.0
        self.runner_pid: Any = None
        self.pending = False

    async def cut(self, status: dict[str, Any], lines: int) -> None:
        drop = getattr(self.transport, "drop_connection", None)
        self.result["lines_before"] = lines
        if drop is None:
            self.result["skipped"] = f"{self.transport.name} has no link to cut"
            return
        self.runner_pid = status.get("runner_pid")
        self.t0 = time.monotonic()
        self.result["dropped"] = bool(await drop())
        self.pending = True

    def link_back(self) -> None:
        """The first operation after the cut succeeded (through a reconnect)."""
        if self.pending and self.result["reconnect_s"] is None:
            self.result["reconnect_s"] = round(time.monotonic() - self.t0, 3)

    def saw_status(self, answer: dict[str, Any]) -> None:
        if not self.pending or self.result["job_kept_running"] is not None:
            return
        status = answer.get("status") or {}
        self.result["job_kept_running"] = bool(
            answer.get("state") not in ("lost", "absent")
            and status.get("runner_pid") == self.runner_pid
            and (answer.get("runner_alive") or answer.get("state") in FINAL)
        )


async def follow(ctx: RunContext, side: Side, request: dict[str, Any]) -> dict[str, Any]:
    """Stream the log from the saved offset until the job's status is final."""
    # a pooled lease delegates to the shared transport: tune that one
    transport = ctx.host_for(side).transport.link_owner()
    old_wait = getattr(transport, "reconnect_max_wait", None)
    if old_wait is not None:
        transport.reconnect_max_wait = min(old_wait, FOLLOW_RECONNECT_MAX_WAIT_S)  # type: ignore[attr-defined]
    before = _link_counts(transport)
    try:
        result = await _follow(ctx, side, request)
    finally:
        if old_wait is not None:
            transport.reconnect_max_wait = old_wait  # type: ignore[attr-defined]
    after = _link_counts(transport)
    result["continuity"] = {k: after[k] - before[k] for k in after}
    return result


def _link_counts(transport: Any) -> dict[str, int]:
    return {
        "disconnects": int(getattr(transport, "disconnects", 0)),
        "reconnects": int(getattr(transport, "reconnects", 0)),
    }


async def _follow(ctx: RunContext, side: Side, request: dict[str, Any]) -> dict[str, Any]:
    binding = ctx.host_for(side)
    transport = binding.transport
    remote_log = f"{request['run_dir']}/logs/{side.label}.log"
    local_log = ctx.out_dir / "logs" / f"{side.label}.log"
    local_log.parent.mkdir(parents=True, exist_ok=True)
    offset, lines = ctx.journal.log_offset(ctx.run_id, side.label)
    # the local copy may hold bytes written after the last saved offset: cut them
    with open(local_log, "ab") as fh:
        fh.truncate(offset)
    last_save = time.monotonic()
    last_status = 0.0
    status: dict[str, Any] = {}
    pending = b""
    poll = ctx.options.follow_poll_s
    drill = (
        _Drill(transport) if ctx.options.drill == "disconnect" and side.role == "target" else None
    )
    give_up_after = float(transport.reconnect_deadline)
    last_ok = time.monotonic()
    warned: set[str] = set()
    relaunched: dict[str, Any] | None = None
    with open(local_log, "ab") as out:
        while True:
            try:
                chunk = await transport.read_from(remote_log, offset + len(pending))
            except FileNotFoundError:
                chunk = b""
            except TransientHostError:
                # the transport gave up on this one operation (the link kept dropping
                # under it); the job does not care: keep following until the link has
                # been unusable for as long as a reconnect may take
                if time.monotonic() - last_ok > give_up_after:
                    raise
                await asyncio.sleep(poll)
                continue
            last_ok = time.monotonic()
            if drill:
                drill.link_back()
            if chunk:
                pending += chunk
                cut = pending.rfind(b"\n")
                if cut >= 0:
                    complete, pending = pending[: cut + 1], pending[cut + 1 :]
                    out.write(complete)
                    out.flush()
                    # split on b"\n" only: the offset must advance by the bytes read, and
                    # splitlines() also ends lines at "\r" and drops it from "\r\n" (a job
                    # printing CRLF or progress bars made the offset lag, re-reading bytes)
                    for raw in complete.split(b"\n")[:-1]:
                        lines += 1
                        ctx.emit(
                            LogLine(
                                ctx.run_id,
                                device=side.label,
                                line=shown_line(raw),
                                offset=offset,
                            )
                        )
                        offset += len(raw) + 1
            now = time.monotonic()
            if now - last_save >= SAVE_EVERY_S:
                ctx.journal.save_log_offset(ctx.run_id, side.label, offset, lines)
                last_save = now
            if chunk and len(chunk) >= (1 << 20):
                continue  # more is waiting: read again before sleeping
            if now - last_status >= 1.0 or not chunk:
                last_status = now
                try:
                    answer = await binding.agent.call(
                        "status",
                        {
                            "run_dir": request["run_dir"],
                            "device": side.label,
                            "session": request["session"],
                        },
                    )
                except TransientHostError:
                    if time.monotonic() - last_ok > give_up_after:
                        raise
                    continue
                last_ok = time.monotonic()
                status = answer.get("status") or {}
                state = answer.get("state")
                if drill:
                    drill.saw_status(answer)
                _warn_once(ctx, side, status, warned)
                if status.get("peak_rss_bytes"):
                    ctx.emit(
                        Metric(
                            ctx.run_id,
                            device=side.label,
                            name="peak_rss_bytes",
                            value=float(status["peak_rss_bytes"]),
                        )
                    )
                if state in FINAL and answer.get("log_size", -1) <= offset + len(pending):
                    break
                if state == "lost":
                    ctx.journal.save_log_offset(ctx.run_id, side.label, offset, lines)
                    reason = answer.get("lost_reason") or "runner gone"
                    if may_relaunch(ctx, status) and relaunched is None:
                        relaunched = await relaunch(ctx, side, request, reason)
                        continue
                    raise JobLost(
                        f"{transport.name}: the {side.label} job was lost "
                        f"({answer.get('lost_reason') or 'runner gone'}; tmux session gone, no "
                        f"heartbeat for {int(answer['now'] - (status.get('heartbeat_at') or 0))}s)"
                        " — was the host rebooted?"
                    )
                ctx.emit(
                    PhaseProgress(
                        ctx.run_id,
                        phase=f"follow:{side.role}",
                        done=lines,
                        unit="lines",
                        detail=state or "",
                    )
                )
                if (
                    drill
                    and not drill.pending
                    and "skipped" not in drill.result
                    and state == "running"
                    and lines >= DRILL_AFTER_LINES
                ):
                    await drill.cut(status, lines)
            if not chunk:
                await asyncio.sleep(poll)
        if pending:  # a last line without newline: the job is over, keep it
            out.write(pending + b"\n")
            lines += 1
            ctx.emit(
                LogLine(
                    ctx.run_id,
                    device=side.label,
                    line=shown_line(pending),
                    offset=offset,
                )
            )
            offset += len(pending)
    ctx.journal.save_log_offset(ctx.run_id, side.label, offset, lines)
    if not status:
        raise HostError(f"{transport.name}: no status for the {side.label} job")
    result = {
        "state": status.get("state"),
        "exit_code": status.get("exit_code"),
        "started_at": status.get("started_at"),
        "ended_at": status.get("ended_at"),
        "peak_rss_bytes": status.get("peak_rss_bytes"),
        "lines": lines,
        "bytes": offset,
        "reason": status.get("reason"),
        "disk": status.get("disk"),
        "disk_warning": status.get("disk_warning"),
    }
    # the host remembers a relaunch even when this process did not make it (re-attach)
    again = relaunched or status.get("relaunched")
    if again:
        result["relaunched"] = {k: again.get(k) for k in ("reason", "marker", "command", "at")}
    if drill:
        if drill.pending:
            drill.result["log_complete"] = await log_matches_host(ctx, side, request, local_log)
        elif "skipped" not in drill.result:
            drill.result["skipped"] = "the job ended before the drill could cut the link"
        result["drill"] = drill.result
    return result


def shown_line(raw: bytes) -> str:
    """A log line as a terminal leaves it: what follows its last carriage return (a
    progress bar's last state), without the ``\\r`` of a CRLF ending."""
    raw = raw[:-1] if raw.endswith(b"\r") else raw
    return raw.rsplit(b"\r", 1)[-1].decode("utf-8", "replace")


def _warn_once(ctx: RunContext, side: Side, status: dict[str, Any], warned: set[str]) -> None:
    """The runner's low-disk warning as a Warning event, once per job."""
    text = status.get("disk_warning")
    if text and text not in warned:
        warned.add(text)
        ctx.emit(Warning(ctx.run_id, message=f"{side.label} job: {text}", code="low-disk"))


def may_relaunch(ctx: RunContext, status: dict[str, Any]) -> bool:
    """``on_lost: relaunch``, and only once: the host's status says if it already was."""
    return ctx.playbook.on_lost == "relaunch" and not status.get("relaunched")


async def relaunch(
    ctx: RunContext, side: Side, request: dict[str, Any], reason: str
) -> dict[str, Any]:
    """Start a lost job again (``resume_command`` if given), appending to the same log.

    The runner writes the marker line into the log when it starts, so the line is
    there exactly once however often this call is retried (a retry finds the job
    running and starts nothing).
    """
    pb = ctx.playbook
    resume = pb.workload.resume_command
    prov = ctx.results["provision"]
    data_dir = ((ctx.results.get("sync") or {}).get("hosts", {}).get(side.host_key) or {}).get(
        "data_dir"
    ) or request.get("env", {}).get("REMOTEMAC_DATA", "")
    device = prov["devices"].get(side.role) or prov["devices"].get("target")
    req = job_request(ctx, side, device, prov["hosts"][side.host_key], data_dir, command=resume)
    marker = RELAUNCH_MARKER.format(reason=reason)
    info = {
        "reason": reason,
        "marker": marker,
        "at": time.time(),
        "command": "resume_command" if resume else "command",
    }
    req["relaunch"] = info
    ctx.emit(
        Warning(
            ctx.run_id,
            message=f"the {side.label} job was lost ({reason}); "
            f"relaunching it once through its {info['command']} (on_lost: relaunch)",
            code="relaunched",
        )
    )
    await ctx.host_for(side).agent.call("launch", req)
    return info


async def log_matches_host(
    ctx: RunContext, side: Side, request: dict[str, Any], local_log: Path
) -> bool:
    """True when the local log is byte-identical to the host's (size and sha256)."""
    binding = ctx.host_for(side)
    listing = await binding.agent.call("list_outputs", {"dir": f"{request['run_dir']}/logs"})
    entry = next((e for e in listing.get("entries", []) if e["path"] == f"{side.label}.log"), None)
    if entry is None:
        return False
    data = local_log.read_bytes()
    if len(data) == entry["size"] + 1 and data.endswith(b"\n"):
        data = data[:-1]  # the last line had no newline on the host; we added one
    return len(data) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
