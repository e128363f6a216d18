"""The playbook's sections (project, environment, agent, data, workload, outputs, ...).

Why a module of its own: each section is a small strict model with its own checks;
remotemac/playbook.py puts them together as :class:`Playbook`, loads the file and
explains its problems. Import them from ``remotemac.playbook``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from remotemac.placeholders import NAMES
from remotemac.placeholders import check as check_placeholders
from remotemac.units import parse_duration, parse_size

PLACEHOLDERS = NAMES
SYSTEM_DIRS = {
    "/",
    "/bin",
    "/sbin",
    "/usr",
    "/etc",
    "/var",
    "/tmp",
    "/private",
    "/System",
    "/Library",
    "/Applications",
    "/Users",
    "/home",
    "/root",
    "/opt",
    "/dev",
    "/proc",
    "/sys",
    "/Volumes",
    "/private/tmp",
    "/private/var",
    "/usr/local",
    "/opt/homebrew",
}

#: where homes live (/Users/<name>, /home/<name>) and homes with a fixed path
HOME_PARENTS = {"/Users", "/home", "/var/home", "/export/home"}
HOME_DIRS = {"/var/root", "/private/var/root"}

Size = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": r"^\d+(\.\d+)?\s*([kKmMgGtT]i?[bB]?|[bB])?$"},
            ],
            "description": "bytes, or a size like 500MB or 2GiB",
        }
    ),
]
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "string", "pattern": r"^(\d+(\.\d+)?\s*(s|m|min|h|d)?)+$"},
            ],
            "description": "seconds, or a duration like 90s, 30m, 2h",
        }
    ),
]
Device = Literal["cpu", "mps", "cuda", "auto"]


class Strict(BaseModel):
    # allow_inf_nan=False: ``.nan``/``.inf`` in a rate or a tolerance is a typo, and
    # json.dumps would write them as the non-JSON tokens NaN/Infinity in the records
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _relative_path(value: str, what: str) -> str:
    """A path below a directory remotemac controls: relative, no ``..``, no NUL."""
    parts = value.replace("\\", "/").split("/")
    if not value.strip() or value.startswith(("/", "~")) or ".." in parts or "\x00" in value:
        raise ValueError(f"{what} {value[:80]!r} must be a relative path without '..'")
    return value


def _globs(patterns: list[str], compile_one: Any) -> list[str]:
    """Patterns that compile; a bad one (``[z-a]``) is an error here, not a crash later."""
    for pattern in patterns:
        if not pattern.strip() or "\x00" in pattern:
            raise ValueError(f"empty or NUL pattern {pattern[:80]!r}")
        try:
            compile_one(pattern)
        except (re.error, ValueError, RecursionError) as exc:
            raise ValueError(f"bad pattern {pattern[:80]!r}: {exc}") from None
    return patterns


def _ignore_pattern(pattern: str) -> None:
    from remotemac.ignore import parse_rules

    parse_rules([pattern])


def _slice_pattern(pattern: str) -> None:
    from remotemac.data.slice import glob_match

    glob_match("x", pattern)


class Project(Strict):
    path: str = Field(".", description="code to upload, relative to the playbook")
    exclude: list[str] = Field(default_factory=list, description="more patterns than .gitignore")

    @field_validator("exclude")
    @classmethod
    def _exclude(cls, value: list[str]) -> list[str]:
        return _globs(value, _ignore_pattern)


class Environment(Strict):
    python: str = Field(
        "python3",
        description="interpreter the remote venv is made from: a name or path (python3), or "
        'a version ("3.11", ">=3.10") that the host\'s interpreters are matched against; '
        "when none matches, remotemac brings a CPython build under remote_root",
    )
    requirements: str | None = Field(None, description="lock or requirements file in the project")
    venv: bool = Field(True, description="make a venv keyed by the requirements' hash")
    system_site_packages: bool = Field(
        False, description="let the venv see the interpreter's packages"
    )

    @field_validator("python", mode="before")
    @classmethod
    def _python_version(cls, value: Any) -> Any:
        # YAML reads `python: 3.10` as the float 3.1: a version is written quoted
        if isinstance(value, float):
            raise ValueError(f'write the version quoted, python: "{value}" (YAML read a number)')
        from remotemac.agent.shared import looks_like_spec, parse_spec

        spec = isinstance(value, str) and "/" not in value and looks_like_spec(value)
        if spec and parse_spec(value) is None:
            raise ValueError(
                f'{value!r} is not a version: write "3.11" or ">=3.10", or an '
                "interpreter's name or path (python3)"
            )
        return value


class Agent(Strict):
    python: str | None = Field(
        None,
        description="the host's own interpreter the agent runs under (default: "
        "$REMOTEMAC_AGENT_PYTHON, else python3); never the workload's venv",
    )
    runtime_install: Literal["auto", "online", "offline"] | None = Field(
        None,
        description="how the agent's runtime (cryptography, for decryption) reaches the "
        "host: online (pip on the host), offline (wheels from this laptop), auto (online, then "
        "offline); $REMOTEMAC_RUNTIME_INSTALL overrides",
    )


class Sample(Strict):
    files: int = Field(gt=0)
    seed: int = 0


class Data(Strict):
    path: str
    include: list[str] = Field(default_factory=lambda: ["**/*"])
    exclude: list[str] = Field(default_factory=list)
    files: list[str] | None = Field(None, description="an explicit file list instead of globs")
    max_bytes: Size | None = None
    sample: Sample | None = None
    classification: Literal["public", "internal", "sensitive"] = "internal"
    approved_for_remote: bool = False
    encrypt: bool = True

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        return _globs(value, _slice_pattern)

    @field_validator("files")
    @classmethod
    def _files(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [_relative_path(f, "data file") for f in value]

    @model_validator(mode="after")
    def _policy(self) -> Data:
        if self.classification == "sensitive" and not self.approved_for_remote:
            raise ValueError("sensitive data is refused unless approved_for_remote: true")
        if not self.encrypt and self.classification != "public":
            raise ValueError(
                f"encrypt: false is only allowed for public data (classification is "
                f"{self.classification})"
            )
        return self


class Side(Strict):
    device: Device
    on: Literal["remote", "local"] = "remote"
    host: str | None = Field(
        None, description="dual-track: run this side on another host (e.g. a Linux GPU box)"
    )


class Trace(Strict):
    """``workload.trace``: record each module call's output on both sides for the first
    ``steps`` top-level forwards, so the record can say where the target first diverges
    (agent/modtrace.py, acceptance/divergence.py). Off when absent."""

    steps: int = Field(ge=1, le=1000, description="top-level forwards of the model to trace")
    drill: bool = Field(
        True,
        description="when the traces name a module call, run it alone on each side to name "
        "the aten op that first differs (the job is started again once per side, up to that "
        "call); false skips those passes",
    )


class Workload(Strict):
    command: str = Field(min_length=1)
    reference: Side | None = Field(default_factory=lambda: Side(device="cpu"))
    target: Side = Field(default_factory=lambda: Side(device="mps"))
    fallback: Literal["off", "diagnostic"] = "diagnostic"
    timeout: Duration = 7200.0
    env: dict[str, str] = Field(default_factory=dict)
    resume_command: str | None = Field(
        None, description="with on_lost: relaunch, the command that resumes from a checkpoint"
    )
    trace: Trace | None = Field(
        None, description="the divergence trace, e.g. {steps: 2}; off when absent"
    )

    @field_validator("command", "resume_command")
    @classmethod
    def _placeholders(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.strip():
            raise ValueError("the command is empty")
        check_placeholders(value)  # a PlaceholderError is a ValueError: pydantic's message
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key.replace("_", "a").isalnum() or key[0].isdigit():
                raise ValueError(f"not an environment variable name: {key!r}")
            if key.startswith("REMOTEMAC_"):
                raise ValueError(f"{key} is set by remotemac itself")
        return value


class CompareRule(Strict):
    """One output file (a glob) and how to compare it with the reference's."""

    file: str = Field(
        description=(
            "glob relative to {output_dir}: .pt .pth .pth.tar .tar .ckpt .safetensors .npy "
            ".npz .json .csv"
        )
    )
    rtol: float | None = Field(
        None, ge=0, description="relative tolerance; default: PyTorch's MPS tests' for the dtype"
    )
    atol: float | None = Field(
        None, ge=0, description="absolute tolerance; default: PyTorch's MPS tests' for the dtype"
    )
    keys: list[str] = Field(
        default_factory=list,
        description=(
            "globs of key paths to compare (default: all), e.g. 'model.*', "
            "'optimizer.state.*'; * matches any characters, dots included; a key also covers "
            "everything below it"
        ),
    )
    ignore: list[str] = Field(
        default_factory=list,
        description=("globs of key paths to skip, e.g. 'config.out_dir', 'timestamp'"),
    )
    safe_globals: list[str] = Field(
        default_factory=list,
        description=(
            "classes torch's safe loader may rebuild for this file, by dotted name, e.g. "
            "[argparse.Namespace] for a trainer's saved args; standard library, torch and "
            "numpy only (a project's own class would run its code here: the host turns "
            "whole-model pickles into tensors instead)"
        ),
    )
    strict: bool = Field(
        False,
        description=(
            "false: strings, paths, devices and other non-numeric values that differ are "
            "reported as metadata differences without failing; true: they fail. Device names "
            "(cpu, mps, mps:0, cuda:1) count as equal either way"
        ),
    )

    @field_validator("file")
    @classmethod
    def _file(cls, value: str) -> str:
        return _relative_path(value, "compare file")

    @field_validator("safe_globals")
    @classmethod
    def _safe_globals(cls, value: list[str]) -> list[str]:
        for name in value:
            parts = name.split(".")
            if len(parts) < 2 or not all(p.isidentifier() for p in parts):
                raise ValueError(
                    f"safe_globals: {name!r} is not a dotted class name like argparse.Namespace"
                )
        return value


DEFAULT_OUTPUT_BYTES = 20 * 1024**3


class Outputs(Strict):
    path: str = Field(".", description="what to pull, relative to {output_dir}; default: all of it")
    compare: list[CompareRule] = Field(default_factory=list)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return value if value.strip("/") in ("", ".") else _relative_path(value, "outputs.path")

    max_bytes: Size = Field(
        DEFAULT_OUTPUT_BYTES,
        description="pull refuses outputs larger than this in total (a hostile or runaway "
        "host cannot fill the laptop's disk); each file is also capped at its listed size",
    )


class StopWhen(Strict):
    fallback_ops: Literal["any", "none"] | list[str] = Field(
        "any", description="any: every fallback op stops; none: never; a list: allowed ops"
    )
    memory_growth: bool | Literal["required"] = Field(
        True,
        description=(
            "true: stop when memory keeps growing after the warm-up (a run too short to "
            "tell, under 10 samples over 10 s after it, reports its peak and 'trend: too "
            "short to tell'); required: that too, and a run too short to tell is "
            "incomplete; false: not judged"
        ),
    )
    max_memory: Size | None = None
    min_free_disk: Size = Field(
        256 * 1024**2,
        description="stop the job cleanly (storage-limit) when remote_root's volume has less free",
    )


class Connection(Strict):
    """How long a dropped link is retried before the run stops locally (the job runs on)."""

    reconnect_deadline: Duration = Field(
        600.0,
        gt=0,
        description="keep reconnecting this long (counted down on screen); past it the run "
        "stops with exit 3 and `remotemac attach <run-id>` resumes it",
    )


class Cost(Strict):
    hourly_rate: float = Field(0.0, ge=0)
    currency: str = "USD"


class Purpose(Strict):
    """What the user wants from the Mac; the decision rules read it."""

    goal: Literal["prototyping", "inference", "macos-validation", "training"] = "macos-validation"
    trains_on_linux: bool = True
    ships_on_macos: bool = False
    multi_gpu: bool = False
