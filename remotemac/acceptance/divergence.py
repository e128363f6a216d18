"""Where the target first diverges from the reference: the compare of two module traces.

A results diff names where a difference *ended up* (after a few optimizer steps every
weight differs). The two sides' divergence traces (agent/modtrace.py: a summary of
every module call's output and first input, in call order) say where it *started*:

* the **first divergence**: the first call, in the reference's order, whose output
  differs beyond the tolerance while its input did not grow the error: the output's
  relative error is more than ``GROWTH`` times the input's (an input error below
  float32's epsilon counts as epsilon, so a layer fed identical inputs that returns
  different outputs has a growth of its own error over float32 noise). Layers after it
  carry its error on (growth near 1) and are not named;
* the **first NaN/Inf**: the first call of the target whose output holds a NaN or Inf
  while its input held none and the reference's output at that call held none: the
  module that made it (innermost first: a child's record precedes its parent's);
* dtype or shape changes between the sides at the same call, and where the calls'
  order differs (a call on one side only, a different module at the same position);
* the same first divergence and first NaN/Inf for the **backward** calls (rows with
  ``"pass": "backward"``), a second sequence in the order the gradients were made:
  there a call's input is the gradient of its output and its output the gradient it
  hands to its input. The headline (``kind``) is the earliest event of the run: a
  step's forward before its backward, before the next step's forward.

The numbers compared are each output's abs-max and its fixed strided sample (the same
indices on both sides), against ``|t - r| <= atol + rtol * |r|`` with the compare rule's
tolerance (PyTorch's MPS tests' for the dtype when the rule gives none).

The traces are JSON lines; nothing is unpickled.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from remotemac.acceptance.jsonfields import (
    JSON_NAME,
    JsonFields,
    from_fields,
    parse_list,
    parse_optional,
)
from remotemac.agent.protocol import JsonObject

if TYPE_CHECKING:  # drill.py reads this module's summaries: imported on use
    from remotemac.acceptance.drill import OpDrill

TRACE_SCHEMA = "remotemac.trace/1"
#: a trace row's ``pass`` for a backward call (a forward one has none)
BACKWARD = "backward"
#: an output error more than this many times the input's is an error of the module's own
GROWTH = 10.0
#: float32's epsilon: the floor of the input error a growth is measured against
EPS32 = 2.0**-23
#: how many growths, dtype/shape changes and one-side calls the record lists
TOP = 5
#: a trace file bigger than this is not read (a trace of 1000 steps of a big model)
MAX_TRACE_BYTES = 512 * 1024**2


@dataclass
class TracedCall(JsonFields):
    """One module call as both sides recorded it, with the error it added."""

    step: int
    index: int  # position in the reference's call order within the step
    path: str  # qualified name from the root model; "" is the root itself
    call: int  # the how-manieth call of that module in the step
    cls: str | None
    src: str | None  # file:line of the module class's forward
    built: str | None  # file:line that built the module (None: built before the trace)
    shape: list[int] | None
    dtype: str | None
    # in the record, null also stands for unbounded (a NaN or Inf on one side)
    out_rel: float | None  # max |t - r| over the compared values / the reference's abs-max
    in_rel: float | None  # the same for the first tensor input; None without one
    out_excess: float | None  # worst |t - r| / (atol + rtol |r|); above 1: beyond tolerance
    in_excess: float | None
    growth: float | None  # out_rel / max(in_rel, EPS32)
    in_shape: list[int] | None = None
    in_dtype: str | None = None


@dataclass
class NanSite(JsonFields):
    """The first call whose output on the target holds a NaN or Inf its input did not."""

    step: int
    index: int
    path: str
    call: int
    cls: str | None
    src: str | None
    built: str | None
    nan: int
    inf: int
    reference_nan: int


@dataclass
class Change(JsonFields):
    """A dtype or shape the two sides disagree on at the same call."""

    step: int
    path: str
    call: int
    what: str  # "dtype" | "shape"
    reference: Any
    target: Any


@dataclass
class OrderDiff(JsonFields):
    """Where the two sides' call orders part, and the calls one side has alone."""

    step: int
    index: int
    reference: str | None
    target: str | None
    only_reference: list[str] = field(default_factory=list)
    only_target: list[str] = field(default_factory=list)


@dataclass
class BackwardDivergence(JsonFields):
    """The backward calls compared as their own sequence (in the order the gradients
    were made): for each module call, the gradient that came into its backward (of its
    output: ``in``) and the one it handed on (of its first input: ``out``)."""

    calls: dict[str, int] = field(default_factory=dict)
    compared: int = 0
    worst_rel: float | None = None
    first: TracedCall | None = None
    nan: NanSite | None = None
    growths: list[TracedCall] = field(default_factory=list)

    JSON_PARSE = {
        "first": parse_optional(TracedCall.from_json),
        "nan": parse_optional(NanSite.from_json),
        "growths": parse_list(TracedCall.from_json),
    }


@dataclass
class Divergence(JsonFields):
    """The ``divergence`` section of the record."""

    traced: bool
    detail: str
    steps: int = 0
    calls: dict[str, int] = field(default_factory=dict)
    compared: int = 0
    # "identical" | "noise" | "divergence" | "nan" | "backward-divergence" | "backward-nan"
    kind: str | None = None
    worst_rel: float | None = None  # the largest relative error of any call's output
    first: TracedCall | None = None
    nan: NanSite | None = None
    growths: list[TracedCall] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    order: OrderDiff | None = None
    growth_factor: float = GROWTH
    backward: BackwardDivergence | None = None
    drill: OpDrill | None = None  # the op-level drill-down of the first divergent call

    JSON_PARSE = {
        "drill": lambda data: _parse_drill(data),
        "backward": parse_optional(BackwardDivergence.from_json),
        "first": parse_optional(TracedCall.from_json),
        "nan": parse_optional(NanSite.from_json),
        "growths": parse_list(TracedCall.from_json),
        "changes": parse_list(Change.from_json),
        "order": parse_optional(OrderDiff.from_json),
    }

    def to_dict(self) -> JsonObject:
        """The section as the record keeps it (``to_json``; engine/record.py's name);
        ``backward`` and ``drill`` only when there is one (a trace without backward
        rows, no drill pass: the section reads as before they existed)."""
        out = self.to_json()
        for key in ("backward", "drill"):
            if out.get(key) is None:
                out.pop(key, None)
        return out


def _parse_drill(data: Any) -> OpDrill | None:
    from remotemac.acceptance.drill import OpDrill

    return OpDrill.from_json(data) if data else None


@dataclass(frozen=True)
class Summary:
    """A traced tensor as agent/modtrace.py summarises it: shape, dtype, NaN and Inf
    counts, abs-max and a fixed strided sample (None: not sampled)."""

    shape: list[int] | None = None
    dtype: str | None = None
    nan: int | None = None
    inf: int | None = None
    absmax: Any = None
    sample: list[Any] | None = None

    @classmethod
    def from_json(cls, data: Any) -> Summary | None:
        """None for a missing or empty summary (no tensor)."""
        return from_fields(cls, data) if data else None

    def bad(self) -> int:
        """NaNs and Infs in the tensor."""
        return int(self.nan or 0) + int(self.inf or 0)


#: what a call without a summary compares as
NO_SUMMARY = Summary()


def _int(value: Any) -> int:
    return int(value or 0)


@dataclass(frozen=True)
class TraceRow:
    """One module call of a trace line: where, what, and its output's and first input's
    summaries (the line's ``in`` is ``inp`` here)."""

    step: int
    path: str
    call: int
    cls: str | None = None
    src: str | None = None
    built: str | None = None
    out: Summary | None = None
    inp: Summary | None = field(default=None, metadata={JSON_NAME: "in"})
    kind: str | None = field(default=None, metadata={JSON_NAME: "pass"})

    @classmethod
    def from_json(cls, row: TraceRow | JsonObject) -> TraceRow:
        if isinstance(row, TraceRow):
            return row
        return from_fields(
            cls,
            row,
            {
                "step": _int,
                "path": str,
                "call": _int,
                "out": Summary.from_json,
                "inp": Summary.from_json,
            },
        )

    @property
    def key(self) -> tuple[int, str, int]:
        return (self.step, self.path, self.call)


class TraceError(ValueError):
    """A trace that is not a remotemac trace (wrong schema, not JSON, too big)."""


def load_trace(path: Path) -> tuple[JsonObject, list[JsonObject]]:
    """The header and the call rows of a trace file; a torn last line is left out."""
    return read_jsonl(path, TRACE_SCHEMA, "path", MAX_TRACE_BYTES, TraceError)


def read_jsonl(
    path: Path, schema: str, key: str, cap: int, error: type[ValueError]
) -> tuple[JsonObject, list[JsonObject]]:
    """A host-made JSON-lines file (a trace, an op trace): its header, which must name
    ``schema``, and the rows that are objects with a string ``key``; a torn or foreign
    line is left out, a file over ``cap`` bytes or with another header raises ``error``."""
    if path.stat().st_size > cap:
        raise error(f"{path.name}: {path.stat().st_size} bytes, over the cap")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if not lines:
        raise error(f"{path.name}: empty")
    try:
        header = json.loads(lines[0])
    except ValueError:
        raise error(f"{path.name}: the first line is not JSON") from None
    if not isinstance(header, dict) or header.get("schema") != schema:
        raise error(f"{path.name}: not a {schema} {'trace' if key == 'path' else 'op trace'}")
    rows = []
    for line in lines[1:]:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get(key), str):
            rows.append(row)
    return header, rows


def _num(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    if v in ("inf", "-inf", "nan"):
        return float(v)
    return math.nan


def _label(key: tuple[int, str, int]) -> str:
    step, path, call = key
    return f"{path or '(model)'}#{call}"


def _errors(t: Summary | None, r: Summary | None, tol: Any) -> tuple[float, float]:
    """(relative error, excess over the tolerance) of summary ``t`` against ``r``."""
    if t is None or r is None or t.sample is None or r.sample is None:
        return 0.0, 0.0
    if t.shape != r.shape:
        return math.inf, math.inf
    from remotemac.acceptance.compare import default_tolerance  # numpy: on first use

    rtol, atol = tol if tol else default_tolerance(r.dtype)
    pairs = list(zip(t.sample, r.sample, strict=False)) + [(t.absmax, r.absmax)]
    worst_abs, excess = 0.0, 0.0
    for a, b in pairs:
        a, b = _num(a), _num(b)
        if a == b or (math.isnan(a) and math.isnan(b)):
            continue
        diff = abs(a - b)
        if math.isnan(diff):
            return math.inf, math.inf
        worst_abs = max(worst_abs, diff)
        bound = atol + rtol * abs(b)
        excess = max(excess, diff / bound if bound > 0 else math.inf)
    scale = abs(_num(r.absmax))
    rel = worst_abs / scale if scale > 0 else (math.inf if worst_abs else 0.0)
    return rel, excess


def _bad(summary: Summary | None) -> int:
    return summary.bad() if summary is not None else 0


def _finite(x: float | None) -> float | None:
    """JSON has no Inf: a NaN or Inf on one side (an unbounded error) is null."""
    if x is None or not math.isfinite(x):
        return None
    return x


def _order(ref: list[tuple[int, str, int]], tgt: list[tuple[int, str, int]]) -> OrderDiff | None:
    if ref == tgt:
        return None
    first = next(
        (i for i, (a, b) in enumerate(zip(ref, tgt, strict=False)) if a != b),
        min(len(ref), len(tgt)),
    )
    at = ref[first] if first < len(ref) else tgt[first]
    in_step = [i for i, k in enumerate(ref[:first]) if k[0] == at[0]]
    a, b = set(ref), set(tgt)
    return OrderDiff(
        step=at[0],
        index=len(in_step),
        reference=_label(ref[first]) if first < len(ref) else None,
        target=_label(tgt[first]) if first < len(tgt) else None,
        only_reference=[_label(k) for k in ref if k not in b][:TOP],
        only_target=[_label(k) for k in tgt if k not in a][:TOP],
    )


@dataclass
class Pass:
    """One pass compared: the calls matched, and what the compare found in them."""

    calls: list[TracedCall]
    changes: list[Change]
    first: TracedCall | None
    nan: NanSite | None
    growths: list[TracedCall]
    worst: float | None


def _compare_pass(
    ref_rows: list[TraceRow], tgt_rows: list[TraceRow], tol: tuple[float, float] | None
) -> Pass:
    """The first divergence, the first NaN/Inf and the growths of one pass (the forward
    calls, or the backward ones), each side in its own call order."""
    by_key = {r.key: r for r in tgt_rows}
    calls: list[TracedCall] = []
    changes: list[Change] = []
    index_in_step: dict[int, int] = {}
    for row in ref_rows:
        step = row.step
        index = index_in_step.get(step, 0)
        index_in_step[step] = index + 1
        other = by_key.get(row.key)
        if other is not None:
            calls.append(_traced_call(row, other, index, tol, changes))
    first = next((c for c in calls if (c.out_excess or 0) > 1 and (c.growth or 0) > GROWTH), None)
    nan = _first_nan(ref_rows, tgt_rows)
    step = first.step if first else (calls[0].step if calls else 0)
    # the modules that contain the first divergence carry its growth: the innermost is named
    growths = sorted(
        (c for c in calls if c.step == step and c.out_rel and not _contains(c, first)),
        key=lambda c: -(c.growth or 0),
    )[:TOP]
    worst = max((c.out_rel for c in calls if c.out_rel is not None), default=None)
    for c in {id(c): c for c in [first, *growths] if c is not None}.values():
        c.out_rel, c.out_excess, c.growth = (
            _finite(c.out_rel),
            _finite(c.out_excess),
            _finite(c.growth),
        )
        c.in_rel, c.in_excess = _finite(c.in_rel), _finite(c.in_excess)
    return Pass(calls, changes, first, nan, growths, worst)


def compare_traces(
    reference: Sequence[TraceRow | JsonObject],
    target: Sequence[TraceRow | JsonObject],
    tol: tuple[float, float] | None = None,
) -> Divergence:
    """The divergence section from the two sides' call rows (see the module docstring);
    rows as :func:`load_trace` returns them are read here. Forward and backward calls
    are two sequences, compared apart; the backward is the headline only when every
    forward call is within tolerance (a forward error changes every gradient after it)."""
    ref_all = [TraceRow.from_json(r) for r in reference]
    tgt_all = [TraceRow.from_json(r) for r in target]
    ref_rows = [r for r in ref_all if r.kind != BACKWARD]
    tgt_rows = [r for r in tgt_all if r.kind != BACKWARD]
    ref_keys = [r.key for r in ref_rows]
    fwd = _compare_pass(ref_rows, tgt_rows, tol)
    ref_back = [r for r in ref_all if r.kind == BACKWARD]
    tgt_back = [r for r in tgt_all if r.kind == BACKWARD]
    back = _compare_pass(ref_back, tgt_back, tol) if ref_back or tgt_back else None
    # the headline is the earliest in the run: step by step, a step's forward before its
    # backward (a backward-only defect in step 0 changes every weight of step 1's forward);
    # within one pass a NaN before a divergence (its NaN makes every error unbounded)
    found = [
        (site.step, rank, label)
        for site, rank, label in (
            (fwd.nan, 0, "nan"),
            (fwd.first, 1, "divergence"),
            (back.nan if back else None, 2, "backward-nan"),
            (back.first if back else None, 3, "backward-divergence"),
        )
        if site is not None
    ]
    worst = max((w for w in (fwd.worst, back.worst if back else None) if w), default=fwd.worst)
    if found:
        kind = min(found)[2]
    elif worst:
        kind = "noise"
    else:
        kind = "identical"
    return Divergence(
        traced=True,
        detail=_detail(kind, fwd.first, fwd.nan, worst, back),
        steps=len({k[0] for k in ref_keys}),
        calls={"reference": len(ref_rows), "target": len(tgt_rows)},
        compared=len(fwd.calls),
        kind=kind,
        worst_rel=_finite(fwd.worst),
        first=fwd.first,
        nan=fwd.nan,
        growths=fwd.growths,
        changes=fwd.changes[:TOP],
        order=_order(ref_keys, [r.key for r in tgt_rows]),
        backward=None
        if back is None
        else BackwardDivergence(
            calls={"reference": len(ref_back), "target": len(tgt_back)},
            compared=len(back.calls),
            worst_rel=_finite(back.worst),
            first=back.first,
            nan=back.nan,
            growths=back.growths,
        ),
    )


def _traced_call(
    row: TraceRow,
    other: TraceRow,
    index: int,
    tol: tuple[float, float] | None,
    changes: list[Change],
) -> TracedCall:
    """One call on both sides: its output's error against the reference, its input's,
    and how much the call grew what came in; a dtype or shape change goes to ``changes``."""
    r_out, t_out = row.out or NO_SUMMARY, other.out or NO_SUMMARY
    if r_out.dtype != t_out.dtype:
        changes.append(Change(row.step, row.path, row.call, "dtype", r_out.dtype, t_out.dtype))
    if r_out.shape != t_out.shape:
        changes.append(Change(row.step, row.path, row.call, "shape", r_out.shape, t_out.shape))
    out_rel, out_excess = _errors(other.out, row.out, tol)
    has_in = row.inp is not None and other.inp is not None
    in_rel, in_excess = _errors(other.inp, row.inp, tol) if has_in else (0.0, 0.0)
    if not out_rel:
        growth = 0.0
    elif math.isinf(in_rel):
        growth = 1.0  # a NaN or a shape change came in: the module carried it on
    else:
        growth = out_rel / max(in_rel, EPS32)
    return TracedCall(
        step=row.step,
        index=index,
        path=row.path,
        call=row.call,
        cls=row.cls,
        src=row.src,
        built=row.built,
        shape=r_out.shape,
        dtype=r_out.dtype,
        out_rel=out_rel,
        in_rel=in_rel if has_in else None,
        out_excess=out_excess,
        in_excess=in_excess if has_in else None,
        growth=growth,
        in_shape=row.inp.shape if row.inp else None,
        in_dtype=row.inp.dtype if row.inp else None,
    )


def _contains(c: TracedCall, first: TracedCall | None) -> bool:
    """Whether ``c`` is a module that holds ``first`` (its parent, the root model)."""
    if first is None or c is first or c.step != first.step or c.index < first.index:
        return False
    return c.path == "" or first.path.startswith(c.path + ".")


def _first_nan(reference: list[TraceRow], target: list[TraceRow]) -> NanSite | None:
    by_key = {r.key: r for r in reference}
    index_in_step: dict[int, int] = {}
    for row in target:
        index = index_in_step.get(row.step, 0)
        index_in_step[row.step] = index + 1
        out = row.out or NO_SUMMARY
        if not out.bad() or _bad(row.inp):
            continue
        ref = by_key.get(row.key)
        ref_out = ref.out if ref is not None else None
        if _bad(ref_out):
            continue  # the reference made it too: not where the sides part
        return NanSite(
            step=row.step,
            index=index,
            path=row.path,
            call=row.call,
            cls=row.cls,
            src=row.src,
            built=row.built,
            nan=int(out.nan or 0),
            inf=int(out.inf or 0),
            reference_nan=_bad(ref_out),
        )
    return None


def _detail(
    kind: str,
    first: TracedCall | None,
    nan: NanSite | None,
    worst: float | None,
    back: Pass | None = None,
) -> str:
    if kind == "nan" and nan is not None:
        return (
            f"the target's first NaN/Inf comes out of {nan.path or '(model)'} "
            f"({nan.cls}, call {nan.call}, step {nan.step}) from a finite input"
        )
    if kind == "divergence" and first is not None:
        return (
            f"the target first diverges at {first.path or '(model)'} ({first.cls}, call "
            f"{first.call}, step {first.step}): output off by {_g(first.out_rel)} of its "
            f"abs-max, {_g(first.growth)}x what came in"
        )
    if kind == "backward-nan" and back is not None and back.nan is not None:
        b = back.nan
        return (
            f"every forward call within tolerance; the target's first NaN/Inf gradient "
            f"comes out of the backward of {b.path or '(model)'} ({b.cls}, call {b.call}, "
            f"step {b.step}) from a finite gradient"
        )
    if kind == "backward-divergence" and back is not None and back.first is not None:
        b1 = back.first
        return (
            f"every forward call within tolerance; the target's gradients first diverge "
            f"in the backward of {b1.path or '(model)'} ({b1.cls}, call {b1.call}, step "
            f"{b1.step}): the gradient to its input off by {_g(b1.out_rel)} of its abs-max, "
            f"{_g(b1.growth)}x the gradient that came in"
        )
    if kind == "noise":
        return (
            f"every call within tolerance; the largest difference {worst:.3g} of a call's abs-max"
        )
    return "every traced call is identical on both sides"


def _g(x: float | None) -> str:
    return "unbounded" if x is None else f"{x:.3g}"


def divergence_for(
    reference: Path, target: Path, tol: tuple[float, float] | None = None
) -> Divergence:
    """The section from the two pulled trace files (``not traced`` when one is missing)."""
    missing = [p.name for p in (reference, target) if not p.is_file()]
    if missing:
        return Divergence(traced=False, detail="no trace from " + ", ".join(missing))
    try:
        _, ref_rows = load_trace(reference)
        _, tgt_rows = load_trace(target)
    except (OSError, TraceError) as exc:
        return Divergence(traced=False, detail=f"trace not read: {exc}")
    found = compare_traces(ref_rows, tgt_rows, tol)
    from remotemac.acceptance.drill import drill_for

    drill = drill_for(drill_path(reference), drill_path(target), tol)
    at = drill_at(found)
    if drill is not None and drill.ran and (at is None or at != drill.at()):
        # the op traces of another call (a drill pass of an older compare): not this run's
        drill.ran, drill.detail = False, "the op traces are of another call than the one named"
        drill.first = drill.nan = None
    found.drill = drill
    return found


def drill_path(trace: Path) -> Path:
    """Where a side's op trace lies beside its module trace (logs/<label>.drill.jsonl)."""
    return trace.with_name(trace.name.replace(".trace.jsonl", ".drill.jsonl"))


@dataclass(frozen=True)
class DrillAt:
    """The module call a drill pass runs alone: the first NaN's, else the first
    divergence's (forward calls only: the drill runs a forward)."""

    step: int
    path: str
    call: int

    def to_json(self) -> JsonObject:
        return {"step": self.step, "path": self.path, "call": self.call}


def drill_at(div: Divergence) -> DrillAt | None:
    """Which call to drill into, or None when the forward has nothing to drill."""
    site = div.nan if div.kind == "nan" else div.first if div.kind == "divergence" else None
    if site is None or site.path.startswith(("<", "?")):
        return None  # a module outside the model's tree cannot be found again by path
    return DrillAt(site.step, site.path, site.call)
