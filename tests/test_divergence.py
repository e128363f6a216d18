"""Issue 35, the parts: the observer's trace (a real process under the job's
sitecustomize, real torch on the CPU) and the laptop's compare of two traces.

The whole pipeline with a perturbed target: test_divergence_local.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from remotemac.acceptance.divergence import compare_traces, load_trace
from remotemac.acceptance.markdown import render_markdown

# ---------------------------------------------------------------- the observer's side

PROBE = """
import sys, torch
from torch import nn
from torch.nn.modules import module as hooks
shared = nn.Tanh()
model = nn.Sequential(nn.Linear(4, 4), shared, nn.Linear(4, 4), shared)
print("hooks", len(hooks._global_forward_hooks), len(hooks._global_forward_pre_hooks))
print("loaded", "_remotemac_modtrace" in sys.modules)
print("init", nn.Module.__init__.__module__)
normalize = nn.Identity()  # a transform: an nn.Module without weights, run first
for _ in range(3):
    model(normalize(torch.ones(2, 4))).sum().backward()
print("after", len(hooks._global_forward_hooks), len(hooks._global_forward_pre_hooks))
print("init", nn.Module.__init__.__module__)
"""


def _probe(tmp_path: Path, trace: dict | None) -> tuple[list[str], Path]:
    import os
    import subprocess

    from remotemac.agent import runner

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    path = tmp_path / "job.trace.jsonl"
    observe = {"dir": str(tmp_path / "obs"), "device": "cpu", "interval": 5.0}
    if trace is not None:
        observe["trace"] = {**trace, "path": str(path)}
    runner.prepare_observer(runner.ObserveSpec.from_json(observe), env)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines(), path


@pytest.mark.e2e
def test_tracing_off_registers_no_hook_and_loads_nothing(tmp_path):
    lines, path = _probe(tmp_path, None)
    assert lines == [
        "hooks 0 0",
        "loaded False",
        "init torch.nn.modules.module",
        "after 0 0",
        "init torch.nn.modules.module",
    ]
    assert not path.exists()


@pytest.mark.e2e
def test_tracing_on_records_n_steps_then_removes_its_hooks(tmp_path):
    lines, path = _probe(tmp_path, {"steps": 2})
    # nn.Module.__init__ is wrapped while tracing, torch's own again once it stops
    assert lines == [
        "hooks 1 1",
        "loaded True",
        "init _remotemac_modtrace",
        "after 0 0",
        "init torch.nn.modules.module",
    ]
    header, rows = load_trace(path)
    assert header["schema"] == "remotemac.trace/1" and header["device"] == "cpu"
    assert {r["step"] for r in rows} == {0, 1}
    step0 = [(r["path"], r["call"]) for r in rows if r["step"] == 0 and "pass" not in r]
    # children before their parent; the reused module keyed by its call index; the
    # transform is not the model: the next batch's belongs to the step in progress
    assert step0 == [("0", 0), ("1", 0), ("2", 0), ("1", 1), ("", 0), ("<Identity>", 0)]

    # where each module was built: the probe's lines (not torch's, not the forward's)
    def at(text: str) -> str:
        return f"probe.py:{1 + PROBE.splitlines().index(text)}"

    seq, shared = (
        at("model = " + PROBE.split("model = ")[1].splitlines()[0]),
        at("shared = nn.Tanh()"),
    )
    assert {r["path"]: r["built"] for r in rows if r["step"] == 0} == {
        "0": seq,
        "1": shared,
        "2": seq,
        "": seq,
        "<Identity>": at(next(ln for ln in PROBE.splitlines() if ln.startswith("normalize"))),
    }
    out = rows[0]["out"]
    assert out["shape"] == [2, 4] and out["dtype"] == "float32" and out["nan"] == 0
    assert len(out["sample"]) == 8 and out["stride"] == 1  # 8 values: every one sampled
    assert rows[0]["in"]["sum"] == 8.0 and rows[0]["in"]["absmax"] == 1.0
    # the backward of each step, in the order its gradients were made: the model's
    # (the gradient of its output came in; its input needs none: no gradient out),
    # then the layers from the last, the shared Tanh's two calls apart; a row is
    # written when its call's backward is complete: the first Linear's as soon as its
    # output's gradient is in (its input needs none), a hair before the Tanh it fed
    back = [r for r in rows if r["step"] == 0 and r.get("pass") == "backward"]
    assert [(r["path"], r["call"], r["i"]) for r in back] == [
        ("", 0, 0),
        ("1", 1, 1),
        ("2", 0, 2),
        ("0", 0, 3),
        ("1", 0, 4),
    ]
    assert back[0]["out"] is None and back[0]["in"]["sum"] == 8.0  # d sum / d output = 1
    assert back[3]["out"] is None  # the first Linear's input (the data) needs no gradient
    assert all(r["in"]["shape"] == [2, 4] for r in back)
    assert [r["out"]["shape"] for r in back if r["path"] not in ("", "0")] == [[2, 4]] * 3
    # the Tanh's call 0 hands on the gradient the first Linear got
    assert back[4]["out"] == back[3]["in"]
    assert {r["step"] for r in rows if r.get("pass") == "backward"} == {0, 1}


# ---------------------------------------------------------------- the compare


def _row(step, i, path, call, out, inp=None, dtype="float32", shape=(4,)):
    summary = {"shape": list(shape), "dtype": dtype, "device": "cpu", "nan": 0, "inf": 0}
    return {
        "step": step,
        "i": i,
        "path": path,
        "call": call,
        "cls": "X",
        "src": "m.py:1",
        "built": "m.py:9",
        "out": {**summary, "sample": out, "absmax": max(abs(v) for v in out), "sum": sum(out)},
        "in": None
        if inp is None
        else {**summary, "sample": inp, "absmax": max(abs(v) for v in inp), "sum": sum(inp)},
    }


def test_a_dtype_change_and_a_call_on_one_side_only_are_reported():
    ref = [_row(0, 0, "a", 0, [1.0, 2.0]), _row(0, 1, "b", 0, [1.0, 2.0]), _row(0, 2, "", 0, [3.0])]
    tgt = [
        _row(0, 0, "a", 0, [1.0, 2.0], dtype="float16"),
        _row(0, 1, "c", 0, [1.0]),
        _row(0, 2, "", 0, [3.0]),
    ]
    div = compare_traces(ref, tgt)
    assert [(c.path, c.what, c.reference, c.target) for c in div.changes] == [
        ("a", "dtype", "float32", "float16")
    ]
    assert div.order is not None
    assert (div.order.step, div.order.index, div.order.reference, div.order.target) == (
        0,
        1,
        "b#0",
        "c#0",
    )
    assert div.order.only_reference == ["b#0"] and div.order.only_target == ["c#0"]


def test_the_rule_tolerance_decides_what_is_beyond_it():
    ref = [_row(0, 0, "a", 0, [1.0, 2.0], inp=[1.0, 1.0])]
    tgt = [_row(0, 0, "a", 0, [1.0, 2.001], inp=[1.0, 1.0])]
    assert compare_traces(ref, tgt, (1e-2, 0.0)).kind == "noise"
    div = compare_traces(ref, tgt, (1e-5, 0.0))
    assert div.kind == "divergence" and div.first is not None and div.first.path == "a"
    assert div.first.in_rel == 0.0 and div.first.growth > 1e3


def test_the_section_renders_where_and_how_much():
    ref = [_row(0, 0, "h.1.mlp", 0, [1.0, 2.0], inp=[1.0, 1.0])]
    tgt = [_row(0, 0, "h.1.mlp", 0, [1.0, 2.002], inp=[1.0, 1.0])]
    md = render_markdown({"verdict": "rejected", "divergence": compare_traces(ref, tgt).to_dict()})
    assert "## First divergence" in md
    assert (
        "first divergence: `h.1.mlp` (call 0, step 0, X, `m.py:1`, built at `m.py:9`): "
        "output off by 0.001" in md
    )


# ---------------------------------------------------------------- the playbook


def test_trace_is_off_unless_the_playbook_asks_and_steps_are_checked():
    import pytest

    from remotemac.playbook import PlaybookErrors, parse_playbook

    assert parse_playbook("name: a\nworkload:\n  command: x\n").workload.trace is None
    pb = parse_playbook("name: a\nworkload:\n  command: x\n  trace: {steps: 3}\n")
    assert pb.workload.trace is not None and pb.workload.trace.steps == 3
    with pytest.raises(PlaybookErrors) as err:
        parse_playbook("name: a\nworkload:\n  command: x\n  trace: {steps: 0}\n", "p.yaml")
    assert "workload.trace.steps: must be at least 1, got 0" in err.value.line()


# ---------------------------------------------------------------- the backward calls


def _back(step, i, path, call, out, inp):
    row = _row(step, i, path, call, out, inp)
    row["pass"] = "backward"
    return row


def test_the_backward_is_a_second_sequence_and_the_earliest_event_is_the_headline():
    fwd = [_row(0, 0, "a", 0, [1.0, 2.0], inp=[1.0, 1.0]), _row(1, 0, "a", 0, [1.0], [1.0])]
    ref = fwd + [
        _back(0, 0, "b", 0, [1.0, 1.0], [1.0, 1.0]),
        _back(0, 1, "a", 0, [2.0, 2.0], [1.0, 1.0]),
    ]
    # the target's step-0 backward of "a" hands on a gradient 1e-3 off; its forward matches
    # in step 0 and differs in step 1 (weights updated with that gradient)
    tgt = [
        fwd[0],
        _row(1, 0, "a", 0, [1.01], [1.0]),
        _back(0, 0, "b", 0, [1.0, 1.0], [1.0, 1.0]),
        _back(0, 1, "a", 0, [2.0, 2.002], [1.0, 1.0]),
    ]
    div = compare_traces(ref, tgt, (1e-5, 0.0))
    # the forward rows are not matched with the backward ones of the same key
    assert div.calls == {"reference": 2, "target": 2} and div.compared == 2
    assert div.first is not None and div.first.step == 1  # step 1's forward: later
    assert div.kind == "backward-divergence", div.detail
    assert div.backward is not None and div.backward.first is not None
    assert (div.backward.first.path, div.backward.first.index) == ("a", 1)
    assert div.backward.first.in_rel == 0.0 and div.backward.calls["reference"] == 2
    assert "first diverge in the backward of a (X, call 0, step 0)" in div.detail
    # a forward error in the same step comes first: the backward only carries it on
    tgt[0] = _row(0, 0, "a", 0, [1.0, 2.01], inp=[1.0, 1.0])
    assert compare_traces(ref, tgt, (1e-5, 0.0)).kind == "divergence"
    md = render_markdown({"verdict": "rejected", "divergence": div.to_dict()})
    assert "- first backward divergence: `a` (call 0, step 0, X" in md
    assert "Largest growths in the backward" in md


def test_a_nan_gradient_is_named_with_the_module_whose_backward_made_it():
    ref = [_back(0, 0, "b", 0, [1.0], [1.0]), _back(0, 1, "a", 0, [1.0], [1.0])]
    tgt = [_back(0, 0, "b", 0, [1.0], [1.0]), _back(0, 1, "a", 0, [1.0], [1.0])]
    tgt[1]["out"]["nan"] = 1
    div = compare_traces(ref, tgt)
    assert div.kind == "backward-nan" and div.backward.nan.path == "a"
    md = render_markdown({"verdict": "rejected", "divergence": div.to_dict()})
    assert "- first NaN/Inf gradient: the backward of `a` (call 0, step 0" in md


# ---------------------------------------------------------------- the drill's compare


def _op(i, op, module, out, inp, in_bad=0):
    def summary(values):
        return {"shape": [len(values)], "dtype": "float32", "nan": 0, "inf": 0,
                "sample": values, "absmax": max(abs(v) for v in values)}  # fmt: skip

    return {"i": i, "op": op, "module": module, "out": summary(out), "in": summary(inp),
            "in_bad": in_bad}  # fmt: skip


def _drill_files(tmp_path, ref_ops, tgt_ops, at=("m", 0, 0), sha=(None, None)):
    import json

    paths = []
    for label, ops, digest in (("cpu", ref_ops, sha[0]), ("cpu-target", tgt_ops, sha[1])):
        head = {"schema": "remotemac.drill/1", "path": at[0], "call": at[1], "step": at[2],
                "cls": "M", "reached": True, "error": None}  # fmt: skip
        if digest is not None:
            head["input_sha256"] = digest
        path = tmp_path / f"{label}.drill.jsonl"
        path.write_text("\n".join(json.dumps(x) for x in [head, *ops]) + "\n")
        paths.append(path)
    return paths


def test_the_drill_names_the_first_matched_op_that_grew_the_error(tmp_path):
    from remotemac.acceptance.drill import drill_for

    ref = [_op(0, "aten::view", "m", [1.0, 2.0], [1.0, 2.0]),
           _op(1, "aten::addmm", "m.fc", [3.0, 4.0], [1.0, 2.0]),
           _op(2, "aten::gelu", "m", [5.0, 6.0], [3.0, 4.0])]  # fmt: skip
    # the target runs an extra copy first (a fallback's), then an addmm 1e-3 off
    tgt = [_op(0, "aten::_to_copy", "m", [1.0, 2.0], [1.0, 2.0]),
           _op(1, "aten::view", "m", [1.0, 2.0], [1.0, 2.0]),
           _op(2, "aten::addmm", "m.fc", [3.0, 4.004], [1.0, 2.0]),
           _op(3, "aten::gelu", "m", [5.0, 6.006], [3.0, 4.004])]  # fmt: skip
    drill = drill_for(*_drill_files(tmp_path, ref, tgt), (1e-5, 0.0))
    assert drill is not None and drill.ran and drill.nan is None
    assert drill.first is not None
    assert (drill.first.op, drill.first.module, drill.first.index) == ("aten::addmm", "m.fc", 2)
    assert not drill.first.one_side and drill.first.in_rel == 0.0
    assert drill.only_target == ["aten::_to_copy in m"] and drill.only_reference == []
    # within a looser tolerance: nothing named
    assert drill_for(*_drill_files(tmp_path, ref, tgt), (1e-2, 0.0)).first is None


def test_a_target_that_loaded_other_bytes_than_the_reference_saved_is_no_drill(tmp_path):
    """The input crosses hosts through the laptop: the target's pass on other bytes than
    the reference saved (a bad copy) would name ops that are not its arithmetic."""
    from remotemac.acceptance.drill import drill_for

    ref = [_op(0, "aten::mul", "m", [1.0, 2.0], [1.0, 2.0])]
    tgt = [_op(0, "aten::mul", "m", [1.0, 2.5], [1.0, 2.5])]
    same = drill_for(*_drill_files(tmp_path, ref, tgt, sha=("ab" * 32, "ab" * 32)))
    assert same is not None and same.ran and same.input_sha256 == "ab" * 32
    other = drill_for(*_drill_files(tmp_path, ref, tgt, sha=("ab" * 32, "cd" * 32)))
    assert other is not None and not other.ran and other.first is None
    assert other.detail == (
        "the target's input (sha256 cdcdcdcdcdcd) is not the one the reference saved "
        "(sha256 abababababab)"
    )
    assert other.to_json()["input_sha256"] is None


def test_op_traces_of_another_call_are_not_taken_for_this_runs(tmp_path):
    from remotemac.acceptance.divergence import divergence_for

    ref = [_row(0, 0, "h.1.mlp", 0, [1.0, 2.0], inp=[1.0, 1.0])]
    tgt = [_row(0, 0, "h.1.mlp", 0, [1.0, 2.002], inp=[1.0, 1.0])]
    import json

    for label, rows in (("cpu", ref), ("cpu-target", tgt)):
        head = {"schema": "remotemac.trace/1"}
        (tmp_path / f"{label}.trace.jsonl").write_text(
            "\n".join(json.dumps(x) for x in [head, *rows]) + "\n"
        )
    ops = [_op(0, "aten::mul", "h.1.mlp", [1.0, 2.0], [1.0, 2.0])]
    bad = [_op(0, "aten::mul", "h.1.mlp", [1.0, 2.5], [1.0, 2.0])]
    _drill_files(tmp_path, ops, bad, at=("h.0.mlp", 0, 0))
    traces = (tmp_path / "cpu.trace.jsonl", tmp_path / "cpu-target.trace.jsonl")
    div = divergence_for(*traces)
    assert div.first is not None and div.drill is not None
    assert not div.drill.ran and div.drill.first is None
    _drill_files(tmp_path, ops, bad, at=("h.1.mlp", 0, 0))
    div = divergence_for(*traces)
    assert div.drill.ran and div.drill.first.op == "aten::mul"
