"""Compare the pulled outputs and write the acceptance record from what the run saw."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

from remotemac.engine.context import RunContext

ENV_MISMATCH_KEYS = ("torch", "numpy", "python", "lock_hash")


def compare_results(ctx: RunContext) -> dict[str, Any]:
    from remotemac.acceptance.compare import CompareRule, compare_outputs

    ref, tgt = ctx.side("reference"), ctx.side("target")
    if ref is None or tgt is None:
        return {"within_tolerance": None, "files": [], "summary": "no reference to compare with"}
    rules = [CompareRule(file=r.file, rtol=r.rtol, atol=r.atol)
             for r in ctx.playbook.outputs.compare]
    if not rules:
        rules = [CompareRule(file="**/*", rtol=None, atol=None)]
    results = ctx.out_dir / "results"
    outcome = compare_outputs(results / ref.label, results / tgt.label, rules).to_dict()
    ok = sum(1 for f in outcome["files"] if f.get("ok"))
    outcome["summary"] = f"{ok}/{len(outcome['files'])} files within tolerance"
    return outcome


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def memory_samples(logs: Path, label: str) -> list[tuple[float, float]]:
    """(t, bytes): Metal's driver memory on MPS, else the process RSS (harness or runner)."""
    rows = _read_jsonl(logs / f"{label}.metrics.jsonl") or _read_jsonl(logs / f"{label}.rss.jsonl")
    key = "mps_driver_allocated_bytes" if any(r.get("mps_driver_allocated_bytes") for r in rows) \
        else "rss_bytes"
    return [(float(r["t"]), float(r[key])) for r in rows if r.get(key)]


def _observations(ctx: RunContext) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from remotemac.acceptance.decide import memory_stable

    tgt = ctx.side("target")
    assert tgt is not None
    logs = ctx.out_dir / "logs"
    obs_file = logs / f"{tgt.label}.obs.json"
    harness = json.loads(obs_file.read_text()) if obs_file.exists() else {}
    samples = memory_samples(logs, tgt.label)
    duration = samples[-1][0] - samples[0][0] if len(samples) > 1 else 0.0
    memory = memory_stable(samples, warmup_s=min(10.0, 0.25 * duration)) if samples else {
        "peak_bytes": None, "stable": None, "slope_bytes_per_s": None}
    memory["samples"] = [[t, b] for t, b in samples][-200:]
    operators = harness.get("operators") or {}
    compare = ctx.results.get("compare", {})
    observations = {
        "tensors_on_device": harness.get("tensors_on_device"),
        "operators": {
            "fallback_ops": operators.get("fallback_ops"),
            "unsupported_ops": operators.get("unsupported_ops"),
            "dtype_errors": operators.get("dtype_errors"),
        },
        "memory": memory,
        "results": {"within_tolerance": compare.get("within_tolerance"),
                    "files": compare.get("files", [])},
    }
    # fallback ops are judged against stop_when.fallback_ops by the record builder
    conditions = [c for c in harness.get("stopping_conditions") or []
                  if c.get("code") != "fallback-op"]
    from remotemac.acceptance.cudalog import scan_log

    cuda_hits = scan_log(logs / f"{tgt.label}.log")
    if cuda_hits:
        first = cuda_hits[0]
        conditions.append({"code": "cuda-dependency",
                           "detail": f"{first['why']}: line {first['line_no']} of "
                                     f"{first['log']}: {first['line']}",
                           "lines": cuda_hits})
    for side in ctx.sides:
        follow = ctx.results.get(f"follow:{side.role}", {})
        if follow and follow.get("state") != "finished":
            conditions.append({"code": "workload-failed",
                               "detail": f"{side.role} job {follow.get('state')} with exit "
                                         f"{follow.get('exit_code')}"})
    return observations, conditions


def _environment(ctx: RunContext) -> dict[str, Any]:
    """Each side's freeze (env/<role>.json) and what differs between them that matters."""
    prov = ctx.results.get("provision", {})
    dataset = _dataset(ctx)
    sides = {}
    for side in ctx.sides:
        host = prov.get("hosts", {}).get(side.host_key, {})
        frozen = dict(host.get("probe", {}))
        packages = frozen.pop("packages", None)
        sides[side.role] = {
            "host": ctx.hosts[side.host_key].transport.name,
            "device": prov.get("devices", {}).get(side.role),
            **{k: frozen.get(k) for k in ("os", "os_version", "arch", "chip", "python", "torch",
                                          "numpy", "mps_built", "mps_available", "cuda_available")},
            "lock_hash": host.get("lock_hash"),
            "project": prov.get("project"),
            "dataset_revision": dataset.get("revision"),
            "command": ctx.playbook.workload.command,
            "pytorch_env": {**frozen.get("pytorch_env", {}),
                            **{k: v for k, v in ctx.playbook.workload.env.items()
                               if k.startswith("PYTORCH_")}},
            "packages": packages,
        }
    env_dir = ctx.out_dir / "env"
    env_dir.mkdir(exist_ok=True)
    for role, data in sides.items():
        (env_dir / f"{role}.json").write_text(json.dumps(data, indent=2), encoding="utf-8")
    mismatches = []
    if "reference" in sides and "target" in sides:
        ref, tgt = sides["reference"], sides["target"]
        for key in ENV_MISMATCH_KEYS:
            if ref.get(key) != tgt.get(key):
                mismatches.append({"key": key, "reference": ref.get(key), "target": tgt.get(key)})
        a, b = ref.get("packages") or {}, tgt.get("packages") or {}
        for name in sorted(set(a) | set(b)):
            if name not in ("torch", "numpy") and a.get(name) != b.get(name):
                mismatches.append({"key": f"package:{name}", "reference": a.get(name),
                                   "target": b.get(name)})
    brief = {role: {k: v for k, v in data.items() if k != "packages"}
             for role, data in sides.items()}
    return {"reference": brief.get("reference"), "target": brief.get("target"),
            "mismatches": mismatches}


def _dataset(ctx: RunContext) -> dict[str, Any]:
    hosts = ctx.results.get("sync", {}).get("hosts", {})
    return hosts.get("remote") or next(iter(hosts.values()), {})


def _decision_context(ctx: RunContext) -> dict[str, Any]:
    """The playbook's purpose plus the CUDA-only dependencies the audit finds in the project."""
    purpose = ctx.playbook.purpose
    blockers: list[str] = []
    try:
        from remotemac.checks.audit import audit_project

        report = audit_project(ctx.playbook.project_dir())
        blockers = [f"{f.file}:{f.line} {f.text.strip()[:80]}" for f in report.findings
                    if f.severity == "blocker"]
        from remotemac.acceptance.cudalog import scan_log

        tgt = ctx.side("target")
        if tgt is not None:
            blockers += [f"log {h['log']}:{h['line_no']} {h['line'][:80]}"
                         for h in scan_log(ctx.out_dir / "logs" / f"{tgt.label}.log")[:3]]
    except Exception as exc:  # the audit informs the decision; it must not sink the record
        blockers = []
        ctx.ledger.append("local", f"audit for the decision failed: {exc}", None, op="audit")
    target = ctx.results.get("provision", {}).get("devices", {}).get("target")
    return {"goal": purpose.goal, "trains_on_linux": purpose.trains_on_linux,
            "target_device": target,
            "ships_on_macos": purpose.ships_on_macos, "multi_gpu": purpose.multi_gpu,
            "cuda_dependencies": blockers}


def _iso(ts: float | None) -> str | None:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)) if ts else None


def reproduce_command(ctx: RunContext) -> str:
    row = ctx.journal.get_run(ctx.run_id)
    source = row.playbook_path if row and row.playbook_path else f"{ctx.playbook.name}.yaml"
    parts = ["remotemac", "run", source, "--host", ctx.playbook.host]
    return " ".join(shlex.quote(p) for p in parts)


async def write_acceptance(ctx: RunContext, lost: str | None = None) -> dict[str, Any]:
    from remotemac.acceptance.record import build_record, write_record

    observations, conditions = _observations(ctx)
    if lost:
        conditions.append({"code": "job-lost", "detail": lost})
    row = ctx.journal.get_run(ctx.run_id)
    started = row.created_at if row else time.time()
    finished = time.time()
    hours = (finished - started) / 3600
    cost = ctx.playbook.cost
    sync = _dataset(ctx)
    counters = ctx.results.get("_continuity", {})
    record = build_record(
        run_id=ctx.run_id, playbook=ctx.playbook.name, host=ctx.playbook.host,
        started_at=_iso(started), finished_at=_iso(finished), observations=observations,
        stopping_conditions=conditions, stop_when=ctx.playbook.stop_when.model_dump(),
        environment=_environment(ctx), context=_decision_context(ctx),
        dataset={"revision": sync.get("revision"), "files": sync.get("files"),
                 "bytes": sync.get("bytes"), "encrypted": sync.get("encrypted")},
        continuity={"disconnects": counters.get("disconnects", 0),
                    "reconnects": counters.get("reconnects", 0),
                    "drill": ctx.options.drill},
        cost={"hours": round(hours, 4), "hourly_rate": cost.hourly_rate,
              "amount": round(hours * cost.hourly_rate, 4), "currency": cost.currency},
        reproduce=reproduce_command(ctx),
    )
    write_record(ctx.out_dir, record)
    return {"verdict": record["verdict"], "summary": record["verdict"],
            "conditions": record["stopping_conditions"]}


def update_record_wipe(ctx: RunContext, wipe: dict[str, Any]) -> None:
    """Fold the wipe's outcome into the already written record."""
    from remotemac.acceptance.record import write_record

    path = ctx.out_dir / "acceptance.json"
    if not path.exists():
        return
    record = json.loads(path.read_text(encoding="utf-8"))
    record["wipe"] = {k: wipe.get(k) for k in ("done", "verified", "removed", "remaining")}
    write_record(ctx.out_dir, record)
