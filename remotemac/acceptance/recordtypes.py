"""The acceptance record (acceptance.json) as dataclasses, read once where it is rendered.

Why: acceptance.md and the judgement read the record's sections by key, and each read
had its own ``.get`` chain and default. :meth:`AcceptanceRecord.from_json` reads a
record of any version once (a missing key is "not known": None, or the empty list the
renderer treated it as), and every reader then uses attributes. The written form stays
the dict :func:`remotemac.acceptance.record.build_record` returns, key for key; these
types write back what they read (:mod:`.jsonfields`). Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remotemac.acceptance.divergence import Divergence
from remotemac.acceptance.jsonfields import (
    JsonFields,
    ObjectOrBare,
    from_fields,
    parse_list,
    parse_object,
)
from remotemac.acceptance.observations import Observations

#: the environment facts each side's record carries (engine/record.py writes them)
ENV_FACT_KEYS = (
    "os",
    "os_version",
    "arch",
    "chip",
    "python",
    "torch",
    "numpy",
    "mps_built",
    "mps_available",
)
#: the facts the environment table shows, in order: the above and the project's state
SHOWN_FACTS = (*ENV_FACT_KEYS, "lock_hash", "git_commit", "git_dirty")


@dataclass
class StoppingCondition(JsonFields):
    """A reason the run stopped or is rejected: a code, its detail, and what else the
    finder attached (a CUDA dependency's log lines, …)."""

    code: Any = None
    detail: Any = None

    @classmethod
    def from_json(cls, data: Any) -> StoppingCondition:
        return data if isinstance(data, StoppingCondition) else from_fields(cls, data)


def conditions_from_json(items: Any) -> list[StoppingCondition]:
    """The record's ``stopping_conditions`` (null: none)."""
    return [StoppingCondition.from_json(c) for c in items or []]


@dataclass
class EnvFacts(JsonFields):
    """One side's environment facts (os, chip, python, torch, the lock and the commit)."""

    os: str | None = None
    os_version: str | None = None
    arch: str | None = None
    chip: str | None = None
    python: str | None = None
    torch: str | None = None
    numpy: str | None = None
    mps_built: bool | None = None
    mps_available: bool | None = None
    lock_hash: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None

    def has(self, name: str) -> bool:
        """Whether the side's record names the fact (a null fact is shown, an absent one not)."""
        return name in (self.json_keys or ())

    def fact(self, name: str) -> Any:
        """The fact called ``name`` (one of SHOWN_FACTS)."""
        return getattr(self, name) if name in SHOWN_FACTS else None


@dataclass
class Mismatch(ObjectOrBare):
    """An environment difference that matters: what, and each side's value; older
    records give a bare sentence."""

    key: str | None = None
    name: str | None = None
    reference: Any = None
    target: Any = None


@dataclass
class Environment(JsonFields):
    reference: EnvFacts = field(default_factory=EnvFacts)
    target: EnvFacts = field(default_factory=EnvFacts)
    mismatches: list[Mismatch] = field(default_factory=list)

    JSON_PARSE = {
        "reference": EnvFacts.from_json,
        "target": EnvFacts.from_json,
        "mismatches": parse_list(Mismatch.from_json),
    }


@dataclass
class Dataset(JsonFields):
    revision: str | None = None
    files: int | None = None
    bytes: int | None = None
    encrypted: bool | None = None


@dataclass
class Continuity(JsonFields):
    disconnects: int | None = None
    reconnects: int | None = None
    drill: Any = None


@dataclass
class Wipe(JsonFields):
    done: bool | None = None
    verified: bool | None = None
    removed: list[str] | None = None
    remaining: list[str] | None = None


@dataclass
class Cost(JsonFields):
    hours: float | None = None
    hourly_rate: float | None = None
    amount: float | None = None
    currency: str | None = None


@dataclass
class Decision(JsonFields):
    recommendation: str | None = None
    #: None: a record that left them null ("no reasons given")
    reasons: list[str] | None = field(default_factory=list)


@dataclass
class DeadmanGuard(JsonFields):
    """Which dead-man guard held: launchd's (its domain, verified) or the sleeper."""

    method: str | None = None
    domain: str | None = None
    verified: bool | None = None


@dataclass
class CpuUse(JsonFields):
    """Seconds of CPU: this laptop's process, the host's agent processes, and the calls."""

    laptop_s: float | None = None
    host_s: float | None = None
    agent_calls: int | None = None


@dataclass
class BehaviourRow(JsonFields):
    """One stress question (a dropped session, a lost job, drift, a full disk …)."""

    question: str | None = None
    how_tested: str | None = None
    result: str | None = None
    outcome: str | None = None
    evidence: str | None = None


@dataclass
class CacheDir(JsonFields):
    """A cache variable the job ran with and where it pointed (inside the run dir)."""

    env: str | None = None
    path: str | None = None


def _behaviour(rows: Any) -> list[BehaviourRow] | None:
    # None: a record from before the table existed; []: not measured
    return None if rows is None else [BehaviourRow.from_json(r) for r in rows]


@dataclass
class AcceptanceRecord(JsonFields):
    """acceptance.json, every section typed; keys this version does not know in ``extra``."""

    schema_version: str | None = None
    run_id: str | None = None
    playbook: str | None = None
    host: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    verdict: str | None = None
    missing_observations: list[str] = field(default_factory=list)
    stopping_conditions: list[StoppingCondition] = field(default_factory=list)
    observations: Observations = field(default_factory=Observations)
    environment: Environment = field(default_factory=Environment)
    dataset: Dataset = field(default_factory=Dataset)
    continuity: Continuity = field(default_factory=Continuity)
    wipe: Wipe = field(default_factory=Wipe)
    cost: Cost = field(default_factory=Cost)
    decision: Decision = field(default_factory=Decision)
    reproduce: str | None = None
    #: where the target first diverged (workload.trace); None: not asked
    divergence: Divergence | None = None
    #: the stress questions; None: a record from before the table existed
    process_behaviour: list[BehaviourRow] | None = None
    caches: list[CacheDir] = field(default_factory=list)
    deadman: DeadmanGuard | None = None
    cpu: CpuUse | None = None

    JSON_PARSE = {
        "missing_observations": lambda v: list(v or []),
        "stopping_conditions": conditions_from_json,
        "observations": Observations.from_json,
        "environment": Environment.from_json,
        "dataset": Dataset.from_json,
        "continuity": Continuity.from_json,
        "wipe": Wipe.from_json,
        "cost": Cost.from_json,
        "decision": Decision.from_json,
        "divergence": parse_object(Divergence.from_json),
        "process_behaviour": _behaviour,
        "caches": parse_list(CacheDir.from_json),
        "deadman": parse_object(DeadmanGuard.from_json),
        "cpu": parse_object(CpuUse.from_json),
    }


# ---------------------------------------------------------------- the judgement's inputs


@dataclass
class StopWhen(JsonFields):
    """The playbook's ``stop_when``: which fallback ops stop the run (any | none | a
    list of names), whether memory growth does (true | false | required), the peak."""

    fallback_ops: Any = "any"
    memory_growth: Any = True
    max_memory: Any = None


@dataclass
class DecisionContext(JsonFields):
    """What the recommendation weighs besides the observations: the playbook's purpose,
    the CUDA-only dependencies the audit found, where the target really ran."""

    goal: str | None = None
    trains_on_linux: bool | None = None
    ships_on_macos: bool | None = None
    cuda_dependencies: list[Any] = field(default_factory=list)
    multi_gpu: bool | None = None
    #: what the target really ran on: no recommendation for Apple Silicon without MPS
    target_device: str | None = None
    results_summary: str | None = None
    stop_when: StopWhen = field(default_factory=StopWhen)

    JSON_PARSE = {
        "cuda_dependencies": lambda v: list(v or []),
        "stop_when": StopWhen.from_json,
    }
