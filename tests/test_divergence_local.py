"""Issue 35: when the results differ, the record says where the target first diverged.

The pipeline tests run a nanoGPT-shaped trainer (tests/fixtures/projects/gpttrace:
tied embedding, SDPA attention, MLPs, one dropout module reused by every block)
through ``remotemac run`` on host ``local``, reference and target both on the CPU;
the target alone is perturbed (TRACE_SCALE / TRACE_NAN, read when the output dir is
the target's), and ``workload.trace: {steps: 2}`` turns the trace on. On ``local``
the project carries a lock file and asks for Python 3.11: the trainer runs in the venv
the host built (conftest's ``host_built``), never in the test runner's interpreter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remotemac.acceptance.divergence import load_trace
from remotemac.acceptance.record import validate_record
from tests.conftest import REPO, remotemac
from tests.harness.hostbuilt import HostBuilt, assert_host_built

pytestmark = pytest.mark.e2e

PROJECT = REPO / "tests" / "fixtures" / "projects" / "gpttrace"
COMMAND = "python train.py --device {device} --out {output_dir} --iters 3"
RULE = {"file": "ckpt.pt", "rtol": 1e-5, "atol": 1e-7}
PERTURBED = "transformer.h.1.mlp"


def _run(
    tmp_path: Path,
    tag: str,
    env: dict,
    trace: dict | None = None,
    cli: tuple[str, ...] = (),
    *,
    built: HostBuilt | None = None,
    host: str = "local",
    python: str | None = None,
    root: Path | None = None,
    options: tuple[str, ...] = (),
) -> tuple[int, dict, Path]:
    """One run; ``built``: on ``local`` in the host-built environment, else (over sshd)
    the preinstalled ``python`` in a root under ``root``."""
    import yaml

    workload = {
        "command": COMMAND,
        "reference": {"device": "cpu"},
        "target": {"device": "cpu"},
        "timeout": "5m",
        "env": env,
    }
    if trace is not None:
        workload["trace"] = trace
    data = {
        "name": f"trace-{tag}",
        "host": host,
        "remote_root": str(built.root if built else (root or tmp_path) / f"host-root-{tag}"),
        "project": {"path": str(built.project(PROJECT) if built else PROJECT)},
        "environment": built.environment() if built else {"python": python, "venv": False},
        "workload": workload,
        "outputs": {"path": ".", "compare": [RULE]},
        "stop_when": {"memory_growth": False},
    }
    pb = tmp_path / f"{tag}.yaml"
    pb.write_text(yaml.safe_dump(data))
    out = tmp_path / f"out-{tag}"
    proc = remotemac(*options, "run", str(pb), "--out", str(out), *cli, timeout=600)
    assert (out / "acceptance.json").exists(), proc.stdout + proc.stderr
    record = json.loads((out / "acceptance.json").read_text())
    assert validate_record(record) == []
    if built:
        assert_host_built(record, built.root)
    return proc.returncode, record, out


# ---------------------------------------------------------------- through the pipeline


def test_a_perturbed_mlp_is_named_as_the_first_divergence_not_the_layers_after(
    tmp_path, host_built
):
    code, record, out = _run(
        tmp_path, "e3", {"TRACE_SCALE": "1e-3"}, {"steps": 2}, built=host_built
    )
    assert code == 1 and record["verdict"] == "rejected"
    div = record["divergence"]
    assert div["traced"] is True and div["kind"] == "divergence", div["detail"]
    first = div["first"]
    assert (first["path"], first["call"], first["step"]) == (PERTURBED, 0, 0)
    assert first["cls"] == "MLP" and first["src"].startswith("train.py:")
    # the line that built that MLP (Block.__init__), not its class's forward
    built = 1 + next(
        i
        for i, line in enumerate((PROJECT / "train.py").read_text().splitlines())
        if "self.mlp = MLP(" in line
    )
    assert first["built"] == f"train.py:{built}", first
    assert 5e-4 < first["out_rel"] < 2e-3 and first["in_rel"] < 1e-6
    # the layers after it carry the error on: none of them is named, none grows it 10x
    assert div["growths"][0]["path"] == PERTURBED
    # (the block and the model holding it are not listed: the innermost is named)
    assert all(g["growth"] < div["growth_factor"] for g in div["growths"][1:]), div["growths"]
    assert div["nan"] is None and div["changes"] == [] and div["order"] is None
    assert div["steps"] == 2 and div["calls"]["reference"] == div["calls"]["target"] > 70
    md = (out / "acceptance.md").read_text()
    assert "## First divergence" in md and f"`{PERTURBED}` (call 0, step 0, MLP" in md
    assert f"built at `train.py:{built}`" in md
    # the drill passes ran that MLP call alone on both sides with the reference's input
    # and weights: the op the target ran on top of the reference's is the scale's mul
    drill = div["drill"]
    assert drill["ran"] is True, drill["detail"]
    assert (drill["path"], drill["call"], drill["step"]) == (PERTURBED, 0, 0)
    assert (drill["first"]["op"], drill["first"]["module"]) == ("aten::mul", PERTURBED)
    assert drill["nan"] is None and drill["ops"]["reference"] >= 5
    # the target loaded the very file the reference saved (one host: no copy)
    assert isinstance(drill["input_sha256"], str) and len(drill["input_sha256"]) == 64
    assert f"- first differing op: `aten::mul` in `{PERTURBED}`" in md
    # the traces, the op traces and the saved input hold the data: gone with the wipe
    # (the root is the worker's: its venv and the other tests' runs are not this run's)
    others = {"envs", "runtime", "runs"}
    mine = [p for p in host_built.root.iterdir() if p.name not in others]
    mine.append(host_built.root / "runs" / record["run_id"])
    assert mine[-1].is_dir()
    left = [
        f
        for top in mine
        for pat in ("*.trace.jsonl", "*.drill.jsonl", "*.pt")
        for f in top.rglob(pat)
    ]
    assert not left, left
    # the traces came back beside the logs, and are nothing but JSON
    for label in ("cpu", "cpu-target"):
        header, rows = load_trace(out / "logs" / f"{label}.trace.jsonl")
        assert header["steps"] == 2 and {r["step"] for r in rows} == {0, 1}


def test_drill_false_names_the_module_and_starts_no_drill_pass(tmp_path, host_built):
    """``workload.trace: {drill: false}``: the compare still names the perturbed MLP, but
    no job is started again (no op trace, no saved input) and the record says no drill."""
    code, record, out = _run(
        tmp_path, "nodrill", {"TRACE_SCALE": "1e-3"}, {"steps": 1, "drill": False}, built=host_built
    )
    assert code == 1 and record["verdict"] == "rejected"
    div = record["divergence"]
    assert div["kind"] == "divergence" and div["first"]["path"] == PERTURBED, div["detail"]
    assert div.get("drill") is None, div["drill"]
    assert not list((out / "logs").glob("*.drill.jsonl"))
    assert "first differing op" not in (out / "acceptance.md").read_text()


def test_over_sshd_the_traces_come_back_and_name_the_perturbed_mlp(
    tmp_path, sshd, ssh_env, host_torch_python
):
    """The same trainer on the lab's sshd host (a real OpenSSH login, the host's own
    torch): the traces travel back with the pull and name the same MLP."""
    home, cfg, alias = ssh_env(sshd)
    code, record, out = _run(
        tmp_path,
        "ssh-e3",
        {"TRACE_SCALE": "1e-3"},
        {"steps": 1},
        host=alias,
        python=host_torch_python,
        root=sshd.home,
        options=("--home", str(home), "--ssh-config", str(cfg)),
    )
    assert code == 1 and record["verdict"] == "rejected"
    first = record["divergence"]["first"]
    assert (first["path"], first["step"]) == (PERTURBED, 0), record["divergence"]["detail"]
    assert (out / "logs" / "cpu-target.trace.jsonl").is_file()


def test_a_float32_rounding_perturbation_is_accepted_and_the_trace_shows_noise(
    tmp_path, host_built
):
    code, record, _ = _run(tmp_path, "e7", {"TRACE_SCALE": "1e-7"}, {"steps": 2}, built=host_built)
    assert code == 0 and record["verdict"] == "accepted", record["stopping_conditions"]
    div = record["divergence"]
    assert div["kind"] == "noise" and div["first"] is None, div["detail"]
    # float32-level noise: a few ulps of the values' scale, no call grows it 10x
    assert 0 < div["worst_rel"] < 1e-5
    assert all(g["growth"] < div["growth_factor"] for g in div["growths"])


def test_a_nan_made_on_the_target_is_named_with_its_module(tmp_path, host_built):
    # turned on with run --trace this time, not in the playbook
    code, record, out = _run(
        tmp_path, "nan", {"TRACE_NAN": "1"}, cli=("--trace", "1"), built=host_built
    )
    assert code == 1 and record["verdict"] == "rejected"
    div = record["divergence"]
    assert div["kind"] == "nan"
    nan = div["nan"]
    assert (nan["path"], nan["cls"], nan["step"]) == (
        "transformer.h.1.attn",
        "CausalSelfAttention",
        0,
    )
    assert nan["nan"] > 0 and nan["reference_nan"] == 0
    assert div["steps"] == 1
    # the op inside the attention where it shows: no op computed it (it is a Python
    # constant written in after SDPA), so the first op holding it, with NaN coming in
    drill = div["drill"]
    assert drill["ran"] is True and drill["path"] == "transformer.h.1.attn", drill
    site = drill["nan"]
    assert (site["op"], site["module"], site["in_bad"]) == (
        "aten::lift_fresh",
        "transformer.h.1.attn",
        1,
    ), site
    assert "already in its inputs (a constant)" in (out / "acceptance.md").read_text()
    assert "transformer.h.1.attn" in (out / "acceptance.md").read_text()


def test_a_backward_only_perturbation_is_named_as_that_layers_backward(tmp_path, host_built):
    """Block 1's MLP hands its input a gradient scaled by 1 + 1e-3 on the target (a
    custom autograd Function): every forward call matches, the backward names it."""
    code, record, out = _run(
        tmp_path, "grad", {"TRACE_GRAD_SCALE": "1e-3"}, {"steps": 2}, built=host_built
    )
    assert code == 1 and record["verdict"] == "rejected"
    div = record["divergence"]
    assert div["kind"] == "backward-divergence", div["detail"]
    # step 0's forward calls are bit-identical: the perturbation touches only the
    # backward (step 1's differ: the weights were updated with step 0's gradients, and
    # step 0's backward comes first in the run, so it is the headline)
    fwd = {}
    for label in ("cpu", "cpu-target"):
        _, rows = load_trace(out / "logs" / f"{label}.trace.jsonl")
        fwd[label] = [r for r in rows if r.get("pass") != "backward" and r["step"] == 0]
    assert len(fwd["cpu"]) > 30 and fwd["cpu"] == fwd["cpu-target"]
    back = div["backward"]
    first = back["first"]
    assert (first["path"], first["call"], first["step"], first["cls"]) == (PERTURBED, 0, 0, "MLP")
    # the gradient that came into the MLP's backward matched; the one it handed on is off
    assert first["in_rel"] == 0.0 and 5e-4 < first["out_rel"] < 2e-3
    # the layers it feeds in the backward (ln_2, the blocks before) carry it on
    assert all(g["growth"] < div["growth_factor"] for g in back["growths"][1:]), back
    # every module call of the two steps has its backward row, the reused dropout too
    assert back["calls"]["reference"] == back["calls"]["target"] == div["calls"]["reference"]
    md = (out / "acceptance.md").read_text()
    assert f"- first backward divergence: `{PERTURBED}` (call 0, step 0, MLP" in md


def test_no_trace_and_no_divergence_section_when_tracing_is_off(tmp_path, host_built):
    code, record, out = _run(tmp_path, "off", {"TRACE_SCALE": "1e-3"}, built=host_built)
    assert code == 1 and "divergence" not in record
    assert not list((out / "logs").glob("*.trace.jsonl"))
    assert "First divergence" not in (out / "acceptance.md").read_text()
