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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

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
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    #: fields written to the journal only when set (a dict without that key before)
    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    def ok(self) -> bool:
        """Whether the phase is shown as passed: only an explicit ``ok: false`` fails it."""
        return self.extra.get("ok", True) is not False

    @property
    def line(self) -> str:
        """The one line the phase's ``PhaseFinished`` event carries."""
        return str(getattr(self, "summary", "") or "")

    def to_dict(self) -> dict[str, Any]:
        """The journal's dict: the fields in order, shallow (nested dicts stay as they are)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("seconds", "extra"):
                continue
            value = getattr(self, f.name)
            if value is None and f.name in self.OMIT_NONE:
                continue
            out[f.name] = value
        if self.seconds is not None:
            out["seconds"] = self.seconds
        out.update((k, v) for k, v in self.extra.items() if k not in out)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """A journal row's result; unknown keys go to ``extra``, missing ones are defaults."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    @classmethod
    def from_row(cls, info: dict[str, Any] | None) -> Self:
        """The result in a ``Journal.phases`` row, whatever its state; empty without a row."""
        info = info or {}
        return cls.from_dict(info.get("result") or {})


@dataclass
class OtherResult(PhaseResult):
    """A row of a phase this version does not run (a journal of another version)."""

    summary: str = ""


@dataclass(kw_only=True)
class HostEntry:
    """One host's part of a phase result, with the journal's dict form key for key.

    Why the key list: a host's dict had only the keys its code path wrote (a sync
    without data has five, a row of an older version or a test fewer), so an absent
    key and a key written as ``null`` both exist in journals. ``from_dict`` keeps the
    row's keys in order and ``to_dict`` writes back exactly those; an entry built here
    writes every field (those in ``OMIT_NONE`` only when set). A key with no field
    goes to ``extra``. A field defaults to what its readers took a missing key for
    (``.get``: None; the paths every reader needs: empty); defaults are never written.
    """

    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    #: the keys of the row this entry was read from, in order (None: built here)
    row_keys: tuple[str, ...] | None = field(default=None, repr=False, compare=False)

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def _names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "row_keys")]

    def to_dict(self) -> dict[str, Any]:
        names = self._names()
        if self.row_keys is None:
            order = [n for n in names if not (n in self.OMIT_NONE and getattr(self, n) is None)]
        else:
            order = list(self.row_keys)
            # set after the entry was made (the sync's dead-man job): appended, as before
            order += [n for n in self.OMIT_NONE if n not in order and getattr(self, n) is not None]
        out: dict[str, Any] = {}
        for name in order:
            if name in names:
                out[name] = getattr(self, name)
            elif name in self.extra:
                out[name] = self.extra[name]
        out.update((k, v) for k, v in self.extra.items() if k not in out)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | HostEntry) -> Self:
        """A host's entry from its journal dict (an entry already typed is returned as is)."""
        if isinstance(data, cls):
            return data
        assert isinstance(data, dict), data
        names = set(cls._names())
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names}
        return cls(**known, extra=extra, row_keys=tuple(data))


@dataclass
class ProvisionHost(HostEntry):
    """What the provision found and made on one host (engine/provision.provision_host)."""

    root: str = ""
    root_as_given: str = ""
    root_id: str | None = None
    run_dir: str = ""
    paths: dict[str, str] | None = None
    venv_python: str = ""
    venv_reused: bool | None = None
    #: the environment's freeze (agent ``freeze_env``): versions, packages, devices
    probe: dict[str, Any] = field(default_factory=dict)
    #: which Python the venv was made from; ``brought``: remotemac brought it
    interpreter: dict[str, Any] | None = None
    project_files: int | None = None
    project_bytes: int | None = None
    lock_hash: str | None = None
    #: the environment's fingerprint at provision, compared before the target starts
    fingerprint: dict[str, Any] | None = None
    #: the agent's ``check_space`` answer
    space: dict[str, Any] | None = None


@dataclass
class SyncHost(HostEntry):
    """One host's copy of the dataset (engine/sync.sync_host) and its dead-man wipe."""

    data_dir: str = ""
    files: int | None = None
    bytes: int | None = None
    encrypted: bool | None = None
    revision: str | None = None
    #: the RAM store (path, kind, device, steps, warning); None when the data is on disk
    ram: dict[str, Any] | None = None
    transfer: dict[str, Any] | None = None
    selection: list[dict[str, Any]] | None = None
    summary: str | None = None
    runtime: dict[str, Any] | None = None
    #: the dead-man wipe scheduled before any byte was sent (agent/deadman.py's job)
    deadman: dict[str, Any] | None = None

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"deadman"})

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


def _hosts_dict(hosts: Mapping[str, HostEntry]) -> dict[str, dict[str, Any]]:
    """The journal form of a result's per-host entries."""
    return {k: h.to_dict() for k, h in hosts.items()}


@dataclass
class ProvisionResult(PhaseResult):
    """Per host: root, run_dir, probe, venv, fingerprint, space; per side: the device."""

    hosts: dict[str, ProvisionHost] = field(default_factory=dict)
    devices: dict[str, str] = field(default_factory=dict)
    project: Any = None
    summary: str = ""

    def __post_init__(self) -> None:
        # rows read from the journal (and callers that build one) give the hosts as dicts
        self.hosts = {k: ProvisionHost.from_dict(h) for k, h in self.hosts.items()}

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "hosts": _hosts_dict(self.hosts)}

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

    def __post_init__(self) -> None:
        self.hosts = {k: SyncHost.from_dict(h) for k, h in self.hosts.items()}

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "hosts": _hosts_dict(self.hosts)}

    def host(self, key: str) -> SyncHost:
        return self.hosts.get(key) or SyncHost()

    def data_dir(self, key: str) -> str | None:
        return self.host(key).data_dir or None

    def ram(self, key: str) -> dict[str, Any]:
        """The host's RAM store (path, kind, device), empty when the data is on disk."""
        return self.host(key).ram or {}

    def dataset(self) -> SyncHost:
        """The target host's copy of the dataset (the record's ``dataset``)."""
        return self.hosts.get("remote") or next(iter(self.hosts.values()), SyncHost())


@dataclass
class LaunchResult(PhaseResult):
    """The job's tmux session, how it was started, and whether it was running already."""

    session: str = ""
    mode: Any = None
    already: bool = False
    access: Any = None
    summary: str = ""

    def checked_paths(self) -> dict[str, bool | None]:
        """Path -> writable, from the launch's access check of the caches."""
        checked = (self.access or {}).get("checked") or []
        return {c.get("path"): c.get("ok") for c in checked}


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
    disk: dict[str, Any] | None = None
    disk_warning: str | None = None
    relaunched: dict[str, Any] | None = None
    drill: dict[str, Any] | None = None
    #: the link's drops and reconnects while this process followed the job
    continuity: dict[str, int] | None = None
    summary: str = ""

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"relaunched", "drill", "continuity"})
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

    def to_dict(self) -> dict[str, Any]:
        if self.launched:
            return super().to_dict()
        out = {k: getattr(self, k) for k in self.NOT_LAUNCHED_KEYS}
        if self.seconds is not None:
            out["seconds"] = self.seconds
        return {**out, **{k: v for k, v in self.extra.items() if k not in out}}

    def min_free_seen(self) -> float | None:
        """The lowest free space the runner saw on remote_root's volume."""
        return ((self.disk or {}).get("root") or {}).get("min_free_seen")


@dataclass
class PullResult(PhaseResult):
    """Per side label: the local dir, the files verified (path, size, sha256), the bytes."""

    sides: dict[str, dict[str, Any]] = field(default_factory=dict)
    summary: str = ""

    def files(self, label: str) -> list[dict[str, Any]]:
        return (self.sides.get(label) or {}).get("files") or []


@dataclass
class CompareResult(PhaseResult):
    """The reference's outputs against the target's: per file within tolerance or not,
    the whole-model pickles turned into tensors, and the target against itself once more."""

    within_tolerance: bool | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    nothing_compared: bool | None = None
    summary: str = ""
    converted: list[str] | None = None
    reproducibility: dict[str, Any] | None = None

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset(
        {"nothing_compared", "converted", "reproducibility"}
    )

    def ok(self) -> bool:
        """A file outside tolerance is a failed compare ("✓ 0/2 within" read as a pass)."""
        if self.within_tolerance is False or self.nothing_compared:
            return False
        return super().ok()


@dataclass
class RecordResult(PhaseResult):
    """The acceptance record's verdict and its stopping conditions."""

    verdict: str | None = None
    summary: str = ""
    conditions: list[dict[str, Any]] = field(default_factory=list)

    OMIT_NONE: ClassVar[frozenset[str]] = frozenset({"verdict"})

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

    def record_form(self) -> dict[str, Any]:
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


def from_journal(name: str, data: dict[str, Any], schema: int | None = None) -> PhaseResult:
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


def as_result(name: str, result: dict[str, Any] | PhaseResult | None) -> PhaseResult:
    """Whatever a phase returned (``None``: an empty result), typed."""
    if isinstance(result, PhaseResult):
        return result
    return from_journal(name, result or {})


def as_dict(result: dict[str, Any] | PhaseResult | None) -> dict[str, Any]:
    """The journal form of whatever a phase returned (``None``: an empty result)."""
    if result is None:
        return {}
    return result.to_dict() if isinstance(result, PhaseResult) else result
