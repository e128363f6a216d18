"""The op-level drill-down's compare: which aten op inside the first divergent module
made the difference (agent/opdrill.py ran that one call on both sides, under an
operator trace, with the reference's input and weights).

The two op sequences are aligned by op name and module (difflib: a target that ran an
op the reference did not, a fallback's extra copy, does not shift every op after it).
Then, in the target's order:

* the **first differing op**: a matched op whose output differs beyond the tolerance
  while its first input grew the error by more than ``GROWTH`` (the module trace's rule);
  an op the target ran alone is compared with the reference's last value of the same
  shape at that point (the value it took the place of: ``one_side``);
* the **first NaN/Inf op**: the first target op whose output holds a NaN or Inf while
  none of its inputs did, and whose reference counterpart's output was finite; when
  none did (a NaN written in from a Python constant: ``aten::lift_fresh`` of it), the
  first op whose output holds one, with ``in_bad`` saying it came with its inputs.

Plain JSON lines both ways; nothing is unpickled here.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.acceptance.divergence import (
    EPS32,
    GROWTH,
    NO_SUMMARY,
    DrillAt,
    Summary,
    _errors,
    _finite,
    read_jsonl,
)
from remotemac.acceptance.jsonfields import JsonFields, parse_optional
from remotemac.agent.protocol import JsonObject

DRILL_SCHEMA = "remotemac.drill/1"
#: an op trace bigger than this is not read
MAX_DRILL_BYTES = 64 * 1024**2
#: how many one-side ops the section lists
TOP = 5


@dataclass
class OpSite(JsonFields):
    """One op of the target's drill, against its reference counterpart."""

    index: int  # position in the target's op sequence
    op: str  # aten::mul
    module: str | None  # the innermost module running it
    shape: list[int] | None = None
    dtype: str | None = None
    out_rel: float | None = None  # null: unbounded (a NaN or Inf on one side)
    in_rel: float | None = None
    growth: float | None = None
    nan: int = 0
    inf: int = 0
    one_side: bool = False  # the reference ran no such op there
    in_bad: int = 0  # NaN/Inf already in its inputs (a constant the code wrote in)


@dataclass
class OpDrill(JsonFields):
    """The ``drill`` part of the divergence section."""

    ran: bool
    detail: str
    path: str | None = None
    call: int | None = None
    step: int | None = None
    cls: str | None = None
    ops: dict[str, int] = field(default_factory=dict)
    first: OpSite | None = None
    nan: OpSite | None = None
    only_reference: list[str] = field(default_factory=list)
    only_target: list[str] = field(default_factory=list)
    #: the sha256 of the reference's saved input, the one the target loaded (the file
    #: crosses hosts through the laptop when the sides are on two)
    input_sha256: str | None = None

    JSON_PARSE = {
        "first": parse_optional(OpSite.from_json),
        "nan": parse_optional(OpSite.from_json),
    }

    def at(self) -> DrillAt | None:
        """The call this drill ran (as the reference's op trace names it)."""
        if self.path is None or self.step is None:
            return None
        return DrillAt(int(self.step), self.path, int(self.call or 0))


@dataclass(frozen=True)
class OpRow:
    """One op of an op trace (agent/opdrill.py's row)."""

    index: int
    op: str
    module: str | None
    out: Summary | None
    inp: Summary | None
    in_bad: int

    @classmethod
    def from_json(cls, row: JsonObject) -> OpRow:
        return cls(
            index=int(row.get("i") or 0),
            op=str(row.get("op")),
            module=row.get("module") if isinstance(row.get("module"), str) else None,
            out=Summary.from_json(row.get("out")),
            inp=Summary.from_json(row.get("in")),
            in_bad=int(row.get("in_bad") or 0),
        )

    @property
    def name(self) -> str:
        return f"{self.op} in {self.module or '?'}"


class DrillError(ValueError):
    """An op trace that is not one (wrong schema, not JSON, too big)."""


def load_drill(path: Path) -> tuple[JsonObject, list[OpRow]]:
    header, rows = read_jsonl(path, DRILL_SCHEMA, "op", MAX_DRILL_BYTES, DrillError)
    return header, [OpRow.from_json(row) for row in rows]


def _growth(out_rel: float, in_rel: float) -> float:
    if not out_rel:
        return 0.0
    if math.isinf(in_rel):
        return 1.0
    return out_rel / max(in_rel, EPS32)


def _site(row: OpRow, out_rel: float, in_rel: float, one_side: bool) -> OpSite:
    out = row.out or NO_SUMMARY
    return OpSite(
        index=row.index,
        op=row.op,
        module=row.module,
        shape=out.shape,
        dtype=out.dtype,
        out_rel=_finite(out_rel),
        in_rel=_finite(in_rel),
        growth=_finite(_growth(out_rel, in_rel)),
        nan=int(out.nan or 0),
        inf=int(out.inf or 0),
        one_side=one_side,
    )


def _last_same_shape(rows: list[OpRow], before: int, shape: Any) -> Summary | None:
    """The reference's latest output of ``shape`` among its first ``before`` ops."""
    for row in reversed(rows[:before]):
        if row.out is not None and row.out.shape == shape:
            return row.out
    return None


def compare_drills(
    ref_header: JsonObject,
    ref_rows: list[OpRow],
    tgt_header: JsonObject,
    tgt_rows: list[OpRow],
    tol: tuple[float, float] | None = None,
) -> OpDrill:
    """The drill's part of the section from the two sides' op traces."""
    where = {k: ref_header.get(k) for k in ("path", "call", "step", "cls")}
    drill = OpDrill(ran=True, detail="", **where)  # type: ignore[arg-type]
    drill.ops = {"reference": len(ref_rows), "target": len(tgt_rows)}
    errors = [
        f"{side}: {h.get('error')}"
        for side, h in (("reference", ref_header), ("target", tgt_header))
        if h.get("error")
    ]
    if errors or not ref_header.get("reached") or not tgt_header.get("reached"):
        drill.ran = False
        drill.detail = "; ".join(errors) or "the drill pass did not reach the call"
        return drill
    saved, loaded = ref_header.get("input_sha256"), tgt_header.get("input_sha256")
    if saved != loaded:
        # the target ran on other bytes than the reference saved (a copy that went
        # wrong): every op could differ, and none of it would be the target's arithmetic
        drill.ran = False
        drill.detail = (
            f"the target's input (sha256 {str(loaded)[:12]}) is not the one the reference "
            f"saved (sha256 {str(saved)[:12]})"
        )
        return drill
    drill.input_sha256 = saved if isinstance(saved, str) else None
    matcher = difflib.SequenceMatcher(
        None, [(r.op, r.module) for r in ref_rows], [(r.op, r.module) for r in tgt_rows], False
    )
    counterpart: dict[int, int] = {}  # target index -> reference index
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            counterpart[block.b + k] = block.a + k
    matched_ref = set(counterpart.values())
    drill.only_reference = [r.name for i, r in enumerate(ref_rows) if i not in matched_ref][:TOP]
    drill.only_target = [r.name for i, r in enumerate(tgt_rows) if i not in counterpart][:TOP]
    ref_at = 0  # the reference ops up to the target's position
    appeared: OpSite | None = None  # the first NaN/Inf, made here or not
    for i, row in enumerate(tgt_rows):
        j = counterpart.get(i)
        if j is not None:
            ref_at = j + 1
            ref_out, ref_in = ref_rows[j].out, ref_rows[j].inp
        else:
            shape = (row.out or NO_SUMMARY).shape
            ref_out = _last_same_shape(ref_rows, ref_at, shape)
            ref_in = _last_same_shape(ref_rows, ref_at, (row.inp or NO_SUMMARY).shape)
        # an op on one side with no value of its shape before it: nothing to compare with
        out_rel, out_excess = _errors(row.out, ref_out, tol) if ref_out else (0.0, 0.0)
        in_rel, _ = _errors(row.inp, ref_in, tol) if ref_in and row.inp else (0.0, 0.0)
        has_nan = row.out is not None and row.out.bad()
        ref_finite = ref_out is None or not ref_out.bad() or j is None
        if drill.nan is None and has_nan and not row.in_bad and ref_finite:
            drill.nan = _site(row, out_rel, in_rel, j is None)
        if appeared is None and has_nan and ref_finite:
            appeared = _site(row, out_rel, in_rel, j is None)
            appeared.in_bad = row.in_bad
        if drill.first is None and out_excess > 1 and _growth(out_rel, in_rel) > GROWTH:
            drill.first = _site(row, out_rel, in_rel, j is None)
    if drill.nan is None:
        # no op made it from finite inputs: it came in from outside the ops (a Python
        # constant lifted into a tensor and written in): where it first shows
        drill.nan = appeared
    drill.detail = _detail(drill)
    return drill


def _detail(drill: OpDrill) -> str:
    inside = drill.path or "(model)"
    if drill.nan is not None:
        return (
            f"first NaN/Inf op: {drill.nan.op} in {drill.nan.module or inside} "
            f"(op {drill.nan.index} of the target's {drill.ops.get('target')})"
        )
    if drill.first is not None:
        alone = ", run on the target only" if drill.first.one_side else ""
        return (
            f"first differing op: {drill.first.op} in {drill.first.module or inside} "
            f"(op {drill.first.index} of the target's {drill.ops.get('target')}{alone})"
        )
    return f"every op of {inside} within tolerance with the reference's input and weights"


def drill_for(
    reference: Path, target: Path, tol: tuple[float, float] | None = None
) -> OpDrill | None:
    """The drill from the two pulled op traces; None when no drill pass ran."""
    if not reference.is_file() and not target.is_file():
        return None
    missing = [p.name for p in (reference, target) if not p.is_file()]
    if missing:
        return OpDrill(ran=False, detail="no op trace from " + ", ".join(missing))
    try:
        ref_header, ref_rows = load_drill(reference)
        tgt_header, tgt_rows = load_drill(target)
    except (OSError, DrillError) as exc:
        return OpDrill(ran=False, detail=f"op trace not read: {exc}")
    return compare_drills(ref_header, ref_rows, tgt_header, tgt_rows, tol)
