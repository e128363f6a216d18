"""The run's phases, typed: a :class:`Phase` and, for per-job phases, the side it runs for.

Why: phase names used to be strings split on ``:`` wherever they were read
(``"launch:target"``), so a typo or a new phase only failed at run time. The
pipeline, the journal and the events now build and read them through
:class:`PhaseKey`; on the wire (journal rows, events, JSON) they stay the same
strings, so old journals resume and outputs are byte-for-byte unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Phase(enum.StrEnum):
    """One step of the pipeline, in the order a run goes through them."""

    PROVISION = "provision"
    SYNC = "sync"
    LAUNCH = "launch"
    FOLLOW = "follow"
    PULL = "pull"
    COMPARE = "compare"
    RECORD = "record"
    WIPE = "wipe"

    @property
    def per_side(self) -> bool:
        """Whether the phase runs once per job (reference, target, reproduce)."""
        return self in (Phase.LAUNCH, Phase.FOLLOW)


@dataclass(frozen=True)
class PhaseKey:
    """A phase, and for launch/follow the side (role) it is for: ``launch:target``."""

    phase: Phase
    role: str | None = None

    def __post_init__(self) -> None:
        if self.phase.per_side != (self.role is not None):
            need = "needs a role" if self.phase.per_side else "takes no role"
            raise ValueError(f"phase {self.phase.value} {need}")

    @property
    def name(self) -> str:
        """The wire name: what the journal, the events and the JSON outputs carry."""
        return f"{self.phase.value}:{self.role}" if self.role else self.phase.value

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> PhaseKey:
        """The key of a wire name; ValueError for a name no pipeline writes."""
        phase, _, role = name.partition(":")
        return cls(Phase(phase), role or None)

    @classmethod
    def group(cls, name: str) -> str:
        """The phase part of a wire name (``launch`` of ``launch:target``), even unknown ones."""
        return name.partition(":")[0]

    @classmethod
    def side(cls, name: str) -> str | None:
        """The role part of a wire name (``target`` of ``launch:target``), if any."""
        return name.partition(":")[2] or None


def launch_key(role: str) -> PhaseKey:
    return PhaseKey(Phase.LAUNCH, role)


def follow_key(role: str) -> PhaseKey:
    return PhaseKey(Phase.FOLLOW, role)
