"""What each phase hands on, as dataclasses; the journal keeps their dict form.

Why dataclasses: the phase code builds and reads these fields by name, a checker
can see a misspelt one, and whether a phase passed (:meth:`PhaseResult.ok`) is the
result's own rule instead of a reader guessing from keys. Why ``to_dict``: the
journal (and every JSON output built from it) stores the result as it always did,
key for key and in the same order, so journals written before resume unchanged.

A journal row carries the version of that form (``RESULT_SCHEMA``, the journal's
``result_schema`` column); rows written before there was a version (NULL) are in
the very form of version 1. A key this version does not know is kept in
``extra`` and written back after the known ones, so a newer row read here loses
nothing. A key a row lacks takes its field's default: rows of older versions (and
the minimal rows tests write) read as results with the parts they had.

The parts of a result (a host's probe, its RAM store, a compared file, a stopping
condition ...) are :class:`~remotemac.engine.jsonpart.JsonPart` dataclasses with the same rule one level down:
``from_json`` keeps the keys a part was read with, in order, and ``to_json`` writes
back exactly those, so a journal row read and written again is the same row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from remotemac.agent.protocol import JsonObject
from remotemac.engine.jsonpart import JsonPart, plain, read_parts
from remotemac.engine.syncplan import SyncStats
from remotemac.phases import Phase, PhaseKey

#: the version of the result form the journal stores (``result_schema``); NULL: before
#: versions, the same form as 1
RESULT_SCHEMA = 1

#: a side's launch/follow result when it was not started (the reference failed)
NOT_LAUNCHED = "not-launched"


@dataclass(kw_only=True)
class PhaseResult:
    """A phase's result with a journal form (``to_dict``) and a verdict (``ok``)."""

    #: how long the phase took here (the pipeline fills it in when the phase did not)
    seconds: float | None = None
    #: keys of the journal row this version has no field for, kept as they were
    extra: JsonObject = field(default_factory=dict, repr=False)

    #: fields written to the journal only when set (a dict without that key before)
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()
    #: fields holding a part (or a list of parts) / a name -> part map: see _read_parts
    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {}
    PART_MAPS: ClassVar[Mapping[str, type[JsonPart]]] = {}

    def __post_init__(self) -> None:
        read_parts(self)

    def ok(self) -> bool:
        """Whether the phase is shown as passed: only an explicit ``ok: false`` fails it."""
        return self.extra.get("ok", True) is not False

    @property
    def line(self) -> str:
        """The one line the phase's ``PhaseFinished`` event carries."""
        return str(getattr(self, "summary", "") or "")

    def to_json(self) -> JsonObject:
        """The journal's dict: the fields in order, parts in their JSON form."""
        out: JsonObject = {}
        for f in dataclasses.fields(self):
            if f.name in ("seconds", "extra"):
                continue
            value = getattr(self, f.name)
            if value is None and f.name in self.OMIT_NONE:
                continue
            out[f.name] = plain(value)
        if self.seconds is not None:
            out["seconds"] = self.seconds
        out.update((k, v) for k, v in self.extra.items() if k not in out)
        return out

    def to_dict(self) -> JsonObject:
        """The journal's dict (the name the pipeline and the journal use)."""
        return self.to_json()

    @classmethod
    def from_json(cls, data: JsonObject) -> Self:
        """A journal row's result; unknown keys go to ``extra``, missing ones are defaults."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    @classmethod
    def from_dict(cls, data: JsonObject) -> Self:
        return cls.from_json(data)

    @classmethod
    def from_row(cls, info: JsonObject | None) -> Self:
        """The result in a ``Journal.phases`` row, whatever its state; empty without a row."""
        return cls.from_json(PhaseRow.of(info or None).result or {})


@dataclass
class PhaseRow(JsonPart):
    """One phase's row of ``Journal.phases``: its state, its result's journal form and
    that form's version (None: before versions), when it started and finished."""

    state: str | None = None
    result: JsonObject | None = None
    schema: int | None = None
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        return self.state == "done"

    @classmethod
    def of(cls, info: JsonObject | None) -> PhaseRow:
        """The row (``None``: the phase has none, an empty row)."""
        return cls.from_json(info) if info is not None else cls.empty()


@dataclass
class OtherResult(PhaseResult):
    """A row of a phase this version does not run (a journal of another version)."""

    summary: str = ""


# ---------------------------------------------------------------- provision's parts


@dataclass
class Probe(JsonPart):
    """The environment's freeze (agent ``freeze_env``): versions, devices, packages."""

    os: str | None = None
    os_version: str | None = None
    arch: str | None = None
    chip: str | None = None
    python: str | None = None
    torch: str | None = None
    numpy: str | None = None
    mps_built: bool | None = None
    mps_available: bool | None = None
    cuda_available: bool | None = None
    packages: dict[str, str] | None = None
    pytorch_env: dict[str, str] | None = None

    def fact(self, key: str) -> Any:
        """One fact by its record key (acceptance's ENV_FACT_KEYS): a field, or a key a
        newer agent wrote that this version keeps in ``extra``."""
        return getattr(self, key) if key in self._names() else self.extra.get(key)


@dataclass
class Interpreter(JsonPart):
    """Which Python the venv was made from; ``brought``: remotemac brought it."""

    interpreter: str | None = None
    version: str | None = None
    interpreter_is_venv: bool | None = None
    parent_site: bool | None = None
    installer: str | None = None
    brought: Any = None

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"brought"})


@dataclass
class Fingerprint(JsonPart):
    """The environment's fingerprint (agent ``env_fingerprint``), or why it has none."""

    python: str | None = None
    executable: str | None = None
    packages: dict[str, str] | None = None
    lock_hash: str | None = None
    torch: str | None = None
    torch_origin: str | None = None
    os: str | None = None
    os_version: str | None = None
    packages_error: str | None = None
    #: the workload's interpreter did not start
    error: str | None = None

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"packages_error", "error"})

    def value(self, key: str) -> Any:
        """One of drift.KEYS (a field name)."""
        return getattr(self, key)


@dataclass
class SpaceCheck(JsonPart):
    """The agent's ``check_space`` answer: the volume's free space against the need."""

    path: str | None = None
    free: int | None = None
    total: int | None = None
    need: int | None = None
    items: dict[str, int] | None = None
    venv: int | None = None
    min_free: int | None = None
    fits: bool | None = None


@dataclass
class ProvisionHost(JsonPart):
    """What the provision found and made on one host (engine/provision.provision_host)."""

    root: str = ""
    root_as_given: str = ""
    root_id: str | None = None
    run_dir: str = ""
    paths: dict[str, str] | None = None
    venv_python: str = ""
    venv_reused: bool | None = None
    #: the environment's freeze (agent ``freeze_env``): versions, packages, devices
    probe: Probe = field(default_factory=Probe)
    #: which Python the venv was made from; ``brought``: remotemac brought it
    interpreter: Interpreter | None = None
    project_files: int | None = None
    project_bytes: int | None = None
    lock_hash: str | None = None
    #: the environment's fingerprint at provision, compared before the target starts
    fingerprint: Fingerprint | None = None
    #: the agent's ``check_space`` answer
    space: SpaceCheck | None = None

    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {
        "probe": Probe,
        "interpreter": Interpreter,
        "fingerprint": Fingerprint,
        "space": SpaceCheck,
    }


# ---------------------------------------------------------------- sync's parts


@dataclass
class RamStore(JsonPart):
    """Where the dataset lives in RAM (``shm``, ``ramdisk``, ``tmp``) and its device."""

    path: str | None = None
    kind: str | None = None
    device: str | None = None
    steps: list[JsonObject] | None = None
    warning: str | None = None


@dataclass
class Transfer(JsonPart, SyncStats):
    """What one sync moved: engine/syncplan.SyncStats as the journal keeps it (its
    ``to_dict``, without the ack list), read back with the same fields."""


@dataclass
class Selected(JsonPart):
    """One file of the dataset's slice and why it was chosen."""

    path: str = ""
    size: int | None = None
    reason: str | None = None


@dataclass
class RuntimeUsed(JsonPart):
    """The agent runtime that decrypted the data on the host."""

    dir: str | None = None
    reused: bool | None = None
    method: str | None = None
    cryptography: str | None = None


@dataclass
class DeadmanJob(JsonPart):
    """The dead-man wipe scheduled before any byte was sent (agent/deadman.py's job):
    launchd (label, plist, domain, the ``launchctl print`` that verified it) or a sleeper
    (pid, its start)."""

    method: str | None = None
    spec: str | None = None
    deadline: float | None = None
    label: str | None = None
    plist: str | None = None
    domain: str | None = None
    verified: str | None = None
    created_dir: str | None = None
    pid: int | None = None
    start: Any = None

    def guard(self) -> JsonObject | None:
        """The record's ``deadman``: which guard held (launchd in the domain ``launchctl
        print`` found it in, or the sleeper); None for a job without a method."""
        if not self.method:
            return None
        if self.method == "launchd":
            keys: tuple[str, ...] = ("method", "domain", "verified", "label", "deadline")
        else:
            keys = ("method", "pid", "deadline")
        return {k: getattr(self, k) for k in keys}


@dataclass
class SyncHost(JsonPart):
    """One host's copy of the dataset (engine/sync.sync_host) and its dead-man wipe."""

    data_dir: str = ""
    files: int | None = None
    bytes: int | None = None
    encrypted: bool | None = None
    revision: str | None = None
    #: the RAM store (path, kind, device, steps, warning); None when the data is on disk
    ram: RamStore | None = None
    transfer: Transfer | None = None
    selection: list[Selected] | None = None
    summary: str | None = None
    runtime: RuntimeUsed | None = None
    #: the dead-man wipe scheduled before any byte was sent (agent/deadman.py's job)
    deadman: DeadmanJob | None = None

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"deadman"})
    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {
        "ram": RamStore,
        "transfer": Transfer,
        "selection": Selected,
        "runtime": RuntimeUsed,
        "deadman": DeadmanJob,
    }

    @classmethod
    def without_data(cls, data_dir: str) -> SyncHost:
        """A run without ``data``: the five keys such a host always had."""
        return cls(
            data_dir=data_dir,
            files=0,
            bytes=0,
            encrypted=False,
            revision=None,
            row_keys=("data_dir", "files", "bytes", "encrypted", "revision"),
        )


@dataclass
class ProvisionResult(PhaseResult):
    """Per host: root, run_dir, probe, venv, fingerprint, space; per side: the device."""

    hosts: dict[str, ProvisionHost] = field(default_factory=dict)
    devices: dict[str, str] = field(default_factory=dict)
    project: Any = None
    summary: str = ""

    PART_MAPS: ClassVar[Mapping[str, type[JsonPart]]] = {"hosts": ProvisionHost}

    def device(self, role: str) -> str:
        """The device ``role`` ran on; a side the provision did not name runs as the target."""
        return self.devices.get(role) or self.devices["target"]

    def host(self, key: str) -> ProvisionHost:
        """What the provision found on one host (empty for a host it did not reach)."""
        return self.hosts.get(key) or ProvisionHost()


@dataclass
class SyncResult(PhaseResult):
    """Per host: the data dir, the dataset's files/bytes/revision, the RAM store, the
    transfer's figures and the dead-man wipe scheduled before any byte was sent."""

    hosts: dict[str, SyncHost] = field(default_factory=dict)
    summary: str = ""

    PART_MAPS: ClassVar[Mapping[str, type[JsonPart]]] = {"hosts": SyncHost}

    def host(self, key: str) -> SyncHost:
        return self.hosts.get(key) or SyncHost()

    def data_dir(self, key: str) -> str | None:
        return self.host(key).data_dir or None

    def ram(self, key: str) -> RamStore:
        """The host's RAM store (path, kind, device), empty when the data is on disk."""
        return self.host(key).ram or RamStore.empty()

    def dataset(self) -> SyncHost:
        """The target host's copy of the dataset (the record's ``dataset``)."""
        return self.hosts.get("remote") or next(iter(self.hosts.values()), SyncHost())


# ---------------------------------------------------------------- launch and follow


@dataclass
class CheckedPath(JsonPart):
    """One cache dir the launch's access check tried to write."""

    path: str = ""
    ok: bool | None = None


@dataclass
class Access(JsonPart):
    """The launch's access check of the caches."""

    checked: list[CheckedPath] = field(default_factory=list)

    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {"checked": CheckedPath}


@dataclass
class LaunchResult(PhaseResult):
    """The job's tmux session, how it was started, and whether it was running already."""

    session: str = ""
    mode: Any = None
    already: bool = False
    access: Access | None = None
    summary: str = ""

    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {"access": Access}

    def checked_paths(self) -> dict[str, bool | None]:
        """Path -> writable, from the launch's access check of the caches."""
        checked = self.access.checked if isinstance(self.access, Access) else []
        return {c.path: c.ok for c in checked}


@dataclass
class VolumeSeen(JsonPart):
    """What the runner saw of one watched volume (remote_root's, the RAM store's)."""

    min_free_seen: float | None = None


@dataclass
class Disk(JsonPart):
    """The runner's disk figures per watched path (``root``, ``ram``)."""

    root: VolumeSeen | None = None
    ram: VolumeSeen | None = None

    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {"root": VolumeSeen, "ram": VolumeSeen}


@dataclass
class Relaunch(JsonPart):
    """The relaunch of a lost job (``on_lost: relaunch``): why, its log marker, how."""

    reason: str | None = None
    marker: str | None = None
    command: str | None = None
    at: float | None = None


@dataclass
class Drill(JsonPart):
    """A drill of the link during the follow (``--drill disconnect``: engine/jobs._Drill's
    result) or the links cut by hand from the TUI (``by: tui``, counted by the record)."""

    kind: str | None = None
    by: str | None = None
    dropped: Any = None
    cuts: int | None = None
    at: Any = None
    skipped: str | None = None
    job_kept_running: bool | None = None
    log_complete: bool | None = None
    reconnect_s: float | None = None
    lines_before: int | None = None


@dataclass
class FollowResult(PhaseResult):
    """How the job ended (state, exit code, times, peak RSS), how much of its log was
    followed, its disk figures, and a relaunch or drill when there was one. A side not
    launched (the reference failed) has a result of this kind too, for both its launch
    and its follow, with only state, exit code, lines and summary."""

    state: str | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    peak_rss_bytes: int | None = None
    lines: int = 0
    bytes: int | None = None
    reason: str | None = None
    disk: Disk | None = None
    disk_warning: str | None = None
    relaunched: Relaunch | None = None
    drill: Drill | None = None
    #: the link's drops and reconnects while this process followed the job
    continuity: dict[str, int] | None = None
    summary: str = ""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"relaunched", "drill", "continuity"})
    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {
        "disk": Disk,
        "relaunched": Relaunch,
        "drill": Drill,
    }
    #: the only keys of a side not launched
    NOT_LAUNCHED_KEYS: ClassVar[tuple[str, ...]] = ("state", "exit_code", "lines", "summary")

    @classmethod
    def not_launched(cls, why: str) -> FollowResult:
        return cls(state=NOT_LAUNCHED, exit_code=None, lines=0, summary=f"not launched: {why}")

    @property
    def launched(self) -> bool:
        return self.state != NOT_LAUNCHED

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def ok(self) -> bool:
        """A job that failed, timed out or was stopped is shown as failed."""
        return self.state in (None, "finished")

    def to_json(self) -> JsonObject:
        if self.launched:
            return super().to_json()
        out = {k: getattr(self, k) for k in self.NOT_LAUNCHED_KEYS}
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return {**out, **{k: v for k, v in self.extra.items() if k not in out}}

    def min_free_seen(self) -> float | None:
        """The lowest free space the runner saw on remote_root's volume."""
        root = self.disk.root if isinstance(self.disk, Disk) else None
        return root.min_free_seen if isinstance(root, VolumeSeen) else None


# ---------------------------------------------------------------- pull and compare


@dataclass
class PulledFile(JsonPart):
    """One output the pull verified."""

    path: str = ""
    size: int | None = None
    sha256: str | None = None


@dataclass
class PulledBytes(JsonPart):
    """A pull's bytes: of the outputs, moved over the link, reused from a partial file."""

    total: int | None = None
    moved: int | None = None
    reused: int | None = None


@dataclass
class PulledSide(JsonPart):
    """One side's pulled outputs (engine/pull.pull_side): the local dir, the files
    verified, the ones skipped and why, the bytes downloaded."""

    dir: str | None = None
    files: list[PulledFile] = field(default_factory=list)
    skipped: list[JsonObject] | None = None
    downloaded: int | None = None
    bytes: PulledBytes | None = None

    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {"files": PulledFile, "bytes": PulledBytes}


@dataclass
class PullResult(PhaseResult):
    """Per side label: the local dir, the files verified (path, size, sha256), the bytes."""

    sides: dict[str, PulledSide] = field(default_factory=dict)
    summary: str = ""

    PART_MAPS: ClassVar[Mapping[str, type[JsonPart]]] = {"sides": PulledSide}

    def files(self, label: str) -> list[PulledFile]:
        side = self.sides.get(label)
        return side.files if isinstance(side, PulledSide) else []


@dataclass
class ComparedFile(JsonPart):
    """One output compared (acceptance/compare.FileResult as the journal keeps it):
    within tolerance (``ok``; None: not compared, and why), and what the host converted."""

    path: str = ""
    ok: bool | None = None
    detail: str | None = None
    not_compared: str | None = None
    converted: str | None = None


@dataclass
class Reproducibility(JsonPart):
    """The target against itself once more (``--reproduce``), with the same rules."""

    reproduces: bool | None = None
    first: str | None = None
    second: str | None = None
    files: list[ComparedFile] = field(default_factory=list)

    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {"files": ComparedFile}


@dataclass
class CompareResult(PhaseResult):
    """The reference's outputs against the target's: per file within tolerance or not,
    the whole-model pickles turned into tensors, and the target against itself once more."""

    within_tolerance: bool | None = None
    files: list[ComparedFile] = field(default_factory=list)
    nothing_compared: bool | None = None
    summary: str = ""
    converted: list[str] | None = None
    reproducibility: Reproducibility | None = None

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"nothing_compared", "converted", "reproducibility"}
    )
    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {
        "files": ComparedFile,
        "reproducibility": Reproducibility,
    }

    def ok(self) -> bool:
        """A file outside tolerance is a failed compare ("✓ 0/2 within" read as a pass)."""
        if self.within_tolerance is False or self.nothing_compared:
            return False
        return super().ok()


# ---------------------------------------------------------------- record and wipe


@dataclass
class Condition(JsonPart):
    """A stopping condition met during the run: its code, what happened, and evidence."""

    code: str = ""
    detail: str | None = None


@dataclass
class RecordResult(PhaseResult):
    """The acceptance record's verdict and its stopping conditions."""

    verdict: str | None = None
    summary: str = ""
    conditions: list[Condition] = field(default_factory=list)

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"verdict"})
    PARTS: ClassVar[Mapping[str, type[JsonPart]]] = {"conditions": Condition}

    def ok(self) -> bool:
        """A record that did not accept is shown as failed ("✓ record rejected" read as a pass)."""
        if (self.verdict if self.verdict is not None else "accepted") != "accepted":
            return False
        return super().ok()


@dataclass
class WipeResult(PhaseResult):
    """Whether the wipe ran (``done: false``: kept by ``wipe: manual``), what it removed
    and verified, what is left, whether the data key was shredded and the outputs went."""

    done: bool = True
    verified: bool | None = None
    removed: list[str] | None = None
    remaining: list[str] | None = None
    key_destroyed: bool | None = None
    outputs_wiped: bool | None = None
    summary: str = ""
    error: str | None = None

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"verified", "removed", "remaining", "key_destroyed", "outputs_wiped", "error"}
    )

    @classmethod
    def kept(cls, summary: str) -> WipeResult:
        return cls(done=False, summary=summary)

    def record_form(self) -> JsonObject:
        """The record's ``wipe`` section."""
        return {
            "done": self.done,
            "verified": self.verified,
            "removed": self.removed,
            "remaining": self.remaining,
        }


#: the result class of each phase
RESULT_TYPES: dict[Phase, type[PhaseResult]] = {
    Phase.PROVISION: ProvisionResult,
    Phase.SYNC: SyncResult,
    Phase.LAUNCH: LaunchResult,
    Phase.FOLLOW: FollowResult,
    Phase.PULL: PullResult,
    Phase.COMPARE: CompareResult,
    Phase.RECORD: RecordResult,
    Phase.WIPE: WipeResult,
}


def from_journal(name: str, data: JsonObject, schema: int | None = None) -> PhaseResult:
    """The typed result of the journal row of phase ``name`` (a wire name).

    ``schema`` None (a row from before versions) and 1 are the same form; a later one
    is read the same way, its new keys kept in ``extra``."""
    del schema  # one form so far: every version reads the same
    group = PhaseKey.group(name)
    if group in (Phase.LAUNCH, Phase.FOLLOW) and data.get("state") == NOT_LAUNCHED:
        return FollowResult.from_dict(data)
    try:
        cls = RESULT_TYPES[Phase(group)]
    except ValueError:
        cls = OtherResult
    return cls.from_dict(data)


def as_result(name: str, result: JsonObject | PhaseResult | None) -> PhaseResult:
    """Whatever a phase returned (``None``: an empty result), typed."""
    if isinstance(result, PhaseResult):
        return result
    return from_journal(name, result or {})


def as_dict(result: JsonObject | PhaseResult | None) -> JsonObject:
    """The journal form of whatever a phase returned (``None``: an empty result)."""
    if result is None:
        return {}
    return result.to_dict() if isinstance(result, PhaseResult) else result
