"""Issue 17: observing the whole job, whatever the command, and a memory trend that
does not cry wolf.

Real processes throughout: the job's sitecustomize is installed the way the runner
installs it (``runner.prepare_observer``), torch is the real CPU build, the process
tree is the real one. The macOS ``ps`` path runs on a shim that replays recorded
output (a simulation, said so in the test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from remotemac.acceptance.decide import memory_stable
from remotemac.agent import obsmerge, proctree, runner
from tests.conftest import REPO
from tests.trendkit import least_squares_slope

MiB = 1 << 20
MACOS = REPO / "tests" / "fixtures" / "macos"
TRACES = REPO / "tests" / "fixtures" / "memtraces"
FALLBACK_TEXT = (
    "The operator 'aten::isin.Tensor_Tensor_out' is not currently supported on "
    "the MPS backend and will fall back to run on the CPU."
)
NOTIMPL_TEXT = (
    "The operator 'aten::isin.Tensor_Tensor_out' is not currently implemented for the MPS device."
)


def job_env(tmp_path: Path, device: str = "cpu") -> tuple[dict, Path]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    obs = tmp_path / "obs"
    runner.prepare_observer(
        runner.ObserveSpec.from_json(
            {"dir": str(obs), "device": device, "fallback": "diagnostic", "interval": 0.2}
        ),
        env,
    )
    return env, obs


def records(obs: Path) -> list[dict]:
    return obsmerge.read_records(str(obs))


# ---------------------------------------------------------------- the sitecustomize


def test_inert_when_torch_is_never_imported(tmp_path):
    env, obs = job_env(tmp_path)
    code = (
        "import sys, json; import email.parser; "
        "print(json.dumps([type(f).__name__ for f in sys.meta_path])); "
        "print('_remotemac_observer' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    assert "_TorchFinder" in json.loads(out[0])  # waiting for torch, nothing else
    assert out[1] == "False" and records(obs) == []


def test_chains_to_the_sitecustomize_it_hides(tmp_path):
    env, obs = job_env(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    env["PYTHONPATH"] += os.pathsep + str(theirs)
    code = "import os, sitecustomize; print(os.environ.get('THEIRS_RAN'), sitecustomize.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert out == ["1", str(theirs / "sitecustomize.py")]


@pytest.mark.e2e
def test_shell_wrapped_script_and_its_subprocess_are_observed(tmp_path):
    """``cd sub && python t.py``; t.py starts another Python that imports torch, replaces
    sys.excepthook and dies of the recorded MPS NotImplementedError (a simulation of MPS
    raised on the CPU). Both processes are observed; the failure is classified."""
    env, obs = job_env(tmp_path)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "t.py").write_text(
        textwrap.dedent(f"""
        import subprocess, sys, warnings
        import torch
        model = torch.nn.Linear(3, 3)
        model(torch.randn(2, 3)).sum().backward()
        for _ in range(3):
            warnings.warn({FALLBACK_TEXT!r}, UserWarning)
        if sys.argv[1:] == ["parent"]:
            subprocess.run([sys.executable, "t.py", "child"])
        else:
            sys.excepthook = lambda *a: print("user hook", file=sys.stderr)
            raise NotImplementedError({NOTIMPL_TEXT!r})
    """)
    )
    proc = subprocess.run(
        ["/bin/sh", "-c", "cd sub && python3 t.py parent"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("UserWarning: The operator") == 2  # the first per process
    merged = obsmerge.merge(records(obs), "cpu")
    assert sorted(p["argv"][-1] for p in merged["processes"]) == ["child", "parent"]
    assert all(p["argv0"] == "t.py" and p["finished"] for p in merged["processes"])
    assert merged["tensors_on_device"] is True and merged["model_on_device"] is True
    assert merged["operators"]["fallback_ops"] == [
        {"op": "aten::isin.Tensor_Tensor_out", "count": 6}
    ]
    assert [u["op"] for u in merged["operators"]["unsupported_ops"]] == [
        "aten::isin.Tensor_Tensor_out"
    ]
    assert any(c["code"] == "unsupported-op" for c in merged["stopping_conditions"])


@pytest.mark.e2e
def test_torchrun_workers_are_observed(tmp_path):
    env, obs = job_env(tmp_path)
    (tmp_path / "w.py").write_text(
        "import os, torch\nx = torch.ones(2) * int(os.environ['RANK'])\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "w.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    merged = obsmerge.merge(records(obs), "cpu")
    workers = [p for p in merged["processes"] if p["argv0"].endswith("w.py")]
    assert len(workers) == 2 and all(p["tensors_on_device"] for p in workers)
    assert any(p["argv0"].endswith("run.py") for p in merged["processes"])  # the launcher


def test_merge_of_no_process_is_not_observed():
    merged = obsmerge.merge([], "mps")
    assert merged["tensors_on_device"] is None and merged["processes"] == []
    assert merged["operators"] == {
        "fallback_ops": None,
        "unsupported_ops": None,
        "dtype_errors": None,
    }


# ---------------------------------------------------------------- the process tree


def _hold(mib: int) -> str:
    return f"python3 -c 'import time; b = bytearray(b\"x\") * ({mib} << 20); time.sleep(60)'"


def _vmrss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _wait_tree(root: int, want: int, leader: bool = True) -> proctree.TreeSample:
    """The tree's sample once it holds ``want`` and has settled (two samples 0.2 s apart
    within 1 MiB): a sum taken while one process still allocates is not the truth read a
    moment later (CI: 155 MB sampled, 180 MB read just after, the 30 MiB one mid-way)."""
    deadline = time.time() + 60
    last = None
    while time.time() < deadline:
        got = proctree.tree_rss(root, session_leader=leader)
        settled = last is not None and abs(got.rss_bytes - last.rss_bytes) <= 1 << 20
        if got.rss_bytes >= want and settled and last is not None and got.pids == last.pids:
            return got
        last = got
        time.sleep(0.2)
    return got


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")
def test_tree_rss_sums_every_process_of_the_job(tmp_path):
    """Two Pythons under one shell, and one orphaned Python (its parent subshell exited):
    the sum covers all three; the shell alone would say a megabyte or two."""
    script = f"{_hold(60)} & {_hold(40)} & ( {_hold(30)} & ) ; wait"
    job = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True)
    try:
        got = _wait_tree(job.pid, 130 * MiB)
        assert len(got.pids) >= 4  # sh, two children, the orphan
        truth = sum(_vmrss(p) for p in got.pids)
        assert abs(got.rss_bytes - truth) <= 0.05 * truth
        assert proctree.tree_rss(job.pid).rss_bytes < got.rss_bytes - 25 * MiB  # no orphan
        assert _vmrss(job.pid) < 10 * MiB
    finally:
        os.killpg(job.pid, 9)
        job.wait()


def test_macos_ps_output_builds_the_tree(tmp_path):
    """Simulation: a ``ps`` shim prints pid, ppid and rss of the recorded Apple Silicon
    ``ps ax -o pid,ppid,pgid,…,rss,…`` rows (plus a stray line) as ``ps -A -o
    pid=,ppid=,pgid=,rss=`` would; a child re-parented to launchd (ppid 1) that keeps the
    job's process group still counts."""
    sample = MACOS / "ps_ax_-o_pid,ppid,pgid,pcpu,time,vsz,rss,etime,command__apple_silicon.txt"
    shim = tmp_path / "ps"
    shim.write_text(
        f"#!/bin/sh\n[ \"$*\" = '-A -o pid=,ppid=,pgid=,rss=' ] || exit 1\n"
        f"awk '{{printf \"%5d %5d %5d %6d\\n\", $1, $2, $3, $7}}' '{sample}'\n"
        "echo ' 4000     1  3644   2048'\n"  # re-parented to launchd, same process group
        "echo '  bogus line'\n"
    )
    shim.chmod(0o755)
    table = proctree.ps_table(str(shim))
    assert table == {
        3644: (3608, 3644, 9120 * 1024),
        3662: (3644, 3644, 6320 * 1024),
        4000: (1, 3644, 2048 * 1024),
    }
    assert proctree.tree_rss(3644, table) == ((9120 + 6320) * 1024, [3644, 3662])
    assert proctree.tree_rss(3644, table, session_leader=True) == (
        (9120 + 6320 + 2048) * 1024,
        [3644, 3662, 4000],
    )
    assert proctree.tree_rss(3662, table) == (6320 * 1024, [3662])
    assert proctree.tree_rss(9999, table) == (0, [])
    assert proctree.ps_table(str(tmp_path / "missing")) == {}


# ---------------------------------------------------------------- the trend


def trace(name: str) -> list[tuple[float, float]]:
    rows = [json.loads(line) for line in (TRACES / f"{name}.jsonl").read_text().splitlines()]
    return [(r["t"], r["rss_bytes"]) for r in rows]


@pytest.mark.parametrize("name", ["plateau", "sawtooth"])
def test_recorded_steady_traces_are_stable(name):
    got = memory_stable(trace(name))
    assert got["stable"] is True and got["trend"] == "stable", got["reason"]
    assert got["peak_bytes"] == int(max(b for _, b in trace(name)))
    assert got["confidence"] == 0.95 and len(got["slope_interval_bytes_per_s"]) == 2


def test_recorded_short_run_is_too_short_to_tell_not_a_verdict():
    """The GPT trainer's 11 s run leaves 7 s after its warm-up: too short to state a
    trend either way (issue 34: such runs flipped between verdicts); the peak stands."""
    got = memory_stable(trace("short_ramp_flat"))
    assert got["stable"] is None and got["trend"] == "too-short", got["reason"]
    assert got["reason"].startswith("trend: too short to tell (")
    assert got["peak_bytes"] == int(max(b for _, b in trace("short_ramp_flat")))


def test_recorded_leak_is_growth():
    got = memory_stable(trace("leak"))
    assert got["stable"] is False, got["reason"]
    assert got["slope_bytes_per_s"] == pytest.approx(8 * MiB, rel=0.25)  # 2 MiB / 0.25 s


def test_the_old_trend_cried_wolf_on_the_short_run():
    """What issue 17 saw: a least-squares line after a 25 % warm-up calls the short
    run's ramp growth; the same trace is stable now."""
    pts = trace("short_ramp_flat")
    start = pts[0][0] + min(10.0, 0.25 * (pts[-1][0] - pts[0][0]))
    assert least_squares_slope([p for p in pts if p[0] >= start]) > MiB
    assert memory_stable(pts)["stable"] is not False
    # the robust trend, asked to judge from so few samples, still does not cry wolf
    assert memory_stable(pts, min_samples=3, min_seconds=0)["stable"] is True


def test_job_memory_adds_metal_driver_memory_of_observed_processes(tmp_path):
    """Simulation: the record an observed MPS process writes (its ``mps_memory``); the
    runner's sample of the job adds it up over the live processes of the tree."""
    obs = tmp_path / "obs"
    obs.mkdir()
    me = os.getpid()
    for pid, driver, finished in (
        (me, 700 * MiB, False),
        (me + 10**6, 5 * MiB, False),
        (me - 1, 9 * MiB, True),
    ):
        (obs / f"{pid}.json").write_text(
            json.dumps(
                {
                    "pid": pid,
                    "finished": finished,
                    "mps_memory": {"mps_driver_allocated_bytes": driver},
                }
            )
        )
    metrics = tmp_path / "rss.jsonl"
    memory = runner.JobMemory(
        runner.JobSpec.from_json(
            {"metrics_path": str(metrics), "observe": {"dir": str(obs), "device": "mps"}}
        ),
        time.time(),
    )
    memory.sample(me, time.time())
    (row,) = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert row["mps_driver_allocated_bytes"] == 700 * MiB  # only pids in the tree, alive
    assert row["rss_bytes"] == memory.peak > 0 and row["source"] == "process-tree"


def test_job_memory_skips_a_process_past_its_end(tmp_path):
    """A process whose observer wrote its final record is tearing down: its falling RSS
    is not sampled (a leak's last samples must not read as memory that stopped growing)."""
    obs = tmp_path / "obs"
    obs.mkdir()
    metrics = tmp_path / "rss.jsonl"
    memory = runner.JobMemory(
        runner.JobSpec.from_json(
            {"metrics_path": str(metrics), "observe": {"dir": str(obs), "device": "cpu"}}
        ),
        time.time(),
    )
    record = obs / f"{os.getpid()}.json"
    record.write_text(json.dumps({"pid": os.getpid(), "finished": False}))
    memory.sample(os.getpid(), time.time())
    record.write_text(json.dumps({"pid": os.getpid(), "finished": True}))
    memory.sample(os.getpid(), time.time())
    assert len(metrics.read_text().splitlines()) == 1


def test_a_slow_torch_import_is_warm_up_not_growth(tmp_path):
    """Recorded on a busy box: ``import torch`` took 15 s of a 20 s run. Counted from the
    first sample, the import looks like growth; counted from the import (the runner's
    ``observed`` column), the run is flat."""
    from remotemac.engine.record import warmup_hints

    pts = trace("slow_import_flat")
    assert memory_stable(pts)["stable"] is False  # what a time-only warm-up concludes
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "cpu-target.rss.jsonl").write_text((TRACES / "slow_import_flat.jsonl").read_text())
    hints = warmup_hints(logs, "cpu-target")
    assert hints == {"active_from": pytest.approx(15.5, abs=0.3), "warm_at": None}
    got = memory_stable(pts, **hints)
    # 3 s of samples after the import: not growth, and too short to call stable
    assert got["stable"] is None and got["warmup_by"] == "torch-import", got["reason"]
    assert got["trend"] == "too-short"


def test_warm_up_by_optimizer_steps():
    """AdamW allocates its moments at the first step: memory jumps after the import.
    Warm-up by steps ends once the first steps are taken, whatever the clock says."""
    pts = [(t * 0.5, 300.0 * MiB) for t in range(13)]  # imported, loading data
    pts += [(6.0 + t * 0.5, 300.0 * MiB + 40 * MiB * t) for t in range(1, 7)]  # first steps
    pts += [(9.0 + t * 0.5, 540.0 * MiB) for t in range(1, 5)]  # training, flat
    # judged from so few samples (as before issue 34), a time-only warm-up sees growth
    assert memory_stable(pts, active_from=0.0, min_samples=3, min_seconds=0)["stable"] is False
    pts += [(11.0 + t * 0.5, 540.0 * MiB) for t in range(1, 21)]  # 10 s more of training
    got = memory_stable(pts, active_from=0.0, warm_at=9.0)  # step 5 was at 9 s
    assert got["stable"] is True and got["warmup_by"] == "steps"
    assert got["slope_bytes_per_s"] == 0.0
