"""Issue 35, the op-level drill-down: the first divergent module call, run alone on
both sides under an operator trace with the reference's input and weights, names the
aten op inside it that made the difference.

Each side is a real process of the nanoGPT-shaped trainer (tests/fixtures/projects/
gpttrace) under the job's sitecustomize (the observer, real torch on the CPU), as the
runner starts it: first a traced run, then the drill pass (``observe.drill``), the
reference's first so the target can load its input. Reference and target are both the
CPU; the target alone is perturbed (TRACE_SCALE / TRACE_LOG, read when the output dir
is the target's): a simulation of an MPS kernel that computes something else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from remotemac.acceptance.divergence import divergence_for, drill_at
from remotemac.acceptance.drill import load_drill
from remotemac.acceptance.markdown import render_markdown
from tests.conftest import REPO

pytestmark = pytest.mark.e2e

PROJECT = REPO / "tests" / "fixtures" / "projects" / "gpttrace"
TOL = (1e-5, 1e-7)
PERTURBED = "transformer.h.1.mlp"


def _job(tmp_path: Path, label: str, env: dict[str, str], observe: dict) -> subprocess.Popen:
    from remotemac.agent import runner

    full = dict(os.environ)
    full.pop("PYTHONPATH", None)
    full.update(env)
    spec = {"dir": str(tmp_path / f"obs-{label}-{len(observe)}"), "device": "cpu", **observe}
    runner.prepare_observer(runner.ObserveSpec.from_json(spec), full)
    out = tmp_path / "out" / label
    return subprocess.Popen(
        [sys.executable, "train.py", "--device", "cpu", "--out", str(out), "--iters", "3"],
        cwd=PROJECT,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(proc: subprocess.Popen) -> str:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    return stdout


def _traced_and_drilled(tmp_path: Path, env: dict[str, str]):
    """The traced run of both sides (at once), the compare, then the drill passes."""
    logs = tmp_path / "logs"
    sides = ("cpu", "cpu-target")
    runs = [
        _job(tmp_path, s, env, {"trace": {"steps": 1, "path": str(logs / f"{s}.trace.jsonl")}})
        for s in sides
    ]
    for proc in runs:
        _wait(proc)
    div = divergence_for(logs / "cpu.trace.jsonl", logs / "cpu-target.trace.jsonl", TOL)
    assert div.drill is None  # no drill pass yet
    at = drill_at(div)
    assert at is not None, div.detail
    saved = tmp_path / "drill" / "cpu.drill-input.pt"
    ref = {**at.to_json(), "out": str(logs / "cpu.drill.jsonl"), "save": str(saved)}
    stdout = _wait(_job(tmp_path, "cpu", env, {"drill": ref}))
    # the drill pass ends the job at the call: no iteration is finished, no checkpoint
    assert "iter 0" not in stdout and "saved" not in stdout
    tgt = {**at.to_json(), "out": str(logs / "cpu-target.drill.jsonl"), "input": str(saved)}
    _wait(_job(tmp_path, "cpu-target", env, {"drill": tgt}))
    return divergence_for(logs / "cpu.trace.jsonl", logs / "cpu-target.trace.jsonl", TOL), logs


def test_a_scaled_mlp_output_is_traced_to_the_mul_that_scales_it(tmp_path):
    div, logs = _traced_and_drilled(tmp_path, {"TRACE_SCALE": "1e-3"})
    assert div.kind == "divergence" and div.first is not None
    assert div.first.path == PERTURBED
    drill = div.drill
    assert drill is not None and drill.ran, drill
    assert (drill.path, drill.call, drill.step, drill.cls) == (PERTURBED, 0, 0, "MLP")
    first = drill.first
    assert first is not None and first.op == "aten::mul" and first.module == PERTURBED
    assert first.one_side and first.in_rel == 0.0 and 5e-4 < first.out_rel < 2e-3
    assert drill.nan is None and drill.only_target == [f"aten::mul in {PERTURBED}"]
    # every op before it, run with the reference's input and weights, is bit-identical
    _, ref_ops = load_drill(logs / "cpu.drill.jsonl")
    header, tgt_ops = load_drill(logs / "cpu-target.drill.jsonl")
    assert header["input"] == "reference" and len(ref_ops) >= 5
    assert [(o.op, o.out) for o in tgt_ops[: len(ref_ops)]] == [(o.op, o.out) for o in ref_ops]
    md = render_markdown({"verdict": "rejected", "divergence": div.to_dict()})
    assert f"- first differing op: `aten::mul` in `{PERTURBED}`: output off by 0.001" in md


def test_a_nan_from_a_log_of_a_negative_names_aten_log_and_its_module(tmp_path):
    div, _ = _traced_and_drilled(tmp_path, {"TRACE_LOG": "1"})
    assert div.kind == "nan" and div.nan is not None and div.nan.path == PERTURBED
    drill = div.drill
    assert drill is not None and drill.ran, drill
    nan = drill.nan
    assert nan is not None and (nan.op, nan.module) == ("aten::log", PERTURBED)
    assert nan.nan == 4 * 16 * 128 and nan.one_side
    assert "first NaN/Inf op: aten::log in transformer.h.1.mlp" in drill.detail
    md = render_markdown({"verdict": "rejected", "divergence": div.to_dict()})
    assert f"- first NaN/Inf op: `aten::log` in `{PERTURBED}`: 8192 NaN" in md


def test_a_call_the_job_never_makes_is_said_so(tmp_path):
    logs = tmp_path / "logs"
    spec = {"step": 0, "path": "transformer.h.9.mlp", "call": 0}
    for side in ("cpu", "cpu-target"):
        out = str(logs / f"{side}.drill.jsonl")
        stdout = _wait(_job(tmp_path, side, {}, {"drill": {**spec, "out": out}}))
        assert "saved ckpt.pt" in stdout  # not reached: the job ran to its end
    from remotemac.acceptance.drill import drill_for

    drill = drill_for(logs / "cpu.drill.jsonl", logs / "cpu-target.drill.jsonl")
    assert drill is not None and not drill.ran
    assert "the job never made that call" in drill.detail


def test_a_later_process_that_never_makes_the_call_keeps_the_op_trace(tmp_path):
    """Every Python process of a drill pass inherits the drill: the one that reached the
    call wrote the op trace; a later one (``python train.py && python eval.py``) ending
    without the call must not replace it with "never made that call"."""
    from remotemac.agent import runner

    out = tmp_path / "logs" / "cpu.drill.jsonl"
    spec = {"step": 0, "path": PERTURBED, "call": 0, "out": str(out)}
    _wait(_job(tmp_path, "cpu", {}, {"drill": spec}))
    header, ops = load_drill(out)
    assert header["reached"] is True and ops, header
    full = dict(os.environ)
    full.pop("PYTHONPATH", None)
    observe = {"dir": str(tmp_path / "obs-later"), "device": "cpu", "drill": spec}
    runner.prepare_observer(runner.ObserveSpec.from_json(observe), full)
    later = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.ones(2).sum().item())"],
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert later.returncode == 0 and "2.0" in later.stdout, later.stderr
    header2, ops2 = load_drill(out)
    assert header2["reached"] is True and len(ops2) == len(ops), header2
