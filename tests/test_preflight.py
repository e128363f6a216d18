"""``remotemac preflight``: real workloads traced on the local CPU with real torch."""

from __future__ import annotations

import importlib.metadata
import io
import json
import shlex
import sys
from pathlib import Path

import pytest

from remotemac.agent import optrace
from remotemac.checks.preflight import (
    PreflightReport,
    python_shims,
    run_preflight,
    substitute,
)
from remotemac.frontend.preflight import main_preflight, render

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "preflight"
COMMAND = "python train.py --device {device} --data {data_dir} --out {output_dir}"
pytestmark = pytest.mark.timeout(180)


def _preflight(name: str, command: str = "python train.py", seconds: float = 30) -> PreflightReport:
    return run_preflight(command, FIXTURES / name, None, seconds, {})


def _flagged(report: PreflightReport) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for f in report.findings:
        out.setdefault(f.op, []).append(f"{f.verdict}: {f.reason}")
    return out


def _playbook(tmp_path: Path, project: Path, command: str) -> Path:
    path = tmp_path / "playbook.yaml"
    path.write_text(
        f"name: preflight-test\nproject:\n  path: {project}\nworkload:\n  command: {command}\n",
        encoding="utf-8",
    )
    return path


@pytest.mark.e2e
def test_quickstart_mlp_has_full_coverage(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Tiny MLP + Adam, through the playbook and --json: 100 %, exit 0."""
    code = main_preflight(_playbook(tmp_path, FIXTURES / "mlp", COMMAND), 30, as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert code == 0 == data["exit_code"]
    assert data["kind"] == "prediction"
    assert data["torch_version"] == importlib.metadata.version("torch")
    assert data["coverage_pct"] == 100.0
    assert data["findings"] == [] and data["float64_sites"] == []
    assert data["stopped"] == "completed"
    ops = {o["op"] for o in data["ops"]}
    assert {"aten::addmm", "aten::mm", "aten::relu", "aten::_log_softmax"} <= ops  # really traced
    assert any(o.startswith("aten::add") for o in ops)  # Adam's update ran too
    assert len(ops) == data["total_ops"] >= 15


@pytest.fixture(scope="module")
def float64_report() -> PreflightReport:
    return _preflight("float64")


@pytest.mark.e2e
def test_float64_model_is_flagged_with_creation_sites(float64_report: PreflightReport) -> None:
    report = float64_report
    assert report.exit_code == 1
    flagged = _flagged(report)
    assert "fail: float64 unsupported on MPS" in flagged["aten::addmm"]
    assert "fail: float64 unsupported on MPS" in flagged["aten::randn"]
    sites = {s.site: s for s in report.float64_sites}
    # train.py: line 7 `.double()` on the model, line 8 randn(dtype=float64), line 9 `.double()`
    assert set(sites) == {"train.py:7", "train.py:8", "train.py:9"}
    assert "aten::randn" in sites["train.py:8"].ops
    assert sites["train.py:7"].count == 2  # weight and bias
    assert report.covered_ops == report.total_ops  # kernels exist: the dtype is the problem
    assert report.clean_ops < report.total_ops


@pytest.mark.e2e
def test_linalg_svd_and_eig_are_flagged() -> None:
    report = _preflight("linalg")
    assert report.exit_code == 1
    flagged = _flagged(report)
    assert flagged["aten::_linalg_svd"] == [
        "fallback: always-fallback list: linalg_svd runs on the CPU"
    ]
    assert flagged["aten::linalg_eig"] == ["fail: no MPS kernel"]
    assert report.coverage_pct < 100


@pytest.mark.e2e
def test_transformer_with_sdpa_is_not_a_false_alarm() -> None:
    report = _preflight("transformer")
    assert report.findings == [], report.findings
    assert report.exit_code == 0 and report.coverage_pct == 100.0
    kinds = {o.op: (o.support, o.via) for o in report.ops}
    # The CPU chose its flash kernel; on MPS the same call takes the math path.
    assert kinds["aten::_scaled_dot_product_flash_attention_for_cpu"] == (
        "mapped",
        "_scaled_dot_product_attention_math_for_mps",
    )
    assert kinds["aten::_scaled_dot_product_flash_attention_for_cpu_backward"][0] == "mapped"


@pytest.mark.e2e
def test_time_limit_stops_an_endless_module_workload() -> None:
    """`python -m train` (endless steps) is stopped after --seconds and still predicted."""
    report = _preflight("mlp", "python -u -m train --steps 0 --out {output_dir}", seconds=3)
    assert report.stopped == "time_limit"
    assert 3.0 <= report.elapsed_s < 5.0
    assert report.exit_code == 0 and report.total_ops >= 1


@pytest.mark.e2e
def test_workload_error_is_reported_and_rejects(tmp_path: Path) -> None:
    (tmp_path / "boom.py").write_text(
        "import sys, torch\nprint('args', sys.argv[1:])\n"
        "torch.ones(2) + 1\nraise ValueError('no data in ' + sys.argv[1])\n",
        encoding="utf-8",
    )
    report = run_preflight("python boom.py {data_dir}", tmp_path, tmp_path / "d d", 10, {})
    assert report.stopped == "error"
    assert report.workload_error == f"ValueError: no data in {tmp_path / 'd d'}"
    assert report.exit_code == 1
    assert any("args" in line for line in report.output_tail)
    assert "aten::add.Tensor" in {o.op for o in report.ops}


def test_a_workload_failing_before_any_operator_is_no_prediction(tmp_path: Path) -> None:
    """The data dir was wrong: the job died before torch ran anything. The report says
    so, not "coverage 100% (0 of 0)" and "some operators are predicted to fall back"."""
    from rich.console import Console

    (tmp_path / "boom.py").write_text("import torch\nraise FileNotFoundError('no shards')\n")
    report = run_preflight("python boom.py", tmp_path, None, 10, {})
    assert report.exit_code == 1 and report.total_ops == 0
    console = Console(file=io.StringIO(), width=160, record=True)
    render(report, console)
    text = console.export_text()
    assert "100.0%" not in text and "coverage: n/a" in text, text
    assert "predicted to fall back" not in text, text
    assert "prediction: incomplete: the workload failed on the CPU" in text, text
    assert "FileNotFoundError: no shards" in text


@pytest.mark.slow
def test_torch_free_loop_is_stopped_by_the_alarm(tmp_path: Path) -> None:
    """The dispatch-hook check never runs here; the SIGALRM backstop must."""
    script = tmp_path / "spin.py"
    script.write_text("while True:\n    pass\n", encoding="utf-8")
    trace = optrace.run(0.3, str(tmp_path / "t.json"), [str(script)], cwd=str(tmp_path))
    assert trace["stopped"] == "time_limit"
    assert 1.0 <= trace["elapsed_s"] < 3.0
    assert json.loads((tmp_path / "t.json").read_text())["stopped"] == "time_limit"


@pytest.mark.e2e
def test_render_labels_a_prediction_for_a_torch_version(float64_report: PreflightReport) -> None:
    from rich.console import Console

    report = float64_report
    console = Console(file=io.StringIO(), width=160, record=True)
    render(report, console)
    text = console.export_text()
    assert f"prediction for torch {importlib.metadata.version('torch')}" in text
    assert "coverage: 100.0%" in text and "train.py:8" in text and "float64" in text
    assert "predicted to fall back or fail" in text


def test_a_bare_python_anywhere_in_the_command_is_the_projects_interpreter(
    tmp_path: Path,
) -> None:
    """The shims first on PATH: ``python``, ``python3`` and the command's own word."""
    import subprocess

    python_shims(tmp_path, sys.executable, shlex.split("A=1 python3.99 -m x"))
    assert {p.name for p in tmp_path.iterdir()} == {"python", "python3", "python3.99"}
    out = subprocess.run(
        [str(tmp_path / "python3.99"), "-c", "import sys; print(sys.executable)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == sys.executable  # exec'd: the venv is kept


def test_placeholders_are_shell_quoted() -> None:
    got = substitute(
        "python t.py --data {data_dir} --dev {device}", {"data_dir": "/a b", "device": "cpu"}
    )
    assert got == "python t.py --data '/a b' --dev cpu"


def test_main_preflight_command_without_python_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``bash run.sh`` with no run.sh starts no Python: nothing to trace, said in one
    line (was: "can only trace Python commands" for every non-python command)."""
    code = main_preflight(_playbook(tmp_path, FIXTURES / "mlp", "bash run.sh"), 5, as_json=False)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("remotemac: error: preflight: "), err  # the prefix every error has
    assert "started no Python process (exited with status 127" in err, err
    assert "run.sh: No such file" in err and "nothing to trace" in err, err
