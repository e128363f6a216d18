"""The in-agent harness (remotemac/agent/harness.py), run as the host runs it: a script.

Every run is a real subprocess with real torch (CPU build). MPS itself does not exist
here, so MPS behaviour is simulated by workloads that emit the exact messages
recorded on real Macs (tests/fixtures/macos/pytorch_mps_*, sources in the
``.source`` files next to them); those tests say "Simulation:".
"""

from __future__ import annotations

import functools
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from remotemac.agent import harness, memsample
from remotemac.engine.record import read_jsonl
from tests.trendkit import least_squares_slope

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "remotemac" / "agent" / "harness.py"
WORK = ROOT / "tests" / "fixtures" / "harness"
MAC = ROOT / "tests" / "fixtures" / "macos"
FALLBACK_2024 = MAC / "pytorch_mps_fallback_userwarning__2024.txt"
FALLBACK_2022 = MAC / "pytorch_mps_fallback_userwarning__2022_torch1.13dev.txt"
FALLBACK_CONDA = MAC / "pytorch_mps_fallback_userwarning__2022_conda_build.txt"
NOTIMPL = sorted(MAC.glob("pytorch_mps_notimplementederror__*.txt"))
OOM = sorted(MAC.glob("pytorch_mps_oom_runtimeerror__*.txt"))
# Not in the recorded samples: the text is PyTorch's own (EmptyTensor.cpp);
# the tail "Please use float32 instead." as reported in pytorch/pytorch#122602.
FLOAT64 = (
    "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support "
    "float64. Please use float32 instead."
)
MB = 1024 * 1024


@dataclass
class Run:
    code: int
    out: str
    err: str
    obs: dict[str, Any]
    metrics: list[dict[str, Any]]
    probe: dict[str, Any] | None = None


class Started:
    """A harness subprocess with its files, so several can run at once."""

    def __init__(
        self,
        tmp: Path,
        target: list[str],
        device: str = "cpu",
        opts: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        python: str = "",
    ) -> None:
        assert python, "the workload's interpreter: conftest's workload_python (host-built)"
        tmp.mkdir(parents=True, exist_ok=True)
        self.obs, self.metrics = tmp / "obs.json", tmp / "metrics.jsonl"
        self.out, self.err = tmp / "stdout", tmp / "stderr"
        cmd = [python, str(HARNESS), "--device", device, "--obs", str(self.obs)]
        cmd += ["--metrics", str(self.metrics), *opts, "--", *target]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTORCH_")}
        full_env["OMP_NUM_THREADS"] = "1"  # a dozen runs share two cores: no thread thrash
        full_env.update(env or {})
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            self.proc = subprocess.Popen(cmd, stdout=o, stderr=e, env=full_env, cwd=cwd)

    def wait(self, timeout: float = 45) -> Run:
        code = self.proc.wait(timeout=timeout)
        obs = json.loads(self.obs.read_text()) if self.obs.exists() else {}
        rows = read_jsonl(self.metrics) if self.metrics.exists() else []
        return Run(code, self.out.read_text(), self.err.read_text(), obs, rows)


def messages(*args: str) -> list[str]:
    return [str(WORK / "mps_messages.py"), *args]


PROBE_SITE = str(WORK / "probe_site")


def _probe_env(tmp: Path, inherited: str | None) -> dict[str, str]:
    env = {"PYTHONPATH": PROBE_SITE, "REMOTEMAC_TEST_TORCH_IMPORT_PROBE": str(tmp / "probe.json")}
    if inherited:
        env["PYTORCH_ENABLE_MPS_FALLBACK"] = inherited
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, workload_python: str) -> dict[str, Run]:
    """All runs that need no signal, started together: each pays torch's import, and
    the workloads' sleeps overlap. Timing-sensitive assertions are relative. Under the
    workload's venv that the host built (conftest's ``workload_python``), as the runner
    starts the harness."""
    base = tmp_path_factory.mktemp("runs")
    start = functools.partial(Started, python=workload_python)
    fast = ("--interval", "0.1")
    started = {
        "warn": start(
            base / "warn",
            messages("warn", f"{FALLBACK_2024}:3", f"{FALLBACK_2022}:4", f"{FALLBACK_CONDA}:1"),
        ),
        "notimpl": start(base / "notimpl", messages("raise-notimpl", str(NOTIMPL[1]))),
        "dtype": start(base / "dtype", messages("raise-dtype", FLOAT64)),
        "oom": start(base / "oom", messages("raise-oom", str(OOM[0]))),
        "cpu": start(base / "cpu", [str(WORK / "device_work.py"), "cpu", "1.5"], opts=fast),
        "mps": start(base / "mps", [str(WORK / "device_work.py"), "cpu", "0.1"], device="mps"),
        "leak": start(base / "leak", [str(WORK / "memory.py"), "leak", "3"], opts=fast),
        "steady": start(base / "steady", [str(WORK / "memory.py"), "steady", "3"], opts=fast),
        "env-diagnostic": start(
            base / "env-diagnostic",
            [str(WORK / "envprobe.py")],
            opts=("--fallback", "diagnostic"),
            env=_probe_env(base / "env-diagnostic", None),
        ),
        "env-off": start(
            base / "env-off",
            [str(WORK / "envprobe.py")],
            opts=("--fallback", "off"),
            env=_probe_env(base / "env-off", "1"),
        ),
        "module": start(base / "module", ["-m", "modwork", "a", "--b"], cwd=WORK),
    }
    done = {name: s.wait(timeout=120) for name, s in started.items()}
    for name in ("env-diagnostic", "env-off"):
        done[name].probe = json.loads((base / name / "probe.json").read_text())
    return done


def codes(run: Run) -> list[str]:
    return [c["code"] for c in run.obs["stopping_conditions"]]


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_fallback_warnings_are_counted_per_op_and_printed_once(runs: dict[str, Run]) -> None:
    """Simulation: the recorded UserWarning texts, warned 3, 4 and 1 times between real
    training steps (from the second warning on through logging.captureWarnings, which
    replaces warnings.showwarning), become fallback_ops with exact counts."""
    run = runs["warn"]
    assert run.code == 0, run.err
    assert run.obs["operators"]["fallback_ops"] == [
        {"op": "aten::isin.Tensor_Tensor_out", "count": 3},
        {"op": "aten::bitwise_and.Tensor_out", "count": 4},
        {"op": "aten::nonzero", "count": 1},
    ]
    assert codes(run) == ["fallback-op"] * 3
    assert run.obs["stopping_conditions"][1]["op"] == "aten::bitwise_and.Tensor_out"
    # Still on stderr as usual, once per op (as TORCH_WARN_ONCE would have shown it).
    assert run.err.count("is not currently supported on the MPS backend") == 3
    assert run.err.count("'aten::bitwise_and.Tensor_out'") == 1
    assert run.obs["exit_code"] == 0 and run.obs["finished"] is True
    assert run.obs["operators"]["unsupported_ops"] == []


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_unsupported_op_is_recorded_and_exits_1(runs: dict[str, Run]) -> None:
    """Simulation: NotImplementedError with the recorded 2024 text, raised inside a
    model's forward during training."""
    run = runs["notimpl"]
    assert run.code == 1 and run.obs["exit_code"] == 1
    (entry,) = run.obs["operators"]["unsupported_ops"]
    assert entry["op"] == "aten::isin.Tensor_Tensor_out"
    assert entry["message"].startswith("The operator 'aten::isin.Tensor_Tensor_out' is not")
    assert codes(run) == ["unsupported-op"]
    # The traceback is the workload's, as `python script.py` prints it: no harness frames.
    assert "Traceback (most recent call last)" in run.err
    assert "NotImplementedError: The operator 'aten::isin.Tensor_Tensor_out'" in run.err
    assert "mps_messages.py" in run.err
    assert "harness.py" not in run.err and "runpy" not in run.err
    assert run.obs["oom"] is False


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_float64_type_error_is_a_dtype_error(runs: dict[str, Run]) -> None:
    """Simulation: the float64 TypeError text from PyTorch's EmptyTensor.cpp."""
    run = runs["dtype"]
    assert run.code == 1
    assert run.obs["operators"]["dtype_errors"] == [{"dtype": "float64", "message": FLOAT64}]
    assert codes(run) == ["dtype-error"]
    assert "TypeError: Cannot convert a MPS Tensor to float64" in run.err


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_mps_out_of_memory_is_recorded(runs: dict[str, Run]) -> None:
    """Simulation: the recorded MPS OOM RuntimeError (GB units, M1 Air, Ventura)."""
    run = runs["oom"]
    assert run.code == 1 and run.obs["oom"] is True
    (cond,) = run.obs["stopping_conditions"]
    assert cond["code"] == "out-of-memory"
    assert cond["detail"].startswith("MPS backend out of memory (MPS allocated: 18.02 GB")


@pytest.mark.parametrize("path", NOTIMPL, ids=lambda p: p.name)
def test_classify_every_recorded_notimplemented_wording(path: Path) -> None:
    """Simulation: the 2022 ("not current implemented"), 2024 and 2025 wordings."""
    line = [x for x in path.read_text().splitlines() if "The operator" in x][0]
    exc = NotImplementedError(line.split("NotImplementedError: ", 1)[-1])
    found = harness.classify(exc)
    assert [u["op"] for u in found.unsupported_ops] == [
        {
            "2022": "aten::_index_put_impl_",
            "2024": "aten::isin.Tensor_Tensor_out",
            "2025": "aten::_upsample_bilinear2d_aa.out",
        }[path.name.split("__")[1][:4]]
    ]
    assert [c["code"] for c in found.stopping_conditions] == ["unsupported-op"]


@pytest.mark.parametrize("path", OOM, ids=lambda p: p.name)
def test_classify_every_recorded_oom(path: Path) -> None:
    """Simulation: OOM texts with and without the "RuntimeError: " prefix, GB and GiB."""
    line = [x for x in path.read_text().splitlines() if "out of memory" in x][0]
    found = harness.classify(RuntimeError(line.split("RuntimeError: ", 1)[-1]))
    assert found.oom is True
    assert [c["code"] for c in found.stopping_conditions] == ["out-of-memory"]


def test_classify_wrapped_errors_and_the_rest() -> None:
    """An MPS error wrapped by the workload is still found; the macOS-too-old text maps
    to mps-unavailable; anything else is workload-failed; a fallback warning text is
    not mistaken for an unsupported op."""
    inner = NotImplementedError(
        "The operator 'aten::col2im' is not currently implemented for the MPS device."
    )
    try:
        try:
            raise inner
        except NotImplementedError as exc:
            raise RuntimeError("training step failed") from exc
    except RuntimeError as outer:
        wrapped = harness.classify(outer)
    assert [u["op"] for u in wrapped.unsupported_ops] == ["aten::col2im"]
    old = harness.classify(RuntimeError("The MPS backend is supported on MacOS 14.0+."))
    assert old.stopping_conditions == [
        {"code": "mps-unavailable", "detail": "The MPS backend is supported on MacOS 14.0+."}
    ]
    other = harness.classify(ValueError("bad shape"))
    assert other.stopping_conditions == [
        {"code": "workload-failed", "detail": "ValueError: bad shape"}
    ]
    fallback_text = FALLBACK_2024.read_text().split("UserWarning: ", 1)[1]
    assert harness.classify(RuntimeError(fallback_text)).unsupported_ops == []
    counter = harness.FallbackCounter()
    assert counter.note(fallback_text) is True and counter.note(fallback_text) is False
    assert counter.note(FLOAT64) is None


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_cpu_workload_lands_on_device_and_is_sampled(runs: dict[str, Run]) -> None:
    """A real model and tensors on cpu: tensors and model on the device, __main__
    semantics (argv, sys.path[0] = script dir), increasing sample times, real RSS."""
    run = runs["cpu"]
    assert run.code == 0, run.err
    seen = json.loads(run.out.splitlines()[0])
    assert seen == {
        "name": "__main__",
        "file": "device_work.py",
        "argv": [str(WORK / "device_work.py"), "cpu", "1.5"],
        "path0": str(WORK),
        "helper": 42,
    }
    obs = run.obs
    assert obs["tensors_on_device"] is True and obs["model_on_device"] is True
    assert obs["device"] == "cpu" and obs["torch_version"].startswith("2.")
    assert obs["stopping_conditions"] == [] and obs["exit_code"] == 0
    assert len(run.metrics) >= 5
    ts = [m["t"] for m in run.metrics]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert all(m["rss_bytes"] > 50 * MB for m in run.metrics)  # torch alone is bigger
    assert obs["peak_rss_bytes"] >= max(m["rss_bytes"] for m in run.metrics)
    assert obs["samples"] == len(run.metrics)


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_mps_requested_on_a_machine_without_mps(runs: dict[str, Run]) -> None:
    """Real, not simulated: this Linux torch has no MPS. The harness says so, and the
    workload's cpu tensors do not count as landing on mps."""
    run = runs["mps"]
    assert run.code == 0, run.err
    obs = run.obs
    assert obs["mps"] == {"is_built": False, "is_available": False}
    assert obs["tensors_on_device"] is False and obs["model_on_device"] is False
    assert [c["code"] for c in obs["stopping_conditions"]] == ["mps-unavailable"]
    assert "is_available() is False" in obs["stopping_conditions"][0]["detail"]


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_leaking_workload_grows_and_steady_one_does_not(runs: dict[str, Run]) -> None:
    """5 MB kept every 0.1 s for 3 s versus 5 MB allocated and dropped: the sampled
    RSS trend (least squares after 0.5 s warm-up) tells them apart. The leak's slope
    is held to the workload's own kept rate (it reports bytes kept over its loop's
    seconds: a loaded machine slows the loop, and the rate with it), the steady one
    to near zero. Only samples inside the loop count: the sampler starts before the
    script, so t <= loop_seconds is before its end; after it, runpy frees ``kept``."""
    slopes, rates = {}, {}
    for name in ("leak", "steady"):
        run = runs[name]
        assert run.code == 0, run.err
        told = json.loads(run.out.strip().splitlines()[-1])
        rates[name] = told["kept_bytes"] / told["loop_seconds"]
        window = [m for m in run.metrics if 0.5 <= m["t"] <= told["loop_seconds"]]
        points = [(m["t"], m["rss_bytes"]) for m in window]
        # nominally ~25 (0.1 s apart); the window starts at the sampler's 0 (before the
        # script's start-up), so a loaded machine leaves fewer: CI saw 9
        assert len(points) >= 5, points
        slopes[name] = least_squares_slope(points)
    assert rates["steady"] == 0 and rates["leak"] >= 5 * MB  # at least 3 blocks kept
    assert slopes["leak"] > 0.5 * rates["leak"]
    assert abs(slopes["steady"]) < min(1 * MB, 0.1 * rates["leak"])


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_fallback_variable_is_set_before_torch_is_imported(runs: dict[str, Run]) -> None:
    """A probe loaded by the interpreter (sitecustomize, before the harness runs) writes
    down the variable at the instant torch starts importing, whoever imports it. With
    --fallback off, the variable, even if the user's shell had it, must be gone."""
    run = runs["env-diagnostic"]
    assert run.code == 0, run.err
    assert run.probe == {"env": "1"}
    assert json.loads(run.out) == {"env": "1", "torch_preloaded": True, "warn_always": True}
    assert run.obs["fallback_env_before_torch"] is True
    assert run.obs["pytorch_env"] == {"PYTORCH_ENABLE_MPS_FALLBACK": "1"}
    run = runs["env-off"]
    assert run.code == 0, run.err
    assert run.probe == {"env": None} and json.loads(run.out)["env"] is None
    assert run.obs["pytorch_env"] == {}


@pytest.mark.e2e  # the runs fixture: every harness scenario over real torch
def test_module_mode_and_exit_code(runs: dict[str, Run]) -> None:
    """-m runs a module as __main__ with its argv and sys.path[0] = cwd, as `python -m`
    does; its sys.exit(3) is the harness's exit code and a stopping condition."""
    run = runs["module"]
    assert run.code == 3, run.err
    assert json.loads(run.out) == {"name": "__main__", "argv": ["a", "--b"], "path0": str(WORK)}
    assert run.obs["exit_code"] == 3 and run.obs["tensors_on_device"] is True
    assert run.obs["stopping_conditions"] == [
        {"code": "workload-failed", "detail": "the workload exited with code 3"}
    ]


@pytest.mark.e2e
def test_sigterm_writes_the_final_record(tmp_path: Path, workload_python: str) -> None:
    """While running, a provisional record exists (finished false); SIGTERM ends the run
    with 143 and a final record naming the signal."""
    started = Started(
        tmp_path, [str(WORK / "sleeper.py")], opts=("--interval", "0.1"), python=workload_python
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if "ready" in started.out.read_text() and started.obs.exists():
            break
        time.sleep(0.05)
    provisional = json.loads(started.obs.read_text())
    assert provisional["finished"] is False and provisional["exit_code"] is None
    started.proc.send_signal(signal.SIGTERM)
    run = started.wait()
    assert run.code == 143
    assert run.obs["finished"] is True and run.obs["exit_code"] == 143
    assert run.obs["stopping_conditions"] == [
        {"code": "workload-failed", "detail": "terminated by signal 15"}
    ]
    assert "not reached" not in run.out


def _python39() -> str | None:
    for cand in [
        shutil.which("python3.9"),
        *glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")),
    ]:
        if cand and subprocess.run([cand, "--version"], capture_output=True).returncode == 0:
            return cand
    return None


@pytest.mark.e2e
@pytest.mark.skipif(_python39() is None, reason="no Python 3.9 interpreter on this machine")
def test_runs_on_python_39_without_torch(tmp_path: Path) -> None:
    """The host's floor: Python 3.9, and no torch for a non-torch workload."""
    run = Started(
        tmp_path,
        [str(WORK / "memory.py"), "steady", "0.3"],
        opts=("--interval", "0.1"),
        python=str(_python39()),
    ).wait()
    assert run.code == 0, run.err
    assert run.obs["torch_version"] is None and run.obs["tensors_on_device"] is None
    assert run.obs["torch_error"] == "torch is not installed"
    assert len(run.metrics) >= 2


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            str(HARNESS),
            "--device",
            "mps",
            "--obs",
            "o",
            "--metrics",
            "m",
            "train.py",
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "remotemac harness: missing '--' before the workload (script.py ARGS or -m MODULE ARGS)"
    )
    with pytest.raises(ValueError, match="--fallback must be diagnostic or off"):
        harness.parse_args(
            ["--device", "mps", "--obs", "o", "--metrics", "m", "--fallback", "on", "--", "x.py"]
        )


def test_sample_rss_of_another_process() -> None:
    """The runner's API: current RSS of a live pid grows with it; a dead pid gives None."""
    code = "import sys,time; b=bytearray(b'x')*(80*2**20); print('ok', flush=True); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ok\n"
        rss = memsample.sample_rss(child.pid)
        assert rss is not None and rss > 80 * MB
    finally:
        child.kill()
        child.wait()
    assert memsample.sample_rss(child.pid) is None


def test_rss_from_ps_on_a_shim(tmp_path: Path) -> None:
    """Simulation: macOS has no /proc; `ps -o rss= -p PID` prints KiB, padded."""
    shim = tmp_path / "ps"
    shim.write_text('#!/bin/sh\n[ "$4" = 4242 ] && { echo "  123456"; exit 0; }\nexit 1\n')
    shim.chmod(0o755)
    assert memsample.rss_from_ps(4242, ps=str(shim)) == 123456 * 1024
    assert memsample.rss_from_ps(4243, ps=str(shim)) is None
    assert memsample.rss_from_ps(4242, ps=str(tmp_path / "missing")) is None


def test_agent_files_stay_python_39_compatible() -> None:
    """vermin: the files shipped to the host must run on Python 3.9."""
    vermin = shutil.which("vermin")
    assert vermin, "vermin is a dev dependency"
    files = [str(HARNESS), str(ROOT / "remotemac" / "agent" / "memsample.py")]
    run = subprocess.run(
        [vermin, "-t=3.9-", "--violations", "--eval-annotations", "--no-tips", *files],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
