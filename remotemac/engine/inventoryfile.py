"""The inventory file: which hosts a fleet has, in groups, with per-host vars.

Why a file of its own and not more playbook keys: the playbook says *what* to
run; the inventory says what the lab rents right now (which Macs, at what hourly
rate, until when). The same playbook then serves one Mac or sixteen.

Format (YAML)::

    macs:                          # a group
      vars: {hourly_rate: 1.10}    # applies to every host of the group
      hosts:
        mac-a: {rental_end: 2026-12-03T18:00:00+00:00}
        admin@10.0.0.7:2222: {remote_root: ~/rm, hourly_rate: 1.40}
    linux:
      hosts: [gpu-box]             # a plain list when there are no vars

A host is an ssh_config alias or ``[user@]host[:port]``. Host vars win over
group vars. Unknown keys are errors with a "did you mean", as in the playbook.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from remotemac.agent.protocol import JsonObject
from remotemac.errors import BadInput
from remotemac.playbook import MAX_HOSTS, check_host, check_remote_root
from remotemac.userfiles import BoundedLoader, read_user_file, yaml_error_where

#: a group or host name an error may quote: anything else may be a secret file's content
_QUOTABLE = re.compile(r"[A-Za-z0-9_.@:\[\]-]{1,80}")


def _shown(name: Any, what: str, index: int) -> str:
    """``name`` when it looks like a name; else its position, never its text (an
    ``--inventory /etc/shadow`` must not print a password hash)."""
    text = str(name)
    return text if _QUOTABLE.fullmatch(text) and "$" not in text else f"{what} #{index + 1}"


class HostVars(BaseModel):
    """What the inventory may say about one host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hourly_rate: float | None = Field(None, ge=0, description="rental price per hour")
    rental_end: datetime | None = Field(None, description="when the rental ends (with timezone)")
    remote_root: str | None = Field(None, description="this host's remote_root")

    @field_validator("rental_end")
    @classmethod
    def _tz(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("give rental_end a timezone, e.g. 2026-12-03T18:00:00+00:00")
        return value

    @field_validator("remote_root")
    @classmethod
    def _root(cls, value: str | None) -> str | None:
        return None if value is None else check_remote_root(value)


@dataclass
class Inventory:
    """Groups of hosts and each host's merged vars, in file order."""

    groups: dict[str, list[str]] = field(default_factory=dict)
    vars: dict[str, HostVars] = field(default_factory=dict)
    source: str = "<inventory>"

    def hosts(self) -> list[str]:
        return list(self.vars)

    def resolve(self, names: list[str] | None) -> list[str]:
        """Group names expand to their hosts; other names are hosts. None: every host."""
        if not names:
            return self.hosts()
        out: list[str] = []
        for name in names:
            for host in self.groups.get(name, [name]):
                if host not in out:
                    out.append(host)
        return out

    def host_vars(self, host: str) -> HostVars:
        return self.vars.get(host) or HostVars()


def load_inventory(path: str | Path) -> Inventory:
    file = Path(path)
    return parse_inventory(read_user_file(file, "inventory file"), str(file))


def parse_inventory(text: str, source: str = "<inventory>") -> Inventory:
    try:
        data = yaml.load(text, Loader=BoundedLoader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        raise BadInput(f"{yaml_error_where(exc, source)}: bad YAML in inventory") from None
    if not isinstance(data, dict) or not data:
        raise BadInput(
            f"{source}: an inventory is a mapping of groups",
            hint="e.g. macs: {hosts: [mac-a, mac-b]}",
        )
    inv = Inventory(source=source)
    # each host's vars as the YAML gave them (a JSON-shaped edge), merged, before
    # HostVars checks them
    host_raw: dict[str, JsonObject] = {}
    for number, (group, body) in enumerate(data.items()):
        where = f"{source}: {_shown(group, 'group', number)}"
        hosts, group_vars = _group(body, where)
        inv.groups[str(group)] = []
        if len(host_raw.keys() | hosts.keys()) > MAX_HOSTS:  # before checking each one
            raise BadInput(
                f"{source}: {_count_hosts(data)} hosts in the inventory: a fleet has at most "
                f"{MAX_HOSTS} hosts"
            )
        for index, (host, own) in enumerate(hosts.items()):
            if not _QUOTABLE.fullmatch(host) or "$" in host:
                raise BadInput(
                    f"{where}.hosts: host #{index + 1} is not a host name "
                    "(write an ssh alias or user@host:port)"
                )
            try:
                check_host(host)
            except ValueError as exc:
                raise BadInput(f"{where}.hosts: {exc}") from None
            merged = {**host_raw.get(host, {}), **group_vars, **own}
            host_raw[host] = merged
            inv.groups[str(group)].append(host)
    for host, raw in host_raw.items():
        try:
            inv.vars[host] = HostVars.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(_shown(p, "key", 0) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                guess = difflib.get_close_matches(key, list(HostVars.model_fields), n=1)
                msg = "unknown key" + (
                    f"; did you mean '{guess[0]}'?"
                    if guess
                    else f"; known keys: {', '.join(HostVars.model_fields)}"
                )
            raise BadInput(f"{source}: host {host}: {key}: {msg}") from None
    return inv


def _count_hosts(data: dict[Any, Any]) -> int:
    """How many hosts the inventory lists (for the refusal's line; each counted once)."""
    names: set[str] = set()
    for body in data.values():
        raw = body.get("hosts") if isinstance(body, dict) else body
        if isinstance(raw, (list, dict)):
            names.update(str(h if not isinstance(h, dict) else next(iter(h), "")) for h in raw)
    return len(names)


def _group(body: Any, where: str) -> tuple[dict[str, JsonObject], JsonObject]:
    """(hosts with their own vars, group vars) of one group's body, as the YAML gave them."""
    if isinstance(body, list):
        body = {"hosts": body}
    if not isinstance(body, dict):
        raise BadInput(f"{where}: a group is a list of hosts or a mapping with hosts/vars")
    unknown = set(body) - {"hosts", "vars"}
    if unknown:
        raise BadInput(f"{where}: unknown key {sorted(unknown)[0]!r} (a group has hosts, vars)")
    group_vars = body.get("vars") or {}
    if not isinstance(group_vars, dict):
        raise BadInput(f"{where}.vars: expected a mapping of vars")
    raw = body.get("hosts") or []
    hosts: dict[str, JsonObject] = {}
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, dict) and len(item) == 1:  # - mac-a: {vars}
                ((name, own),) = item.items()
                hosts[str(name)] = dict(own or {})
            else:
                hosts[str(item)] = {}
    elif isinstance(raw, dict):
        for name, own in raw.items():
            if own is not None and not isinstance(own, dict):
                raise BadInput(f"{where}.hosts.{name}: host vars must be a mapping")
            hosts[str(name)] = dict(own or {})
    else:
        raise BadInput(f"{where}.hosts: expected a list or a mapping of hosts")
    if not hosts:
        raise BadInput(f"{where}: the group has no hosts")
    return hosts, dict(group_vars)
