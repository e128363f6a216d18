"""The guards around a job on the host: it can reach its dirs, the disk holds, and its
environment has not drifted (the parts below the pipeline: access guard, disk watch,
drift comparison).

The agent operations run for real (``python3 hostagent.py OP`` with JSON on stdin)
on this machine; the read-only volume is a real read-only tmpfs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remotemac.agent.shared import agent_argv
from remotemac.engine.drift import DriftEntry, compare_fingerprints, drift_summary
from remotemac.engine.phaseresults import Fingerprint
from tests.harness.maclab import root_argv

AGENT = Path(__file__).resolve().parent.parent / "remotemac" / "agent"


def agent(op: str, req: dict) -> dict:
    res = subprocess.run(
        agent_argv(sys.executable, str(AGENT), "hostagent", op, site=True),
        input=json.dumps(req),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(res.stdout)


def job_env(run_dir: Path, output: Path) -> dict:
    return {
        "REMOTEMAC_DATA": str(run_dir / "data"),
        "REMOTEMAC_OUTPUT": str(output),
        **{
            var: str(run_dir / "cache" / sub)
            for var, sub in (
                ("TORCH_HOME", "torch"),
                ("HF_HOME", "hf"),
                ("PIP_CACHE_DIR", "pip"),
                ("XDG_CACHE_HOME", "xdg"),
                ("MPLCONFIGDIR", "mpl"),
            )
        },
    }


@pytest.fixture
def read_only_dir(tmp_path: Path):
    path = tmp_path / "ro"
    path.mkdir()
    res = subprocess.run(
        root_argv(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)]),
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.fail(f"cannot mount a read-only tmpfs here: {res.stderr.strip()}")
    yield path
    subprocess.run(root_argv(["umount", "-l", str(path)]), capture_output=True)


def test_access_check_creates_the_caches_in_the_workloads_environment(tmp_path: Path):
    run_dir = tmp_path / "run"
    (run_dir / "data").mkdir(parents=True)
    (run_dir / "data" / "a.csv").write_text("x\n1\n")
    answer = agent(
        "check_access", {"env": job_env(run_dir, run_dir / "out" / "cpu"), "cwd": str(tmp_path)}
    )
    assert answer["ok"], answer
    checked = answer["result"]["checked"]
    assert {c["what"] for c in checked} == {
        "data dir",
        "output dir",
        "cache TORCH_HOME",
        "cache HF_HOME",
        "cache PIP_CACHE_DIR",
        "cache XDG_CACHE_HOME",
        "cache MPLCONFIGDIR",
    }
    assert all(c["ok"] for c in checked)
    for sub in ("torch", "hf", "pip", "xdg", "mpl"):
        assert (run_dir / "cache" / sub).is_dir()
        assert os.listdir(run_dir / "cache" / sub) == []  # the probe file is gone


def test_launch_is_refused_when_the_output_dir_is_not_writable(tmp_path: Path, read_only_dir: Path):
    """A read-only output dir: one line naming it, and no job started."""
    run_dir = tmp_path / "run"
    for sub in ("data", "logs", "status"):
        (run_dir / sub).mkdir(parents=True)
    req = {
        "run_dir": str(run_dir),
        "device": "cpu",
        "session": "remotemac-test-ro",
        "command": "echo never",
        "env": job_env(run_dir, read_only_dir / "out"),
        "use_tmux": False,
    }
    answer = agent("launch", req)
    assert answer["ok"] is False and answer["code"] == "access"
    assert "\n" not in answer["error"]
    assert f"cannot write to its output dir {read_only_dir}/out" in answer["error"]
    assert "Read-only file system" in answer["error"] and "remote_root" in answer["error"]
    assert not (run_dir / "status" / "cpu.json").exists()


def _run_runner(tmp_path: Path, disk: dict, command: str) -> dict:
    run_dir = tmp_path / "run"
    for sub in ("logs", "status"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    spec = {
        "device": "cpu",
        "command": command,
        "status_path": str(run_dir / "status/cpu.json"),
        "log_path": str(run_dir / "logs/cpu.log"),
        "mode": "daemon",
        "disk": disk,
    }
    (run_dir / "spec.json").write_text(json.dumps(spec))
    started = time.monotonic()
    subprocess.run(
        agent_argv(sys.executable, str(AGENT), "runner", str(run_dir / "spec.json"), site=True),
        timeout=60,
        check=True,
    )
    status = json.loads((run_dir / "status/cpu.json").read_text())
    status["_seconds"] = time.monotonic() - started
    status["_log"] = (run_dir / "logs/cpu.log").read_text()
    return status


@pytest.mark.e2e
def test_runner_stops_below_min_free_with_sigterm_then_sigkill(tmp_path: Path):
    """Shim threshold: min_free above what this volume has free; a workload that ignores
    SIGTERM is killed after the grace period, and the final state is storage-limit."""
    free = shutil.disk_usage(tmp_path).free
    status = _run_runner(
        tmp_path,
        {"paths": {"root": str(tmp_path)}, "min_free": free + (1 << 30)},
        "trap '' TERM; echo started; sleep 30",
    )
    assert status["state"] == "storage-limit"
    assert "min_free_disk" in status["reason"] and str(tmp_path) in status["reason"]
    assert status["exit_code"] == -9  # SIGTERM ignored: SIGKILL after the grace period
    assert 4 < status["_seconds"] < 20
    assert status["disk"]["root"]["free"] > 0
    assert status["_log"].startswith("started\n")
    assert "stopping the workload" in status["_log"]


@pytest.mark.e2e
def test_runner_warns_between_the_thresholds_and_lets_the_job_finish(tmp_path: Path):
    free = shutil.disk_usage(tmp_path).free
    status = _run_runner(
        tmp_path,
        {"paths": {"root": str(tmp_path)}, "min_free": 1 << 20, "warn_free": free + (1 << 30)},
        "sleep 1.2; echo done",
    )
    assert status["state"] == "finished" and status["exit_code"] == 0
    assert status["disk_warning"].startswith("low disk:")
    assert status["disk"]["root"]["min_free_seen"] <= free + (64 << 20)


def test_drift_comparison_on_the_real_fingerprint_of_a_preinstalled_python():
    """torch is a stopping condition; another package is a warning; a dead venv is torch's.

    The fingerprint is the test runner's own interpreter's (a preinstalled environment
    with torch: the comparison needs real packages and a real torch, not a build); the
    fingerprint of a venv the host built is in every record of
    tests/test_pipeline_local.py (``environment.<side>``: torch, lock_hash)."""
    raw = agent("env_fingerprint", {"python": sys.executable})["result"]
    assert raw["packages"] and raw["lock_hash"] and raw["os_version"]
    before = Fingerprint.from_json(raw)
    assert compare_fingerprints(before, before) == []

    other_raw = dict(raw, packages=dict(raw["packages"], fakepkg="1.0"), lock_hash="x")
    other = Fingerprint.from_json(other_raw)
    changes = compare_fingerprints(before, other)
    assert [c.key for c in changes] == ["lock_hash"]
    assert changes[0].touches_torch is False
    assert [p.to_json() for p in changes[0].packages or []] == [
        {"name": "fakepkg", "before": None, "after": "1.0"}
    ]

    newer = dict(other_raw, torch="2.99.0", packages=dict(other_raw["packages"], torch="2.99.0"))
    changes = compare_fingerprints(before, Fingerprint.from_json(newer))
    assert {c.key for c in changes} == {"torch", "lock_hash"}
    assert all(c.touches_torch for c in changes)

    gone = compare_fingerprints(
        before,
        Fingerprint.from_json(
            agent("env_fingerprint", {"python": "/nonexistent/python"})["result"]
        ),
    )
    assert gone[0].key == "interpreter" and gone[0].touches_torch

    summary = drift_summary(
        [
            DriftEntry.from_json(
                {
                    "when": "re-attach",
                    "host_name": "h",
                    "host": "remote",
                    "changes": [c.to_json() for c in compare_fingerprints(before, other)],
                }
            )
        ]
    )
    assert summary.torch == [] and len(summary.drifts) == 1
    assert summary.drifts[0].detail == "packages fakepkg - → 1.0"


def test_a_failed_access_check_is_the_launchs_answer_even_when_the_fingerprint_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The launch takes the environment's fingerprint while its access check runs. When
    both fail, the user reads the access check's line (what the job could not reach),
    not the fingerprint probe's error that once replaced it (a unit test: both
    guards are stand-ins that raise)."""
    from remotemac.agent import guards, hostagent

    def access(req):
        raise hostagent.AgentError("the job cannot write its output dir /x/out")

    def fingerprint(req):
        def finish():
            raise ValueError("the fingerprint probe printed nothing")

        return finish

    monkeypatch.setattr(guards, "check_access", access)
    monkeypatch.setattr(guards, "start_env_fingerprint", fingerprint)
    (tmp_path / "run" / "status").mkdir(parents=True)
    req = {
        "run_dir": str(tmp_path / "run"),
        "device": "cpu",
        "session": "remotemac-t-cpu",
        "command": "true",
        "fingerprint": sys.executable,
    }
    with pytest.raises(hostagent.AgentError, match="cannot write its output dir"):
        hostagent.op_launch(req)
