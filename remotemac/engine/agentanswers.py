"""The agent's answers as the laptop reads them: one message type per op.

Why a table: an answer used to be a dict read with ``.get`` wherever it landed, so
the keys an op answers with were written down nowhere on this side. Each op's answer
is now a :class:`~remotemac.agent.protocol.Message` (named fields, the rest kept in
``extra``), read once where it arrives (:meth:`AgentClient.ask
<remotemac.engine.agentclient.AgentClient.ask>`); :data:`ANSWERS` says which type
answers which op, and ``ask`` refuses to read one op's answer as another's.

The agent still writes plain JSON objects: the wire does not change, and an answer
read here and written back (the dead-man job kept in the journal) keeps every key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remotemac.agent.protocol import (
    Answer,
    BringAnswer,
    FindPythonAnswer,
    JobStatus,
    JsonObject,
    LaunchAnswer,
    Message,
    Op,
    PrepareRunAnswer,
    RuntimeEnsureAnswer,
    RuntimeStatus,
)
from remotemac.engine.ledger import AgentStep


@dataclass
class AgentAnswer(Answer):
    """The envelope as it arrives: ``replayed`` when the resident agent answers from
    its store (the call finished before the link dropped), ``cpu_s`` from a one-shot
    ``hostagent OP`` process."""

    replayed: bool = False
    cpu_s: Any = None


@dataclass
class Steps(Message):
    """An answer that lists the commands the agent ran for it (for the ledger)."""

    steps: list[AgentStep] = field(default_factory=list)

    def __post_init__(self) -> None:
        # read from the wire: each step is still its JSON object (an agent may send null)
        self.steps = [
            s if isinstance(s, AgentStep) else AgentStep.from_json(s) for s in self.steps or []
        ]

    def to_json(self) -> JsonObject:
        out = super().to_json()
        if "steps" in out:
            out["steps"] = [s.to_json() for s in self.steps]
        return out


@dataclass
class ClaimAnswer(Steps):
    """``claim_root`` (cleanupops): the root made or adopted and its id, or ``refused``
    (why; nothing was written)."""

    refused: str | None = None
    #: with ``refused``: ``no-space`` when the disk, not the root, refused it
    code: str | None = None
    root: str | None = None
    real_root: str | None = None
    root_id: str | None = None
    created: bool = False
    #: asked with ``agent_version``: that agent's ``.complete`` marker is below the root
    agent_ready: bool | None = None


@dataclass
class WipeAnswer(Steps):
    """``wipe_run_data`` (wipeops): what went, what is left, and the agent's verdict."""

    removed: list[str] = field(default_factory=list)
    remaining: list[str] = field(default_factory=list)
    verified: bool = False


@dataclass
class DeadmanJob(Message):
    """``deadman_schedule`` (agent/deadman.py): how the host will wipe the run on its own
    (launchd ``label`` or a sleeper ``pid``), its spec file and deadline. Kept in the
    sync's result (without the ``steps``, which go to the ledger)."""

    method: str | None = None
    label: str | None = None
    pid: int | None = None
    spec: str | None = None
    deadline: float | None = None
    run_id: str | None = None

    @property
    def who(self) -> str:
        """The launchd label, else the sleeper's pid (for "what is left" lines)."""
        return str(self.label or self.pid or "")


@dataclass
class StopAnswer(Message):
    """``stop``: the job's processes signalled, and those left alone (a reused pid)."""

    stopped: bool = False
    left_alone: list[str] = field(default_factory=list)


@dataclass
class OutputListing(Message):
    """``list_outputs``: the entries below a directory, as the host sent them (each one
    is validated by the reader: engine/pull.py ListingEntry)."""

    entries: Any = None


#: the answer type of each op read through AgentClient.ask
ANSWERS: dict[Op, type[Message]] = {
    Op.CLAIM_ROOT: ClaimAnswer,
    Op.PREPARE_RUN: PrepareRunAnswer,
    Op.LAUNCH: LaunchAnswer,
    Op.STATUS: JobStatus,
    Op.STOP: StopAnswer,
    Op.LIST_OUTPUTS: OutputListing,
    Op.WIPE_RUN_DATA: WipeAnswer,
    Op.DEADMAN_SCHEDULE: DeadmanJob,
    Op.FIND_PYTHON: FindPythonAnswer,
    Op.RUNTIME_STATUS: RuntimeStatus,
    Op.RUNTIME_ENSURE: RuntimeEnsureAnswer,
    Op.BRING: BringAnswer,
}
