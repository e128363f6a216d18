"""What the run observed of the target job, as dataclasses: built once by the engine,
written as the record's ``observations`` and read back by the markdown.

Why one type for both: the record (acceptance.json) and its markdown used to read
the same nested dicts with their own ``.get`` chains, and a key renamed on one side
went unnoticed on the other. ``to_json`` is the JSON form acceptance.schema.json
describes, key for key; ``from_json`` reads a record of any version (a missing key
is "not observed": None) and writes it back as it was (:mod:`.jsonfields`). The
compare's per-file and per-tensor results live here too (``compare`` builds them with
numpy; the judgement and the markdown read them without). Standard library only, like
the rest of the judgement.

The memory figures stay the dict :func:`remotemac.acceptance.decide.memory_stable`
returns (the host-side harness writes the same form): :class:`Memory` reads the
figures the record and the markdown use by name and keeps the rest as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from remotemac.acceptance.jsonfields import (
    JsonFields,
    ObjectOrBare,
    from_fields,
    parse_list,
)
from remotemac.agent.protocol import JsonObject

#: the three operator lists, as the record names them
OPERATOR_KINDS = ("fallback_ops", "unsupported_ops", "dtype_errors")


@dataclass
class OpEntry(ObjectOrBare):
    """One operator finding as the observer reports it: ``{op, count}`` for a fallback,
    ``{op, message}`` for an operator MPS does not implement, ``{dtype, message}`` for a
    dtype error; older observers (and hand-written records) give a bare name."""

    op: str | None = None
    dtype: str | None = None
    name: str | None = None
    message: str | None = None
    count: int | None = None
    detail: str | None = None

    @property
    def label(self) -> Any:
        """What names the finding: the op, else its name, else its message (None: none)."""
        return self.op or self.name or self.message

    def title(self) -> str:
        """The label, or the whole item when nothing names it."""
        if self.is_bare:
            return str(self.bare)
        return str(self.label or self.to_json())


def _op_entries(items: Any) -> list[OpEntry] | None:
    return None if items is None else [OpEntry.from_json(i) for i in items]


@dataclass
class Operators(JsonFields):
    """Operators that fell back to the CPU, were not implemented, or failed on a dtype.
    None: not observed (the job never imported torch); an empty list: observed, none."""

    fallback_ops: list[OpEntry] | None = None
    unsupported_ops: list[OpEntry] | None = None
    dtype_errors: list[OpEntry] | None = None

    JSON_PARSE = {k: _op_entries for k in OPERATOR_KINDS}
    # the record always has the three keys (null: not observed)
    JSON_ALWAYS = OPERATOR_KINDS

    @classmethod
    def from_dict(cls, data: JsonObject | None) -> Operators:
        """engine/record.py's name for ``from_json``."""
        return cls.from_json(data)

    def to_dict(self) -> JsonObject | None:
        """The name of main before the typing sweep, for ``to_json``."""
        return self.to_json()

    def lists(self) -> tuple[list[OpEntry] | None, ...]:
        return (self.fallback_ops, self.unsupported_ops, self.dtype_errors)

    @property
    def observed(self) -> bool:
        return all(items is not None for items in self.lists())

    def count(self) -> int:
        return sum(len(items or []) for items in self.lists())


@dataclass
class Memory:
    """The memory figures: peak, trend after warm-up, its slope and confidence, what
    was measured (``source``) and the samples; ``figures`` is the record's dict."""

    figures: JsonObject = field(
        default_factory=lambda: {"peak_bytes": None, "stable": None, "slope_bytes_per_s": None}
    )

    @classmethod
    def from_json(cls, data: JsonObject | None) -> Memory:
        return cls(dict(data)) if data else cls()

    def to_json(self) -> JsonObject:
        return self.figures

    # the names of main before the typing sweep (engine/record.py may still use them)
    from_dict = from_json
    to_dict = to_json

    def _get(self, key: str) -> Any:
        return self.figures.get(key)

    @property
    def peak_bytes(self) -> int | None:
        return self._get("peak_bytes")

    @peak_bytes.setter
    def peak_bytes(self, value: int | None) -> None:
        self.figures["peak_bytes"] = value

    @property
    def stable(self) -> bool | None:
        return self._get("stable")

    @property
    def slope(self) -> float | None:
        """Bytes per second after the warm-up (Theil–Sen); None: no trend told."""
        return self._get("slope_bytes_per_s")

    @property
    def too_short(self) -> bool:
        return self._get("trend") == "too-short"

    @property
    def samples_used(self) -> int:
        return int(self._get("samples_used") or 0)

    @property
    def source(self) -> str | None:
        return self._get("source")

    @property
    def reason(self) -> str:
        return str(self._get("reason") or "")

    @property
    def confidence(self) -> float | None:
        return self._get("confidence")

    @property
    def interval(self) -> tuple[float, float] | None:
        """The slope's confidence interval (bytes/s), when one was told."""
        found = self._get("slope_interval_bytes_per_s")
        return (found[0], found[1]) if isinstance(found, list) and len(found) == 2 else None

    def sample_bytes(self) -> list[float]:
        """The bytes of each sample the record keeps (the last 200), in order."""
        return [
            s[1]
            for s in self._get("samples") or []
            if isinstance(s, (list, tuple)) and len(s) >= 2 and s[1] is not None
        ]


@dataclass
class TensorResult(JsonFields):
    """One compared key: its shape and dtype, how far the target is from the reference."""

    key: str
    shape: list[int] | None
    dtype: str | None
    max_abs_err: float | None
    max_rel_err: float | None
    ok: bool
    detail: str = ""
    rtol: float | None = None
    atol: float | None = None
    #: a non-numeric leaf: its difference fails the rule only when strict
    metadata: bool = False


@dataclass
class WorstKey(JsonFields):
    """One of a file's keys furthest from its tolerance."""

    key: str
    max_abs_err: float | None
    max_rel_err: float | None
    ok: bool | None = None


@dataclass
class MetadataDifference(JsonFields):
    """A non-numeric key (a path, a device name) that differs between the sides."""

    key: str
    detail: str


@dataclass
class FileResult(JsonFields):
    """One compared file: within tolerance or not (None: not compared), and its keys."""

    path: str
    max_abs_err: float | None
    max_rel_err: float | None
    rtol: float | None
    atol: float | None
    #: None: not compared (see ``not_compared``)
    ok: bool | None
    detail: str = ""
    tensors: list[TensorResult] = field(default_factory=list)
    first_failing_key: str | None = None
    worst: list[WorstKey] = field(default_factory=list)
    metadata_differences: list[MetadataDifference] = field(default_factory=list)
    compared: int = 0
    ignored: int = 0
    strict: bool = False
    #: why the file was not compared (the verdict is then incomplete, never "outside
    #: tolerance"); None when it was
    not_compared: str | None = None
    #: both sides byte-identical: passed without loading
    identical: bool = False
    #: what the host turned into tensors (a whole-model pickle), when it did
    converted: str | None = None

    JSON_PARSE = {
        "tensors": parse_list(TensorResult.from_json),
        "worst": parse_list(WorstKey.from_json),
        "metadata_differences": parse_list(MetadataDifference.from_json),
    }


def _file_result(data: FileResult | JsonObject) -> FileResult:
    return data if isinstance(data, FileResult) else FileResult.from_json(data)


@dataclass(init=False)
class ResultsSeen(JsonFields):
    """The compare's outcome as the record keeps it: within tolerance (None: nothing
    compared), per file, and the whole-model pickles turned into tensors.

    ``files`` may be given as the compare phase's JSON objects (the engine passes them
    from the journal): they are read here, once."""

    within_tolerance: bool | None
    files: list[FileResult]
    converted: list[str] | None

    JSON_ALWAYS = ("within_tolerance", "files")

    def __init__(
        self,
        within_tolerance: bool | None = None,
        files: Sequence[FileResult | JsonObject] | None = None,
        converted: list[str] | None = None,
        extra: JsonObject | None = None,
        json_keys: tuple[str, ...] | None = None,
        json_null: bool = False,
    ) -> None:
        self.within_tolerance = within_tolerance
        self.files = [_file_result(f) for f in files or []]
        self.converted = converted
        self.extra = dict(extra or {})
        self.json_keys = json_keys
        self.json_null = json_null

    def to_json(self) -> JsonObject | None:
        if self.json_null:
            return None
        out: JsonObject = {
            "within_tolerance": self.within_tolerance,
            "files": [f.to_json() for f in self.files],
        }
        if self.converted is not None:
            out["converted"] = self.converted
        out.update(self.extra)
        if self.json_keys is not None:
            return {k: out[k] for k in self.json_keys if k in out}
        return out

    @classmethod
    def from_dict(cls, data: JsonObject | None) -> ResultsSeen:
        """The name of main before the typing sweep, for ``from_json``."""
        return cls.from_json(data)

    def to_dict(self) -> JsonObject | None:
        """The name of main before the typing sweep, for ``to_json``."""
        return self.to_json()

    def failed(self) -> int:
        """Files not within tolerance (the ones not compared too)."""
        return sum(1 for f in self.files if not f.ok)

    def not_compared(self) -> int:
        return sum(1 for f in self.files if f.ok is None)


@dataclass
class ProcessSeen(JsonFields):
    """A Python process of the job that imported torch, as its observer saw it."""

    pid: int | None = None
    ppid: int | None = None
    argv0: str | None = None
    argv: list[str] | None = None
    executable: str | None = None
    finished: bool | None = None
    tensors_on_device: bool | None = None
    peak_rss_bytes: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> ProcessSeen:
        return data if isinstance(data, ProcessSeen) else from_fields(cls, data)


def _processes(items: Any) -> list[ProcessSeen] | None:
    return None if items is None else [ProcessSeen.from_json(p) for p in items]


@dataclass
class Observations(JsonFields):
    """The record's ``observations``: device placement, operators, memory, processes,
    the compared results and whether the target reproduces.

    ``processes`` may be given as the observer's JSON objects (the engine passes the
    harness's list): they are read here, once. ``reproducibility`` is the compare of the
    target against a second run of itself, kept as the engine wrote it."""

    tensors_on_device: bool | None = None
    operators: Operators = field(default_factory=Operators)
    torch_imported: bool | None = None
    memory: Memory = field(default_factory=Memory)
    processes: list[ProcessSeen] | None = None
    results: ResultsSeen = field(default_factory=ResultsSeen)
    reproducibility: JsonObject | None = None

    JSON_PARSE = {
        "operators": Operators.from_json,
        "memory": Memory.from_json,
        "results": ResultsSeen.from_json,
    }

    def __post_init__(self) -> None:
        self.processes = _processes(self.processes)

    @classmethod
    def from_dict(cls, data: JsonObject | None) -> Observations:
        """The name engine/record.py and older tests use for ``from_json``."""
        return cls.from_json(data)

    def to_dict(self) -> JsonObject:
        """What ``build_record`` merges into the record (``to_json``)."""
        return self.to_json()
