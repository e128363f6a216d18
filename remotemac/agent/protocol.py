"""The laptop–host protocol, declared once: both sides import this module.

Why one module: the op names, the job's states, the frame letters of the sync and pull
streams, the cache variables and the error codes used to be bare strings repeated on
each side (the frame ``Struct`` three times, the final states three times, ``b"D"``
meaning "done" in one stream and "data" in the other). A name that changes here changes
on both sides; a typo is an ``AttributeError`` at import, not a host that answers
"unknown operation" in the middle of a run.

Standard library only, Python 3.9: the agent ships this file to the host with the rest.
"""

from __future__ import annotations

import dataclasses
import struct
from enum import Enum
from typing import Any, Dict, List, Optional, Type, TypeVar

#: a JSON object as it travels (the parts of a message this module leaves untyped)
JsonObject = Dict[str, Any]

#: Bumped when a message or frame changes shape. The resident agent's hello carries it
#: (``ping`` too); the laptop refuses an agent that speaks another version with one
#: clear error instead of misreading its answers. The agent is shipped by content hash,
#: so a mismatch means a stale or foreign agent directory, not a normal upgrade.
PROTOCOL_VERSION = 1


class _WireEnum(str, Enum):
    """A ``str`` enum whose members *are* their wire strings: JSON, dict keys, ``==``
    with a plain string, ``%s`` and f-strings all see the value (Python 3.11 changed
    ``format()`` of mixed-in enums to ``Class.MEMBER``; this keeps 3.9's behaviour)."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str(self), spec)


class Op(_WireEnum):
    """Every operation the agent serves (``hostagent.OPS``, the resident agent)."""

    PING = "ping"
    PREPARE_RUN = "prepare_run"
    LAUNCH = "launch"
    STATUS = "status"
    STOP = "stop"
    EXTRACT_PROJECT = "extract_project"
    LIST_OUTPUTS = "list_outputs"
    ENSURE_VENV = "ensure_venv"
    PREPARE_DATA = "prepare_data"
    WIPE_RUN_DATA = "wipe_run_data"
    CLEANUP_HOST = "cleanup_host"
    DEADMAN_SCHEDULE = "deadman_schedule"
    DEADMAN_CANCEL = "deadman_cancel"
    FREEZE_ENV = "freeze_env"
    CHECK_ACCESS = "check_access"
    CHECK_SPACE = "check_space"
    ENV_FINGERPRINT = "env_fingerprint"
    RUNTIME_STATUS = "runtime_status"
    RUNTIME_ENSURE = "runtime_ensure"
    FIND_PYTHON = "find_python"
    BRING = "bring"
    #: served from memory only (cleanupops, before anything is written below the root)
    CLAIM_ROOT = "claim_root"
    #: served from memory only (hostfacts: doctor leaves nothing on the host)
    FACTS = "facts"
    #: the resident agent's own: its CPU figure, answered inline (no thread, no store)
    USAGE = "__usage__"

    @property
    def function(self) -> str:
        """The agent module's function for this op (``op_<name>``)."""
        return "op_" + self.value


class JobState(_WireEnum):
    """A job's ``state`` in its status file (runner.py writes it) and in ``status``
    answers (``lost`` and ``absent`` are the agent's verdicts, never written)."""

    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    TIMEOUT = "timeout"
    STOPPED = "stopped"
    STORAGE_LIMIT = "storage-limit"
    LOST = "lost"
    ABSENT = "absent"


#: the states a runner ends a job in: nothing changes the job after one (a tuple of plain
#: strings so ``in`` works on whatever a status file holds)
FINAL_STATES = tuple(
    str(s.value)
    for s in (
        JobState.FINISHED,
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.STOPPED,
        JobState.STORAGE_LIMIT,
    )
)
#: a job that is, or may still be, running (launch answers ``already_running``)
LIVE_STATES = (str(JobState.STARTING.value), str(JobState.RUNNING.value))


def is_final(state: Any) -> bool:
    """The job reached its end (``lost``/``absent`` are not ends: nobody wrote one)."""
    return state in FINAL_STATES


class ErrorCode(_WireEnum):
    """The ``code`` of an agent's error answer ``{"ok": false, "error", "code"}``."""

    ERROR = "error"  # an AgentError without a more precise code
    INTERNAL = "internal"  # an exception the agent did not expect: remotemac's bug
    USAGE = "usage"  # unknown op, bad call id, malformed request
    HOST_ENV = "host-env"
    ENV_FAILED = "env-failed"
    NO_PYTHON = "no-python"
    MISSING_MODULE = "missing-module"
    RUNTIME_FAILED = "runtime-failed"
    ONLINE_FAILED = "online-failed"
    NO_SPACE = "no-space"
    DISK_FULL = "disk-full"  # the launch's write check met a full disk
    UNSAFE_PATH = "unsafe-path"
    NOT_OURS = "not-ours"
    LAUNCH = "launch"
    INTEGRITY = "integrity"
    BAD_WHEEL = "bad-wheel"
    BAD_ARCHIVE = "bad-archive"
    ACCESS = "access"
    RAM = "ram"


#: codes that mean "the host's environment lacks something" (exit 6, not 3): a full
#: disk too (the link is fine, retrying will not help)
HOST_ENV_CODES = frozenset(
    str(c.value)
    for c in (
        ErrorCode.HOST_ENV,
        ErrorCode.ENV_FAILED,
        ErrorCode.NO_PYTHON,
        ErrorCode.MISSING_MODULE,
        ErrorCode.RUNTIME_FAILED,
        ErrorCode.NO_SPACE,
        ErrorCode.DISK_FULL,
    )
)


# ------------------------------------------------------------------ streams

#: one frame header of the sync and pull streams: kind (1 byte), index (u32), length (u64)
FRAME = struct.Struct(">cIQ")
#: the length of a sync ``R``/``S`` frame's JSON meta, after the header
META_LEN = struct.Struct(">I")

#: first path parts a dataset slice may not use: the host keeps its own files there
#: (the record ``.verified.jsonl``, partial and split files, packs, writing markers,
#: agent/datarecords.py); compared case-folded, as an APFS volume compares names
RESERVED_DATA_NAMES = (".remotemac-", ".verified.jsonl")


def reserved_data_path(rel: Any) -> bool:
    """Whether a slice's path starts with a name the host keeps for itself: refused on
    the laptop before anything is sent (engine/syncplan.py) and by the receiver."""
    return isinstance(rel, str) and rel.split("/", 1)[0].casefold().startswith(RESERVED_DATA_NAMES)


class SyncFrame:
    """Frame kinds laptop → host on a sync stream (agent/dataops.py receives them)."""

    FILE = b"F"  # a whole file's ciphertext
    PARTIAL = b"R"  # the rest of a file the host holds part of (+ meta)
    PIECE = b"S"  # one piece of a split file (+ meta)
    JOIN = b"J"  # every piece of a split file is in: join them
    HASH = b"H"  # hash the pieces of a split file noted so far (the join hashes the rest)
    PING = b"P"  # a round trip, answered at once (sizes the channel window)
    DONE = b"D"  # this stream has nothing more
    END = b"E"  # the first stream's last frame: the manifest, once every stream is done


class PullFrame:
    """Frame kinds host → laptop on a pull stream (agent/pullops.py sends them)."""

    PING = b"P"  # the answer to a ``{"ping": true}`` line
    DATA = b"D"  # bytes of the file, continuing from the offset asked
    HASH = b"H"  # the SHA-256 of the file's bytes from 0 to where the data ended
    SKIP = b"X"  # the file is not sent: JSON ``{"why"}``
    VERIFY = b"V"  # the SHA-256 of the first ``offset`` bytes: the laptop says go/restart
    END = b"Z"  # every file asked was sent
    ERROR = b"E"  # JSON ``{"error", "code"}``, then the end of the stream


def pack_frame(kind: bytes, index: int, length: int) -> bytes:
    """One frame header (the payload follows it)."""
    return FRAME.pack(kind, index, length)


# ------------------------------------------------------------------ job environment

#: the caches a job's environment points inside the run dir (wiped with it), each to
#: its subdirectory of ``<run_dir>/cache``: the laptop sets them (engine/jobs.py), the
#: host checks them (agent/guards.py) and the record reports them
CACHE_DIRS: Dict[str, str] = {
    "TORCH_HOME": "torch",
    "HF_HOME": "hf",
    "PIP_CACHE_DIR": "pip",
    "XDG_CACHE_HOME": "xdg",
    "MPLCONFIGDIR": "mpl",
}
CACHE_VARS = tuple(CACHE_DIRS)
#: what a workload is told about its run (engine/jobs.py sets them, the job reads them)
ENV_DEVICE = "REMOTEMAC_DEVICE"
ENV_DATA = "REMOTEMAC_DATA"
ENV_OUTPUT = "REMOTEMAC_OUTPUT"
ENV_RUN_ID = "REMOTEMAC_RUN_ID"
#: knobs read from the agent's environment (tests, or a host where tmux misbehaves)
ENV_HEARTBEAT_STALE_S = "REMOTEMAC_HEARTBEAT_STALE_S"
ENV_NO_TMUX = "REMOTEMAC_NO_TMUX"


# ------------------------------------------------------------------ messages

M = TypeVar("M", bound="Message")


class ProtocolError(ValueError):
    """A message that does not have the shape this side expects."""


@dataclasses.dataclass
class Message:
    """A request or answer with named fields; ``extra`` keeps the keys this side does not
    name, so reading and writing back a message never loses what the other side added."""

    extra: JsonObject = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls: Type[M], data: Any) -> M:
        """Read a message the other side sent; ProtocolError when it is not one."""
        if not isinstance(data, dict):
            raise ProtocolError("%s: expected an object, got %s" % (cls.__name__, type(data)))
        fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        missing = [
            name
            for name, f in fields.items()
            if name not in data
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        ]
        if missing:
            raise ProtocolError("%s: missing %s" % (cls.__name__, ", ".join(missing)))
        known = {k: v for k, v in data.items() if k in fields}
        extra = {k: v for k, v in data.items() if k not in fields}
        message = cls(extra=extra, **known)
        # not a field (equality ignores it): the keys the other side left out stay out
        object.__setattr__(message, "_absent", frozenset(fields) - frozenset(data))
        return message

    def to_json(self) -> JsonObject:
        """The message as a JSON object: its named fields, then ``extra``.

        A message read with :meth:`from_json` writes back the keys it was read with
        (a field it lacked stays absent unless set since); one built here leaves out
        optional fields that are None."""
        absent = getattr(self, "_absent", None)
        out: JsonObject = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if absent is not None:
                if f.name in absent and value == _default(f):
                    continue
            elif value is None and f.default is None:
                continue  # an optional field left unset is absent
            out[f.name] = value
        out.update(self.extra)
        return out


def _default(f: Any) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


@dataclasses.dataclass
class Hello(Message):
    """The resident agent's first frame: who it is, and the protocol it speaks."""

    id: str = ""
    hello: int = 1
    pid: Optional[int] = None
    cpu_s: Optional[float] = None
    python: Optional[str] = None
    protocol: Optional[int] = None


def check_protocol(version: Any) -> Optional[str]:
    """None when ``version`` is this side's, else why not (for the laptop's error)."""
    if version == PROTOCOL_VERSION:
        return None
    return "the agent speaks protocol %s, this remotemac speaks %s" % (
        "(none)" if version is None else version,
        PROTOCOL_VERSION,
    )


@dataclasses.dataclass
class LaunchRequest(Message):
    """Start one device's job (hostagent.op_launch). ``relaunch``: ``true`` starts a
    finished job again; ``{reason, marker}`` restarts a lost one. ``next``: the launch
    the host makes itself when this job finishes. ``fingerprint``: the workload's
    interpreter, with which the host takes the environment's fingerprint (the drift
    check before the target) inside the launch, before the runner starts: a job that
    changes its own environment as it starts is never taken for a drift, and the
    check costs no round trip of its own."""

    run_dir: str = ""
    device: str = ""
    session: str = ""
    command: str = ""
    metrics_path: Optional[str] = None
    cwd: Optional[str] = None
    env: Dict[str, str] = dataclasses.field(default_factory=dict)
    timeout: Optional[float] = None
    mode: Optional[str] = None
    disk: Optional[JsonObject] = None
    convert: Optional[JsonObject] = None
    observe: Optional[JsonObject] = None
    next: Optional[JsonObject] = None
    relaunch: Any = None
    fingerprint: Optional[str] = None


@dataclasses.dataclass
class LaunchAnswer(Message):
    """What a launch did: started (``mode``, ``status``), or found the job running or done.
    ``fingerprint``: asked for, the environment's fingerprint taken before the job
    started (kept beside its status, so a launch that finds the job already started by
    the host, its ``next``, answers it too)."""

    session: str = ""
    mode: Optional[str] = None
    status: Optional[JsonObject] = None
    access: Optional[JsonObject] = None
    tmux_hint: Optional[str] = None
    fingerprint: Optional[JsonObject] = None
    already_running: bool = False
    already_done: bool = False

    def to_json(self) -> JsonObject:
        out = super().to_json()
        if getattr(self, "_absent", None) is None:
            for flag in ("already_running", "already_done"):
                if not out.get(flag):
                    out.pop(flag, None)  # the agent names a flag only when it is set
        return out


@dataclasses.dataclass
class StatusRequest(Message):
    """A ``status`` request; ``log_from`` (a byte offset) also asks for the job's log from
    there, up to ``log_max`` bytes, read after the status (issue 36: the follow waited
    for an SFTP read and a status call, four round trips and one, where one will do)."""

    run_dir: str = ""
    device: str = ""
    session: str = ""
    log_from: Optional[int] = None
    log_max: int = 1 << 20
    #: only the log's bytes (and size), no status unless the job is over: the follow's
    #: reads between its once-a-second status
    log_only: bool = False
    #: answer once the log grew past ``log_from`` or the job is over, or after this long
    wait_s: float = 0.0


@dataclasses.dataclass
class JobStatus(Message):
    """A ``status`` answer: the runner's status file, and the agent's verdict ``state``
    (``lost`` when the runner is gone and its heartbeat stale, ``absent`` with no file)."""

    state: Optional[str] = None
    status: Optional[JsonObject] = None
    now: Optional[float] = None
    tmux_alive: Optional[bool] = None
    log_size: int = -1
    runner_alive: Optional[bool] = None
    stale_after_s: Optional[float] = None
    lost_reason: Optional[str] = None
    #: asked with ``log_from``: the log's bytes from there (base64), read after the
    #: status, so a final state's log is all there up to ``log_size``; None: not asked,
    #: or no log (yet)
    log_b64: Optional[str] = None

    @property
    def final(self) -> bool:
        return is_final(self.state)

    def log_bytes(self) -> bytes:
        """The log bytes the answer carries (empty when none)."""
        import base64

        return base64.b64decode(self.log_b64) if self.log_b64 else b""

    @property
    def file(self) -> JsonObject:
        """The runner's status file, or ``{}`` when there is none yet."""
        return self.status or {}


@dataclasses.dataclass
class FindPythonRequest(Message):
    root: str = ""
    spec: str = ""


@dataclasses.dataclass
class FindPythonAnswer(Message):
    """The host's interpreters (pythons.op_find_python) and the best match for ``spec``."""

    spec: Optional[str] = None
    python: Optional[str] = None
    version: Optional[str] = None
    brought: bool = False
    pythons: List[JsonObject] = dataclasses.field(default_factory=list)
    platform: Optional[JsonObject] = None
    brought_dirs: List[JsonObject] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RuntimeStatus(Message):
    """Is the agent runtime (its wheels) installed for this interpreter (agentruntime)?"""

    key: str = ""
    dir: str = ""
    present: bool = False
    marker: Optional[JsonObject] = None
    tags: JsonObject = dataclasses.field(default_factory=dict)
    pins: Any = None
    pip: bool = False
    python_ok: bool = False
    wheels_known: bool = False


@dataclasses.dataclass
class BringAnswer(Message):
    """What ``bring`` put under ``<root>/runtime`` (an interpreter, uv), or why it
    could not (``failed``: the host cannot download it; the laptop brings it then)."""

    failed: Optional[str] = None
    dir: Optional[str] = None
    exe: Optional[str] = None
    version: Optional[str] = None
    reused: bool = False
    method: Optional[str] = None
    bytes: int = 0
    seconds: Optional[float] = None


@dataclasses.dataclass
class RuntimeEnsureAnswer(Message):
    """The agent runtime installed (or found), or ``failed`` with pip's ``tail`` and the
    host's wheel ``tags`` for the laptop to bring the wheels offline."""

    failed: Optional[str] = None
    tail: Optional[List[str]] = None
    tags: Optional[JsonObject] = None
    dir: Optional[str] = None
    reused: bool = False
    method: Optional[str] = None
    installed: Optional[List[str]] = None
    seconds: Optional[float] = None
    cryptography: Optional[str] = None


@dataclasses.dataclass
class PrepareRunAnswer(Message):
    """The run's directory on the host and its subdirectories by name; ``extracted``:
    asked with ``project`` (a small project's tar), extract_project's answer for it."""

    run_dir: str = ""
    paths: Dict[str, str] = dataclasses.field(default_factory=dict)
    extracted: Optional[JsonObject] = None


@dataclasses.dataclass
class Answer(Message):
    """The envelope of every answer: ``{"ok": true, "result"}`` or an error with its code."""

    ok: bool = False
    result: Any = None
    error: Optional[str] = None
    code: Optional[str] = None
    tail: Optional[List[str]] = None

    @property
    def host_env(self) -> bool:
        """The host's environment failed the op (exit 6), not the link or remotemac."""
        return self.code in HOST_ENV_CODES
