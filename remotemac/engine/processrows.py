"""The record's process-behaviour rows: five questions a careful user asks of a rented
machine (does the job survive a dropped link, a lost host, a drifted environment, a full
disk; can the run be reproduced), each answered from what this run saw.

Why its own module: the rows read the run's follows, stopping conditions and journal,
not the compared results; engine/record.py builds the record and calls
:func:`process_behaviour` once.
"""

from __future__ import annotations

from typing import Any

from remotemac.engine.context import Continuity, RunContext
from remotemac.engine.phaseresults import Condition, Drill, FollowResult, Reproducibility
from remotemac.units import format_size


def _row(question: str, how: str, result: str, evidence: str, outcome: str) -> dict[str, str]:
    return {
        "question": question,
        "how_tested": how,
        "result": result,
        "evidence": evidence,
        "outcome": outcome,
    }


def process_behaviour(
    ctx: RunContext,
    conditions: list[Condition],
    continuity: Continuity,
    again: Reproducibility | None,
) -> list[dict[str, str]]:
    """Five questions a careful user asks of a rented machine, answered by this run:
    from the record's stopping conditions, its continuity and the target run twice."""
    codes = {c.code: c for c in conditions}
    follows = {s.role: (ctx.follow_result(s.role) or FollowResult(), s.label) for s in ctx.sides}
    return [
        _ssh_row(continuity, follows),
        _lost_row(ctx, codes, follows),
        _drift_row(ctx),
        _disk_row(ctx, follows),
        _reproduce_row(ctx, again, codes),
    ]


Follows = dict[str, tuple[FollowResult, str]]
Codes = dict[str, Condition]


def _ssh_row(cont: Continuity, follows: Follows) -> dict[str, str]:
    q = "Does the job survive a dropped SSH session?"
    drill = cont.drill if isinstance(cont.drill, Drill) else None
    label = follows.get("target", (FollowResult(), "target"))[1]
    evidence = f"continuity in acceptance.json; logs/{label}.log"
    if drill is not None and drill.dropped and drill.by != "tui":
        ok = drill.job_kept_running and drill.log_complete
        return _row(
            q,
            "run --drill disconnect: the SSH link was cut once during the target run",
            f"job kept running: {_yes(drill.job_kept_running)}; log complete: "
            f"{_yes(drill.log_complete)}; link back after "
            f"{drill.reconnect_s} s",
            evidence,
            "ok" if ok else "problem",
        )
    drops = cont.disconnects or 0
    how = "counted the link drops during this run (no drill)"
    if drill is not None and drill.by == "tui":
        how = (
            f"the SSH link was cut by hand from the TUI ({drill.dropped} of "
            f"{drill.cuts} drill(s) found a live link); counted the drops"
        )
    if drops:
        target = follows.get("target", (FollowResult(), ""))[0]
        ok = target.finished
        return _row(
            q,
            how,
            f"{drops} disconnect(s), {cont.reconnects or 0} reconnect(s); "
            f"the target job {target.state or 'did not finish'} and its log was "
            "followed from the saved byte offset",
            evidence,
            "ok" if ok else "problem",
        )
    skipped = drill.skipped if drill is not None else None
    return _row(
        q,
        how,
        f"not tested: {skipped or 'no disconnect happened'} (run with "
        "--drill disconnect to test it)",
        evidence,
        "not-tested",
    )


def _lost_row(ctx: RunContext, codes: Codes, follows: Follows) -> dict[str, str]:
    q = "What happens when the machine restarts or the job is lost?"
    mode = ctx.playbook.on_lost
    for role, (follow, label) in follows.items():
        again = follow.relaunched
        if again:
            ok = follow.finished
            return _row(
                q,
                f"on_lost: relaunch: the lost {role} job was relaunched once through "
                f"its {again.command}",
                f"lost ({again.reason}); relaunched; then {follow.state} "
                f"with exit {follow.exit_code}",
                f"logs/{label}.log: {again.marker}",
                "ok" if ok else "problem",
            )
    if "job-lost" in codes:
        return _row(
            q,
            f"on_lost: {mode}",
            f"the job was lost: {codes['job-lost'].detail}",
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


def _drift_row(ctx: RunContext) -> dict[str, str]:
    from remotemac.engine.drift import DriftSummary

    q = "Did a package update change the environment during the run (drift)?"
    drift = ctx.drift or DriftSummary()
    whens = sorted({c.when for c in drift.checks if c.when})
    how = (
        "the environment's fingerprint (Python, OS version, venv package set and its hash, "
        "torch) at launch compared with the host's " + (" and ".join(whens) or "—")
    )
    evidence = "env/drift.jsonl; environment.drift in acceptance.json"
    if not drift.checks:
        return _row(
            q,
            "fingerprint at launch only",
            "not tested: no re-attach and no reference run before the target",
            evidence,
            "not-tested",
        )
    if not drift.drifts:
        return _row(q, how, "no drift", evidence, "ok")
    text = "; ".join(d.detail for d in drift.drifts[:4])
    if drift.torch:
        return _row(q, how, f"torch changed (environment-drift): {text}", evidence, "problem")
    return _row(q, how, f"changed, not torch (a warning): {text}", evidence, "warning")


def _disk_row(ctx: RunContext, follows: Follows) -> dict[str, str]:
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


def _reproduce_row(ctx: RunContext, again: Reproducibility | None, codes: Codes) -> dict[str, str]:
    q = "Does the workflow reproduce after a fresh process?"
    if not ctx.playbook.reproduce or again is None:
        return _row(
            q,
            "reproduce: false",
            "not tested (run with --reproduce or reproduce: true)",
            "—",
            "not-tested",
        )
    files = again.files
    ok = sum(1 for f in files if f.ok)
    how = (
        "reproduce: the target ran a second time in a fresh process (freshly activated venv) "
        "and both outputs were compared with the same tolerances"
    )
    evidence = f"results/{again.first} vs results/{again.second}"
    if again.reproduces:
        return _row(
            q, how, f"reproduces: {ok} of {len(files)} files within tolerance", evidence, "ok"
        )
    met = codes.get("not-reproducible")
    detail = (met.detail if met else None) or "no file compared"
    return _row(
        q,
        how,
        f"does not reproduce: {ok} of {len(files)} files within tolerance; {detail}",
        evidence,
        "problem",
    )


def _yes(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "unknown")
