"""Preflight of commands that are not ``python script.py`` (issue 34): real torch, real
subprocesses, every Python process of the command traced as the run observes a job.

The project (tests/fixtures/preflight/trainer) looks like real training code: a
``run.sh`` that activates nothing and calls ``python train.py`` from ``src/``; a vision
trainer whose DataLoader has two workers (the flip augmentation runs only in them);
a DDP script on gloo launched by torchrun, by ``python -m torch.distributed.run`` or
alone with WORLD_SIZE=1. The project has its own venv (``python -m venv
--system-site-packages`` plus the test runner's site-packages, as in
test_preflight_env.py) with a ``torchrun`` console script as pip writes it, so
``torchrun`` is found on PATH the way a user's activated venv finds it.
"""

from __future__ import annotations

import json
import shutil
import site as pysite
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from remotemac.checks.preflight import PreflightReport, run_preflight
from remotemac.frontend.preflight import main_preflight

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "preflight" / "trainer"
VENV_PYTHON = ".venv/bin/python"
pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trainer")
    shutil.copytree(FIXTURE, root, dirs_exist_ok=True)
    venv = root / ".venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "test-runner-site.pth").write_text("\n".join(pysite.getsitepackages()) + "\n")
    torchrun = venv / "bin" / "torchrun"  # what pip writes for torch's console script
    torchrun.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\n"
        "from torch.distributed.run import main\nsys.exit(main())\n"
    )
    torchrun.chmod(0o755)
    return root


def _ops(report: PreflightReport) -> set[str]:
    return {o.op for o in report.ops}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.e2e
def test_run_sh_with_dataloader_workers_merges_every_process(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``bash run.sh``: the trainer and its two DataLoader workers are traced; the flip
    only the workers run is in the merged ops, so the workers' traces were counted."""
    playbook = tmp_path / "playbook.yaml"
    playbook.write_text(
        f"name: trainer\nproject:\n  path: {project}\n"
        "workload:\n  command: bash run.sh --workers 2 --out {output_dir}\n"
        f"environment:\n  python: {VENV_PYTHON}\n",
        encoding="utf-8",
    )
    code = main_preflight(playbook, 60, as_json=True)
    data = json.loads(capsys.readouterr().out)
    assert data["workload_error"] is None, data["output_tail"]
    assert data["stopped"] == "completed"
    assert data["processes"] == 3  # train.py and its two workers
    assert data["interpreter"] == str(project / VENV_PYTHON)
    # run.sh's bare python is the venv's (its directory first on PATH)
    assert data["executables"] == [str(project / VENV_PYTHON)]
    ops = {o["op"] for o in data["ops"]}
    assert "aten::flip" in ops, ops  # __getitem__ runs only in the workers
    assert {"aten::convolution", "aten::addmm", "aten::relu"} <= ops, ops
    assert data["total_ops"] == len(ops) > 15
    assert data["coverage_pct"] == 100.0 and data["findings"] == []
    assert code == 0 == data["exit_code"]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "command",
    ['sh -c "cd src && python train.py --workers 0"', "cd src && python3 train.py --workers 0"],
)
def test_shell_commands_in_a_subdirectory_are_traced(project: Path, command: str) -> None:
    report = run_preflight(command, project, None, 60, {}, VENV_PYTHON)
    assert report.processes == 1 and report.stopped == "completed"
    assert {"aten::flip", "aten::convolution", "aten::stack"} <= _ops(report)
    assert report.coverage_pct == 100.0 and report.exit_code == 0


@pytest.mark.e2e
@pytest.mark.parametrize(
    "launcher",
    ["torchrun", "python -m torch.distributed.run"],
)
def test_torchrun_nproc_1_on_gloo_is_traced_in_the_worker(project: Path, launcher: str) -> None:
    """torchrun's agent and its one worker are both Python processes that import torch;
    the worker's model ops and DDP's collectives are traced. A collective is no MPS
    kernel: a finding that says so, not "100 %"."""
    report = run_preflight(
        f"{launcher} --standalone --nproc_per_node=1 src/train_ddp.py",
        project,
        None,
        90,
        {},
        VENV_PYTHON,
    )
    assert report.workload_error is None, report.output_tail
    assert report.processes == 2  # the elastic agent and rank 0
    ops = _ops(report)
    assert {"aten::addmm", "aten::tanh", "aten::mse_loss"} <= ops, ops
    assert "c10d::allreduce_" in ops  # DDP's gradient bucket, through gloo
    collective = [f for f in report.findings if f.op == "c10d::allreduce_"]
    assert collective and "torch.distributed collective" in collective[0].reason
    assert report.total_ops > 0 and report.coverage_pct is not None
    assert report.coverage_pct < 100 and report.exit_code == 1


@pytest.mark.e2e
def test_ddp_without_torchrun_world_size_1(project: Path) -> None:
    """The script calls init_process_group("gloo") itself; the command sets the env."""
    port = _free_port()
    report = run_preflight(
        f"env WORLD_SIZE=1 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT={port} python src/train_ddp.py",
        project,
        None,
        60,
        {},
        VENV_PYTHON,
    )
    assert report.workload_error is None, report.output_tail
    assert report.processes == 1
    assert {"aten::addmm", "c10d::allreduce_", "c10d::broadcast_"} <= _ops(report)


@pytest.mark.e2e
def test_time_limit_stops_the_trainer_and_its_workers(project: Path) -> None:
    """An endless run.sh: every process stops at the shared deadline and its ops count."""
    report = run_preflight("bash run.sh --epochs 100000", project, None, 4, {}, VENV_PYTHON)
    assert report.stopped == "time_limit"
    assert report.processes >= 2 and "aten::flip" in _ops(report)
    assert report.exit_code == 0 and report.total_ops > 0


@pytest.mark.parametrize(
    ("command", "says"),
    [
        ("sh -c 'echo no python here'", "started no Python process (exited with status 0)"),
        ("python -c 'print(1)'", "1 Python process(es) never imported torch"),
        ("python -c 'import torch'", "1 Python process(es) imported torch but ran no torch op"),
        ("python -I -c 'import torch; torch.ones(1)'", "(`python -I` skips the tracer's"),
        (
            "sh -c \"python -c 'import no_such_module'\"",
            "never imported torch (exited with status 1: "
            "ModuleNotFoundError: No module named 'no_such_module')",
        ),
    ],
)
def test_a_command_without_torch_is_one_line_not_full_coverage(
    project: Path, tmp_path: Path, capsys: pytest.CaptureFixture, command: str, says: str
) -> None:
    """No "100 % of 0": one line (``--json``: ``error`` and exit code 2, no coverage)."""
    playbook = tmp_path / "playbook.yaml"
    doc = {"name": "t", "project": {"path": str(project)}, "workload": {"command": command}}
    playbook.write_text(yaml.safe_dump(doc), encoding="utf-8")
    code = main_preflight(playbook, 10, as_json=True)
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1
    data = json.loads(out)
    assert code == 2 == data["exit_code"] and "coverage_pct" not in data
    assert says in data["error"] and "nothing to" in data["error"], data
    assert data["error"].startswith("preflight: ")


def test_an_unknown_tracer_module_is_refused_and_the_job_still_runs(tmp_path: Path) -> None:
    """jobsite.py starts only observer.py or optrace.py, whatever the variable says."""
    from remotemac.agent.shared import install_jobsite
    from remotemac.checks.preflight import agent_dir

    env: dict[str, str] = {"PATH": "/usr/bin:/bin"}
    install_jobsite(str(agent_dir()), str(tmp_path / "site"), str(tmp_path), env, "../x")
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.ones(2).sum().item())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "2.0"
    assert "could not observe this process (ValueError: unknown REMOTEMAC_OBSERVE_MODULE" in (
        out.stderr
    )
    assert not list(tmp_path.glob("trace-*.json"))
