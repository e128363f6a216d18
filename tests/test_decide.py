"""Decision rules, observation evaluation and the memory trend (stdlib module)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import remotemac.acceptance.decide as decide_mod
from remotemac.acceptance.decide import (
    APPLE_FIRST,
    BOTH,
    LINUX_FIRST,
    decide,
    evaluate_observations,
    memory_stable,
)
from tests.trendkit import least_squares_slope

MiB = 1024 * 1024


def passing_observations() -> dict:
    return {
        "tensors_on_device": True,
        "operators": {"fallback_ops": [], "unsupported_ops": [], "dtype_errors": []},
        "memory": {"peak_bytes": 900 * MiB, "stable": True, "slope_bytes_per_s": 12.0},
        "results": {"within_tolerance": True, "files": [{"path": "m.pt", "ok": True}]},
    }


# ---------------------------------------------------------------- memory


def _series(seconds: int, base: float, slope: float, noise: float, seed: int = 1) -> list:
    rng = random.Random(seed)
    return [(float(t), base + slope * t + rng.uniform(-noise, noise)) for t in range(seconds)]


def test_steady_memory_is_stable_despite_noise():
    samples = _series(120, 800 * MiB, 0.0, 20 * MiB)
    got = memory_stable(samples, warmup_s=10, tolerance_bytes_per_s=MiB)
    assert got["stable"] is True
    assert abs(got["slope_bytes_per_s"]) < MiB
    assert got["peak_bytes"] == int(max(b for _, b in samples))
    assert got["samples_used"] == 110


def test_leaking_memory_is_not_stable():
    samples = _series(120, 800 * MiB, 3 * MiB, 20 * MiB)  # +3 MiB every second
    got = memory_stable(samples, warmup_s=10, tolerance_bytes_per_s=MiB)
    assert got["stable"] is False
    assert got["slope_bytes_per_s"] == pytest.approx(3 * MiB, rel=0.1)


def test_warmup_growth_is_ignored_but_counts_for_peak():
    """Model build and allocator warm-up climb fast, then memory is flat: stable."""
    warm = [(float(t), 100 * MiB * t) for t in range(10)]
    flat = [(float(t), 1000 * MiB) for t in range(10, 60)]
    got = memory_stable(warm + flat, warmup_s=10, tolerance_bytes_per_s=MiB)
    assert got["stable"] is True and got["slope_bytes_per_s"] == 0.0
    assert got["peak_bytes"] == 1000 * MiB
    # without the warm-up cut a least-squares line calls it a leak (issue 17: it cried
    # wolf); the robust trend sees growth that stopped and still says stable
    assert least_squares_slope(warm + flat) > MiB
    assert memory_stable(warm + flat, warmup_s=0, tolerance_bytes_per_s=MiB)["stable"] is True


def test_the_last_value_does_not_decide():
    """A steady series whose last sample spikes is still stable: the trend decides."""
    samples = [(float(t), 500 * MiB) for t in range(60)] + [(60.0, 900 * MiB)]
    assert memory_stable(samples, 5, MiB)["stable"] is True


def test_too_short_a_run_is_unknown():
    got = memory_stable(
        [(0.0, 1.0), (1.0, 2.0), (12.0, 3.0)], warmup_s=10, tolerance_bytes_per_s=MiB
    )
    assert got["stable"] is None and got["slope_bytes_per_s"] is None
    assert got["trend"] == "too-short" and "too short to tell (1 samples" in got["reason"]
    assert memory_stable([], 10, MiB)["peak_bytes"] is None


def test_decide_module_runs_on_python_39():
    """The host reuses this module: it must stay stdlib-only and Python 3.9 compatible."""
    source = Path(decide_mod.__file__)
    imports = [
        line for line in source.read_text().splitlines() if line.startswith(("import ", "from "))
    ]
    allowed = ("from __future__", "from typing", "from collections.abc", "import math")
    assert all(line.startswith(allowed) for line in imports), imports
    vermin = shutil.which("vermin")
    assert vermin, "vermin is a test dependency"
    proc = subprocess.run(
        [vermin, "-t=3.9-", "--violations", "--no-tips", str(source)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- observations


def test_evaluate_passing_observations():
    assert evaluate_observations(passing_observations()) == ([], [])


def test_evaluate_names_failures_and_missing():
    obs = passing_observations()
    obs["tensors_on_device"] = None
    obs["operators"] = {
        "fallback_ops": [{"op": "aten::_linalg_svd", "count": 3}],
        "unsupported_ops": ["aten::_fft_r2c"],
        "dtype_errors": ["Cannot convert a MPS Tensor to float64 dtype"],
    }
    obs["memory"] = {"peak_bytes": 30 * 1024 * MiB, "stable": False, "slope_bytes_per_s": 2 * MiB}
    obs["results"] = {
        "within_tolerance": False,
        "files": [
            {
                "path": "preds/a.pt",
                "ok": False,
                "tensors": [{"key": "logits", "ok": False}, {"key": "x", "ok": True}],
            },
            {"path": "metrics.json", "ok": True},
        ],
    }
    conds, missing = evaluate_observations(obs, {"max_memory": "24GiB"})
    by_code = {c["code"]: c["detail"] for c in conds}
    assert missing == ["tensors_on_device"]
    assert by_code["unsupported_ops"] == "not implemented on MPS: aten::_fft_r2c"
    assert "float64" in by_code["dtype_errors"]
    assert by_code["fallback_ops"] == "ran on the CPU instead of MPS: aten::_linalg_svd ×3"
    assert by_code["memory_growth"] == "memory keeps growing (2.00 MiB/s after warm-up)"
    assert by_code["max_memory"].endswith(f"above max_memory {24 * 1024 * MiB} bytes")
    assert by_code["results_outside_tolerance"] == "outside tolerance: preds/a.pt [logits]"


def test_fallback_policy():
    obs = passing_observations()
    obs["operators"]["fallback_ops"] = ["aten::col2im", "aten::linalg_svd"]
    codes = lambda sw: [c["code"] for c in evaluate_observations(obs, sw)[0]]  # noqa: E731
    assert codes({"fallback_ops": "any"}) == ["fallback_ops"]
    assert codes(None) == ["fallback_ops"]  # the playbook default is "any"
    assert codes({"fallback_ops": "none"}) == []
    assert codes({"fallback_ops": ["col2im", "aten::linalg_svd"]}) == []
    conds = evaluate_observations(obs, {"fallback_ops": ["col2im"]})[0]
    assert conds == [
        {"code": "fallback_ops", "detail": "ran on the CPU instead of MPS: aten::linalg_svd"}
    ]


def test_memory_growth_off_makes_memory_optional():
    obs = passing_observations()
    obs["memory"] = {"peak_bytes": None, "stable": None, "slope_bytes_per_s": None}
    assert evaluate_observations(obs)[1] == ["memory"]
    assert evaluate_observations(obs, {"memory_growth": False}) == ([], [])


# ---------------------------------------------------------------- decision


@pytest.mark.parametrize("goal", ["prototyping", "inference", "macos-validation"])
def test_all_pass_and_mac_goal_is_apple_first(goal):
    got = decide(passing_observations(), [], {"goal": goal})
    assert got["recommendation"] == APPLE_FIRST
    assert any(goal in r for r in got["reasons"])


def test_training_on_linux_that_ships_on_macos_is_both():
    got = decide(
        passing_observations(),
        [],
        {"goal": "training", "trains_on_linux": True, "ships_on_macos": True},
    )
    assert got["recommendation"] == BOTH
    got = decide(
        passing_observations(),
        [],
        {"goal": "inference", "trains_on_linux": True, "ships_on_macos": True},
    )
    assert got["recommendation"] == BOTH


def test_training_with_nothing_on_macos_stays_on_linux():
    got = decide(passing_observations(), [], {"goal": "training", "trains_on_linux": True})
    assert got["recommendation"] == LINUX_FIRST
    assert "nothing ships on macOS" in got["reasons"][-1]


def test_cuda_dependencies_force_linux():
    got = decide(
        passing_observations(),
        [],
        {"goal": "inference", "cuda_dependencies": ["flash-attn", "apex"]},
    )
    assert got == {
        "recommendation": LINUX_FIRST,
        "reasons": ["requires CUDA-only dependencies: flash-attn, apex"],
    }


def test_multi_gpu_forces_linux():
    got = decide(passing_observations(), [], {"goal": "prototyping", "multi_gpu": True})
    assert got["recommendation"] == LINUX_FIRST
    assert got["reasons"] == ["needs several GPUs; an Apple-Silicon Mac has one"]


def test_unsupported_ops_force_linux_even_when_shipping_on_macos():
    obs = passing_observations()
    obs["operators"]["unsupported_ops"] = [{"op": "aten::_fft_c2c", "count": 1}]
    got = decide(obs, [], {"goal": "training", "trains_on_linux": True, "ships_on_macos": True})
    assert got["recommendation"] == LINUX_FIRST
    assert got["reasons"] == ["operators not implemented on MPS: aten::_fft_c2c"]


def test_stopping_condition_or_missing_observation_is_not_apple_first():
    got = decide(
        passing_observations(),
        [{"code": "out_of_memory", "detail": "MPS backend out of memory"}],
        {"goal": "inference"},
    )
    assert got["recommendation"] == LINUX_FIRST
    assert got["reasons"] == ["stopping condition out_of_memory: MPS backend out of memory"]
    obs = passing_observations()
    obs["results"] = {"within_tolerance": None, "files": []}
    got = decide(obs, [], {"goal": "inference"})
    assert got["recommendation"] is None  # no evidence either way: no hardware advice yet
    assert got["reasons"] == ["no recommendation yet: not observed: results"]


def test_failed_workload_gets_no_hardware_recommendation():
    """Issue 14: a job that failed to start is not evidence for Linux GPUs."""
    failed = {
        "code": "workload-failed",
        "detail": "target job failed with exit 1: ModuleNotFoundError: No module named 'torch'",
    }
    got = decide(passing_observations(), [failed], {"goal": "inference"})
    assert got["recommendation"] is None
    assert "ModuleNotFoundError" in got["reasons"][0]
    assert "says nothing about the hardware" in got["reasons"][0]


def test_runs_under_the_interpreter_it_ships_for():
    """The module has no package-relative imports: it loads standalone as the host would."""
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            "import importlib.util as u, sys; s = u.spec_from_file_location('d', sys.argv[1]);"
            " m = u.module_from_spec(s); s.loader.exec_module(m);"
            " print(m.memory_stable([(t, 5.0 * t) for t in range(30)], 5, 1.0)['stable'])",
            decide_mod.__file__,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_no_apple_silicon_claim_without_mps_evidence():
    from remotemac.acceptance.decide import decide as decide_fn

    obs = {
        "tensors_on_device": True,
        "operators": {"fallback_ops": [], "unsupported_ops": [], "dtype_errors": []},
        "memory": {"stable": True, "peak_bytes": 1, "slope_bytes_per_s": 0.0},
        "results": {"within_tolerance": True, "files": []},
    }
    on_cpu = decide_fn(obs, [], {"goal": "inference", "target_device": "cpu"})
    assert on_cpu["recommendation"] is None and "not MPS" in on_cpu["reasons"][0]
    on_mps = decide_fn(obs, [], {"goal": "inference", "target_device": "mps"})
    assert on_mps["recommendation"] == "apple-silicon-first"


def _short_run_observations() -> dict:
    mem = memory_stable([(0.5 * i, 300.0 * MiB + (i % 3) * MiB) for i in range(8)])
    assert mem["trend"] == "too-short" and mem["peak_bytes"] == 302 * MiB
    return {
        "tensors_on_device": True,
        "operators": {"fallback_ops": [], "unsupported_ops": [], "dtype_errors": []},
        "memory": mem,
        "results": {"within_tolerance": True, "files": []},
    }


def test_a_trend_too_short_to_tell_is_not_missing_by_default():
    """Issue 32: a one-second job's peak is an observation; its trend cannot be told,
    which is no verdict either way and does not make the run incomplete."""
    conditions, missing = evaluate_observations(_short_run_observations(), {})
    assert conditions == [] and missing == []
    conditions, missing = evaluate_observations(_short_run_observations(), {"memory_growth": True})
    assert conditions == [] and missing == []


def test_memory_growth_required_makes_a_run_too_short_to_tell_incomplete():
    _, missing = evaluate_observations(_short_run_observations(), {"memory_growth": "required"})
    assert missing == ["memory"]


def test_no_memory_sample_at_all_is_still_not_observed():
    obs = _short_run_observations()
    obs["memory"] = memory_stable([])
    _, missing = evaluate_observations(obs, {})
    assert missing == ["memory"]


def test_noisy_growth_the_interval_cannot_separate_from_the_tolerance_is_not_growth():
    """The slope's 95% interval reaches below the tolerance: not called growth, so a
    rerun with other noise cannot flip the verdict to 'keeps growing'."""
    import random

    rng = random.Random(3)
    pts = [(0.5 * i, 400 * MiB + 1.3 * MiB * 0.5 * i + rng.gauss(0, 12 * MiB)) for i in range(60)]
    got = memory_stable(pts, warmup_s=0)
    assert got["slope_bytes_per_s"] > MiB  # the point estimate alone would say growing
    assert got["slope_interval_bytes_per_s"][0] <= MiB and got["stable"] is True
    assert "interval" in got["reason"]


def test_check_says_when_a_memory_trend_can_be_told(tmp_path):
    from tests.conftest import remotemac

    for policy, words in ((True, "not incomplete"), ("required", "a shorter run is incomplete")):
        pb = tmp_path / f"p{policy}.yaml"
        pb.write_text(
            "name: p\nhost: local\nworkload: {command: 'true'}\n"
            f"stop_when: {{memory_growth: {str(policy).lower()}}}\n"
        )
        js = json.loads(remotemac("check", str(pb), "--json", check=True).stdout)
        (note,) = js["notes"]
        assert "10 samples over 10 s after the warm-up" in note and words in note
        text = remotemac("check", str(pb), check=True).stdout
        assert f"note: {note}" in text
