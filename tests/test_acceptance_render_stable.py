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
