"""Launch a device's job detached on the host, and follow its log to the end.

The log is followed by byte offset: the local ``logs/<label>.log`` is always a
byte-exact copy of the first ``offset`` bytes of the host's log, and the offset
is saved in the journal at least every second. After any interruption the local
file is cut back to the saved offset and reading resumes there, so no line is
lost or repeated, whatever happened in between.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import time
from typing import Any

from remotemac.engine.context import RunContext, Side, substitute
from remotemac.errors import HostError, JobLost
from remotemac.events import LogLine, Metric, PhaseProgress

FINAL = ("finished", "failed", "timeout", "stopped")
SAVE_EVERY_S = 1.0


def job_request(ctx: RunContext, side: Side, device: str, prov: dict[str, Any],
                data_dir: str) -> dict[str, Any]:
    pb = ctx.playbook
    run_dir = prov["run_dir"]
    output_dir = f"{run_dir}/out/{side.label}"
    values = {"device": device, "data_dir": data_dir, "output_dir": output_dir}
    venv_bin = os.path.dirname(prov["venv_python"]) if "/" in prov["venv_python"] else ""
    env = dict(pb.workload.env)
    env.update({
        "REMOTEMAC_DEVICE": device, "REMOTEMAC_DATA": data_dir, "REMOTEMAC_OUTPUT": output_dir,
        "REMOTEMAC_RUN_ID": ctx.run_id,
        # caches live in the run dir so that wipe and cleanup remove them too
        "TORCH_HOME": f"{run_dir}/cache/torch", "HF_HOME": f"{run_dir}/cache/hf",
        "PIP_CACHE_DIR": f"{run_dir}/cache/pip", "XDG_CACHE_HOME": f"{run_dir}/cache/xdg",
        "MPLCONFIGDIR": f"{run_dir}/cache/mpl",
    })
    if venv_bin and pb.environment.venv:
        env["VIRTUAL_ENV"] = os.path.dirname(venv_bin)
    if venv_bin:
        env["PATH"] = venv_bin + ":/usr/local/bin:/opt/homebrew/bin:/usr/bin:/bin:/usr/sbin:/sbin"
    if device == "mps" and pb.workload.fallback == "diagnostic":
        env["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"
    command = substitute(pb.workload.command, values)
    agent_dir = ctx.host_for(side).agent.agent_dir
    if agent_dir:
        command = wrap_in_harness(command, f"{agent_dir}/harness.py", device=device,
                                  obs=f"{run_dir}/status/{side.label}.obs.json",
                                  metrics=f"{run_dir}/logs/{side.label}.metrics.jsonl",
                                  fallback=pb.workload.fallback)
    return {
        "run_dir": run_dir, "device": side.label, "session": side.session(ctx.run_id),
        "command": f"mkdir -p {shlex.quote(output_dir)} && {command}",
        "metrics_path": f"{run_dir}/logs/{side.label}.rss.jsonl",
        "cwd": f"{run_dir}/project", "env": env, "timeout": pb.workload.timeout,
        "mode": "tmux",
    }


_PYTHON = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)?)?$")
_SHELL_SYNTAX = set("|&;<>()$`\n")


def wrap_in_harness(command: str, harness: str, *, device: str, obs: str, metrics: str,
                    fallback: str) -> str:
    """Run ``python script.py …`` / ``python -m mod …`` inside the agent's MPS harness.

    Anything else (shell syntax, other interpreters, python flags we do not know) runs
    as written: it still gets its log, exit code and RSS samples from the runner.
    """
    if any(c in _SHELL_SYNTAX for c in command):
        return command
    try:
        argv = shlex.split(command)
    except ValueError:
        return command
    if len(argv) < 2 or not _PYTHON.match(argv[0]):
        return command
    rest = argv[1:]
    while rest and rest[0] in ("-u", "-B"):
        rest = rest[1:]
    if not rest or (rest[0].startswith("-") and rest[0] != "-m"):
        return command
    wrapped = [argv[0], harness, "--device", device, "--obs", obs, "--metrics", metrics,
               "--fallback", fallback, "--", *rest]
    return " ".join(shlex.quote(a) for a in wrapped)


async def launch(ctx: RunContext, side: Side, request: dict[str, Any],
                 next_request: dict[str, Any] | None = None) -> dict[str, Any]:
    binding = ctx.host_for(side)
    req = dict(request)
    if next_request is not None:
        req["next"] = next_request
    return await binding.agent.call("launch", req)


async def follow(ctx: RunContext, side: Side, request: dict[str, Any]) -> dict[str, Any]:
    """Stream the log from the saved offset until the job's status is final."""
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
    with open(local_log, "ab") as out:
        while True:
            try:
                chunk = await transport.read_from(remote_log, offset + len(pending))
            except FileNotFoundError:
                chunk = b""
            if chunk:
                pending += chunk
                cut = pending.rfind(b"\n")
                if cut >= 0:
                    complete, pending = pending[: cut + 1], pending[cut + 1 :]
                    out.write(complete)
                    out.flush()
                    for raw in complete.splitlines():
                        lines += 1
                        ctx.emit(LogLine(ctx.run_id, device=side.label,
                                         line=raw.decode("utf-8", "replace"), offset=offset))
                        offset += len(raw) + 1
            now = time.monotonic()
            if now - last_save >= SAVE_EVERY_S:
                ctx.journal.save_log_offset(ctx.run_id, side.label, offset, lines)
                last_save = now
            if chunk and len(chunk) >= (1 << 20):
                continue  # more is waiting: read again before sleeping
            if now - last_status >= 1.0 or not chunk:
                last_status = now
                answer = await binding.agent.call(
                    "status", {"run_dir": request["run_dir"], "device": side.label,
                               "session": request["session"]})
                status = answer.get("status") or {}
                state = answer.get("state")
                if status.get("peak_rss_bytes"):
                    ctx.emit(Metric(ctx.run_id, device=side.label, name="peak_rss_bytes",
                                    value=float(status["peak_rss_bytes"])))
                if state in FINAL and answer.get("log_size", -1) <= offset + len(pending):
                    break
                if state == "lost":
                    ctx.journal.save_log_offset(ctx.run_id, side.label, offset, lines)
                    raise JobLost(
                        f"{transport.name}: the {side.label} job was lost (tmux session gone, "
                        f"no heartbeat for {int(answer['now'] - (status.get('heartbeat_at') or 0))}s)"
                        " — was the host rebooted?"
                    )
                ctx.emit(PhaseProgress(ctx.run_id, phase=f"follow:{side.label}", done=lines,
                                       unit="lines", detail=state or ""))
            if not chunk:
                await asyncio.sleep(poll)
        if pending:  # a last line without newline: the job is over, keep it
            out.write(pending + b"\n")
            lines += 1
            ctx.emit(LogLine(ctx.run_id, device=side.label,
                             line=pending.decode("utf-8", "replace"), offset=offset))
            offset += len(pending)
    ctx.journal.save_log_offset(ctx.run_id, side.label, offset, lines)
    if not status:
        raise HostError(f"{transport.name}: no status for the {side.label} job")
    return {"state": status.get("state"), "exit_code": status.get("exit_code"),
            "started_at": status.get("started_at"), "ended_at": status.get("ended_at"),
            "peak_rss_bytes": status.get("peak_rss_bytes"), "lines": lines, "bytes": offset,
            "reason": status.get("reason")}
