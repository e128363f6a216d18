"""acceptance.md, the record and the divergence section come out byte for byte as they
did before the record was read through typed objects (issue 33).

The fixtures in tests/fixtures/acceptance were written once by its make_cases.py with the
code of main before the typing sweep: records built from playbook-like inputs (the verdict,
the stopping conditions the observations show, the recommendation), records from
tests/test_record.py's real CPU training and compare, records from before a section
existed or with odd values, and trace pairs from tests/test_divergence.py's row form.
Fast tier: pure functions over stored JSON, no torch, no host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remotemac.acceptance.divergence import compare_traces
from remotemac.acceptance.markdown import render_markdown
from remotemac.acceptance.record import build_record, validate_record

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "acceptance"
BUILDS = sorted(
    p.name[len("build_") : -len(".inputs.json")] for p in FIXTURES.glob("build_*.inputs.json")
)
RAWS = sorted(
    p.name[len("raw_") : -len(".record.json")] for p in FIXTURES.glob("raw_*.record.json")
)
TRACES = sorted(p.name[len("trace_") : -len(".json")] for p in FIXTURES.glob("trace_*.json"))


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_the_fixtures_are_there():
    assert len(BUILDS) >= 8 and len(RAWS) >= 8 and len(TRACES) >= 4


@pytest.mark.parametrize("name", BUILDS)
def test_a_built_record_is_the_stored_one_and_renders_the_stored_markdown(name):
    record = json.loads(json.dumps(build_record(**_json(FIXTURES / f"build_{name}.inputs.json"))))
    assert json.loads(json.dumps(record)) == _json(FIXTURES / f"build_{name}.record.json")
    assert validate_record(record) == []
    assert render_markdown(record) == (FIXTURES / f"build_{name}.md").read_text("utf-8")


@pytest.mark.parametrize("name", RAWS)
def test_a_stored_record_renders_the_stored_markdown(name):
    record = _json(FIXTURES / f"raw_{name}.record.json")
    assert render_markdown(record) == (FIXTURES / f"raw_{name}.md").read_text("utf-8")


@pytest.mark.parametrize("name", TRACES)
def test_two_traces_give_the_stored_divergence_section(name):
    case = _json(FIXTURES / f"trace_{name}.json")
    tol = tuple(case["tol"]) if case["tol"] else None
    found = compare_traces(case["reference"], case["target"], tol).to_dict()
    assert json.loads(json.dumps(found)) == case["divergence"]


def _assert_close(got: object, want: object, where: str = "files") -> None:
    """``got`` is ``want`` with each float within 1 % of it (relative): same keys, same
    lengths, same strings and verdicts."""
    if isinstance(want, float) and isinstance(got, (int, float)):
        assert abs(got - want) <= 1e-2 * max(abs(want), 1e-12), (where, got, want)
    elif isinstance(want, dict) and isinstance(got, dict):
        assert list(got) == list(want), where
        for key in want:
            _assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _assert_close(g, w, f"{where}[{i}]")
    else:
        assert got == want, (where, got, want)


def test_observations_built_as_the_engine_builds_them_give_the_stored_record(tmp_path):
    """The engine's way in (engine/record.py ``observe``/``_memory`` on main): the
    compare phase's file objects, the memory figures dict filled after ``Memory`` wraps
    it, the harness's operators and processes; a real CPU training's compare. The
    record's JSON text and its markdown are main's, byte for byte (engine_built.*)."""
    from remotemac.acceptance.compare import compare_outputs
    from remotemac.acceptance.decide import memory_stable
    from remotemac.acceptance.observations import Memory, Observations, Operators, ResultsSeen
    from tests.test_record import RULES, train_tiny

    for name, drift in (("cpu", 0.0), ("drift", 1e-2)):
        train_tiny(tmp_path / name, drift=drift)
    found = compare_outputs(tmp_path / "cpu", tmp_path / "drift", RULES).to_dict()
    # a CPU's float results differ in their last digits from one processor to another
    # (vector width, reduction order); the compare is checked against the stored one
    # within that, then the stored one is rendered, so the bytes compared are the code's
    stored = _json(FIXTURES / "engine_built.record.json")["observations"]["results"]
    _assert_close(found["files"], stored["files"])
    assert found["within_tolerance"] == stored["within_tolerance"]
    found["files"] = stored["files"]
    figures = memory_stable([(float(t), 1e8 + 3e6 * t) for t in range(40)])
    memory = Memory(figures)
    figures["source"] = "process-tree-pss"
    figures["samples"] = [[float(t), 1e8 + 3e6 * t] for t in range(40)]
    given = _json(FIXTURES / "engine_built.inputs.json")
    observations = Observations(
        tensors_on_device=True,
        operators=Operators.from_dict(given["operators"]),
        torch_imported=True,
        memory=memory,
        processes=[given["process"]],
        results=ResultsSeen(found["within_tolerance"], found["files"], ["model.pt"]),
        reproducibility={"reproduces": True, "files": []},
    )
    record = build_record(observations=observations, **given["build"])
    text = json.dumps(record)
    assert text + "\n" == (FIXTURES / "engine_built.record.json").read_text("utf-8")
    md = render_markdown(json.loads(text))
    assert md == (FIXTURES / "engine_built.md").read_text("utf-8")
