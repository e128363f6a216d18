"""Compare the pulled outputs and write the acceptance record from what the run saw."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remotemac.acceptance.markdown import ENV_FACT_KEYS
from remotemac.acceptance.observations import (
    Memory,
    Observations,
    Operators,
    ProcessSeen,
    ResultsSeen,
)
from remotemac.agent.protocol import JsonObject
from remotemac.engine.context import Continuity, RunContext, Side
from remotemac.engine.drift import DriftSummary
from remotemac.engine.jsonpart import JsonPart, json_of
from remotemac.engine.ledger import REDACTED, redact
from remotemac.engine.phaseresults import (
    NOT_LAUNCHED,
    CompareResult,
    Condition,
    Drill,
    ProvisionResult,
    RecordResult,
    Reproducibility,
    SyncHost,
    SyncResult,
    WipeResult,
)
from remotemac.engine.processrows import process_behaviour
from remotemac.phases import Phase
from remotemac.units import iso_utc

ENV_MISMATCH_KEYS = ("torch", "numpy", "python", "lock_hash")


def compare_results(ctx: RunContext) -> CompareResult:
    from remotemac.acceptance.compare import CompareRule, compare_outputs

    ref, tgt, again = ctx.side("reference"), ctx.side("target"), ctx.side("reproduce")
    rules = list(ctx.playbook.outputs.compare) or [CompareRule(file="**/*")]
    results = ctx.out_dir / "results"
    target_follow = ctx.follow_result(tgt.role) if tgt is not None else None
    if ref is None or tgt is None:
        outcome = CompareResult(summary="no reference to compare with")
    elif target_follow is not None and not target_follow.launched:
        outcome = CompareResult(
            nothing_compared=True,
            # why it was not: the reference failed, or the host's disk refused its launch
            summary=f"nothing to compare: the target was {target_follow.summary}"
            if target_follow.summary.startswith("not launched")
            else "nothing to compare: the target was not launched",
        )
    elif not _any_file(results / ref.label) and not _any_file(results / tgt.label):
        # nothing to compare is no evidence either way: incomplete, never "rejected"
        outcome = CompareResult(
            nothing_compared=True,
            summary="nothing to compare: neither side wrote a file under "
            "{output_dir} (outputs.path: "
            f"{ctx.playbook.outputs.path})",
        )
    else:
        found = CompareResult.from_json(
            compare_outputs(results / ref.label, results / tgt.label, rules).to_dict()
        )
        outcome = CompareResult(within_tolerance=found.within_tolerance, files=found.files)
        ok = sum(1 for f in outcome.files if f.ok)
        outcome.summary = f"{ok}/{len(outcome.files)} files within tolerance"
        skipped = [f for f in outcome.files if f.ok is None]
        if skipped:
            outcome.summary += f"; {len(skipped)} not compared: " + "; ".join(
                f"{f.path}: {f.not_compared}" for f in skipped[:3]
            )
        converted = [f.path for f in outcome.files if f.converted]
        if converted:
            outcome.converted = converted
    if tgt is not None and again is not None:
        # the same rules, target against target: does the workflow reproduce on this machine?
        twice = CompareResult.from_json(
            compare_outputs(results / tgt.label, results / again.label, rules).to_dict()
        )
        outcome.reproducibility = Reproducibility(
            reproduces=twice.within_tolerance,
            first=tgt.label,
            second=again.label,
            files=twice.files,
        )
        ok = sum(1 for f in twice.files if f.ok)
        outcome.summary += f"; reproduce: {ok}/{len(twice.files)} files"
    return outcome


def _any_file(directory: Path) -> bool:
    return directory.is_dir() and any(p.is_file() for p in directory.rglob("*"))


def read_jsonl(path: Path) -> list[JsonObject]:
    """The rows of a JSON-lines file (metrics, ledger); a torn line left out, none when missing."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


@dataclass
class Sample(JsonPart):
    """One row of the runner's ``<label>.rss.jsonl`` (or an older run's harness
    ``<label>.metrics.jsonl``): when, the job's memory by each measure, and how far the
    job had got (torch imported: ``observed``; optimizer ``steps``)."""

    t: float = 0.0
    rss_bytes: float | None = None
    own_bytes: float | None = None
    own_kind: str | None = None
    mps_driver_allocated_bytes: float | None = None
    source: str | None = None
    observed: int | None = None
    steps: int | None = None


def read_samples(path: Path) -> list[Sample]:
    return [Sample.from_json(r) for r in read_jsonl(path)]


#: the memory trend's warm-up ends after this many optimizer steps, when they are known
WARMUP_STEPS = 5


def warmup_hints(logs: Path, label: str) -> dict[str, float | None]:
    """When the job had imported torch and taken its first optimizer steps (the runner's
    ``observed``/``steps`` columns), for the memory trend's warm-up."""
    rows = read_samples(logs / f"{label}.rss.jsonl")
    active = next((float(r.t) for r in rows if (r.observed or 0) > 0), None)
    warm = next((float(r.t) for r in rows if (r.steps or 0) >= WARMUP_STEPS), None)
    return {"active_from": active, "warm_at": warm}


def memory_samples(logs: Path, label: str) -> tuple[list[tuple[float, float]], str]:
    """(t, bytes) of the job and what they measure: Metal's driver memory summed over the
    observed processes on MPS, else RSS summed over the job's process tree (the runner's
    samples; an older run's harness metrics when that is all there is)."""
    rows = read_samples(logs / f"{label}.rss.jsonl") or read_samples(
        logs / f"{label}.metrics.jsonl"
    )
    kinds = {r.own_kind for r in rows}
    if any(r.mps_driver_allocated_bytes for r in rows):
        key, source = "mps_driver_allocated_bytes", "mps-driver"
    elif rows and len(kinds) == 1 and None not in kinds:
        # the job's own use in every sample: PSS (Linux) or phys_footprint (macOS), where
        # a forked DataLoader worker's shared pages count once, not once per worker
        key, source = (
            "own_bytes",
            f"process-tree-{'footprint' if kinds == {'phys-footprint'} else 'pss'}",
        )
    else:
        key = "rss_bytes"
        source = (
            "process-tree-rss" if any(r.source == "process-tree" for r in rows) else "process-rss"
        )
    measured = ((r.t, getattr(r, key)) for r in rows)
    return [(float(t), float(b)) for t, b in measured if b], source


@dataclass
class Harness(JsonPart):
    """What the job's in-process observer wrote (``<label>.obs.json``): whether torch was
    imported, where the tensors were, the operators that fell back or failed, the
    processes, its own high-water mark and the stopping conditions it saw."""

    torch_version: str | None = None
    torch_imported: bool | None = None
    tensors_on_device: bool | None = None
    operators: dict[str, list[Any] | None] | None = None
    processes: list[JsonObject] | None = None
    peak_rss_bytes: int | None = None
    stopping_conditions: list[Condition] | None = None

    PARTS = {"stopping_conditions": Condition}

    @property
    def torch_seen(self) -> bool:
        """A job that never imported torch showed nothing about operators or devices."""
        return bool(self.torch_version or self.torch_imported)


def _harness(logs: Path, label: str) -> Harness | None:
    """What the job's in-process observer wrote (``<label>.obs.json``), None without one."""
    obs_file = logs / f"{label}.obs.json"
    data = json.loads(obs_file.read_text()) if obs_file.exists() else {}
    return Harness.from_json(data) if data else None


def _memory(logs: Path, label: str, harness: Harness | None) -> Memory:
    """The job's memory: the trend of its samples, their source, and the peaks."""
    from remotemac.acceptance.decide import memory_stable

    samples, source = memory_samples(logs, label)
    figures = (
        memory_stable(samples, **warmup_hints(logs, label))
        if samples
        else {"peak_bytes": None, "stable": None, "slope_bytes_per_s": None}
    )
    memory = Memory(figures)
    figures["source"] = source if samples else None
    # a sample every 0.5 s can miss a short spike; each process's own high-water mark
    # (ru_maxrss, reported by its observer) cannot
    summed_rss = [int(r.rss_bytes or 0) for r in read_samples(logs / f"{label}.rss.jsonl")]
    own_peak = int((harness.peak_rss_bytes if harness else None) or 0)
    rss_peak = max(summed_rss + [own_peak])
    figures["rss_peak_bytes"] = rss_peak or None
    if samples and source != "mps-driver":
        # with the job's own use measured, the summed RSS counts shared pages again per
        # process: only one process's high-water mark (a floor of the job's use) joins it
        floor = own_peak if source.endswith(("pss", "footprint")) else rss_peak
        memory.peak_bytes = max(memory.peak_bytes or 0, floor)
    figures["samples"] = [[t, b] for t, b in samples][-200:]
    return memory


def observe(harness: Harness | None, memory: Memory, compare: CompareResult) -> Observations:
    """The record's observations from the observer's report, the memory and the compare."""
    # a job that never imported torch showed nothing about operators or devices:
    # "not observed", never an empty list that reads as "pass"
    torch_seen = harness is not None and harness.torch_seen
    operators = harness.operators if harness is not None and torch_seen else None
    return Observations(
        tensors_on_device=harness.tensors_on_device if harness and torch_seen else None,
        operators=Operators.from_dict(operators or {}),
        torch_imported=torch_seen if harness else None,
        memory=memory,
        processes=[ProcessSeen.from_json(p) for p in harness.processes]
        if harness and harness.processes is not None
        else None,
        # whole-model pickles the host turned into tensors after the job: ``converted``
        results=ResultsSeen(
            compare.within_tolerance, [f.to_json() for f in compare.files], compare.converted or []
        ),
        reproducibility=json_of(compare.reproducibility),
    )


def _observations(ctx: RunContext) -> tuple[Observations, list[Condition]]:
    """What the target job showed, and the stopping conditions met while it ran."""
    tgt = ctx.side("target")
    assert tgt is not None
    logs = ctx.out_dir / "logs"
    harness = _harness(logs, tgt.label)
    compare = ctx.result(Phase.COMPARE) or CompareResult()
    observations = observe(harness, _memory(logs, tgt.label, harness), compare)
    # fallback ops are judged against stop_when.fallback_ops by the record builder
    seen = (harness.stopping_conditions if harness else None) or []
    conditions = [c for c in seen if c.code != "fallback-op"]
    conditions += _cuda_conditions(ctx, logs, tgt)
    conditions += _job_conditions(ctx, logs)
    conditions += _reproduce_conditions(compare.reproducibility)
    conditions += _drift_conditions(ctx)
    return observations, conditions


def _cuda_conditions(ctx: RunContext, logs: Path, tgt: Side) -> list[Condition]:
    """The target's log; a reference that failed on a CUDA path (its target then not
    launched) shows the same dependency in its own log: the workload needs CUDA anywhere."""
    from remotemac.acceptance.cudalog import scan_log

    cuda_hits = scan_log(logs / f"{tgt.label}.log")
    for side in ctx.sides:
        if not cuda_hits and side.role == "reference":
            cuda_hits = scan_log(logs / f"{side.label}.log")
    if not cuda_hits:
        return []
    first = cuda_hits[0]
    return [
        Condition(
            code="cuda-dependency",
            detail=f"{first['why']}: line {first['line_no']} of {first['log']}: {first['line']}",
            extra={"lines": cuda_hits},
        )
    ]


def _job_conditions(ctx: RunContext, logs: Path) -> list[Condition]:
    """A job stopped before the volume was full, or one that did not finish."""
    conditions: list[Condition] = []
    for side in ctx.sides:
        follow = ctx.follow_result(side.role)
        if follow is None:
            continue
        if follow.state == "storage-limit":
            conditions.append(
                Condition(
                    code="storage-limit",
                    detail=f"{side.role} job stopped cleanly before the volume "
                    f"was full: {follow.reason}",
                )
            )
        elif follow.state not in ("finished", NOT_LAUNCHED):
            line = last_error_line(logs / f"{side.label}.log")
            conditions.append(
                Condition(
                    code="workload-failed",
                    detail=f"{side.role} job {follow.state} with exit "
                    f"{follow.exit_code}" + (f": {line}" if line else ""),
                )
            )
    return conditions


def _reproduce_conditions(again: Reproducibility | None) -> list[Condition]:
    if again is None or again.reproduces is not False:
        return []
    bad = [f for f in again.files if not f.ok]
    path, detail = (bad[0].path, bad[0].detail) if bad else (None, None)
    return [
        Condition(
            code="not-reproducible",
            detail=f"a second run of the target in a fresh process gave "
            f"different outputs: {path} "
            f"{detail or ''}".strip(),
        )
    ]


def _drift_conditions(ctx: RunContext) -> list[Condition]:
    """torch changed on a host since launch (the drift check's findings)."""
    from remotemac.engine.drift import drift_summary, load_drift

    drift = drift_summary(load_drift(ctx.out_dir))
    ctx.drift = drift
    return [
        Condition(
            code="environment-drift",
            detail=f"{change.host}: torch changed since launch ({change.when}): {change.detail}",
        )
        for change in drift.torch
    ]


ERROR_MARKERS = (
    "Error",
    "error:",
    "Exception",
    "Traceback",
    "No such file",
    "not found",
    "Killed",
    "Segmentation fault",
)


def last_error_line(log: Path, scan: int = 64 * 1024) -> str | None:
    """The line that says why a job failed: the last error-looking line of its log's tail."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, log.stat().st_size - scan))
            tail = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    lines = [ln.strip() for ln in tail if ln.strip()]
    for line in reversed(lines):
        if any(m in line for m in ERROR_MARKERS) and not line.startswith("File "):
            return line[:300]
    return lines[-1][:300] if lines else None


#: workload.env names whose values are tuning knobs, kept in records when they do not
#: look like a secret; every other value is redacted unless ``--show-secrets``
SAFE_ENV_PREFIXES = (
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "VECLIB_",
    "CUDA_VISIBLE_DEVICES",
    "TORCH_",
    "NUMEXPR_",
    "TOKENIZERS_PARALLELISM",
)


def record_env(ctx: RunContext) -> dict[str, str]:
    """workload.env as records show it: values treated as possibly secret.

    Why: the env is where users put API tokens for the workload, and records
    (acceptance.json, env/*.json) are shared. A known tuning knob
    (PYTORCH_*, OMP_NUM_THREADS, …) keeps its value unless it looks like a secret.
    """
    env = dict(ctx.playbook.workload.env)
    if ctx.options.show_secrets:
        return env
    return {
        k: v if k.startswith(SAFE_ENV_PREFIXES) and redact(v) == v else REDACTED
        for k, v in env.items()
    }


def record_command(ctx: RunContext) -> str:
    """The workload command as records show it: tokens, passwords, keys and every
    workload.env value redacted (``--show-secrets`` keeps it verbatim)."""
    command = ctx.playbook.workload.command
    if ctx.options.show_secrets:
        return command
    hidden = [
        v
        for k, v in ctx.playbook.workload.env.items()
        if len(v) >= 4 and record_env(ctx).get(k) == REDACTED
    ]
    return redact(command, hidden)


def _environment(ctx: RunContext) -> JsonObject:
    """Each side's freeze (env/<role>.json) and what differs between them that matters."""
    prov = ctx.result(Phase.PROVISION) or ProvisionResult()
    dataset = _dataset(ctx)
    sides: dict[str, JsonObject] = {}
    for side in ctx.sides:
        if side.role == "reproduce":
            continue  # the target's environment, once more
        host = prov.host(side.host_key)
        probe = host.probe
        sides[side.role] = {
            "host": ctx.hosts[side.host_key].transport.name,
            "device": prov.devices.get(side.role),
            **{k: probe.fact(k) for k in (*ENV_FACT_KEYS, "cuda_available")},
            "lock_hash": host.lock_hash,
            # which Python the venv was made from; ``brought``: remotemac brought it
            "interpreter": json_of(host.interpreter),
            "project": prov.project,
            "dataset_revision": dataset.revision,
            "command": record_command(ctx),
            "pytorch_env": {
                **(probe.pytorch_env if probe.pytorch_env is not None else {}),
                **{k: v for k, v in record_env(ctx).items() if k.startswith("PYTORCH_")},
            },
            "packages": probe.packages,
        }
    env_dir = ctx.out_dir / "env"
    env_dir.mkdir(exist_ok=True)
    for role, data in sides.items():
        (env_dir / f"{role}.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    mismatches = []
    if "reference" in sides and "target" in sides:
        ref, tgt = sides["reference"], sides["target"]
        for key in ENV_MISMATCH_KEYS:
            if ref[key] != tgt[key]:
                mismatches.append({"key": key, "reference": ref[key], "target": tgt[key]})
        a, b = ref["packages"] or {}, tgt["packages"] or {}
        for name in sorted(set(a) | set(b)):
            if name not in ("torch", "numpy") and a.get(name) != b.get(name):
                mismatches.append(
                    {"key": f"package:{name}", "reference": a.get(name), "target": b.get(name)}
                )
    brief = {
        role: {k: v for k, v in data.items() if k != "packages"} for role, data in sides.items()
    }
    drift = ctx.drift or DriftSummary()
    return {
        **{role: brief.get(role) for role in ("reference", "target")},
        "mismatches": mismatches,
        "drift": drift.record_form(),
    }


def _dataset(ctx: RunContext) -> SyncHost:
    return (ctx.result(Phase.SYNC) or SyncResult()).dataset()


def _deadman_guard(sync: SyncHost) -> JsonObject | None:
    """Which dead-man guard held for the run (agent/deadman.py's job), or None without
    ``wipe_deadline``: launchd in the domain ``launchctl print`` found it in, or the sleeper."""
    return sync.deadman.guard() if sync.deadman is not None else None


def _decision_context(ctx: RunContext) -> JsonObject:
    """The playbook's purpose plus the CUDA-only dependencies the audit finds in the project."""
    purpose = ctx.playbook.purpose
    blockers: list[str] = []
    try:
        from remotemac.checks.audit import audit_project

        report = audit_project(ctx.playbook.project_dir())
        blockers = [
            f"{f.file}:{f.line} {f.text.strip()[:80]}"
            for f in report.findings
            if f.severity == "blocker"
        ]
        from remotemac.acceptance.cudalog import scan_log

        for side in (ctx.side("target"), ctx.side("reference")):
            hits = scan_log(ctx.out_dir / "logs" / f"{side.label}.log") if side else []
            if hits:
                blockers += [f"log {h['log']}:{h['line_no']} {h['line'][:80]}" for h in hits[:3]]
                break
    except Exception as exc:  # the audit informs the decision; it must not sink the record
        blockers = []
        ctx.ledger.append("local", f"audit for the decision failed: {exc}", None, op="audit")
    prov, compare = ctx.result(Phase.PROVISION), ctx.result(Phase.COMPARE)
    return {
        "goal": purpose.goal,
        "trains_on_linux": purpose.trains_on_linux,
        "results_summary": compare.summary if compare else None,
        "target_device": prov.devices.get("target") if prov else None,
        "ships_on_macos": purpose.ships_on_macos,
        "multi_gpu": purpose.multi_gpu,
        "cuda_dependencies": blockers,
    }


def continuity(ctx: RunContext) -> Continuity:
    """Disconnects and reconnects over the whole run (earlier processes included), and the drill."""
    from remotemac.engine.jobs import continuity_totals

    totals = Continuity.of(continuity_totals(ctx, ctx.link_tally, ctx.carried_phases))
    if ctx.drills and not isinstance(totals.drill, Drill):
        totals.drill = Drill.from_json(
            {
                "kind": "disconnect",
                "by": "tui",
                "cuts": len(ctx.drills),
                "dropped": sum(1 for d in ctx.drills if d.dropped),
                "at": [d.at for d in ctx.drills],
            }
        )
    ctx.continuity = totals
    return totals


def _iso(ts: float | None) -> str | None:
    return iso_utc(ts) if ts else None


def reproduce_command(ctx: RunContext) -> str:
    row = ctx.journal.get_run(ctx.run_id)
    source = row.playbook_path if row and row.playbook_path else f"{ctx.playbook.name}.yaml"
    parts = ["remotemac", "run", source, "--host", ctx.playbook.host]
    if ctx.playbook.reproduce:
        parts.append("--reproduce")
    return " ".join(shlex.quote(p) for p in parts)


def caches(ctx: RunContext) -> list[JsonObject]:
    """The caches the workload was pointed at (inside the run dir, so wiped with it)."""
    from remotemac.engine.jobs import CACHE_VARS

    tgt = ctx.side("target")
    prov = ctx.result(Phase.PROVISION)
    if tgt is None or prov is None or tgt.host_key not in prov.hosts:
        return []
    run_dir = prov.hosts[tgt.host_key].run_dir
    # every job on a host shares these dirs: any launch's access check covers them (a
    # target chained after the reference on the host is checked there, not by a launch phase)
    checked: dict[str, bool | None] = {}
    for side in ctx.sides:
        launched = ctx.launch_result(side.role)
        if launched is not None and side.host_key == tgt.host_key:
            checked.update(launched.checked_paths())
    paths = {
        "TORCH_HOME": "torch",
        "HF_HOME": "hf",
        "PIP_CACHE_DIR": "pip",
        "XDG_CACHE_HOME": "xdg",
        "MPLCONFIGDIR": "mpl",
    }
    return [
        {
            "env": var,
            "path": f"{run_dir}/cache/{paths[var]}",
            "writable": checked.get(f"{run_dir}/cache/{paths[var]}"),
        }
        for var in CACHE_VARS
    ]


def trace_tol(ctx: RunContext) -> tuple[float, float] | None:
    """The divergence compare's tolerance: the first compare rule's that gives one."""
    from remotemac.acceptance.compare import FLOAT32_TOL

    return next(
        (
            (
                r.rtol if r.rtol is not None else FLOAT32_TOL[0],
                r.atol if r.atol is not None else FLOAT32_TOL[1],
            )
            for r in ctx.playbook.outputs.compare
            if r.rtol is not None or r.atol is not None
        ),
        None,
    )


def divergence(ctx: RunContext) -> JsonObject | None:
    """Where the target first diverges from the reference, from the two pulled traces
    (``workload.trace``) and the drill passes' op traces when they ran."""
    from remotemac.acceptance.divergence import divergence_for

    ref, tgt = ctx.side("reference"), ctx.side("target")
    if ref is None or tgt is None:
        return None
    logs = ctx.out_dir / "logs"
    found = divergence_for(
        logs / f"{ref.label}.trace.jsonl", logs / f"{tgt.label}.trace.jsonl", trace_tol(ctx)
    )
    return found.to_dict()


async def write_acceptance(ctx: RunContext, lost: str | None = None) -> RecordResult:
    from remotemac.acceptance.record import build_record, write_record

    observations, conditions = _observations(ctx)
    if lost:
        conditions.append(Condition(code="job-lost", detail=lost))
    row = ctx.journal.get_run(ctx.run_id)
    started = row.created_at if row else time.time()
    finished = time.time()
    hours = (finished - started) / 3600
    cost = ctx.playbook.cost
    sync = _dataset(ctx)
    counters = continuity(ctx)
    record = build_record(
        run_id=ctx.run_id,
        playbook=ctx.playbook.name,
        host=ctx.playbook.host,
        started_at=_iso(started),
        finished_at=_iso(finished),
        observations=observations,
        stopping_conditions=[c.to_json() for c in conditions],
        stop_when=ctx.playbook.stop_when.model_dump(),
        environment=_environment(ctx),
        context=_decision_context(ctx),
        dataset={
            "revision": sync.revision,
            "files": sync.files,
            "bytes": sync.bytes,
            "encrypted": sync.encrypted,
        },
        continuity=counters.record_form(),
        cost={
            "hours": round(hours, 4),
            "hourly_rate": cost.hourly_rate,
            "amount": round(hours * cost.hourly_rate, 4),
            "currency": cost.currency,
        },
        reproduce=reproduce_command(ctx),
        caches=caches(ctx),
        deadman=_deadman_guard(sync),
    )
    met = [Condition.from_json(c) for c in record["stopping_conditions"]]
    again = (ctx.result(Phase.COMPARE) or CompareResult()).reproducibility
    record["process_behaviour"] = process_behaviour(ctx, met, counters, again)
    record["cpu"] = _cpu(ctx)
    if ctx.playbook.workload.trace is not None:
        record["divergence"] = divergence(ctx)
    write_record(ctx.out_dir, record)
    return RecordResult(verdict=record["verdict"], summary=record["verdict"], conditions=met)


def update_record_wipe(ctx: RunContext, wipe: WipeResult) -> None:
    """Fold the wipe's outcome into the already written record."""
    from remotemac.acceptance.record import write_record

    path = ctx.out_dir / "acceptance.json"
    if not path.exists():
        return
    record = json.loads(path.read_text(encoding="utf-8"))
    record["wipe"] = wipe.record_form()
    record["cpu"] = _cpu(ctx)  # the wipe's calls count too
    write_record(ctx.out_dir, record)


def _cpu(ctx: RunContext) -> JsonObject:
    from remotemac.engine.cpuusage import run_cpu

    return run_cpu(ctx.cpu_start, [b.agent for b in ctx.hosts.values()])
