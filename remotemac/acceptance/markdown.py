"""Render acceptance.md: the record as a reviewer reads it, in a minute, on its own.

Deterministic (same record, same text: no clock, no locale) so that it can be
diffed between runs and snapshot-tested. Every section of the JSON is present, in
SPEC order; tables use pipes escaped, numbers in fixed formats.
"""

from __future__ import annotations

from typing import Any

from remotemac.acceptance.observations import Memory, Observations, Operators, ResultsSeen
from remotemac.vocab import human_size

#: the environment facts each side's record carries (engine/record.py writes them)
ENV_FACT_KEYS = (
    "os",
    "os_version",
    "arch",
    "chip",
    "python",
    "torch",
    "numpy",
    "mps_built",
    "mps_available",
)

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


def _op_rows(kind: str, items: Any) -> list[list[str]]:
    rows = []
    for item in items or []:
        if isinstance(item, dict):
            name = item.get("op") or item.get("name") or item.get("message") or ""
            count = item.get("count")
            detail = (item.get("detail") or item.get("message") or "") if item.get("op") else ""
            rows.append([kind, _cell(name), _num(count), _cell(detail or "")])
        else:
            rows.append([kind, _cell(item), "—", ""])
    return rows


def _operators_ok(ops: Operators, conditions: list[dict[str, Any]]) -> Any:
    if not ops.observed:
        return None
    codes = {c.get("code") for c in conditions}
    return not ({"fallback_ops", "unsupported_ops", "dtype_errors"} & codes)


def _memory_ok(mem: Memory, conditions: list[dict[str, Any]]) -> Any:
    if mem.stable is None:
        return None
    codes = {c.get("code") for c in conditions}
    return not ({"memory_growth", "max_memory", "out_of_memory"} & codes)


def _summary(rec: dict[str, Any]) -> str:
    verdict = rec.get("verdict") or "incomplete"
    parts = [f"**{verdict}**: {VERDICT_LINES.get(verdict, '')}"]
    conds = rec.get("stopping_conditions") or []
    if conds:
        parts.append("stopping: " + ", ".join(_cell(c.get("code")) for c in conds))
    missing = rec.get("missing_observations") or []
    if missing:
        parts.append("not observed: " + ", ".join(missing))
    rec_ = (rec.get("decision") or {}).get("recommendation")
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


def _observations(rec: dict[str, Any]) -> list[str]:
    obs = Observations.from_dict(rec.get("observations"))
    conds = rec.get("stopping_conditions") or []
    out = ["## Observations", ""]
    out += _overview(obs, conds)
    out += _tensors_section(obs)
    out += _operators_section(obs.operators, conds)
    out += _memory_section(obs.memory)
    out += _results_section(obs.results)
    return out


def _overview(obs: Observations, conds: list[dict[str, Any]]) -> list[str]:
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
        shown = ", ".join(f"{_code(p.get('argv0'))} (pid {p.get('pid')})" for p in procs[:8])
        out += [
            "",
            f"Observed in-process: {len(procs)} Python process(es) that imported "
            f"torch{': ' + shown if shown else ''}"
            f"{' …' if len(procs) > 8 else ''}.",
        ]
    return out


def _operators_section(ops: Operators, conds: list[dict[str, Any]]) -> list[str]:
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
                _code(f.get("path")),
                _mark(f.get("ok")) if f.get("ok") is not None else "not compared",
                _num(f.get("max_abs_err")),
                _num(f.get("max_rel_err")),
                _num(f.get("rtol")),
                _num(f.get("atol")),
                _cell(f.get("detail") or ""),
            ]
            for f in files
        ],
    )
    out += _file_notes(files)
    return out + _tensor_table(files)


def _tensor_table(files: list[dict[str, Any]]) -> list[str]:
    """Every compared tensor, failures first, up to MAX_TENSOR_ROWS."""
    pairs = [(f, t) for f in files for t in f.get("tensors") or []]
    pairs.sort(key=lambda ft: bool(ft[1].get("ok")))  # stable: failures first
    rows = [
        [
            _code(f.get("path")),
            _code(t.get("key")),
            _shape(t.get("shape")),
            _cell(t.get("dtype")),
            _num(t.get("max_abs_err")),
            _num(t.get("max_rel_err")),
            _mark(t.get("ok")),
            _cell(t.get("detail") or ""),
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


def _file_notes(files: list[dict[str, Any]]) -> list[str]:
    """Per file: the first failing key, the worst keys and the metadata differences."""
    out: list[str] = []
    for f in files:
        lines = []
        if f.get("first_failing_key"):
            lines.append(f"first failing key: {_code(f['first_failing_key'])}")
        worst = [w for w in f.get("worst") or [] if w.get("max_abs_err") is not None]
        if worst:
            lines.append(
                "worst keys: "
                + ", ".join(
                    f"{_code(w.get('key'))} (abs {_num(w.get('max_abs_err'))}, "
                    f"rel {_num(w.get('max_rel_err'))})"
                    for w in worst
                )
            )
        meta = f.get("metadata_differences") or []
        if meta:
            verb = "fail: strict rule" if f.get("strict") else "reported, not failing"
            lines.append(
                f"metadata differences ({verb}): "
                + "; ".join(f"{_code(m.get('key'))} {_cell(m.get('detail'))}" for m in meta[:5])
                + (" …" if len(meta) > 5 else "")
            )
        if lines:
            out += ["", f"{_code(f.get('path'))}: " + "; ".join(lines)]
    return out


def _kv_section(title: str, data: dict[str, Any], keys: list[str]) -> list[str]:
    out = ["", f"## {title}", ""]
    rows = [[k, _value(data.get(k))] for k in keys]
    for row in rows:
        if row[0] == "bytes" and isinstance(data.get("bytes"), int):
            row[1] = f"{data['bytes']} ({human_bytes(data['bytes'])})"
    out += _table(["key", "value"], rows)
    return out


def _value(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(_cell(x) for x in v) if v else "none"
    if isinstance(v, (bool, int, float)) or v is None:
        return _num(v)
    return _cell(v)


def _environment(env: dict[str, Any]) -> list[str]:
    out = ["", "## Environment", ""]
    mism = env.get("mismatches") or []
    if mism:
        rows = []
        for m in mism:
            if isinstance(m, dict):
                rows.append(
                    [
                        _cell(m.get("key") or m.get("name")),
                        _cell(m.get("reference")),
                        _cell(m.get("target")),
                    ]
                )
            else:
                rows.append([_cell(m), "", ""])
        out += ["Mismatches that matter:", ""]
        out += _table(["what", "reference", "target"], rows)
    else:
        out.append("No mismatch between reference and target that matters.")
    ref, tgt = env.get("reference") or {}, env.get("target") or {}
    keys = [
        k for k in (*ENV_FACT_KEYS, "lock_hash", "git_commit", "git_dirty") if k in ref or k in tgt
    ]
    if keys:
        out += [""]
        out += _table(
            ["", "reference", "target"], [[k, _value(ref.get(k)), _value(tgt.get(k))] for k in keys]
        )
    return out


OUTCOMES = {"ok": "ok", "warning": "warning", "problem": "**PROBLEM**", "not-tested": "not tested"}


def _process_behaviour(rec: dict[str, Any]) -> list[str]:
    """The stress questions (dropped session, lost job, drift, full disk, reproduce)."""
    rows = rec.get("process_behaviour")
    if rows is None:  # a record from before the table existed
        return []
    out = ["", "## Process behaviour", ""]
    if not rows:
        return out + ["Not measured."]
    out += _table(
        ["question", "how it was tested", "result", "outcome", "evidence"],
        [
            [
                _cell(r.get("question")),
                _cell(r.get("how_tested")),
                _cell(r.get("result")),
                OUTCOMES.get(r.get("outcome"), _cell(r.get("outcome"))),
                _cell(r.get("evidence")),
            ]
            for r in rows
        ],
    )
    caches = rec.get("caches") or []
    if caches:
        out += [
            "",
            "Caches (inside the run dir, wiped with it): "
            + ", ".join(f"{_code(c.get('env'))} → {_code(c.get('path'))}" for c in caches),
        ]
    return out


def _rel(x: Any) -> str:
    return "unbounded (NaN/Inf)" if x is None else f"{float(x):.3g}"


def _where(c: dict[str, Any]) -> str:
    src = "".join(
        f", {label}{_code(c[key])}"
        for key, label in (("src", ""), ("built", "built at "))
        if c.get(key)
    )
    return (
        f"{_code(c.get('path') or '(model)')} (call {c.get('call')}, step {c.get('step')}, "
        f"{_cell(c.get('cls'))}{src})"
    )


def _divergence(div: dict[str, Any] | None) -> list[str]:
    """The "first divergence" section: where the target's error started (workload.trace)."""
    if not div:
        return []
    out = ["", "## First divergence", "", _cell(div.get("detail")), ""]
    if not div.get("traced"):
        return out
    first, nan = div.get("first"), div.get("nan")
    if nan:
        out.append(
            f"- first NaN/Inf: {_where(nan)}: {nan.get('nan')} NaN, {nan.get('inf')} Inf "
            "out of a finite input; the reference's output there is finite"
        )
    if first:
        shape = _shape(first.get("in_shape"))
        out.append(
            f"- first divergence: {_where(first)}: output off by {_rel(first.get('out_rel'))} "
            f"of its abs-max, {_rel(first.get('growth'))}x the error of what came in "
            f"({_cell(first.get('in_dtype'))} {shape}, off by {_rel(first.get('in_rel'))})"
        )
    elif not nan:
        out.append(
            f"- no call beyond tolerance; the largest difference: {_rel(div.get('worst_rel'))} "
            "of a call's abs-max"
        )
    for c in div.get("changes") or []:
        out.append(
            f"- {_cell(c.get('what'))} differs at {_code(c.get('path') or '(model)')} "
            f"(call {c.get('call')},"
            f" step {c.get('step')}): {_cell(c.get('reference'))} on the reference, "
            f"{_cell(c.get('target'))} on the target"
        )
    order = div.get("order")
    if order:
        out.append(
            f"- call order differs in step {order.get('step')} at call {order.get('index')}: "
            f"{_code(order.get('reference'))} on the reference, "
            f"{_code(order.get('target'))} on the target"
        )
    growths = div.get("growths") or []
    if growths:
        out += ["", "Largest growths (output error over input error) in that step:", ""]
        out += _table(
            ["module", "call", "output off by", "input off by", "growth"],
            [
                [
                    _code(g.get("path") or "(model)"),
                    str(g.get("call")),
                    _rel(g.get("out_rel")),
                    "no input"
                    if g.get("in_rel") is None and g.get("in_shape") is None
                    else _rel(g.get("in_rel")),
                    _rel(g.get("growth")),
                ]
                for g in growths
            ],
        )
    return out


def render_markdown(record: dict[str, Any]) -> str:
    """acceptance.md for ``record`` (an acceptance.json object)."""
    rec = record
    verdict = (rec.get("verdict") or "incomplete").upper()
    name = rec.get("playbook") or rec.get("run_id") or "run"
    out = [f"# Acceptance: {_cell(name)} — {verdict}", "", _summary(rec), ""]
    out += _table(
        ["run", "host", "started", "finished"],
        [
            [
                _code(rec.get("run_id")),
                _cell(rec.get("host")),
                _cell(rec.get("started_at")),
                _cell(rec.get("finished_at")),
            ]
        ],
    )
    out += [""] + _observations(rec)

    out += ["", "## Stopping conditions", ""]
    conds = rec.get("stopping_conditions") or []
    if conds:
        out += _table(
            ["code", "detail"], [[_code(c.get("code")), _cell(c.get("detail"))] for c in conds]
        )
    else:
        out.append("None.")

    out += _divergence(rec.get("divergence"))
    out += _process_behaviour(rec)
    out += _environment(rec.get("environment") or {})
    out += _kv_section(
        "Dataset", rec.get("dataset") or {}, ["revision", "files", "bytes", "encrypted"]
    )
    out += _kv_section(
        "Continuity", rec.get("continuity") or {}, ["disconnects", "reconnects", "drill"]
    )
    out += _kv_section("Wipe", rec.get("wipe") or {}, ["done", "verified", "removed", "remaining"])
    guard = rec.get("deadman")
    if isinstance(guard, dict):  # which dead-man guard held (launchd's domain, or the sleeper)
        keys = ["method", "domain", "verified"] if guard.get("method") == "launchd" else ["method"]
        out += _kv_section("Dead-man", guard, keys)
    if rec.get("cpu"):  # seconds: this laptop's process, the host's agent processes
        out += _kv_section("CPU", rec["cpu"], ["laptop_s", "host_s", "agent_calls"])
    cost = rec.get("cost") or {}
    out += ["", "## Cost", ""]
    if cost.get("amount") is not None:
        out.append(
            f"{_num(cost.get('hours'))} h × {_num(cost.get('hourly_rate'))} "
            f"{_cell(cost.get('currency'))}/h = **{cost['amount']:.2f} "
            f"{_cell(cost.get('currency'))}**"
        )
    else:
        out.append("Unknown (no hourly rate or rental hours).")

    decision = rec.get("decision") or {}
    recommendation = decision.get("recommendation")
    out += [
        "",
        "## Decision",
        "",
        f"**{_cell(recommendation)}**" if recommendation else "**No recommendation yet.**",
        "",
    ]
    out += [f"- {_cell(r)}" for r in decision.get("reasons") or []] or ["- no reasons given"]

    out += ["", "## Reproduce", ""]
    out += (
        ["```sh", rec.get("reproduce") or "# unknown", "```"]
        if rec.get("reproduce")
        else ["Unknown."]
    )
    return "\n".join(out) + "\n"
