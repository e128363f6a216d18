"""The record's process-behaviour rows: five questions a careful user asks of a rented
machine (does the job survive a dropped link, a lost host, a drifted environment, a full
disk; can the run be reproduced), each answered from what this run saw.

Why its own module: the rows read the run's follows, stopping conditions and journal,
not the compared results; engine/record.py builds the record and calls
:func:`process_behaviour` once.
"""

from __future__ import annotations

from typing import Any

from remotemac.engine.context import RunContext
from remotemac.engine.phaseresults import FollowResult
from remotemac.units import format_size


def _row(question: str, how: str, result: str, evidence: str, outcome: str) -> dict[str, str]:
    return {
        "question": question,
        "how_tested": how,
        "result": result,
        "evidence": evidence,
        "outcome": outcome,
    }


def process_behaviour(ctx: RunContext, record: dict[str, Any]) -> list[dict[str, str]]:
    """Five questions a careful user asks of a rented machine, answered by this run."""
    codes = {c["code"]: c for c in record.get("stopping_conditions") or []}
    follows = {s.role: (ctx.follow_result(s.role) or FollowResult(), s.label) for s in ctx.sides}
    return [
        _ssh_row(record, follows),
        _lost_row(ctx, codes, follows),
        _drift_row(ctx, codes),
        _disk_row(ctx, codes, follows),
        _reproduce_row(ctx, record, codes),
    ]


Follows = dict[str, tuple[FollowResult, str]]


def _ssh_row(record: dict[str, Any], follows: Follows) -> dict[str, str]:
    q = "Does the job survive a dropped SSH session?"
    cont = record.get("continuity") or {}
    drill = cont.get("drill")
    label = follows.get("target", (FollowResult(), "target"))[1]
    evidence = f"continuity in acceptance.json; logs/{label}.log"
    if isinstance(drill, dict) and drill.get("dropped") and drill.get("by") != "tui":
        ok = drill.get("job_kept_running") and drill.get("log_complete")
        return _row(
            q,
            "run --drill disconnect: the SSH link was cut once during the target run",
            f"job kept running: {_yes(drill.get('job_kept_running'))}; log complete: "
            f"{_yes(drill.get('log_complete'))}; link back after "
            f"{drill.get('reconnect_s')} s",
            evidence,
            "ok" if ok else "problem",
        )
    drops = cont.get("disconnects") or 0
    how = "counted the link drops during this run (no drill)"
    if isinstance(drill, dict) and drill.get("by") == "tui":
        how = (
            f"the SSH link was cut by hand from the TUI ({drill.get('dropped')} of "
            f"{drill.get('cuts')} drill(s) found a live link); counted the drops"
        )
    if drops:
        target = follows.get("target", (FollowResult(), ""))[0]
        ok = target.finished
        return _row(
            q,
            how,
            f"{drops} disconnect(s), {cont.get('reconnects') or 0} reconnect(s); "
            f"the target job {target.state or 'did not finish'} and its log was "
            "followed from the saved byte offset",
            evidence,
            "ok" if ok else "problem",
        )
    skipped = drill.get("skipped") if isinstance(drill, dict) else None
    return _row(
        q,
        how,
        f"not tested: {skipped or 'no disconnect happened'} (run with "
        "--drill disconnect to test it)",
        evidence,
        "not-tested",
    )


def _lost_row(ctx: RunContext, codes: dict[str, Any], follows: Follows) -> dict[str, str]:
    q = "What happens when the machine restarts or the job is lost?"
    mode = ctx.playbook.on_lost
    for role, (follow, label) in follows.items():
        again = follow.relaunched
        if again:
            ok = follow.finished
            return _row(
                q,
                f"on_lost: relaunch: the lost {role} job was relaunched once through "
                f"its {again.get('command')}",
                f"lost ({again.get('reason')}); relaunched; then {follow.state} "
                f"with exit {follow.exit_code}",
                f"logs/{label}.log: {again.get('marker')}",
                "ok" if ok else "problem",
            )
    if "job-lost" in codes:
        return _row(
            q,
            f"on_lost: {mode}",
            f"the job was lost: {codes['job-lost']['detail']}",
            "stopping condition job-lost",
            "problem",
        )
    return _row(
        q,
        f"on_lost: {mode}",
        "not tested: no job was lost during this run",
        "status/<label>.json heartbeats",
        "not-tested",
    )


def _drift_row(ctx: RunContext, codes: dict[str, Any]) -> dict[str, str]:
    q = "Did a package update change the environment during the run (drift)?"
    drift = ctx.drift or {"checks": [], "drifts": [], "torch": []}
    whens = sorted({c["when"] for c in drift["checks"] if c.get("when")})
    how = (
        "the environment's fingerprint (Python, OS version, venv package set and its hash, "
        "torch) at launch compared with the host's " + (" and ".join(whens) or "—")
    )
    evidence = "env/drift.jsonl; environment.drift in acceptance.json"
    if not drift["checks"]:
        return _row(
            q,
            "fingerprint at launch only",
            "not tested: no re-attach and no reference run before the target",
            evidence,
            "not-tested",
        )
    if not drift["drifts"]:
        return _row(q, how, "no drift", evidence, "ok")
    text = "; ".join(d["detail"] for d in drift["drifts"][:4])
    if drift["torch"]:
        return _row(q, how, f"torch changed (environment-drift): {text}", evidence, "problem")
    return _row(q, how, f"changed, not torch (a warning): {text}", evidence, "warning")


def _disk_row(ctx: RunContext, codes: dict[str, Any], follows: Follows) -> dict[str, str]:
    q = "What happens when the disk fills up?"
    min_free = int(ctx.playbook.stop_when.min_free_disk)
    how = (
        f"the runner checks free space on remote_root's volume every 0.5 s and stops the job "
        f"(SIGTERM, then SIGKILL) below stop_when.min_free_disk = {format_size(min_free)}"
    )
    seen = (f.min_free_seen() for f, _label in follows.values())
    lows: list[float] = [float(x) for x in seen if x is not None]
    stopped = [
        (role, f, label) for role, (f, label) in follows.items() if f.state == "storage-limit"
    ]
    if stopped:
        role, follow, label = stopped[0]
        return _row(
            q,
            how,
            f"the {role} job was stopped with storage-limit before the volume "
            f"was full: {follow.reason}; its log and status were kept",
            f"logs/{label}.log; status/{label}.json",
            "problem",
        )
    warned = [f.disk_warning for f, _label in follows.values() if f.disk_warning]
    if not lows:
        return _row(q, how, "not measured (the runner reported no disk figures)", "—", "not-tested")
    result = f"limit not reached; lowest free space seen {format_size(min(lows))}"
    if warned:
        result += f"; warning: {warned[0]}"
    return _row(q, how, result, "disk in status/<label>.json", "warning" if warned else "ok")


def _reproduce_row(
    ctx: RunContext, record: dict[str, Any], codes: dict[str, Any]
) -> dict[str, str]:
    q = "Does the workflow reproduce after a fresh process?"
    again = (record.get("observations") or {}).get("reproducibility")
    if not ctx.playbook.reproduce or not again:
        return _row(
            q,
            "reproduce: false",
            "not tested (run with --reproduce or reproduce: true)",
            "—",
            "not-tested",
        )
    files = again.get("files") or []
    ok = sum(1 for f in files if f.get("ok"))
    how = (
        "reproduce: the target ran a second time in a fresh process (freshly activated venv) "
        "and both outputs were compared with the same tolerances"
    )
    evidence = f"results/{again.get('first')} vs results/{again.get('second')}"
    if again.get("reproduces"):
        return _row(
            q, how, f"reproduces: {ok} of {len(files)} files within tolerance", evidence, "ok"
        )
    detail = codes.get("not-reproducible", {}).get("detail") or "no file compared"
    return _row(
        q,
        how,
        f"does not reproduce: {ok} of {len(files)} files within tolerance; {detail}",
        evidence,
        "problem",
    )


def _yes(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "unknown")
