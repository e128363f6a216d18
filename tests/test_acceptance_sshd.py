"""Issue 7 over the real sshd: the acceptance record answers the user's question.

Workloads are real torch (CPU). Tests that emit MPS messages are simulations of
MPS: the recorded message texts are raised inside a real workload on the CPU.

Every workload here needs torch on the host, which a rental does not have: the tests
say ``host_torch`` and run on the lab host's torch interpreter (``host_torch_python``),
not the laptop's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from remotemac.acceptance.record import validate_record
from tests.conftest import REPO, remotemac

PROJECT = REPO / "tests" / "fixtures" / "projects" / "accept"


@pytest.fixture
def sshd_run(sshd, ssh_env, tmp_path: Path, host_torch_python: str):
    """Run a playbook against the real sshd; returns (exit code, record, out dir)."""
    home, cfg, alias = ssh_env(sshd)
    counter = iter(range(100))

    def run(
        mode: str,
        *,
        seconds: float = 1.0,
        reference_seconds: float | None = None,
        stop_when: dict | None = None,
        target: str = "remote",
        purpose: dict | None = None,
    ):
        n = next(counter)
        ref_seconds = (
            "" if reference_seconds is None else f" --reference-seconds {reference_seconds}"
        )
        data = {
            "name": f"accept-{mode}",
            "host": alias,
            "remote_root": str(sshd.home / f"host-root-{n}"),
            "project": {"path": str(PROJECT)},
            "environment": {"python": host_torch_python, "venv": False},
            "workload": {
                "command": f"python3 work.py --device {{device}} --out {{output_dir}} "
                f"--mode {mode} --seconds {seconds}{ref_seconds}",
                "reference": {"device": "cpu"},
                "target": {"device": "cpu", "on": target},
                "timeout": "5m",
            },
            "outputs": {
                "path": ".",
                "compare": [
                    {"file": "preds.pt", "rtol": 1e-5, "atol": 1e-6},
                    {"file": "metrics.json", "rtol": 1e-5, "atol": 1e-6},
                ],
            },
            "stop_when": {"memory_growth": False, **(stop_when or {})},
        }
        if purpose:
            data["purpose"] = purpose
        pb = tmp_path / f"pb{n}.yaml"
        pb.write_text(yaml.safe_dump(data))
        out = tmp_path / f"out{n}"
        proc = remotemac(
            "--home",
            str(home),
            "--ssh-config",
            str(cfg),
            "run",
            str(pb),
            "--out",
            str(out),
            timeout=240,
        )
        record_path = out / "acceptance.json"
        assert record_path.exists(), proc.stdout + proc.stderr
        record = json.loads(record_path.read_text())
        assert validate_record(record) == []
        return proc.returncode, record, out

    return run


def test_host_torch_within_tolerance_is_accepted(sshd_run):
    code, record, out = sshd_run("ok")
    assert code == 0, record["stopping_conditions"]
    assert record["verdict"] == "accepted"
    assert record["observations"]["tensors_on_device"] is True
    assert record["observations"]["results"]["within_tolerance"] is True
    # the target ran on the CPU here: no claim about Apple Silicon without MPS evidence
    assert record["decision"]["recommendation"] is None
    assert "not MPS" in record["decision"]["reasons"][0]
    env = json.loads((out / "env" / "target.json").read_text())
    assert env["torch"] and env["packages"]["torch"].startswith(env["torch"].split("+")[0])
    assert record["environment"]["mismatches"] == []
    assert (
        "| results |" in (out / "acceptance.md").read_text().lower()
        or "results" in (out / "acceptance.md").read_text().lower()
    )


def test_host_torch_beyond_tolerance_is_rejected_naming_file_and_tensor(sshd_run):
    code, record, _ = sshd_run("noise")
    assert code == 1 and record["verdict"] == "rejected"
    cond = [c for c in record["stopping_conditions"] if c["code"] == "results_outside_tolerance"]
    assert cond and "preds.pt" in cond[0]["detail"] and "preds" in cond[0]["detail"]
    files = {f["path"]: f for f in record["observations"]["results"]["files"]}
    assert files["preds.pt"]["ok"] is False and files["preds.pt"]["max_abs_err"] > 1e-5


def test_host_torch_fallback_ops_captured_and_policy_applied(sshd_run):
    """Simulation of MPS: the recorded fallback warning, raised 3 times in a real workload."""
    code, record, _ = sshd_run("fallback")
    ops = record["observations"]["operators"]["fallback_ops"]
    assert any("aten::isin.Tensor_Tensor_out" in json.dumps(op) for op in ops)
    assert code == 1 and any(c["code"] == "fallback_ops" for c in record["stopping_conditions"])
    code, record, _ = sshd_run(
        "fallback", stop_when={"fallback_ops": ["aten::isin.Tensor_Tensor_out"]}
    )
    assert code == 0, record["stopping_conditions"]


def test_host_torch_unsupported_op_and_float64_are_stopping_conditions(sshd_run):
    """Simulation of MPS: the recorded NotImplementedError and the float64 TypeError text."""
    code, record, _ = sshd_run("notimpl")
    assert code == 1
    unsupported = json.dumps(record["observations"]["operators"]["unsupported_ops"])
    assert "aten::isin.Tensor_Tensor_out" in unsupported
    assert record["decision"]["recommendation"] == "linux-gpu-first"
    code, record, _ = sshd_run("float64")
    assert code == 1
    assert "float64" in json.dumps(record["observations"]["operators"]["dtype_errors"])


def test_host_torch_memory_leak_is_not_stable_and_steady_is(sshd_run):
    """The target's memory is judged: 15 s of it, as a trend needs 10 samples over 10 s
    after the warm-up (issue 34); the reference gives the results to compare only, and
    runs 1 s (before, 15 s too: 28 s of the test's 75)."""
    grow = {"seconds": 15, "reference_seconds": 1, "stop_when": {"memory_growth": True}}
    code, record, _ = sshd_run("leak", **grow)
    mem = record["observations"]["memory"]
    assert mem["stable"] is False and code == 1
    assert any(c["code"] == "memory_growth" for c in record["stopping_conditions"])
    assert mem["window_s"] >= 10, mem  # judged over the target's long run
    code, record, _ = sshd_run("steady", **grow)
    assert record["observations"]["memory"]["stable"] is True, record["observations"]["memory"]
    assert code == 0, record["stopping_conditions"]


def test_host_torch_target_on_the_laptop_reference_on_the_host(sshd_run):
    """``on: local`` for one side: both environments are frozen and compared."""
    code, record, out = sshd_run("ok", target="local")
    assert code == 0, record["stopping_conditions"]
    assert record["environment"]["reference"]["host"] != record["environment"]["target"]["host"]
    assert (out / "results" / "cpu-target" / "preds.pt").exists()


def test_host_torch_cuda_path_in_the_log_is_a_stopping_condition(sshd_run):
    """A real CPU-build torch asked for CUDA: the record quotes the line (issue 11)."""
    code, record, _ = sshd_run("cuda")
    assert code == 1
    cond = [c for c in record["stopping_conditions"] if c["code"] == "cuda-dependency"]
    assert cond and "Torch not compiled with CUDA enabled" in cond[0]["detail"]
    assert record["decision"]["recommendation"] == "linux-gpu-first"
