"""Render acceptance.md: the record as a reviewer reads it, in a minute, on its own.

Deterministic (same record, same text: no clock, no locale) so that it can be
diffed between runs and snapshot-tested. Every section of the JSON is present, in
SPEC order; tables use pipes escaped, numbers in fixed formats.
"""

from __future__ import annotations

from typing import Any

from remotemac.acceptance.divergence import (
    BackwardDivergence,
    Change,
    Divergence,
    NanSite,
    TracedCall,
)
from remotemac.acceptance.drill import OpDrill
from remotemac.acceptance.observations import (
    FileResult,
    Memory,
    Observations,
    OpEntry,
    Operators,
    ResultsSeen,
)
from remotemac.acceptance.recordtypes import (
    ENV_FACT_KEYS,
    SHOWN_FACTS,
    AcceptanceRecord,
    BehaviourRow,
    Environment,
    StoppingCondition,
)
from remotemac.vocab import human_size

__all__ = ["ENV_FACT_KEYS", "SPARK", "render_markdown", "sparkline"]

SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 48
MAX_TENSOR_ROWS = 40

VERDICT_LINES = {
    "accepted": "every observation passed",
    "rejected": "a stopping condition was hit",
    "incomplete": "an observation is missing",
}


def sparkline(values: list[float], width: int = SPARK_WIDTH) -> str:
    """A plot-free line of ``values``: buckets averaged down to ``width`` characters."""
    if not values:
        return ""
    if len(values) > width:
        buckets = []
        for i in range(width):
            lo = i * len(values) // width
            hi = max(lo + 1, (i + 1) * len(values) // width)
            chunk = values[lo:hi]
            buckets.append(sum(chunk) / len(chunk))
        values = buckets
    low, high = min(values), max(values)
    if high == low:
        return SPARK[0] * len(values)
    scale = (len(SPARK) - 1) / (high - low)
    return "".join(SPARK[round((v - low) * scale)] for v in values)


human_bytes = human_size  # the one size format (remotemac.vocab), as in the CLI and TUI


def _num(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return f"{x:.3g}"
    return _cell(x)


def _cell(x: Any) -> str:
    """Text safe inside a table cell: pipes, backslashes and HTML-like ``<`` escaped."""
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    text = str(x).replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;")
    return " ".join(text.split()) or "—"


def _code(x: Any) -> str:
    """A name in backticks inside a table cell (only pipes need escaping there)."""
    text = " ".join(str(x).replace("|", "\\|").replace("`", "'").split())
    return f"`{text}`" if text else "—"


def _shape(shape: Any) -> str:
    if shape is None:
        return "—"
    return "×".join(str(s) for s in shape) if shape else "scalar"


def _mark(ok: Any) -> str:
    return {True: "pass", False: "**FAIL**", None: "not observed"}.get(ok, _cell(ok))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _op_rows(kind: str, items: list[OpEntry] | None) -> list[list[str]]:
    rows = []
    for item in items or []:
        if item.is_bare:
            rows.append([kind, _cell(item.bare), "—", ""])
        else:
            detail = (item.detail or item.message or "") if item.op else ""
            rows.append([kind, _cell(item.label or ""), _num(item.count), _cell(detail or "")])
    return rows


def _operators_ok(ops: Operators, conditions: list[StoppingCondition]) -> Any:
    if not ops.observed:
        return None
    codes = {c.code for c in conditions}
    return not ({"fallback_ops", "unsupported_ops", "dtype_errors"} & codes)


def _memory_ok(mem: Memory, conditions: list[StoppingCondition]) -> Any:
    if mem.stable is None:
        return None
    codes = {c.code for c in conditions}
    return not ({"memory_growth", "max_memory", "out_of_memory"} & codes)


def _summary(rec: AcceptanceRecord) -> str:
    verdict = rec.verdict or "incomplete"
    parts = [f"**{verdict}**: {VERDICT_LINES.get(verdict, '')}"]
    conds = rec.stopping_conditions
    if conds:
        parts.append("stopping: " + ", ".join(_cell(c.code) for c in conds))
    missing = rec.missing_observations
    if missing:
        parts.append("not observed: " + ", ".join(missing))
    rec_ = rec.decision.recommendation
    if rec_:
        parts.append(f"recommendation: **{rec_}**")
    return " · ".join(parts) + "."


#: the words for each ``tensors_on_device`` value
ON_DEVICE_WORDS = {
    True: "tensors and model on the target device",
    False: "not on the target device",
    None: "—",
}

#: what each memory ``source`` measures, as the record's reader needs it said
MEMORY_SOURCES = {
    "process-tree-pss": "the job's own memory: proportional set size (PSS) summed "
    "over its process tree, so pages forked DataLoader workers share count once",
    "process-tree-footprint": "the job's own memory: physical footprint "
    "(proc_pid_rusage) summed over its process tree",
    "process-tree-rss": "resident memory summed over the job's process tree",
    "mps-driver": "Metal's driver memory summed over the observed processes",
    "process-rss": "resident memory of the job's first process",
}


def _observations(rec: AcceptanceRecord) -> list[str]:
    obs = rec.observations
    conds = rec.stopping_conditions
    out = ["## Observations", ""]
    out += _overview(obs, conds)
    out += _tensors_section(obs)
    out += _operators_section(obs.operators, conds)
    out += _memory_section(obs.memory)
    out += _results_section(obs.results)
    return out


def _overview(obs: Observations, conds: list[StoppingCondition]) -> list[str]:
    """One row per observation: its mark and a summary."""
    ops, mem, res = obs.operators, obs.memory, obs.results
    slope_text = f", slope {human_bytes(mem.slope)}/s" if mem.slope is not None else ""
    if mem.too_short:
        slope_text = f", trend: too short to tell ({mem.samples_used} samples)"
    skipped_files = res.not_compared()
    return _table(
        ["observation", "result", "summary"],
        [
            [
                "tensors on device",
                _mark(obs.tensors_on_device),
                ON_DEVICE_WORDS.get(obs.tensors_on_device, "—"),
            ],
            [
                "operators",
                _mark(_operators_ok(ops, conds)),
                f"{len(ops.fallback_ops or [])} fallback, "
                f"{len(ops.unsupported_ops or [])} unsupported, "
                f"{len(ops.dtype_errors or [])} dtype errors",
            ],
            [
                "memory",
                _mark(_memory_ok(mem, conds)),
                f"peak {human_bytes(mem.peak_bytes)}{slope_text}",
            ],
            [
                "results",
                _mark(res.within_tolerance),
                f"{len(res.files) - res.failed()} of {len(res.files)} files within tolerance"
                + (f", {skipped_files} not compared" if skipped_files else ""),
            ],
        ],
    )


def _tensors_section(obs: Observations) -> list[str]:
    out = ["", "### Tensors on device", ""]
    out += _table(
        ["check", "result"],
        [["tensors and model on the target device", _mark(obs.tensors_on_device)]],
    )
    procs = obs.processes
    if procs is not None:
        shown = ", ".join(f"{_code(p.argv0)} (pid {p.pid})" for p in procs[:8])
        out += [
            "",
            f"Observed in-process: {len(procs)} Python process(es) that imported "
            f"torch{': ' + shown if shown else ''}"
            f"{' …' if len(procs) > 8 else ''}.",
        ]
    return out


def _operators_section(ops: Operators, conds: list[StoppingCondition]) -> list[str]:
    out = ["", "### Operators", ""]
    rows = (
        _op_rows("fallback", ops.fallback_ops)
        + _op_rows("unsupported", ops.unsupported_ops)
        + _op_rows("dtype error", ops.dtype_errors)
    )
    if ops.count():
        out += _table(["kind", "operator", "count", "detail"], rows)
    elif _operators_ok(ops, conds) is None:
        out.append("Not observed.")
    else:
        out.append("No fallback, unsupported operator or dtype error.")
    return out


def _memory_section(mem: Memory) -> list[str]:
    out = ["", "### Memory", ""]
    if mem.source:
        out += [
            f"Measured: {MEMORY_SOURCES.get(mem.source, mem.source)}."
            + (f" {mem.reason}." if mem.reason else ""),
            "",
        ]
    interval, confidence = mem.interval, mem.confidence
    out += _table(
        ["peak", "slope after warm-up", "confidence", "stable"],
        [
            [
                human_bytes(mem.peak_bytes),
                f"{human_bytes(mem.slope)}/s" if mem.slope is not None else "—",
                f"{confidence:.0%}: {human_bytes(interval[0])}/s .. {human_bytes(interval[1])}/s"
                if confidence and interval
                else "—",
                "too short to tell" if mem.too_short else _mark(mem.stable),
            ]
        ],
    )
    samples = mem.sample_bytes()
    if samples:
        out += [
            "",
            f"`{sparkline(samples)}` {human_bytes(min(samples))} → "
            f"{human_bytes(max(samples))} over {len(samples)} samples",
        ]
    return out


def _results_section(res: ResultsSeen) -> list[str]:
    out = ["", "### Results", ""]
    files = res.files
    if not files:
        out.append("Not observed." if res.within_tolerance is None else "No files compared.")
        return out
    out += _table(
        ["file", "result", "max abs err", "max rel err", "rtol", "atol", "detail"],
        [
            [
                _code(f.path),
                _mark(f.ok) if f.ok is not None else "not compared",
                _num(f.max_abs_err),
                _num(f.max_rel_err),
                _num(f.rtol),
                _num(f.atol),
                _cell(f.detail or ""),
            ]
            for f in files
        ],
    )
    out += _file_notes(files)
    return out + _tensor_table(files)


def _tensor_table(files: list[FileResult]) -> list[str]:
    """Every compared tensor, failures first, up to MAX_TENSOR_ROWS."""
    pairs = [(f, t) for f in files for t in f.tensors or []]
    pairs.sort(key=lambda ft: bool(ft[1].ok))  # stable: failures first
    rows = [
        [
            _code(f.path),
            _code(t.key),
            _shape(t.shape),
            _cell(t.dtype),
            _num(t.max_abs_err),
            _num(t.max_rel_err),
            _mark(t.ok),
            _cell(t.detail or ""),
        ]
        for f, t in pairs
    ]
    if not rows:
        return []
    header = ["file", "tensor", "shape", "dtype", "max abs err", "max rel err", "result", "detail"]
    out = ["", "Per tensor (failures first):", ""]
    out += _table(header, rows[:MAX_TENSOR_ROWS])
    if len(rows) > MAX_TENSOR_ROWS:
        out += ["", f"… {len(rows) - MAX_TENSOR_ROWS} more in acceptance.json."]
    return out


def _file_notes(files: list[FileResult]) -> list[str]:
    """Per file: the first failing key, the worst keys and the metadata differences."""
    out: list[str] = []
    for f in files:
        lines = []
        if f.first_failing_key:
            lines.append(f"first failing key: {_code(f.first_failing_key)}")
        worst = [w for w in f.worst or [] if w.max_abs_err is not None]
        if worst:
            lines.append(
                "worst keys: "
                + ", ".join(
                    f"{_code(w.key)} (abs {_num(w.max_abs_err)}, rel {_num(w.max_rel_err)})"
                    for w in worst
                )
            )
        meta = f.metadata_differences or []
        if meta:
            verb = "fail: strict rule" if f.strict else "reported, not failing"
            lines.append(
                f"metadata differences ({verb}): "
                + "; ".join(f"{_code(m.key)} {_cell(m.detail)}" for m in meta[:5])
                + (" …" if len(meta) > 5 else "")
            )
        if lines:
            out += ["", f"{_code(f.path)}: " + "; ".join(lines)]
    return out


def _kv_section(title: str, rows: list[tuple[str, Any]]) -> list[str]:
    """A section of ``key | value`` rows; a byte count also in human units."""
    out = ["", f"## {title}", ""]
    cells = [
        [k, f"{v} ({human_bytes(v)})" if k == "bytes" and isinstance(v, int) else _value(v)]
        for k, v in rows
    ]
    out += _table(["key", "value"], cells)
    return out


def _value(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(_cell(x) for x in v) if v else "none"
    if isinstance(v, (bool, int, float)) or v is None:
        return _num(v)
    return _cell(v)


def _environment(env: Environment) -> list[str]:
    out = ["", "## Environment", ""]
    mism = env.mismatches
    if mism:
        rows = [
            [_cell(m.bare), "", ""]
            if m.is_bare
            else [_cell(m.key or m.name), _cell(m.reference), _cell(m.target)]
            for m in mism
        ]
        out += ["Mismatches that matter:", ""]
        out += _table(["what", "reference", "target"], rows)
    else:
        out.append("No mismatch between reference and target that matters.")
    ref, tgt = env.reference, env.target
    keys = [k for k in SHOWN_FACTS if ref.has(k) or tgt.has(k)]
    if keys:
        out += [""]
        out += _table(
            ["", "reference", "target"],
            [[k, _value(ref.fact(k)), _value(tgt.fact(k))] for k in keys],
        )
    return out


OUTCOMES = {"ok": "ok", "warning": "warning", "problem": "**PROBLEM**", "not-tested": "not tested"}


def _outcome(row: BehaviourRow) -> str:
    found = OUTCOMES.get(row.outcome) if isinstance(row.outcome, str) else None
    return found if found is not None else _cell(row.outcome)


def _process_behaviour(rec: AcceptanceRecord) -> list[str]:
    """The stress questions (dropped session, lost job, drift, full disk, reproduce)."""
    rows = rec.process_behaviour
    if rows is None:  # a record from before the table existed
        return []
    out = ["", "## Process behaviour", ""]
    if not rows:
        return out + ["Not measured."]
    out += _table(
        ["question", "how it was tested", "result", "outcome", "evidence"],
        [
            [
                _cell(r.question),
                _cell(r.how_tested),
                _cell(r.result),
                _outcome(r),
                _cell(r.evidence),
            ]
            for r in rows
        ],
    )
    if rec.caches:
        out += [
            "",
            "Caches (inside the run dir, wiped with it): "
            + ", ".join(f"{_code(c.env)} → {_code(c.path)}" for c in rec.caches),
        ]
    return out


def _rel(x: Any) -> str:
    return "unbounded (NaN/Inf)" if x is None else f"{float(x):.3g}"


def _where(c: TracedCall | NanSite) -> str:
    src = "".join(
        f", {label}{_code(value)}"
        for value, label in ((c.src, ""), (c.built, "built at "))
        if value
    )
    return f"{_code(c.path or '(model)')} (call {c.call}, step {c.step}, {_cell(c.cls)}{src})"


def _change(c: Change) -> str:
    return (
        f"- {_cell(c.what)} differs at {_code(c.path or '(model)')} (call {c.call},"
        f" step {c.step}): {_cell(c.reference)} on the reference, "
        f"{_cell(c.target)} on the target"
    )


def _growth_row(g: TracedCall) -> list[str]:
    no_input = g.in_rel is None and g.in_shape is None
    return [
        _code(g.path or "(model)"),
        str(g.call),
        _rel(g.out_rel),
        "no input" if no_input else _rel(g.in_rel),
        _rel(g.growth),
    ]


def _divergence(div: Divergence | None) -> list[str]:
    """The "first divergence" section: where the target's error started (workload.trace)."""
    if div is None or div.read_empty():
        return []
    out = ["", "## First divergence", "", _cell(div.detail), ""]
    if not div.traced:
        return out
    first, nan = div.first, div.nan
    if nan:
        out.append(
            f"- first NaN/Inf: {_where(nan)}: {nan.nan} NaN, {nan.inf} Inf "
            "out of a finite input; the reference's output there is finite"
        )
    if first:
        shape = _shape(first.in_shape)
        out.append(
            f"- first divergence: {_where(first)}: output off by {_rel(first.out_rel)} "
            f"of its abs-max, {_rel(first.growth)}x the error of what came in "
            f"({_cell(first.in_dtype)} {shape}, off by {_rel(first.in_rel)})"
        )
    elif not nan:
        out.append(
            f"- {'forward: ' if div.backward else ''}no call beyond tolerance; the largest "
            f"difference: {_rel(div.worst_rel)} of a call's abs-max"
        )
    out += [_change(c) for c in div.changes]
    order = div.order
    if order:
        out.append(
            f"- call order differs in step {order.step} at call {order.index}: "
            f"{_code(order.reference)} on the reference, "
            f"{_code(order.target)} on the target"
        )
    if div.drill is not None:
        out += _drill(div.drill)
    back = div.backward
    if back is not None:
        out += _backward(back)
    if div.growths and not (div.kind or "").startswith("backward"):
        out += ["", "Largest growths (output error over input error) in that step:", ""]
        out += _table(
            ["module", "call", "output off by", "input off by", "growth"],
            [_growth_row(g) for g in div.growths],
        )
    if back is not None and back.growths and (div.kind or "").startswith("backward"):
        out += [
            "",
            "Largest growths in the backward (gradient handed on over gradient come in):",
            "",
        ]
        out += _table(
            ["module", "call", "gradient out off by", "gradient in off by", "growth"],
            [_growth_row(g) for g in back.growths],
        )
    return out


def _drill(drill: OpDrill) -> list[str]:
    """The op-level drill-down's lines: the op inside the module that made it."""
    at = f"{_code(drill.path or '(model)')} (call {drill.call}, step {drill.step})"
    if not drill.ran:
        return [f"- op-level drill-down of {at}: not run: {_cell(drill.detail)}"]
    out = []
    if drill.nan:
        n = drill.nan
        source = "already in its inputs (a constant)" if n.in_bad else "from finite inputs"
        out.append(
            f"- first NaN/Inf op: {_code(n.op)} in {_code(n.module or drill.path)}: "
            f"{n.nan} NaN, {n.inf} Inf {source} (op {n.index} of "
            f"{drill.ops.get('target')}, run alone on both sides with the reference's input)"
        )
    if drill.first:
        f = drill.first
        alone = "; the reference ran no such op there" if f.one_side else ""
        out.append(
            f"- first differing op: {_code(f.op)} in {_code(f.module or drill.path)}: "
            f"output off by {_rel(f.out_rel)} of its abs-max, {_rel(f.growth)}x its "
            f"input's error (op {f.index} of {drill.ops.get('target')}, run alone on both "
            f"sides with the reference's input and weights{alone})"
        )
    if not drill.nan and not drill.first:
        out.append(f"- op-level drill-down of {at}: {_cell(drill.detail)}")
    for side, ops in (("reference", drill.only_reference), ("target", drill.only_target)):
        if ops:
            out.append(f"- ops on the {side} only: " + ", ".join(_code(o) for o in ops))
    return out


def _backward(back: BackwardDivergence) -> list[str]:
    """The backward calls' lines: the first NaN/Inf gradient, the first divergence."""
    out = []
    if back.nan:
        n = back.nan
        out.append(
            f"- first NaN/Inf gradient: the backward of {_where(n)}: {n.nan} NaN, "
            f"{n.inf} Inf handed to its input from a finite gradient; the reference's is finite"
        )
    if back.first:
        b = back.first
        out.append(
            f"- first backward divergence: {_where(b)}: the gradient to its input off by "
            f"{_rel(b.out_rel)} of its abs-max, {_rel(b.growth)}x the error of the "
            f"gradient that came in (off by {_rel(b.in_rel)})"
        )
    elif not back.nan:
        out.append(
            f"- backward: no call beyond tolerance ({back.compared} compared); the largest "
            f"difference: {_rel(back.worst_rel)} of a gradient's abs-max"
        )
    return out


def _cost(rec: AcceptanceRecord) -> list[str]:
    cost = rec.cost
    out = ["", "## Cost", ""]
    if cost.amount is not None:
        out.append(
            f"{_num(cost.hours)} h × {_num(cost.hourly_rate)} "
            f"{_cell(cost.currency)}/h = **{cost.amount:.2f} "
            f"{_cell(cost.currency)}**"
        )
    else:
        out.append("Unknown (no hourly rate or rental hours).")
    return out


def _decision(rec: AcceptanceRecord) -> list[str]:
    recommendation = rec.decision.recommendation
    out = [
        "",
        "## Decision",
        "",
        f"**{_cell(recommendation)}**" if recommendation else "**No recommendation yet.**",
        "",
    ]
    out += [f"- {_cell(r)}" for r in rec.decision.reasons or []] or ["- no reasons given"]
    return out


def _sections(rec: AcceptanceRecord) -> list[str]:
    """Dataset, continuity, wipe, the dead-man guard and the CPU used, as key/value tables."""
    ds, cont, wipe = rec.dataset, rec.continuity, rec.wipe
    out = _kv_section(
        "Dataset",
        [
            ("revision", ds.revision),
            ("files", ds.files),
            ("bytes", ds.bytes),
            ("encrypted", ds.encrypted),
        ],
    )
    out += _kv_section(
        "Continuity",
        [
            ("disconnects", cont.disconnects),
            ("reconnects", cont.reconnects),
            ("drill", cont.drill),
        ],
    )
    out += _kv_section(
        "Wipe",
        [
            ("done", wipe.done),
            ("verified", wipe.verified),
            ("removed", wipe.removed),
            ("remaining", wipe.remaining),
        ],
    )
    guard = rec.deadman
    if guard is not None:  # which dead-man guard held (launchd's domain, or the sleeper)
        rows: list[tuple[str, Any]] = [("method", guard.method)]
        if guard.method == "launchd":
            rows += [("domain", guard.domain), ("verified", guard.verified)]
        out += _kv_section("Dead-man", rows)
    cpu = rec.cpu
    if (
        cpu is not None and not cpu.read_empty()
    ):  # seconds: this laptop's process, the host's agent processes
        out += _kv_section(
            "CPU",
            [("laptop_s", cpu.laptop_s), ("host_s", cpu.host_s), ("agent_calls", cpu.agent_calls)],
        )
    return out


def render_markdown(record: Any) -> str:
    """acceptance.md for ``record`` (an acceptance.json object, or one already read)."""
    rec = record if isinstance(record, AcceptanceRecord) else AcceptanceRecord.from_json(record)
    verdict = (rec.verdict or "incomplete").upper()
    name = rec.playbook or rec.run_id or "run"
    out = [f"# Acceptance: {_cell(name)} — {verdict}", "", _summary(rec), ""]
    out += _table(
        ["run", "host", "started", "finished"],
        [[_code(rec.run_id), _cell(rec.host), _cell(rec.started_at), _cell(rec.finished_at)]],
    )
    out += [""] + _observations(rec)

    out += ["", "## Stopping conditions", ""]
    conds = rec.stopping_conditions
    if conds:
        out += _table(["code", "detail"], [[_code(c.code), _cell(c.detail)] for c in conds])
    else:
        out.append("None.")

    out += _divergence(rec.divergence)
    out += _process_behaviour(rec)
    out += _environment(rec.environment)
    out += _sections(rec)
    out += _cost(rec)
    out += _decision(rec)
    out += ["", "## Reproduce", ""]
    out += ["```sh", rec.reproduce, "```"] if rec.reproduce else ["Unknown."]
    return "\n".join(out) + "\n"
