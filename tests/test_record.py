"""The acceptance record: building, schema validation, atomic writing and acceptance.md."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from remotemac.acceptance.compare import CompareRule, compare_outputs
from remotemac.acceptance.decide import memory_stable
from remotemac.acceptance.markdown import SPARK, render_markdown, sparkline
from remotemac.acceptance.record import (
    SUPPORTED_KEYWORDS,
    build_record,
    load_schema,
    validate,
    validate_record,
    write_record,
)

MiB = 1024 * 1024
SPEC_KEYS = [
    "schema_version",
    "run_id",
    "playbook",
    "host",
    "started_at",
    "finished_at",
    "verdict",
    "stopping_conditions",
    "observations",
    "environment",
    "dataset",
    "continuity",
    "wipe",
    "cost",
    "decision",
    "reproduce",
]


def train_tiny(out_dir: Path, *, drift: float = 0.0) -> None:
    """A real (CPU) training run writing the outputs a playbook would compare.

    ``drift`` stands in for a device whose kernels disagree with the reference.
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(64, 6), torch.randn(64, 1)
    for _ in range(20):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        if drift:
            model[2].weight.add_(drift)
        preds = model(x)
    (out_dir / "preds").mkdir(parents=True)
    torch.save({"state_dict": model.state_dict()}, out_dir / "model.pt")
    torch.save(preds, out_dir / "preds" / "train.pt")
    (out_dir / "metrics.json").write_text(
        json.dumps({"final": {"loss": float(torch.nn.functional.mse_loss(preds, y))}})
    )


RULES = [
    CompareRule(file="metrics.json", rtol=1e-4, atol=1e-5),
    CompareRule(file="preds/*.pt", rtol=1e-3, atol=1e-4),
    CompareRule(file="model.pt"),
]


def observations(results, *, stable_series=True) -> dict:
    series = [(float(t), 500 * MiB + (0 if stable_series else 4 * MiB * t)) for t in range(40)]
    mem = memory_stable(series, warmup_s=5, tolerance_bytes_per_s=MiB)
    return {
        "tensors_on_device": True,
        "operators": {"fallback_ops": [], "unsupported_ops": [], "dtype_errors": []},
        "memory": {
            "peak_bytes": mem["peak_bytes"],
            "stable": mem["stable"],
            "slope_bytes_per_s": mem["slope_bytes_per_s"],
            "samples": [list(s) for s in series],
        },
        "results": results,
    }


def full_record(results, **kw) -> dict:
    parts = dict(
        run_id="20260101-tiny-ab12",
        playbook="tiny-mlp",
        host="mac-rental",
        started_at="2026-01-01T10:00:00Z",
        finished_at="2026-01-01T10:30:00Z",
        observations=observations(results),
        environment={
            "reference": {"torch": "2.13.0", "python": "3.12.1"},
            "target": {"torch": "2.13.0", "python": "3.12.1"},
            "mismatches": [],
        },
        dataset={"revision": "sha256:ab", "files": 200, "bytes": 1 << 20, "encrypted": True},
        continuity={"disconnects": 1, "reconnects": 1, "drill": "passed"},
        wipe={
            "done": True,
            "verified": True,
            "removed": ["~/remotemac/runs/x/data"],
            "remaining": [],
        },
        cost={"hours": 2.5, "hourly_rate": 1.1, "currency": "USD"},
        context={"goal": "inference"},
        reproduce="remotemac run playbooks/tiny.yaml --host mac-rental",
    )
    parts.update(kw)
    return build_record(**parts)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("runs")
    train_tiny(root / "cpu")
    train_tiny(root / "same")
    train_tiny(root / "drift", drift=1e-2)
    return {name: root / name for name in ("cpu", "same", "drift")}


def test_workload_within_tolerance_is_accepted(runs, tmp_path):
    results = compare_outputs(runs["cpu"], runs["same"], RULES)
    rec = full_record(results)
    assert rec["verdict"] == "accepted"
    assert rec["stopping_conditions"] == [] and rec["missing_observations"] == []
    assert rec["decision"]["recommendation"] == "apple-silicon-first"
    assert rec["cost"]["amount"] == 2.75
    assert validate_record(rec) == []
    json_path, md_path = write_record(tmp_path / "out", rec)
    assert json.loads(json_path.read_text()) == rec
    assert md_path.read_text().startswith("# Acceptance: tiny-mlp — ACCEPTED\n")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "acceptance.json",
        "acceptance.md",
    ]  # no temporary files left behind


def test_workload_beyond_tolerance_is_rejected_naming_file_and_tensor(runs):
    rec = full_record(compare_outputs(runs["cpu"], runs["drift"], RULES))
    assert rec["verdict"] == "rejected"
    (cond,) = rec["stopping_conditions"]
    assert cond["code"] == "results_outside_tolerance"
    assert "model.pt [state_dict.2.weight]" in cond["detail"]
    assert "preds/train.pt [(root)]" in cond["detail"]
    # the loss moved by 6e-5 relative: inside the playbook's rtol 1e-4, so not named
    assert "metrics.json" not in cond["detail"]
    files = {f["path"]: f for f in rec["observations"]["results"]["files"]}
    assert files["metrics.json"]["ok"] is True and files["metrics.json"]["max_abs_err"] > 0
    assert rec["decision"]["recommendation"] == "linux-gpu-first"
    assert validate_record(rec) == []
    md = render_markdown(rec)
    assert md.startswith("# Acceptance: tiny-mlp — REJECTED\n")
    assert "| `model.pt` | `state_dict.2.weight` | 1×16 | float32 |" in md
    assert "| `results_outside_tolerance` |" in md


def test_every_spec_key_is_present_even_when_nothing_is_known():
    rec = build_record(run_id="r1")
    assert (
        list(rec)[: len(SPEC_KEYS) + 1] == SPEC_KEYS[:7] + ["missing_observations"] + SPEC_KEYS[7:]
    )
    assert rec["schema_version"] == "1"
    assert rec["verdict"] == "incomplete"
    assert rec["missing_observations"] == ["tensors_on_device", "operators", "memory", "results"]
    obs = rec["observations"]
    assert obs["operators"] == {"fallback_ops": None, "unsupported_ops": None, "dtype_errors": None}
    assert obs["memory"] == {"peak_bytes": None, "stable": None, "slope_bytes_per_s": None}
    assert rec["wipe"] == {"done": None, "verified": None, "removed": [], "remaining": []}
    assert rec["cost"]["amount"] is None
    assert validate_record(rec) == []


def test_lost_job_is_incomplete_and_a_stopping_condition_rejects(runs):
    results = compare_outputs(runs["cpu"], runs["same"], RULES)
    obs = observations(results)
    obs["results"] = None  # the target never finished: nothing to compare
    rec = build_record(run_id="r", observations=obs)
    assert rec["verdict"] == "incomplete" and rec["missing_observations"] == ["results"]
    rec = build_record(
        run_id="r",
        observations=observations(results),
        stopping_conditions=[{"code": "out_of_memory", "detail": "MPS backend out of memory"}],
    )
    assert rec["verdict"] == "rejected"
    assert rec["stopping_conditions"] == [
        {"code": "out_of_memory", "detail": "MPS backend out of memory"}
    ]


def test_leaking_memory_rejects(runs):
    results = compare_outputs(runs["cpu"], runs["same"], RULES)
    obs = observations(results, stable_series=False)
    rec = build_record(run_id="r", observations=obs, stop_when={"memory_growth": True})
    assert obs["memory"]["stable"] is False
    assert rec["verdict"] == "rejected"
    assert [c["code"] for c in rec["stopping_conditions"]] == ["memory_growth"]


# ---------------------------------------------------------------- schema


def test_schema_uses_only_what_the_validator_checks():
    def walk(node):
        if isinstance(node, dict):
            assert set(node) <= SUPPORTED_KEYWORDS, set(node) - SUPPORTED_KEYWORDS
            for sub in node.get("properties", {}).values():
                walk(sub)
            if "items" in node:
                walk(node["items"])

    schema = load_schema()
    walk(schema)
    assert schema["required"] == SPEC_KEYS
    assert validate(1, {"minimum": 0}) == ["$: schema uses unsupported keyword(s) ['minimum']"]


@pytest.mark.parametrize(
    "breakage, expected",
    [
        (lambda r: r.pop("wipe"), "$: missing required key 'wipe'"),
        (
            lambda r: r.update(verdict="maybe"),
            "$.verdict: 'maybe' is not one of ['accepted', 'rejected', 'incomplete']",
        ),
        (
            lambda r: r["decision"].update(recommendation="windows-first"),
            "$.decision.recommendation",
        ),
        (
            lambda r: r["observations"]["memory"].pop("stable"),
            "$.observations.memory: missing required key 'stable'",
        ),
        (
            lambda r: r["observations"].update(tensors_on_device="yes"),
            "$.observations.tensors_on_device: expected boolean or null, got str",
        ),
        (
            lambda r: r["observations"]["results"]["files"][0].pop("max_abs_err"),
            "$.observations.results.files[0]: missing required key 'max_abs_err'",
        ),
        (lambda r: r.update(schema_version=1), "$.schema_version: expected string, got int"),
        (lambda r: r["cost"].update(amount=float("nan")), "not representable as strict JSON"),
    ],
)
def test_broken_records_do_not_validate(runs, breakage, expected):
    rec = full_record(compare_outputs(runs["cpu"], runs["same"], RULES))
    assert validate_record(rec) == []
    broken = copy.deepcopy(rec)
    breakage(broken)
    problems = validate_record(broken)
    assert any(expected in p for p in problems), problems


def test_write_refuses_an_invalid_record_and_writes_nothing(tmp_path):
    rec = build_record(run_id="r")
    rec["verdict"] = "maybe"
    with pytest.raises(ValueError, match="verdict"):
        write_record(tmp_path, rec)
    assert list(tmp_path.iterdir()) == []


def test_write_replaces_an_existing_record(tmp_path):
    write_record(tmp_path, build_record(run_id="first"))
    json_path, _ = write_record(tmp_path, build_record(run_id="second"))
    assert json.loads(json_path.read_text())["run_id"] == "second"
    assert len(list(tmp_path.iterdir())) == 2


def test_infinite_values_are_written_as_null(tmp_path):
    rec = build_record(run_id="r", cost={"hours": float("inf")})
    json_path, _ = write_record(tmp_path, rec)
    text = json_path.read_text()
    assert "Infinity" not in text and json.loads(text)["cost"]["hours"] is None


# ---------------------------------------------------------------- markdown


def test_markdown_has_every_section_and_table(runs):
    rec = full_record(compare_outputs(runs["cpu"], runs["same"], RULES))
    rec["observations"]["operators"]["fallback_ops"] = [{"op": "aten::col2im", "count": 12}]
    rec["environment"]["mismatches"] = [{"key": "numpy", "reference": "2.4.6", "target": "2.3.0"}]
    md = render_markdown(rec)
    for heading in (
        "## Observations",
        "### Tensors on device",
        "### Operators",
        "### Memory",
        "### Results",
        "## Stopping conditions",
        "## Environment",
        "## Dataset",
        "## Continuity",
        "## Wipe",
        "## Cost",
        "## Decision",
        "## Reproduce",
    ):
        assert f"\n{heading}\n" in md, heading
    assert "| observation | result | summary |" in md
    assert "| fallback | aten::col2im | 12 |" in md
    assert "| `metrics.json` | pass |" in md
    assert "| numpy | 2.4.6 | 2.3.0 |" in md
    assert "| bytes | 1048576 (1.0 MiB) |" in md
    # the two sides wrote the same bytes: passed without loading, no per-key rows
    assert "| `metrics.json` | pass |" in md and "byte-identical: passed without loading" in md
    assert "2.5 h × 1.1 USD/h = **2.75 USD**" in md
    assert "**apple-silicon-first**" in md
    assert "```sh\nremotemac run playbooks/tiny.yaml --host mac-rental\n```" in md
    assert f"`{SPARK[0] * 40}`" in md  # a flat memory line
    assert render_markdown(copy.deepcopy(rec)) == md  # deterministic


def test_markdown_of_an_incomplete_record_says_what_is_missing():
    md = render_markdown(build_record(run_id="r9", host="mac"))
    assert md.startswith("# Acceptance: r9 — INCOMPLETE\n")
    assert "not observed: tensors_on_device, operators, memory, results" in md
    assert "| results | not observed |" in md


def test_table_cells_are_escaped():
    rec = build_record(run_id="r", stopping_conditions=[{"code": "x|y", "detail": "a|b\nc <d>"}])
    assert "| `x\\|y` | a\\|b c &lt;d> |" in render_markdown(rec)


def test_sparkline_shows_a_leak_rising():
    line = sparkline([float(i) for i in range(100)], width=8)
    assert line == SPARK
    assert sparkline([5.0, 5.0, 5.0]) == SPARK[0] * 3
    assert sparkline([]) == ""
