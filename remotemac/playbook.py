"""The playbook: one YAML file that says what to run where, and how to judge it.

Validation is strict on purpose: a typo in a rented-Mac run costs money, so an
unknown key is an error with a "did you mean", and every error names the key
path and the line and column in the file.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from remotemac.errors import BadInput
from remotemac.hostspec import split_spec
from remotemac.placeholders import names as placeholder_names
from remotemac.playbooksections import (  # noqa: F401 (the sections are imported from here)
    DEFAULT_OUTPUT_BYTES,
    HOME_DIRS,
    HOME_PARENTS,
    PLACEHOLDERS,
    SYSTEM_DIRS,
    Agent,
    CompareRule,
    Connection,
    Cost,
    Data,
    Device,
    Duration,
    Environment,
    Outputs,
    Project,
    Purpose,
    Sample,
    Side,
    Size,
    StopWhen,
    Strict,
    Trace,
    Workload,
)
from remotemac.termsafe import escape_controls
from remotemac.units import parse_duration
from remotemac.userfiles import bounded_int, read_user_file, yaml_error_where

MatrixValue = str | int | float | bool


class Playbook(Strict):
    """A validated playbook; ``base_dir`` is the directory of the YAML file."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    host: str = "local"
    hosts: list[str] | None = Field(
        None, description="fleet: run on every one of these hosts (overrides host)"
    )
    matrix: dict[str, list[MatrixValue]] | None = Field(
        None, description="sweep: one run per combination; use {matrix.<key>} in the command"
    )
    remote_root: str = "~/remotemac"
    project: Project = Field(default_factory=Project)
    environment: Environment = Field(default_factory=Environment)
    agent: Agent = Field(default_factory=Agent)
    connection: Connection = Field(default_factory=Connection)
    data: Data | None = None
    workload: Workload
    outputs: Outputs = Field(default_factory=Outputs)
    stop_when: StopWhen = Field(default_factory=StopWhen)
    cost: Cost = Field(default_factory=Cost)
    wipe: Literal["after_pull", "manual"] = "after_pull"
    reproduce: bool = Field(False, description="run the target twice and compare the two")
    on_lost: Literal["fail", "relaunch"] = Field(
        "fail", description="relaunch once (through resume_command) after a lost job"
    )
    purpose: Purpose = Field(default_factory=Purpose)
    wipe_deadline: str | None = Field(
        None,
        description="dead-man wipe: the host wipes the run's data at this time even if the "
        "laptop never comes back; a duration after launch (48h) or an ISO time "
        "(2026-12-03T18:00:00+00:00)",
    )

    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _source: Path | None = PrivateAttr(default=None)

    @property
    def base_dir(self) -> Path:
        return self._base_dir

    @property
    def source(self) -> Path | None:
        return self._source

    @field_validator("remote_root")
    @classmethod
    def _safe_root(cls, value: str) -> str:
        return check_remote_root(value)

    @field_validator("wipe_deadline", mode="before")
    @classmethod
    def _deadline(cls, value: object) -> str | None:
        if value is None:
            return None
        if isinstance(value, datetime):
            return value.isoformat()
        text = str(value).strip()
        try:
            parse_duration(text)
            return text
        except ValueError:
            pass
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"not a duration or an ISO time: {text!r} (write 48h or 2026-12-03T18:00:00+00:00)"
            ) from None
        if when.tzinfo is None:
            raise ValueError("give the deadline a timezone, e.g. 2026-12-03T18:00:00+00:00")
        return when.isoformat()

    def wipe_deadline_at(self, launched_at: float) -> float | None:
        """The dead-man deadline as a Unix time, or None."""
        if self.wipe_deadline is None:
            return None
        try:
            return launched_at + parse_duration(self.wipe_deadline)
        except ValueError:
            return datetime.fromisoformat(self.wipe_deadline).timestamp()

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_host(value)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("hosts is empty: give at least one host or remove the key")
        if len(value) > MAX_HOSTS:
            raise ValueError(f"{len(value)} hosts: a fleet has at most {MAX_HOSTS} hosts")
        if len(set(value)) != len(value):
            raise ValueError("a host appears twice in hosts")
        return [check_host(h) for h in value]

    @field_validator("matrix")
    @classmethod
    def _matrix(
        cls, value: dict[str, list[MatrixValue]] | None
    ) -> dict[str, list[MatrixValue]] | None:
        if value is None:
            return None
        for key, values in value.items():
            if not key.isidentifier():
                raise ValueError(f"matrix key {key!r} must be a name like batch_size")
            if not values:
                raise ValueError(f"matrix.{key} has no values")
        count = math.prod(len(values) for values in value.values())
        if count > MAX_VARIANTS:
            raise ValueError(
                f"the matrix makes {count} variants (one run each): at most {MAX_VARIANTS}"
            )
        return value

    @model_validator(mode="after")
    def _matrix_used(self) -> Playbook:
        used = {
            name.split(".", 1)[1]
            for name in placeholder_names(self.workload.command)
            if name.startswith("matrix.")
        }
        known = set(self.matrix or {})
        if used - known:
            raise ValueError(
                f"the command uses {{matrix.{sorted(used - known)[0]}}} but matrix has no such key"
            )
        return self

    def target_hosts(self) -> list[str]:
        """Every host the target runs on: ``hosts`` for a fleet, else ``host``."""
        return list(self.hosts) if self.hosts else [self.host]

    def project_dir(self) -> Path:
        return (self.base_dir / self.project.path).resolve()

    def data_dir(self) -> Path | None:
        return (self.base_dir / self.data.path).resolve() if self.data else None


#: a fleet's hosts and a matrix's variants: each is a run (and a tmux session, a
#: connection); refused above these before anything is expanded or planned
MAX_HOSTS = 1000
MAX_VARIANTS = 1000


def check_host(value: str) -> str:
    """``local``, an ssh alias or ``[user@]host[:port]`` (port 1-65535, IPv6 in brackets)."""
    if not value or any(c.isspace() for c in value) or value.startswith("-"):
        raise ValueError(
            f"not a host: {value[:60]!r} (write local, an ssh alias or user@host:port)"
        )
    if value != "local":
        split_spec(value)
    return value


def check_remote_root(value: str) -> str:
    """Refuse a remote_root whose removal would hurt: /, ~, empty, a system dir."""
    text = value.strip()
    norm = os.path.normpath(text) if text else ""
    if not norm or norm in {".", "~", "/"} or norm.startswith("~") and norm.rstrip("/") == "~":
        raise ValueError(
            f"remote_root {value!r} is not allowed: use a dedicated dir like ~/remotemac"
        )
    if ".." in Path(norm).parts:
        raise ValueError(f"remote_root {value!r} may not contain '..'")
    if not (norm.startswith("~/") or norm.startswith("/")):
        raise ValueError(f"remote_root {value!r} must start with ~/ or /")
    if norm in SYSTEM_DIRS or (norm.startswith("/") and len(Path(norm).parts) < 3):
        raise ValueError(f"remote_root {value!r} is a system dir: use e.g. ~/remotemac")
    parts = Path(norm).parts
    if norm in HOME_DIRS or (len(parts) == 3 and "/" + parts[1] in HOME_PARENTS):
        # cleanup removes remote_root: a home dir (the host's is checked again on the host)
        raise ValueError(
            f"remote_root {value!r} looks like a home directory: use a dedicated "
            "dir below it, like ~/remotemac"
        )
    return norm


# ---------------------------------------------------------------- loading


class PlaybookErrors(BadInput):
    """All problems of one playbook; ``lines`` holds one line per problem."""

    def __init__(self, lines: list[str]) -> None:
        # one line per problem, whatever the file's keys and values hold
        lines = [escape_controls(line).replace("\n", "\\n") for line in lines]
        super().__init__(lines[0] if len(lines) == 1 else f"{len(lines)} problems in playbook")
        self.lines = lines

    def line(self) -> str:
        return "\n".join(self.lines)


def load_playbook(
    path: str | os.PathLike[str], overrides: dict[str, Any] | None = None
) -> Playbook:
    """Read, parse and validate a playbook file. Raises PlaybookErrors (exit 2)."""
    file = Path(path)
    text = read_user_file(file, "playbook")
    return parse_playbook(text, str(file), overrides=overrides, source=file)


_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present


class PlaybookLoader(_BaseLoader):
    """YAML 1.2 booleans: only true/false. SPEC's ``on: remote`` must stay a key named "on"."""


PlaybookLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
PlaybookLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)
PlaybookLoader.add_constructor("tag:yaml.org,2002:int", bounded_int)  # 5,000 digits: one line


def parse_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node tree (for line numbers) and its data, parsed once."""
    loader = PlaybookLoader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    finally:
        loader.dispose()


def parse_playbook(
    text: str,
    filename: str = "<playbook>",
    overrides: dict[str, Any] | None = None,
    source: Path | None = None,
) -> Playbook:
    """Validate a playbook's text; with ``source`` (its file) also the paths it names.

    Raises PlaybookErrors (exit 2), one line per problem with its key path and line.
    """
    try:
        node, data = parse_yaml(text)
    except RecursionError:
        raise PlaybookErrors([f"{filename}:1:1: bad YAML: nested too deeply"]) from None
    except yaml.YAMLError as exc:
        where = yaml_error_where(exc, filename)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PlaybookErrors([f"{where}: bad YAML: {problem}"]) from None
    if not isinstance(data, dict):
        raise PlaybookErrors(
            [f"{filename}:1:1: a playbook is a mapping of keys (name, workload, ...)"]
        )
    if overrides:
        data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        playbook = Playbook.model_validate(data)
    except ValidationError as exc:
        raise PlaybookErrors(_explain(exc, node, filename)) from None
    except RecursionError:  # a YAML tree nested thousands deep
        raise PlaybookErrors([f"{filename}:1:1: the playbook is nested too deeply"]) from None
    if source is not None:
        playbook._base_dir = source.resolve().parent
        playbook._source = source.resolve()
        problems = [
            f"{_where(node, loc, filename)}: {'.'.join(loc)}: {why}"
            for loc, why in _path_problems(playbook)
        ]
        if problems:
            raise PlaybookErrors(problems)
    return playbook


def _path_problems(pb: Playbook) -> list[tuple[list[str], str]]:
    """Local paths the playbook names that do not exist or are not what they must be.

    Why at load time: ``check`` and ``--dry-run`` are where a typo should show,
    not an "internal error" halfway through provisioning a rented Mac.
    """
    found: list[tuple[list[str], str]] = []
    project = pb.project_dir()
    if not project.exists():
        found.append((["project", "path"], f"{project} does not exist"))
    elif not project.is_dir():
        found.append((["project", "path"], f"{project} is not a directory"))
    elif pb.environment.requirements:
        req = project / pb.environment.requirements
        if not req.is_file():
            found.append(
                (
                    ["environment", "requirements"],
                    f"{req} is not a file (it is read from the project directory)",
                )
            )
    data = pb.data_dir()
    if data is not None:
        if not data.exists():
            found.append((["data", "path"], f"{data} does not exist"))
        elif not data.is_dir():
            found.append((["data", "path"], f"{data} is not a directory"))
    return found


def _where(root: yaml.Node | None, loc: list[Any], filename: str) -> str:
    mark = mark_for(root, loc, key_node=False)
    return f"{filename}:{mark[0]}:{mark[1]}" if mark else filename


def _explain(exc: ValidationError, root: yaml.Node | None, filename: str) -> list[str]:
    """One line per problem, in the order of the file (by line, then column)."""
    lines: list[tuple[tuple[int, int], str]] = []
    seen: set[str] = set()
    for err in exc.errors():
        raw = list(err["loc"])
        # an unknown key is the user's own word, whatever it looks like; elsewhere drop
        # the union tags pydantic puts in the location ("list[str]", "literal[...]")
        unknown = raw.pop() if err["type"] == "extra_forbidden" and raw else None
        loc = [p for p in raw if not (isinstance(p, str) and ("[" in p or p in _UNION_TAGS))]
        if unknown is not None:
            loc.append(unknown)
        key_path = ".".join(_shown_key(p) for p in loc) or "(top)"
        mark = mark_for(root, loc, key_node=err["type"] == "extra_forbidden")
        where = f"{filename}:{mark[0]}:{mark[1]}" if mark else filename
        message = _message(err, loc)
        line = f"{where}: {key_path}: {message}"
        if line not in seen:
            seen.add(line)
            lines.append((mark or (0, 0), line))
    return [line for _, line in sorted(lines, key=lambda item: item[0])]


def _shown_key(part: Any) -> str:
    """A key of the user's file for a one-line message: printable, at most 60 characters."""
    text = str(part)
    if text.isprintable() and len(text) <= 60:
        return text
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


_UNION_TAGS = {"literal['any','none']", "list[str]", "int", "str", "float", "Side", "Sample"}


def _message(err: dict[str, Any], loc: list[Any]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        known = _fields_at(loc[:-1])
        guess = difflib.get_close_matches(str(loc[-1]), known, n=1) if loc else []
        hint = f"; did you mean '{guess[0]}'?" if guess else f"; known keys: {', '.join(known)}"
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind in _PLAIN:
        return _PLAIN[kind].format(got=_shown(err.get("input")))
    if kind in _BOUNDS:
        bound = next(iter((err.get("ctx") or {}).values()), "?")
        return f"must be {_BOUNDS[kind]} {bound}, got {_shown(err.get('input'))}"
    if kind == "literal_error":
        expected = (err.get("ctx") or {}).get("expected", "")
        return f"expected one of {expected}, got {_shown(err.get('input'))}"
    if kind == "string_pattern_mismatch" and loc == ["name"]:  # words, not the regex
        return (
            "use 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit "
            f"(it names the run and its dirs), got {_shown(err.get('input'))}"
        )
    message = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    return message


# pydantic's own wording ("Input should be a valid number, unable to parse string as a
# number") → what a playbook author needs to read.
_PLAIN = {
    "float_parsing": "expected a number, got {got}",
    "float_type": "expected a number, got {got}",
    "int_parsing": "expected a whole number, got {got}",
    "int_type": "expected a whole number, got {got}",
    "int_from_float": "expected a whole number, got {got}",
    "bool_parsing": "expected true or false, got {got}",
    "bool_type": "expected true or false, got {got}",
    "string_type": "expected text, got {got}",
    "list_type": "expected a list, got {got}",
    "dict_type": "expected a mapping of keys, got {got}",
    "model_type": "expected a mapping of keys, got {got}",
    "model_attributes_type": "expected a mapping of keys, got {got}",
}
_BOUNDS = {
    "greater_than": "greater than",
    "greater_than_equal": "at least",
    "less_than": "less than",
    "less_than_equal": "at most",
}


def _shown(value: Any) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _fields_at(loc: list[Any]) -> list[str]:
    """The keys the model accepts at a location, for "did you mean"."""
    model: Any = Playbook
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return []
        model = _model_in(field.annotation)
        if model is None:
            return []
    return sorted(model.model_fields) if hasattr(model, "model_fields") else []


def _model_in(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def mark_for(root: yaml.Node | None, loc: list[Any], key_node: bool) -> tuple[int, int] | None:
    """Line and column (1-based) of the node at ``loc``; nearest parent if absent."""
    node = root
    best = (node.start_mark.line + 1, node.start_mark.column + 1) if node is not None else None
    for i, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    last = i == len(loc) - 1
                    node = key if (last and key_node) else value
                    break
            else:
                return best
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
        else:
            return best
        best = (node.start_mark.line + 1, node.start_mark.column + 1)
    return best


def playbook_json_schema() -> dict[str, Any]:
    schema = Playbook.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "remotemac playbook"
    return schema
