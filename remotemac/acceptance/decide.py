"""Judge the observations: memory trend, what failed or is missing, and the recommendation.

Standard library only and Python 3.9 compatible: the host-side harness reuses
``memory_stable`` on the Mac, where only the user's interpreter exists. So this module
loads on its own: the judgement reads the observations, the stopping conditions and the
context through the record's types (:mod:`.observations`, :mod:`.recordtypes`), which
it imports when it judges, never at load time.

The recommendation follows issue 7's rules, blockers first:

1. required CUDA-only dependencies, multiple GPUs or operators MPS does not
   implement -> ``linux-gpu-first`` (a Mac cannot run the workload as is);
2. the workload failed or was lost -> no recommendation (the run says what failed);
   an observation missing -> no recommendation yet; any other stopping condition
   -> ``linux-gpu-first`` (no evidence that MPS is good enough yet);
3. a training pipeline on Linux that must also ship on macOS -> ``both``;
4. every observation passed and the goal is prototyping, inference or macOS
   validation -> ``apple-silicon-first``;
5. otherwise (training with nothing shipping on macOS) -> ``linux-gpu-first``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from remotemac.acceptance.observations import (
        Memory,
        Observations,
        OpEntry,
        Operators,
        ResultsSeen,
    )
    from remotemac.acceptance.recordtypes import (
        Decision,
        DecisionContext,
        StoppingCondition,
        StopWhen,
    )
    from remotemac.agent.protocol import JsonObject

APPLE_FIRST = "apple-silicon-first"
LINUX_FIRST = "linux-gpu-first"
BOTH = "both"
RECOMMENDATIONS = (APPLE_FIRST, LINUX_FIRST, BOTH)
#: stopping conditions after which the run is no evidence about the hardware at all
NO_EVIDENCE = ("workload-failed", "job-lost")
GOALS = ("prototyping", "inference", "macos-validation", "training")
APPLE_GOALS = ("prototyping", "inference", "macos-validation")

# Memory trend. Warm-up: model build, allocator warm-up and the first batches climb
# fast, so the first seconds (at most a quarter of a short run) and the first samples
# are skipped. A trend is then stated only from at least MIN_TREND_SAMPLES samples over
# at least MIN_TREND_SECONDS after the warm-up: from fewer (a 3-5 s job gives 3-5
# samples) the slope is noise, and identical reruns flipped between "growing" and
# "stable" (issue 34). Shorter runs are "too short to tell", a verdict neither way.
# Memory "keeps growing" only when all three hold:
#   * the Theil–Sen slope (median of pairwise slopes: robust to GC and allocator
#     sawtooth, to spikes and to a leftover ramp) is above the tolerance, and so is
#     the lower end of its 95% confidence interval (Sen's, from Kendall's S): growth
#     the samples cannot tell apart from the tolerance is not called growth,
#   * the slope over the last half of those samples is too: growth that stopped
#     (a ramp, then flat) is not a leak,
#   * the growth it implies over the window is at least MIN_GROWTH_SECONDS worth of
#     the tolerated rate: a few noisy samples cannot cry wolf.
DEFAULT_WARMUP_S = 10.0
DEFAULT_WARMUP_FRACTION = 0.25
DEFAULT_WARMUP_SAMPLES = 2
DEFAULT_TOLERANCE_BYTES_PER_S = 1024.0 * 1024.0
MIN_GROWTH_SECONDS = 16.0
#: a trend needs this many samples after the warm-up …
MIN_TREND_SAMPLES = 10
#: … spread over at least this long
MIN_TREND_SECONDS = 10.0
#: the confidence of the slope's interval, and its two-sided normal quantile
CONFIDENCE = 0.95
_Z = 1.959964
#: Theil–Sen is quadratic: longer series are thinned to this many evenly spaced points
MAX_TREND_POINTS = 400
#: ``trend`` values: what the judgement could say
TREND_STABLE, TREND_GROWING, TREND_SHORT, TREND_NONE = (
    "stable",
    "growing",
    "too-short",
    "no-samples",
)
#: the shortest job (seconds from the first sample) whose trend can be told with the
#: default warm-up: MIN_TREND_SECONDS after at most a quarter of the run
MIN_JOB_SECONDS_FOR_TREND = MIN_TREND_SECONDS / (1.0 - DEFAULT_WARMUP_FRACTION)


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0


def _thin(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    pts = list(points)
    if len(pts) > MAX_TREND_POINTS:
        step = len(pts) / float(MAX_TREND_POINTS)
        pts = [pts[int(i * step)] for i in range(MAX_TREND_POINTS)]
    return pts


def _pair_slopes(pts: list[tuple[float, float]]) -> list[float]:
    return sorted(
        (pts[j][1] - pts[i][1]) / (pts[j][0] - pts[i][0])
        for i in range(len(pts))
        for j in range(i + 1, len(pts))
        if pts[j][0] != pts[i][0]
    )


def theil_sen_slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Median of the slopes between every two points with distinct t; None if there are none."""
    slopes = _pair_slopes(_thin(points))
    return _median(slopes) if slopes else None


def slope_interval(points: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Sen's CONFIDENCE interval of the Theil–Sen slope, or None with too few points.

    The ranks come from the variance of Kendall's S, ``N(N-1)(2N+5)/18`` (Sen 1968):
    with few points the interval is wide, which is the honest answer.
    """
    pts = _thin(points)
    slopes = _pair_slopes(pts)
    n_pts, n = len(pts), len(slopes)
    if n < 2:
        return None
    c = _Z * math.sqrt(n_pts * (n_pts - 1) * (2 * n_pts + 5) / 18.0)
    lo = int(math.floor((n - c) / 2.0))
    hi = int(math.ceil((n + c) / 2.0))
    return slopes[max(0, min(n - 1, lo))], slopes[max(0, min(n - 1, hi))]


def warmup_end(
    pts: Sequence[tuple[float, float]],
    warmup_s: float | None,
    warmup_samples: int,
    active_from: float | None = None,
    warm_at: float | None = None,
) -> float:
    """When the warm-up ends, by steps or by time, and never before the
    ``warmup_samples``-th sample.

    By steps: ``warm_at``, when the workload had taken its first optimizer steps
    (optimizer state allocated, first batches through). By time: ``warmup_s`` (default
    10 s, at most a quarter of what follows) after ``active_from`` — when the workload
    had imported torch: a slow import on a busy machine is a ramp, not a leak — or
    after the first sample.
    """
    if warm_at is not None and warmup_s is None:
        end = warm_at
    else:
        start = pts[0][0] if active_from is None else max(pts[0][0], active_from)
        if warmup_s is None:
            warmup_s = min(DEFAULT_WARMUP_S, DEFAULT_WARMUP_FRACTION * (pts[-1][0] - start))
        end = start + warmup_s
    if 0 < warmup_samples < len(pts):
        end = max(end, pts[warmup_samples][0])
    return end


def too_short_reason(samples: int, seconds: float, warmup_s: float) -> str:
    """The words for a trend that cannot be told, with what it would need."""
    return (
        f"trend: too short to tell ({samples} samples over {seconds:.1f} s after the "
        f"{warmup_s:g} s warm-up; a trend needs {MIN_TREND_SAMPLES} samples over "
        f"{MIN_TREND_SECONDS:g} s)"
    )


def memory_growth_note(policy: Any) -> str | None:
    """What ``check`` says about ``stop_when.memory_growth``: when a trend can be told."""
    need = (
        f"a memory trend needs {MIN_TREND_SAMPLES} samples over {MIN_TREND_SECONDS:g} s "
        f"after the warm-up (a job of about {MIN_JOB_SECONDS_FOR_TREND:.0f} s or more)"
    )
    if policy == "required":
        return f"stop_when.memory_growth: required: {need}; a shorter run is incomplete"
    if policy is False:
        return None
    return (
        f"stop_when.memory_growth: {need}; a shorter run reports its peak and "
        "'trend: too short to tell', not incomplete (memory_growth: required makes it so)"
    )


def memory_stable(
    samples: Sequence[tuple[float, float]],
    warmup_s: float | None = None,
    tolerance_bytes_per_s: float = DEFAULT_TOLERANCE_BYTES_PER_S,
    warmup_samples: int = DEFAULT_WARMUP_SAMPLES,
    min_growth_bytes: float | None = None,
    active_from: float | None = None,
    warm_at: float | None = None,
    min_samples: int = MIN_TREND_SAMPLES,
    min_seconds: float = MIN_TREND_SECONDS,
) -> JsonObject:
    """Decide from the trend after warm-up whether memory keeps growing.

    A trend, not the last value: a steady run has noise, allocator steps and GC
    sawtooth, a leaking one climbs to the end (see the comment above for the test).
    ``peak_bytes`` covers every sample and is an observation whatever the length.
    ``stable`` is None and ``trend`` ``too-short`` when fewer than ``min_samples``
    samples over ``min_seconds`` follow the warm-up: the same short job must not be
    "growing" on one run and "stable" on the next. ``confidence`` and
    ``slope_interval_bytes_per_s`` say how sure the judgement is. The warm-up: see
    :func:`warmup_end`; ``min_growth_bytes`` defaults to MIN_GROWTH_SECONDS of the
    tolerated rate.
    """
    pts = sorted((float(t), float(b)) for t, b in samples)
    peak = int(max(b for _, b in pts)) if pts else None
    if min_growth_bytes is None:
        min_growth_bytes = MIN_GROWTH_SECONDS * tolerance_bytes_per_s
    result: JsonObject = {
        "stable": None,
        "trend": TREND_NONE,
        "slope_bytes_per_s": None,
        "slope_interval_bytes_per_s": None,
        "confidence": None,
        "peak_bytes": peak,
        "samples_used": 0,
        "window_s": 0.0,
        "warmup_s": warmup_s,
        "method": "theil-sen",
        "tolerance_bytes_per_s": tolerance_bytes_per_s,
        "min_growth_bytes": min_growth_bytes,
        "min_trend_samples": min_samples,
        "min_trend_seconds": min_seconds,
        "reason": "",
    }
    if not pts:
        result["reason"] = "no memory samples"
        return result
    start = warmup_end(pts, warmup_s, warmup_samples, active_from, warm_at)
    result["warmup_s"] = round(start - pts[0][0], 3)
    result["warmup_by"] = (
        "steps"
        if warm_at is not None and warmup_s is None
        else "torch-import"
        if active_from is not None
        else "time"
    )
    after = [p for p in pts if p[0] >= start]
    window = after[-1][0] - after[0][0] if after else 0.0
    result["samples_used"] = len(after)
    result["window_s"] = round(window, 3)
    interval = slope_interval(after) if len(after) >= max(3, min_samples) else None
    slope = theil_sen_slope(after) if interval is not None else None
    if slope is None or interval is None or window < min_seconds:
        result["trend"] = TREND_SHORT
        result["reason"] = too_short_reason(len(after), window, result["warmup_s"])
        return result
    _judge_trend(result, after, slope, interval, window, tolerance_bytes_per_s, min_growth_bytes)
    return result


def _judge_trend(
    result: JsonObject,
    after: list[tuple[float, float]],
    slope: float,
    interval: tuple[float, float],
    window: float,
    tolerance_bytes_per_s: float,
    min_growth_bytes: float,
) -> None:
    """Fill ``result`` with the trend of the samples ``after`` the warm-up: growing only
    when the slope, its interval's lower end and the last half's slope are all above
    the tolerance and the growth is big enough (see the comment above MIN_GROWTH_SECONDS)."""
    late = after[len(after) // 2 :]
    late_slope = theil_sen_slope(late) if len(late) >= 3 else slope
    growth = slope * window
    result["slope_bytes_per_s"] = slope
    result["slope_interval_bytes_per_s"] = [interval[0], interval[1]]
    result["confidence"] = CONFIDENCE
    result["late_slope_bytes_per_s"] = late_slope
    result["growth_bytes"] = growth
    sure = f"{CONFIDENCE:.0%} interval {interval[0]:.0f}..{interval[1]:.0f} B/s"
    growing = (
        slope > tolerance_bytes_per_s
        and interval[0] > tolerance_bytes_per_s
        and late_slope is not None
        and late_slope > tolerance_bytes_per_s
        and growth >= min_growth_bytes
    )
    result["stable"] = not growing
    result["trend"] = TREND_GROWING if growing else TREND_STABLE
    if growing:
        result["reason"] = (
            f"grows {slope:.0f} B/s after the {result['warmup_s']:g}s warm-up "
            f"({sure}; {late_slope:.0f} B/s over the last half, {growth:.0f} B in all; "
            f"tolerance {tolerance_bytes_per_s:.0f} B/s)"
        )
    elif slope > tolerance_bytes_per_s:
        if interval[0] <= tolerance_bytes_per_s:
            why = f"the {sure} reaches the tolerance"
        elif late_slope is None or late_slope <= tolerance_bytes_per_s:
            why = "stopped growing in the last half"
        else:
            why = f"grew only {growth:.0f} B, under {min_growth_bytes:.0f} B"
        result["reason"] = f"rose {slope:.0f} B/s after warm-up but {why}: stable"
    else:
        result["reason"] = (
            f"grows {slope:.0f} B/s after the {result['warmup_s']:g}s warm-up "
            f"(within the {tolerance_bytes_per_s:.0f} B/s tolerance; {sure})"
        )


def _names(items: Sequence[OpEntry] | None) -> list[str]:
    """Operator names (with their count when above one) from plain strings or
    ``{op, count}`` objects."""
    out = []
    for item in items or []:
        count = None if item.is_bare else item.count
        label = item.title()
        out.append(f"{label} ×{count}" if isinstance(count, int) and count > 1 else label)
    return out


def _fallback_policy_violations(fallback_ops: Sequence[OpEntry] | None, policy: Any) -> list[str]:
    """Labels of the fallback ops that ``stop_when.fallback_ops`` does not allow.

    The policy is matched on the op's name alone (``aten::isin.Tensor_Tensor_out`` or
    ``isin.Tensor_Tensor_out``), never on the display label that carries the count.
    """
    items = list(fallback_ops or [])
    if policy == "none":
        return []
    if policy not in (None, "any"):
        allowed = set(policy)
        items = [
            i
            for i in items
            if i.title() not in allowed and i.title().replace("aten::", "") not in allowed
        ]
    return _names(items)


def _parse_bytes(value: Any) -> int | None:
    """``24GiB`` / ``512MB`` / 1024 -> bytes; None when absent."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return int(value)
    text = str(value).strip()
    units = {
        "kib": 1024,
        "mib": 1024**2,
        "gib": 1024**3,
        "tib": 1024**4,
        "kb": 1000,
        "mb": 1000**2,
        "gb": 1000**3,
        "tb": 1000**4,
        "b": 1,
    }
    lower = text.lower()
    for unit in sorted(units, key=len, reverse=True):
        if lower.endswith(unit):
            return int(float(lower[: -len(unit)].strip()) * units[unit])
    return int(float(text))


def _read_observations(observations: Observations | JsonObject | None) -> Observations:
    from remotemac.acceptance.observations import Observations

    if isinstance(observations, Observations):
        return observations
    return Observations.from_json(observations)


def _read_stop_when(stop_when: StopWhen | JsonObject | None) -> StopWhen:
    from remotemac.acceptance.recordtypes import StopWhen

    return stop_when if isinstance(stop_when, StopWhen) else StopWhen.from_json(stop_when)


def evaluate_observations(
    observations: Observations | JsonObject | None,
    stop_when: StopWhen | JsonObject | None = None,
) -> tuple[list[JsonObject], list[str]]:
    """Stopping conditions the observations show (as the record writes them), and the
    observations not made.

    ``stop_when`` is the playbook's section (``fallback_ops``: any | none | list,
    ``memory_growth``: true | false | required, ``max_memory``). A memory trend too
    short to tell is not missing unless ``memory_growth: required``. Unknown values are None in the record:
    an empty list means "observed, none", None means "not observed". Either may be
    given as its JSON object (read here) or already read.
    """
    obs = _read_observations(observations)
    stop = _read_stop_when(stop_when)
    conditions, missing = _judge(obs, stop)
    return [c.to_json() for c in conditions], missing


def _judge(obs: Observations, stop: StopWhen) -> tuple[list[StoppingCondition], list[str]]:
    """The stopping conditions the observations show, and the observations not made."""
    conditions: list[StoppingCondition] = []
    missing: list[str] = []
    _device_conditions(obs, conditions, missing)
    _operator_conditions(obs.operators, stop, conditions, missing)
    _memory_conditions(obs.memory, stop, conditions, missing)
    _results_conditions(obs.results, conditions, missing)
    return conditions, missing


def _condition(code: str, detail: str) -> StoppingCondition:
    from remotemac.acceptance.recordtypes import StoppingCondition

    return StoppingCondition(code, detail)


def _device_conditions(
    obs: Observations, conditions: list[StoppingCondition], missing: list[str]
) -> None:
    on_device = obs.tensors_on_device
    if on_device is None:
        missing.append("tensors_on_device")
    elif on_device is False:
        conditions.append(
            _condition(
                "tensors_not_on_device", "tensors or the model did not land on the target device"
            )
        )


def _operator_conditions(
    ops: Operators, stop: StopWhen, conditions: list[StoppingCondition], missing: list[str]
) -> None:
    if not ops.observed:
        missing.append("operators")
    unsupported = _names(ops.unsupported_ops)
    if unsupported:
        conditions.append(
            _condition("unsupported_ops", "not implemented on MPS: " + ", ".join(unsupported))
        )
    dtype_errors = _names(ops.dtype_errors)
    if dtype_errors:
        conditions.append(_condition("dtype_errors", "; ".join(dtype_errors)))
    stopping_fallbacks = _fallback_policy_violations(ops.fallback_ops, stop.fallback_ops)
    if stopping_fallbacks:
        conditions.append(
            _condition(
                "fallback_ops", "ran on the CPU instead of MPS: " + ", ".join(stopping_fallbacks)
            )
        )


def _memory_conditions(
    mem: Memory, stop: StopWhen, conditions: list[StoppingCondition], missing: list[str]
) -> None:
    growth = stop.memory_growth
    growth_matters = growth is not False
    if mem.peak_bytes is None and mem.stable is None:
        # not one sample: memory was not observed at all
        if growth_matters or stop.max_memory is not None:
            missing.append("memory")
    elif mem.stable is None:
        # the peak is an observation; a trend too short to tell is none either way,
        # unless the playbook demands one (memory_growth: required)
        if growth == "required":
            missing.append("memory")
    elif mem.stable is False and growth_matters:
        slope = mem.slope
        rate = f" ({slope / 1024**2:.2f} MiB/s after warm-up)" if slope is not None else ""
        conditions.append(_condition("memory_growth", "memory keeps growing" + rate))
    limit = _parse_bytes(stop.max_memory)
    peak = mem.peak_bytes
    if limit is not None and peak is not None and peak > limit:
        conditions.append(
            _condition("max_memory", f"peak {peak} bytes above max_memory {limit} bytes")
        )


def _results_conditions(
    results: ResultsSeen, conditions: list[StoppingCondition], missing: list[str]
) -> None:
    within = results.within_tolerance
    if within is None:
        missing.append("results")
    elif within is False:
        # a file not compared (ok None) is no evidence of a difference: not listed here
        failed = [f for f in results.files if f.ok is False]
        parts = []
        for f in failed[:5]:
            # a metadata difference (a path, a device name) fails only a strict rule
            bad = [t.key for t in f.tensors if not t.ok and (f.strict or not t.metadata)]
            if f.first_failing_key in bad:
                bad.remove(f.first_failing_key)
                bad.insert(0, f.first_failing_key)
            parts.append(
                f"{f.path}"
                + (f" [{', '.join(bad[:3])}" + (" …" if len(bad) > 3 else "") + "]" if bad else "")
            )
        if len(failed) > 5:
            parts.append(f"+{len(failed) - 5} more")
        conditions.append(
            _condition(
                "results_outside_tolerance",
                "outside tolerance: " + (", ".join(parts) or "no files"),
            )
        )


def _read_context(context: DecisionContext | JsonObject | None) -> DecisionContext:
    from remotemac.acceptance.recordtypes import DecisionContext

    return context if isinstance(context, DecisionContext) else DecisionContext.from_json(context)


def _read_conditions(items: Sequence[StoppingCondition | JsonObject]) -> list[StoppingCondition]:
    from remotemac.acceptance.recordtypes import StoppingCondition

    return [StoppingCondition.from_json(c) for c in items]


def _decision(recommendation: str | None, reasons: list[str]) -> Decision:
    from remotemac.acceptance.recordtypes import Decision

    return Decision(recommendation, reasons)


def decide(
    observations: Observations | JsonObject | None,
    stopping_conditions: Sequence[StoppingCondition | JsonObject],
    context: DecisionContext | JsonObject | None = None,
) -> JsonObject:
    """The recommendation and the reasons for it (see the module docstring's rules), as
    the record's ``decision`` object.

    ``context``: ``goal`` (prototyping | inference | macos-validation | training),
    ``trains_on_linux``, ``ships_on_macos``, ``cuda_dependencies`` (list),
    ``multi_gpu``, ``target_device`` (what the target really ran on: no recommendation
    for Apple Silicon without MPS evidence), and optionally the playbook's ``stop_when``.
    """
    ctx = _read_context(context)
    obs = _read_observations(observations)
    return _recommend(obs, _read_conditions(stopping_conditions), ctx).to_json()


def _recommend(
    obs: Observations, stopping_conditions: list[StoppingCondition], ctx: DecisionContext
) -> Decision:
    blockers = _blockers(obs, ctx)
    if blockers:
        return _decision(LINUX_FIRST, blockers)

    derived, missing = _judge(obs, ctx.stop_when)
    every = [*stopping_conditions, *derived]
    failed: list[str] = []
    seen = set()
    for cond in every:
        key = (cond.code, cond.detail)
        if key not in seen:
            seen.add(key)
            failed.append(f"{cond.code}: {cond.detail}")
    broken = [c for c in every if c.code in NO_EVIDENCE]
    if broken:
        # a job that failed or was lost says nothing about the hardware: no recommendation
        return _decision(
            None,
            [
                f"the workload did not run to the end, so this run says nothing "
                f"about the hardware: {c.code}: {c.detail}"
                for c in broken
            ]
            + ["stopping condition " + f for f in failed if f.split(":", 1)[0] not in NO_EVIDENCE],
        )
    if failed:
        reasons = ["stopping condition " + f for f in failed]
        if missing:
            reasons.append("not observed: " + ", ".join(missing))
        return _decision(LINUX_FIRST, reasons)
    if missing:
        return _decision(
            None,
            ["no recommendation yet: not observed: " + ", ".join(missing)]
            + ([f"results: {ctx.results_summary}"] if ctx.results_summary else []),
        )

    return _when_every_observation_passed(ctx)


def _blockers(obs: Observations, ctx: DecisionContext) -> list[str]:
    """Why a Mac cannot run the workload as is (rule 1 of the module docstring)."""
    blockers: list[str] = []
    cuda = [str(d) for d in ctx.cuda_dependencies]
    if cuda:
        blockers.append("requires CUDA-only dependencies: " + ", ".join(cuda))
    if ctx.multi_gpu:
        blockers.append("needs several GPUs; an Apple-Silicon Mac has one")
    unsupported = _names(obs.operators.unsupported_ops)
    if unsupported:
        blockers.append("operators not implemented on MPS: " + ", ".join(unsupported))
    return blockers


def _when_every_observation_passed(ctx: DecisionContext) -> Decision:
    """Rules 3-5: by the goal, once every observation passed (on MPS, or no recommendation)."""
    goal = ctx.goal or "macos-validation"
    device = ctx.target_device
    if device not in (None, "mps"):
        return _decision(
            None,
            [
                f"every observation passed, but the target ran on {device}, not "
                "MPS: this run proves the pipeline, not Apple Silicon; run it on "
                "an Apple-Silicon Mac to decide"
            ],
        )
    passed = "every observation passed on MPS (tensors on device, operators, memory, results)"
    if ctx.ships_on_macos and (ctx.trains_on_linux or goal == "training"):
        return _decision(
            BOTH,
            [
                passed,
                "the training pipeline stays on Linux GPUs and the "
                "project must also ship on macOS: validate on both",
            ],
        )
    if goal in APPLE_GOALS:
        return _decision(APPLE_FIRST, [passed, f"the goal is {goal}"])
    return _decision(
        LINUX_FIRST,
        [passed, "the goal is training and nothing ships on macOS: keep training on Linux GPUs"],
    )
