"""Preflight traces in the project's own environment (issue 34).

The project (tests/fixtures/preflight/visionlike) imports a torchvision-like package that
only its own venv holds; the venv is a real one (``python -m venv
--system-site-packages``, plus the test runner's own site-packages: it sees this
machine's torch, as a project venv on a laptop sees its own). Its package registers an operator library at import time and queries
it, as torchvision does with ``torchvision::_cuda_version``.
"""

from __future__ import annotations

import json
import shutil
import site as pysite
import subprocess
import sys
from pathlib import Path

import pytest

from remotemac.checks.preflight import predict, run_preflight
from remotemac.errors import BadInput
from remotemac.frontend.preflight import main_preflight

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "preflight" / "visionlike"
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project with its own ``.venv`` holding ``visionlike``."""
    root = tmp_path_factory.mktemp("visionproj")
    shutil.copy(FIXTURE / "train.py", root / "train.py")
    venv = root / ".venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    (site,) = venv.glob("lib/python*/site-packages")
    # the interpreter running the tests may itself be a venv (a contributor's, as the
    # README sets up), whose torch --system-site-packages does not see: its own
    # site-packages go on the new venv's path too
    (site / "test-runner-site.pth").write_text("\n".join(pysite.getsitepackages()) + "\n")
    shutil.copytree(FIXTURE / "site-packages" / "visionlike", site / "visionlike")
    return root


def _playbook(tmp_path: Path, project: Path, command: str, python: str | None = None) -> Path:
    path = tmp_path / "playbook.yaml"
    env = f"environment:\n  python: {python}\n" if python else ""
    path.write_text(
        f"name: vision\nproject:\n  path: {project}\nworkload:\n  command: {command}\n{env}",
        encoding="utf-8",
    )
    return path


def _json(tmp_path: Path, capsys: pytest.CaptureFixture, *args: str | None) -> tuple[int, dict]:
    code = main_preflight(_playbook(tmp_path, *args), 60, as_json=True)  # type: ignore[arg-type]
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1, out
    return code, json.loads(out)


def _assert_full_coverage(code: int, data: dict, interpreter: Path) -> None:
    assert data["workload_error"] is None, data["output_tail"]
    assert code == 0 == data["exit_code"]
    assert data["interpreter"] == str(interpreter)
    assert data["coverage_pct"] == 100.0 and data["findings"] == []
    ops = {o["op"] for o in data["ops"]}
    assert {"aten::convolution", "aten::native_batch_norm", "aten::addmm"} <= ops, ops
    assert not any(op.startswith("visionlike::") for op in ops)
    # the import-time query is reported as such, not as an op MPS cannot be predicted for
    queries = {q["op"]: q for q in data["queries"]}
    assert "visionlike::_cuda_version" in queries, queries
    assert all(q["dtypes"] == [] and not op.startswith("aten::") for op, q in queries.items())


def test_a_venv_named_in_the_command_is_the_interpreter_traced_at_full_coverage(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    command = ".venv/bin/python train.py --device {device} --out {output_dir}"
    code, data = _json(tmp_path, capsys, project, command)
    _assert_full_coverage(code, data, project / ".venv" / "bin" / "python")


def test_a_venv_named_by_environment_python_is_the_interpreter_traced(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code, data = _json(tmp_path, capsys, project, "python train.py", ".venv/bin/python")
    _assert_full_coverage(code, data, project / ".venv" / "bin" / "python")


def test_a_project_that_does_not_import_is_a_failed_preflight_not_100_percent(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """remotemac's interpreter has no ``visionlike``: was ``coverage_pct: 100.0``,
    ``total_ops: 0``, exit 1 with no error line."""
    code, data = _json(tmp_path, capsys, project, "python train.py")
    assert code == 1 == data["exit_code"]
    assert data["coverage_pct"] is None and data["total_ops"] == 0
    assert data["error"].startswith("preflight: the workload failed before any torch operator")
    assert "ModuleNotFoundError: No module named 'visionlike'" in data["error"]
    assert sys.executable in data["error"]  # which interpreter looked for it


def test_a_failed_import_is_one_error_line_on_stderr(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    code = main_preflight(_playbook(tmp_path, project, "python train.py"), 60, as_json=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("remotemac: error: preflight: the workload failed")
    assert "No module named 'visionlike'" in err[0]


def test_a_command_interpreter_that_does_not_exist_is_bad_input(project: Path) -> None:
    with pytest.raises(BadInput, match=r"\.venv2/bin/python.*does not exist"):
        run_preflight(".venv2/bin/python train.py", project, None, 10, {})


def test_tensorless_custom_ops_are_queries_and_tensor_custom_ops_stay_findings() -> None:
    """Unit: ``visionlike::nms`` takes tensors (a real op MPS may lack); ``_cuda_version``
    does not."""
    from remotemac.checks import mps_coverage

    trace = {
        "stopped": "completed",
        "ops": [
            {"op": "visionlike::_cuda_version", "dtypes": [], "out_dtypes": [], "count": 1},
            {"op": "visionlike::nms", "dtypes": ["float32"], "out_dtypes": ["int64"], "count": 2},
            {
                "op": "aten::add.Tensor",
                "dtypes": ["float32"],
                "out_dtypes": ["float32"],
                "count": 3,
            },
        ],
    }
    report = predict(trace, mps_coverage.load_table(), None)
    assert [q.op for q in report.queries] == ["visionlike::_cuda_version"]
    assert {o.op for o in report.ops} == {"visionlike::nms", "aten::add.Tensor"}
    assert [(f.op, f.verdict) for f in report.findings] == [("visionlike::nms", "unknown")]


def test_the_table_says_which_calls_were_not_counted() -> None:
    import io

    from rich.console import Console

    from remotemac.checks import mps_coverage
    from remotemac.frontend.preflight import render

    trace = {
        "stopped": "completed",
        "ops": [
            {"op": "visionlike::_cuda_version", "dtypes": [], "out_dtypes": [], "count": 1},
            {
                "op": "aten::add.Tensor",
                "dtypes": ["float32"],
                "out_dtypes": ["float32"],
                "count": 3,
            },
        ],
    }
    console = Console(file=io.StringIO(), width=120, record=True)
    render(predict(trace, mps_coverage.load_table(), None), console)
    text = console.export_text()
    assert "coverage: 100.0% (1 of 1 traced" in text, text
    assert "not counted: 1 custom op call(s) without tensors (visionlike::_cuda_version)" in text
