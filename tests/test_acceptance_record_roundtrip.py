"""The acceptance record's types read every stored record and write it back key for key
(``to_json(from_json(x)) == x``, key order included), so reading a record through them
loses nothing and an old record (a section missing, a key renamed since) still reads.

The records are tests/fixtures/acceptance's (written from main before the types, see its
make_cases.py): built ones, ones from a real CPU training's compare, old and partial ones.
Fast tier: pure functions over stored JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remotemac.acceptance.divergence import Divergence, TraceRow, compare_traces
from remotemac.acceptance.observations import FileResult, Observations, OpEntry, ResultsSeen
from remotemac.acceptance.recordtypes import (
    AcceptanceRecord,
    DecisionContext,
    Mismatch,
    StoppingCondition,
    StopWhen,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "acceptance"
#: raw_weird_values puts a string where an object belongs (``"deadman": "not a dict"``):
#: it is read as "not known" and renders (test_acceptance_render_stable), not kept
RECORDS = sorted(p for p in FIXTURES.glob("*.record.json") if "weird" not in p.name)


def _text(value) -> str:
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_a_stored_record_reads_and_writes_back_key_for_key(path: Path):
    stored = json.loads(path.read_text(encoding="utf-8"))
    typed = AcceptanceRecord.from_json(stored)
    assert _text(typed.to_json()) == _text(stored)
    if "observations" in stored:
        obs = Observations.from_json(stored["observations"])
        assert _text(obs.to_json()) == _text(stored["observations"])


def test_the_sections_read_typed():
    stored = json.loads((FIXTURES / "build_rich_rejected.record.json").read_text("utf-8"))
    rec = AcceptanceRecord.from_json(stored)
    assert rec.verdict == "rejected" and rec.cost.amount == 1.08
    assert [c.code for c in rec.stopping_conditions][:2] == ["cuda-dependency", "out_of_memory"]
    assert rec.stopping_conditions[0].extra == {"lines": [{"line": "x"}]}
    assert rec.environment.target.chip == "Apple M2" and rec.environment.reference.has("lock_hash")
    assert not rec.environment.target.has("lock_hash")
    assert rec.environment.reference.extra == {"extra_fact": 1}
    bare = rec.environment.mismatches[2]
    assert bare.is_bare and bare.to_json() == "python differs"
    assert rec.deadman is not None and rec.deadman.method == "launchd"
    assert rec.cpu is not None and rec.cpu.agent_calls == 12
    first = rec.observations.results.files[0]
    assert isinstance(first, FileResult) and first.first_failing_key == "s"
    assert [t.key for t in first.tensors if t.metadata] == ["meta.dir"]
    assert first.worst[0].max_rel_err == 1.5 and first.metadata_differences[0].key == "meta.k0"
    ops = rec.observations.operators
    assert ops.fallback_ops is not None and ops.fallback_ops[1].is_bare
    assert ops.fallback_ops[0].title() == "aten::isin.Tensor_Tensor_out"
    assert rec.observations.processes is not None and rec.observations.processes[9].pid == 109


def test_an_old_record_reads_with_defaults():
    rec = AcceptanceRecord.from_json({"run_id": "r"})
    assert rec.verdict is None and rec.stopping_conditions == [] and rec.divergence is None
    assert rec.process_behaviour is None and rec.deadman is None and rec.cpu is None
    assert rec.observations.results.files == [] and not rec.observations.operators.observed
    assert rec.to_json() == {"run_id": "r"}
    assert AcceptanceRecord.from_json(None).run_id is None


def test_values_built_in_code_write_every_field():
    cond = StoppingCondition("job-lost", "gone")
    assert cond.to_json() == {"code": "job-lost", "detail": "gone"}
    assert StoppingCondition.from_json(cond.to_json()) == cond
    results = ResultsSeen(False, [{"path": "a.pt", "ok": False}], ["a.pt"])
    assert isinstance(results.files[0], FileResult)
    assert results.to_json() == {
        "within_tolerance": False,
        "files": [{"path": "a.pt", "ok": False}],
        "converted": ["a.pt"],
    }
    assert OpEntry.from_json({"op": "x", "count": 2}).to_json() == {"op": "x", "count": 2}
    assert OpEntry.from_json("aten::x").to_json() == "aten::x"
    assert Mismatch.from_json({"key": "os"}).to_json() == {"key": "os"}


def test_stop_when_and_context_keep_the_playbook_defaults():
    assert StopWhen.from_json(None) == StopWhen("any", True, None)
    assert StopWhen.from_json({"fallback_ops": None}).fallback_ops is None
    sw = {"fallback_ops": ["isin"], "memory_growth": "required", "max_memory": "1GiB"}
    assert StopWhen.from_json(sw).to_json() == sw
    ctx = {"goal": "training", "stop_when": sw, "cuda_dependencies": ["apex"], "more": 1}
    typed = DecisionContext.from_json(ctx)
    assert typed.stop_when.memory_growth == "required" and typed.extra == {"more": 1}
    assert typed.to_json() == ctx


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("trace_*.json")), ids=lambda p: p.name)
def test_a_divergence_section_and_trace_rows_read_back(path: Path):
    case = json.loads(path.read_text(encoding="utf-8"))
    div = Divergence.from_json(case["divergence"])
    assert _text(div.to_json()) == _text(case["divergence"])
    rows = [TraceRow.from_json(r) for r in case["reference"]]
    assert all(r.out is not None for r in rows)
    tol = tuple(case["tol"]) if case["tol"] else None
    again = compare_traces(rows, [TraceRow.from_json(r) for r in case["target"]], tol)
    assert _text(json.loads(_text(again.to_dict()))) == _text(case["divergence"])
