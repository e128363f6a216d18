"""What the run observed of the target job, as dataclasses: built once by the engine,
written as the record's ``observations`` and read back by the markdown.

Why one type for both: the record (acceptance.json) and its markdown used to read
the same nested dicts with their own ``.get`` chains, and a key renamed on one side
went unnoticed on the other. ``to_dict`` is the JSON form acceptance.schema.json
describes, key for key; ``from_dict`` reads a record of any version (a missing key
is "not observed": None). Standard library only, like the rest of the judgement.

The memory figures stay the dict :func:`remotemac.acceptance.decide.memory_stable`
returns (the host-side harness writes the same form): :class:`Memory` reads the
figures the record and the markdown use by name and keeps the rest as they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the three operator lists, as the record names them
OPERATOR_KINDS = ("fallback_ops", "unsupported_ops", "dtype_errors")


@dataclass
class Operators:
    """Operators that fell back to the CPU, were not implemented, or failed on a dtype.
    None: not observed (the job never imported torch); an empty list: observed, none."""

    fallback_ops: list[Any] | None = None
    unsupported_ops: list[Any] | None = None
    dtype_errors: list[Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Operators:
        data = data or {}
        return cls(*(data.get(k) for k in OPERATOR_KINDS))

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in OPERATOR_KINDS}

    @property
    def observed(self) -> bool:
        return all(getattr(self, k) is not None for k in OPERATOR_KINDS)

    def count(self) -> int:
        return sum(len(getattr(self, k) or []) for k in OPERATOR_KINDS)


@dataclass
class Memory:
    """The memory figures: peak, trend after warm-up, its slope and confidence, what
    was measured (``source``) and the samples; ``figures`` is the record's dict."""

    figures: dict[str, Any] = field(
        default_factory=lambda: {"peak_bytes": None, "stable": None, "slope_bytes_per_s": None}
    )

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Memory:
        return cls(dict(data)) if data else cls()

    def to_dict(self) -> dict[str, Any]:
        return self.figures

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
class ResultsSeen:
    """The compare's outcome as the record keeps it: within tolerance (None: nothing
    compared), per file, and the whole-model pickles turned into tensors."""

    within_tolerance: bool | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    converted: list[str] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ResultsSeen:
        data = data or {}
        return cls(data.get("within_tolerance"), data.get("files") or [], data.get("converted"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"within_tolerance": self.within_tolerance, "files": self.files}
        if self.converted is not None:
            out["converted"] = self.converted
        return out

    def failed(self) -> int:
        """Files not within tolerance (the ones not compared too)."""
        return sum(1 for f in self.files if not f.get("ok"))

    def not_compared(self) -> int:
        return sum(1 for f in self.files if f.get("ok") is None)


@dataclass
class Observations:
    """The record's ``observations``: device placement, operators, memory, processes,
    the compared results and whether the target reproduces."""

    tensors_on_device: bool | None = None
    operators: Operators = field(default_factory=Operators)
    torch_imported: bool | None = None
    memory: Memory = field(default_factory=Memory)
    processes: list[dict[str, Any]] | None = None
    results: ResultsSeen = field(default_factory=ResultsSeen)
    reproducibility: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Observations:
        data = data or {}
        return cls(
            tensors_on_device=data.get("tensors_on_device"),
            operators=Operators.from_dict(data.get("operators")),
            torch_imported=data.get("torch_imported"),
            memory=Memory.from_dict(data.get("memory")),
            processes=data.get("processes"),
            results=ResultsSeen.from_dict(data.get("results")),
            reproducibility=data.get("reproducibility"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensors_on_device": self.tensors_on_device,
            "operators": self.operators.to_dict(),
            "torch_imported": self.torch_imported,
            "memory": self.memory.to_dict(),
            "processes": self.processes,
            "results": self.results.to_dict(),
            "reproducibility": self.reproducibility,
        }
