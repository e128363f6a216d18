"""Build, validate and write the acceptance record (acceptance.json + acceptance.md).

The record is the product's answer, so it always has every key docs/contract.md lists:
unknown values are explicit nulls (an empty list means "observed, none"), and the
verdict is derived here from the evidence, never passed in, so no caller can
call a run accepted that is missing an observation.

The JSON Schema ships in the package (``acceptance.schema.json``); it uses only
``type``, ``required``, ``properties``, ``enum``, ``items`` and
``additionalProperties``, which ``validate`` below checks with the standard library.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from remotemac.acceptance.decide import decide, evaluate_observations
from remotemac.acceptance.observations import Observations
from remotemac.acceptance.recordtypes import Cost
from remotemac.agent.protocol import JsonObject
from remotemac.termsafe import escape_controls

SCHEMA_VERSION = "1"
VERDICTS = ("accepted", "rejected", "incomplete")
SCHEMA_FILE = "acceptance.schema.json"
JSON_NAME = "acceptance.json"
MD_NAME = "acceptance.md"

SUPPORTED_KEYWORDS = frozenset(
    {
        "$schema",
        "$id",
        "title",
        "description",
        "type",
        "required",
        "properties",
        "enum",
        "items",
        "additionalProperties",
    }
)


# ---------------------------------------------------------------- defaults


def empty_observations() -> JsonObject:
    """Observations before anything was observed: every value null."""
    return {
        "tensors_on_device": None,
        "operators": {"fallback_ops": None, "unsupported_ops": None, "dtype_errors": None},
        "memory": {"peak_bytes": None, "stable": None, "slope_bytes_per_s": None},
        "results": {"within_tolerance": None, "files": []},
    }


DEFAULTS: dict[str, JsonObject] = {
    "environment": {"reference": None, "target": None, "mismatches": []},
    "dataset": {"revision": None, "files": None, "bytes": None, "encrypted": None},
    "continuity": {"disconnects": None, "reconnects": None, "drill": None},
    "wipe": {"done": None, "verified": None, "removed": [], "remaining": []},
    "cost": {"hours": None, "hourly_rate": None, "amount": None, "currency": None},
    "decision": {"recommendation": None, "reasons": []},
}


def _merge(default: Any, given: Any) -> Any:
    """``given`` over ``default``, recursively for dicts; extra keys are kept."""
    if given is None:
        return copy.deepcopy(default)
    if isinstance(default, dict) and isinstance(given, dict):
        out = {
            k: _merge(v, given.get(k)) if k in given else copy.deepcopy(v)
            for k, v in default.items()
        }
        for k, v in given.items():
            if k not in out:
                out[k] = copy.deepcopy(v)
        return out
    return copy.deepcopy(given)


def _as_plain(value: Any) -> Any:
    """Objects with ``to_dict`` (Observations, a ComparisonResult) or ``to_json`` (the
    acceptance types) as dicts, recursively."""
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, dict):
        return {k: _as_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_plain(v) for v in value]
    return value


def _cost(given: JsonObject) -> JsonObject:
    """Fill ``amount`` from rental hours x hourly rate when both are known."""
    cost = Cost.from_json(given)
    if cost.amount is None and cost.hours is not None and cost.hourly_rate is not None:
        cost.amount = round(float(cost.hours) * float(cost.hourly_rate), 2)
    return cost.to_json()


def verdict_for(stopping_conditions: list[JsonObject], missing: list[str]) -> str:
    """rejected on any stopping condition; incomplete when an observation is missing."""
    if stopping_conditions:
        return "rejected"
    if missing:
        return "incomplete"
    return "accepted"


def build_record(
    *,
    run_id: str,
    playbook: str | None = None,
    host: str | None = None,
    started_at: str | None = None,
    finished_at: str | None = None,
    observations: Observations | JsonObject | None = None,
    stopping_conditions: list[JsonObject] | None = None,
    stop_when: JsonObject | None = None,
    context: JsonObject | None = None,
    environment: JsonObject | None = None,
    dataset: JsonObject | None = None,
    continuity: JsonObject | None = None,
    wipe: JsonObject | None = None,
    cost: JsonObject | None = None,
    decision: JsonObject | None = None,
    reproduce: str | None = None,
    **extra: Any,
) -> JsonObject:
    """The acceptance record with every SPEC key present, and its verdict derived.

    ``stopping_conditions`` are the ones met while running (out of memory, a lost
    job's reason …); the ones the observations show (unsupported ops, results out of
    tolerance, memory growth under ``stop_when``) are added here. ``decision`` is
    computed with :func:`decide` from ``context`` unless given. ``extra`` keys are
    kept (the schema allows more than the minimum).
    """
    obs = _merge(empty_observations(), _as_plain(observations))
    seen = Observations.from_json(obs)  # read once: the judgement and the decision
    given = [dict(c) for c in stopping_conditions or []]
    derived, missing = evaluate_observations(seen, stop_when)
    conditions: list[JsonObject] = []
    for cond in given + derived:
        cond = {
            "code": str(cond.get("code", "")),
            "detail": str(cond.get("detail", "")),
            **{k: v for k, v in cond.items() if k not in ("code", "detail")},
        }
        if all((c["code"], c["detail"]) != (cond["code"], cond["detail"]) for c in conditions):
            conditions.append(cond)
    if decision is None:
        ctx = dict(context or {})
        ctx.setdefault("stop_when", stop_when)
        decision = decide(seen, conditions, ctx)
    record: JsonObject = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "playbook": playbook,
        "host": host,
        "started_at": started_at,
        "finished_at": finished_at,
        "verdict": verdict_for(conditions, missing),
        "missing_observations": missing,
        "stopping_conditions": conditions,
        "observations": obs,
        "environment": _merge(DEFAULTS["environment"], environment),
        "dataset": _merge(DEFAULTS["dataset"], dataset),
        "continuity": _merge(DEFAULTS["continuity"], continuity),
        "wipe": _merge(DEFAULTS["wipe"], wipe),
        "cost": _cost(_merge(DEFAULTS["cost"], cost)),
        "decision": _merge(DEFAULTS["decision"], decision),
        "reproduce": reproduce,
    }
    for key, value in extra.items():
        record.setdefault(key, _as_plain(value))
    return record


# ---------------------------------------------------------------- validation


@lru_cache(maxsize=1)
def load_schema() -> JsonObject:
    """The JSON Schema shipped next to this module."""
    text = resources.files("remotemac.acceptance").joinpath(SCHEMA_FILE).read_text("utf-8")
    return json.loads(text)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (
        isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()
    ),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def validate(instance: Any, schema: JsonObject, path: str = "$") -> list[str]:
    """Problems of ``instance`` against ``schema`` (the subset named in SUPPORTED_KEYWORDS).

    An unsupported keyword in the schema is itself reported, so a schema edit can
    never be silently ignored.
    """
    unknown = set(schema) - SUPPORTED_KEYWORDS
    if unknown:
        return [f"{path}: schema uses unsupported keyword(s) {sorted(unknown)}"]
    problems: list[str] = []
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](instance) for t in types):
            return [f"{path}: expected {' or '.join(types)}, got {type(instance).__name__}"]
    if "enum" in schema and not any(
        instance == e and type(instance) is type(e) for e in schema["enum"]
    ):
        problems.append(f"{path}: {instance!r} is not one of {schema['enum']}")
    if isinstance(instance, dict):
        for key in schema.get("required", []):
            if key not in instance:
                problems.append(f"{path}: missing required key '{key}'")
        props = schema.get("properties", {})
        for key, value in instance.items():
            if key in props:
                problems.extend(validate(value, props[key], f"{path}.{key}"))
            elif schema.get("additionalProperties", True) is False:
                problems.append(f"{path}: unexpected key '{key}'")
    if isinstance(instance, list) and "items" in schema:
        for i, item in enumerate(instance):
            problems.extend(validate(item, schema["items"], f"{path}[{i}]"))
    return problems


def validate_record(record: Any) -> list[str]:
    """Problems of an acceptance record against the shipped schema; [] when valid."""
    problems = validate(record, load_schema())
    try:
        json.dumps(record, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"$: not representable as strict JSON: {exc}")
    return problems


# ---------------------------------------------------------------- writing


def _strict_json(value: Any) -> Any:
    """NaN and infinities as null: acceptance.json must be strict JSON. Every string
    with its terminal controls made visible: the record quotes the job and the host
    (a loader's error, a log line), and ``cat acceptance.md`` must not obey them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return escape_controls(value)
    if isinstance(value, dict):
        return {escape_controls(str(k)): _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    return value


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and ``os.replace``.

    A reader (or a crash) never sees half a record.
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_record(out_dir: Path, record: JsonObject) -> tuple[Path, Path]:
    """Write acceptance.json and acceptance.md into ``out_dir``; return both paths.

    The record is checked against the schema first: a record that breaks the
    contract is a bug, raised as ValueError with every problem, before anything
    is written.
    """
    from remotemac.acceptance.markdown import render_markdown

    clean = _strict_json(record)
    problems = validate_record(clean)
    if problems:
        raise ValueError("acceptance record does not match its schema: " + "; ".join(problems))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / JSON_NAME, out_dir / MD_NAME
    _write_atomic(
        json_path, json.dumps(clean, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    )
    _write_atomic(md_path, render_markdown(clean))
    return json_path, md_path
