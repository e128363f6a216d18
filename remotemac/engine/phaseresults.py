"""What the provision and launch phases hand on, as dataclasses; the journal keeps dicts.

Why dataclasses: the phase code builds and reads these fields by name, and a
checker can see a misspelt one. Why ``to_dict``: the journal (and every JSON
output built from it) stores the result as it always did, key for key and in
the same order, so journals written before resume unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


class PhaseResult:
    """A phase's result with a journal form (``to_dict``)."""

    def to_dict(self) -> dict[str, Any]:
        """The journal's dict: the fields in order, shallow (nested dicts stay as they are)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


@dataclass
class ProvisionResult(PhaseResult):
    """Per host: root, run_dir, probe, venv, fingerprint, space; per side: the device."""

    hosts: dict[str, dict[str, Any]]
    devices: dict[str, str]
    project: Any
    summary: str


@dataclass
class LaunchResult(PhaseResult):
    """The job's tmux session, how it was started, and whether it was running already."""

    session: str
    mode: Any
    already: bool
    access: Any
    summary: str


def as_dict(result: dict[str, Any] | PhaseResult | None) -> dict[str, Any]:
    """The journal form of whatever a phase returned (``None``: an empty result)."""
    if result is None:
        return {}
    return result.to_dict() if isinstance(result, PhaseResult) else result
