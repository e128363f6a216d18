"""Host side of end-of-rental cleanup: find what remotemac left under a root, remove it.

It removes things the way the run wipe does, under the safety rules written out
in wipeops.py (only below the real path of ``root``, only what carries remotemac's
marker, every file operation through safefs.py, a process signalled only when it
is the one remotemac started). Cleanup adds: a root without a marker is left
alone, with what was found in it; a root is removed only when nothing but
remotemac's own entries is left in it; a dead-man job outside ``root`` is only
touched when its name carries a known run id or names ``root`` on a
path-component boundary.

Python 3.9, standard library only; siblings are imported by plain name, as in
wipeops.py (``cleanup`` preloads them all from stdin: see engine/cleanup.py).
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from . import deadman, procid, safefs
from .agentutil import cmdline, kill_session, tmux_sessions
from .deadman import DeadmanJob, Fate, Steps, sleeper_job
from .protocol import JsonObject
from .rootclaim import op_claim_root  # noqa: F401 (cleanupops serves it too)
from .wipeops import (
    VOLUMES,
    RamStore,
    UnsafeRoot,
    below,
    check_root,
    destroy_ram,
    find_ram_store,
    listdir_or_empty,
    ownership,
    ram_refusal,
    remove_item,
    session_name,
    stop_run_processes,
    strays_naming,
    tree_size,
)

_HERE = os.path.dirname(os.path.abspath(globals().get("__file__") or "."))


@dataclass
class Listed:
    """An item the inventory or the laptop's journal lists (``kind``, ``path``,
    ``run_id``; a journal item may name its ``root``). ``rest``: its other keys (a
    dead-man's pid and label, ``created_at`` …), passed on into the plan's entry."""

    kind: str
    path: str
    run_id: Optional[str] = None
    root: Optional[str] = None
    rest: JsonObject = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: JsonObject) -> Listed:
        return cls(
            kind=str(data.get("kind")),
            path=str(data["path"]),
            run_id=data.get("run_id"),
            root=data.get("root"),
            rest={k: v for k, v in data.items() if k not in ("kind", "path", "run_id", "root")},
        )

    def to_json(self) -> JsonObject:
        out: JsonObject = {"kind": self.kind, "path": self.path, "run_id": self.run_id}
        if self.root is not None:
            out["root"] = self.root
        out.update(self.rest)
        return out


@dataclass
class CleanupRequest:
    """The ``cleanup_host`` request: ``roots``, the journal's ``known`` items,
    ``run_ids``, ``dry_run``."""

    roots: List[str] = field(default_factory=list)
    known: List[Listed] = field(default_factory=list)
    run_ids: List[str] = field(default_factory=list)
    dry_run: bool = False

    @classmethod
    def from_json(cls, data: JsonObject) -> CleanupRequest:
        return cls(
            roots=list(data.get("roots") or []),
            known=[Listed.from_json(k) for k in data.get("known") or []],
            run_ids=list(data.get("run_ids") or []),
            dry_run=bool(data.get("dry_run")),
        )


@dataclass
class CleanupEntry:
    """One entry of a root's cleanup plan: what (``kind``, ``path``), whose (``run_id``),
    known from where (``sources``: inventory, journal, found, playbook) and, once
    disposed of, its ``fate``. The plan is the same for the dry run and the real one."""

    kind: str
    path: str
    run_id: Optional[str] = None
    sources: List[str] = field(default_factory=list)
    #: a RAM store's kind (shm or ramdisk)
    ram_kind: Optional[str] = None
    #: the live dead-man job behind a ``deadman`` entry (never in the answer)
    job: Optional[DeadmanJob] = None
    fate: Optional[Fate] = None
    #: the listing's other keys, passed on as listed
    rest: JsonObject = field(default_factory=dict)

    @property
    def key(self) -> Tuple[str, str]:
        return (self.kind, self.path)

    @property
    def fate_is(self) -> str:
        return self.fate.fate if self.fate is not None else ""

    @property
    def bytes(self) -> int:
        return self.fate.bytes if self.fate is not None else 0

    def to_json(self) -> JsonObject:
        out: JsonObject = {"kind": self.kind, "path": self.path}
        if self.kind != "root":  # the root's own entry names no run
            out["run_id"] = self.run_id
        out["sources"] = self.sources
        for k, v in self.rest.items():
            out.setdefault(k, v)
        if self.ram_kind is not None:
            out["ram_kind"] = self.ram_kind
        if self.fate is not None:
            out.update(self.fate.to_json())
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> CleanupEntry:
        own = ("kind", "path", "run_id", "sources", "ram_kind")
        fates = ("fate", "bytes", "why", "notes", "foreign")
        return cls(
            kind=data["kind"],
            path=data["path"],
            run_id=data.get("run_id"),
            sources=list(data.get("sources") or []),
            ram_kind=data.get("ram_kind"),
            fate=Fate.from_json(data) if "fate" in data else None,
            rest={k: v for k, v in data.items() if k not in own + fates},
        )


@dataclass
class Leftover:
    """What is still there after a cleanup, and why it matters."""

    kind: str
    path: str
    why: str

    def to_json(self) -> JsonObject:
        return {"kind": self.kind, "path": self.path, "why": self.why}

    @classmethod
    def from_json(cls, data: JsonObject) -> Leftover:
        return cls(str(data["kind"]), str(data["path"]), str(data["why"]))


@dataclass
class RootReport:
    """One root's part of the ``cleanup_host`` answer (``refused``: the root was left
    alone, nothing listed)."""

    root: str
    real_root: str = ""
    items: List[CleanupEntry] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    remaining: List[Leftover] = field(default_factory=list)
    bytes_freed: int = 0
    bytes_to_free: int = 0
    verified: bool = False
    run_ids: List[str] = field(default_factory=list)
    refused: Optional[str] = None

    _KEYS = ("root", "real_root", "notes", "bytes_freed", "bytes_to_free", "verified", "run_ids")
    _REFUSED = ("root", "refused", "items", "remaining", "bytes_freed", "verified")
    _ALL = _KEYS[:2] + ("items",) + _KEYS[2:3] + ("remaining",) + _KEYS[3:]

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            k: getattr(self, k) for k in (self._REFUSED if self.refused is not None else self._ALL)
        }
        out.update(items=[i.to_json() for i in self.items])
        out.update(remaining=[r.to_json() for r in self.remaining])
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> RootReport:
        return cls(
            **{k: data[k] for k in cls._KEYS + ("refused",) if k in data},
            items=[CleanupEntry.from_json(i) for i in data.get("items") or []],
            remaining=[Leftover.from_json(r) for r in data.get("remaining") or []],
        )


def read_inventory(real_root: str) -> Tuple[List[Listed], Optional[str]]:
    """Items of ``inventory.json`` and a note when it is missing or damaged (a FIFO or
    a link there is never opened)."""
    path = os.path.join(real_root, "inventory.json")
    if os.path.islink(path):
        return [], "inventory.json is a symlink: ignored"
    if not os.path.lexists(path):
        return [], "inventory.json missing"
    data = safefs.read_json_file(path)
    if not isinstance(data, dict):
        return [], "inventory.json unreadable (not a regular JSON file)"
    items = [
        Listed.from_json(i) for i in data.get("items", []) if isinstance(i, dict) and i.get("path")
    ]
    return items, None


_Items = Dict[Tuple[str, str], CleanupEntry]


def _add(
    items: _Items,
    kind: str,
    path: str,
    source: str,
    run_id: Optional[str] = None,
    rest: Optional[JsonObject] = None,
    ram_kind: Optional[str] = None,
    job: Optional[DeadmanJob] = None,
) -> None:
    item = items.get((kind, path))
    if item is None:
        item = items[(kind, path)] = CleanupEntry(kind, path, run_id)
    if source not in item.sources:
        item.sources.append(source)
    if run_id and not item.run_id:
        item.run_id = run_id
    for k, v in (rest or {}).items():
        item.rest.setdefault(k, v)
    if item.ram_kind is None:
        item.ram_kind = ram_kind
    if item.job is None:
        item.job = job


@dataclass
class Found:
    """Everything remotemac made for one root: the plan before anything is disposed of."""

    root: str
    real_root: str
    items: _Items
    notes: List[str]
    run_ids: List[str]
    exists: bool
    #: the root's ownership marker (safefs), or a stand-in (:func:`only_agents`)
    marker: Optional[Dict[str, Any]]


def collect(root: str, known: List[Listed], run_ids: List[str]) -> Found:
    """Everything remotemac made for ``root``: from inventory, journal and a scan."""
    lexical, real_root = check_root(root)
    items: _Items = {}
    notes: List[str] = []
    ids = set(r for r in run_ids if r)
    root_exists = os.path.isdir(real_root)
    if os.path.islink(lexical):
        notes.append("remote_root %s is a symlink to %s" % (lexical, real_root))
    inventory, note = read_inventory(real_root) if root_exists else ([], None)
    if note:
        notes.append(note)
    listed = [(i, "inventory") for i in inventory] + [(i, "journal") for i in known]
    deadmen = _add_listed(items, ids, listed, lexical, real_root)
    if root_exists:
        _add_found(items, ids, real_root)
    ids.discard("")
    _add_live(items, ids, lexical, real_root)
    _add_deadmen(items, deadmen, ids, lexical, real_root)
    for item in list(items.values()):
        if item.kind == "ramstore" and item.ram_kind is None:
            item.ram_kind = "ramdisk" if item.path.startswith(VOLUMES + "/") else "shm"
    return Found(
        root=lexical,
        real_root=real_root,
        items=items,
        notes=notes,
        run_ids=sorted(ids),
        exists=root_exists,
        marker=safefs.marker_of(real_root) if root_exists else None,
    )


@dataclass
class _ListedDeadman:
    """A dead-man job the inventory or the journal lists, to be matched to the live ones."""

    spec: str
    sources: List[str] = field(default_factory=list)
    pid: Any = None
    label: Optional[str] = None
    plist: Optional[str] = None
    method: Optional[str] = None
    start: Optional[JsonObject] = None

    def note(self, listed: Listed, source: str) -> None:
        self.sources.append(source)
        for key in ("pid", "label", "plist", "method", "start"):
            if key in listed.rest:
                setattr(self, key, listed.rest[key])


def _add_listed(
    items: _Items,
    ids: Set[str],
    listed: List[Tuple[Listed, str]],
    lexical: str,
    real_root: str,
) -> Dict[str, _ListedDeadman]:
    """The inventory's and the journal's items (their run ids into ``ids``); the dead-man
    entries among them, by run id, to be matched to the live jobs (:func:`_add_deadmen`)."""
    deadmen: Dict[str, _ListedDeadman] = {}
    for item, source in listed:
        ids.add(item.run_id or "")
        path = _relocate(item.path, lexical, real_root)
        if item.kind == "deadman":  # matched to the live job below, by run id or pid
            deadmen.setdefault(item.run_id or path, _ListedDeadman(path)).note(item, source)
            continue
        rest = dict(item.rest)
        ram_kind = rest.pop("ram_kind", None)
        _add(items, item.kind, path, source, item.run_id, rest, ram_kind=ram_kind)
    return deadmen


def _add_found(items: _Items, ids: Set[str], real_root: str) -> None:
    """What a scan of the root's containers finds (each run dir's name into ``ids``)."""
    for sub, kind in CONTAINERS.items():
        base = os.path.join(real_root, sub)
        for name in listdir_or_empty(base):
            if kind == "run":
                ids.add(name)
            _add(items, kind, os.path.join(base, name), "found", name if kind == "run" else None)
    if os.path.lexists(os.path.join(real_root, "deadman")):
        _add(items, "deadman-dir", os.path.join(real_root, "deadman"), "found")


def _add_live(items: _Items, ids: Set[str], lexical: str, real_root: str) -> None:
    """The RAM stores of the runs in ``ids`` and the tmux sessions of those runs (or
    whose command names the root)."""
    for run_id in sorted(ids):
        ram = find_ram_store(run_id)
        if ram:
            _add(items, "ramstore", ram.path, "found", run_id, ram_kind=ram.kind)
    for session in tmux_sessions():
        name = session["name"]
        mine = any(name.startswith(session_name(r)) for r in ids) or (
            procid.names_path(session["command"], real_root)
            or procid.names_path(session["command"], lexical)
        )
        if mine:
            _add(items, "tmux", name, "found")


def _add_deadmen(
    items: _Items, deadmen: Dict[str, _ListedDeadman], ids: Set[str], lexical: str, real_root: str
) -> None:
    """The dead-man jobs still scheduled (found, or a listed sleeper still running), and
    the listed ones no longer scheduled (fired or cancelled) by their spec."""
    jobs = deadman.find_jobs([lexical, real_root], sorted(ids))
    for key, entry in deadmen.items():
        pid = entry.pid
        if (
            entry.method == "sleeper"
            and isinstance(pid, int)
            and not any(j.pid == pid for j in jobs)
            and "deadman.py" in cmdline(pid)
            and procid.same_start(pid, entry.start)
        ):
            jobs.append(sleeper_job(pid, key, entry.start))
    for job in jobs:
        _add(items, "deadman", job.what, "found", job.run_id, job=job)
        listed = deadmen.pop(job.run_id or "", None)
        if listed:
            items[("deadman", job.what)].sources += listed.sources
    for key, listed in deadmen.items():  # known but no longer scheduled: fired or cancelled
        for source in listed.sources:
            _add(items, "deadman", "spec:" + listed.spec, source, key)


#: the laptop's upload dirs below ``<root>/runtime`` (engine/bring.py, engine/runtime.py:
#: ``upload-<sha256 prefix>-<laptop pid>``): a brought archive or the runtime's wheels
#: on their way. The bring op removes one once used; an upload that a full disk, a cut
#: link or a killed laptop stopped leaves it unmarked (its marker could not be written
#: either), and it is remotemac's all the same: the root and its runtime dir are
UPLOAD_DIR = re.compile(r"upload-[0-9a-f]{12,64}-[0-9]+\Z")


def _is_upload_dir(path: str) -> bool:
    return bool(UPLOAD_DIR.match(os.path.basename(path))) and not os.path.islink(path)


def _relocate(path: str, lexical: str, real_root: str) -> str:
    """Inventory paths may use the lexical root; compare everything on the real one."""
    if path == lexical or path.startswith(lexical.rstrip("/") + "/"):
        return real_root + path[len(lexical) :]
    return path


_ORDER = {
    "deadman": 0,
    "tmux": 1,
    "ramstore": 2,
    "run": 3,
    "venv": 4,
    "agent": 5,
    "runtime": 6,
    "deadman-dir": 7,
}
#: directories of a root that hold one owned directory per run / venv / agent version
CONTAINERS = {"runs": "run", "envs": "venv", "agent": "agent", "runtime": "runtime"}
#: marker kind of each item kind that is a directory below the root
DIR_KINDS = {
    "run": "run",
    "venv": "venv",
    "agent": "agent",
    "runtime": "runtime",
    "deadman-dir": "deadman",
}
#: files remotemac keeps at the top of a root (removed last, with the root)
BOOKKEEPING = ("inventory.json", safefs.MARKER)


def op_cleanup_host(req: JsonObject) -> JsonObject:
    """Remove (or with ``dry_run`` only list) everything remotemac made for each root.

    Request: ``roots`` (list), ``known`` (items the laptop's journal knows:
    kind/path/run_id), ``run_ids``, ``dry_run``. Answer per root: every item with
    its fate, bytes, and what remains afterwards.
    """
    request = CleanupRequest.from_json(req)
    answers: List[RootReport] = []
    steps: Steps = []
    claimed: Set[Tuple[str, str]] = set()  # host-wide items a root already listed
    for root in request.roots:
        try:
            answers.append(_cleanup_root(root, request, steps, claimed))
        except UnsafeRoot as exc:
            answers.append(RootReport(root, refused=str(exc)))
    return {
        "roots": [a.to_json() for a in answers],
        "steps": steps,
        "host": _host_facts(),
        "dry_run": request.dry_run,
    }


#: items that live outside every root (a RAM store, a tmux session): each root's scan
#: finds them by run id, so the first root to list one answers for it
HOST_WIDE = ("ramstore", "tmux")


def _cleanup_root(
    root: str, req: CleanupRequest, steps: Steps, claimed: Set[Tuple[str, str]]
) -> RootReport:
    """One root: the same decisions for the dry run and the real one (only the last
    step, doing it, differs), so the dry run lists exactly what would go."""
    dry_run = req.dry_run
    known = [k for k in req.known if k.root in (None, root)]
    found = collect(root, known, req.run_ids)
    real_root, lexical = found.real_root, found.root
    if found.exists and found.marker is None:
        found.marker = only_agents(real_root)
    if found.exists and found.marker is None:
        _size, count = tree_size(real_root)
        raise UnsafeRoot(
            "%s: not made by remotemac (no marker; %d entries) - left alone"
            % (lexical, max(0, count - 1))
        )
    if found.exists and found.marker is not None and found.marker.get("kind") != "root":
        raise UnsafeRoot(
            "%s: marked as remotemac's %s, not a remote_root - left alone"
            % (lexical, found.marker.get("kind"))
        )
    items = sorted(found.items.values(), key=lambda i: (_ORDER.get(i.kind, 9), i.path))
    items = [i for i in items if i.key not in claimed]
    claimed.update(i.key for i in items if i.kind in HOST_WIDE)
    for item in items:
        item.fate = _dispose(item, real_root, lexical, found.marker, dry_run, steps)
    gone = set(i.path for i in items if i.fate_is in ("removed", "would remove"))
    counted = sum(
        i.bytes for i in items if i.fate_is == "would remove" and procid.is_below(i.path, real_root)
    )
    items.append(_finish_root(lexical, real_root, gone, dry_run, counted))
    remaining = [] if dry_run else verify(lexical, real_root, found.run_ids)
    return RootReport(
        root=lexical,
        real_root=real_root,
        items=items,
        notes=found.notes,
        remaining=remaining,
        bytes_freed=sum(i.bytes for i in items if i.fate_is == "removed"),
        bytes_to_free=sum(i.bytes for i in items if i.fate_is == "would remove"),
        verified=not dry_run and not remaining,
        run_ids=found.run_ids,
    )


def only_agents(real_root: str) -> Optional[Dict[str, Any]]:
    """A stand-in root marker for a root that lost its marker but holds nothing but
    remotemac's agent (``agent/<version>/``, each with the agent's marker), else None.

    An older ``attach`` after a cleanup re-created just that; such a root is
    remotemac's, so cleanup removes it instead of refusing it for ever."""
    if listdir_or_empty(real_root) != ["agent"]:
        return None
    agents = os.path.join(real_root, "agent")
    if os.path.islink(agents) or not os.path.isdir(agents):
        return None
    for name in listdir_or_empty(agents):
        path = os.path.join(agents, name)
        if os.path.islink(path) or not os.path.isdir(path):
            return None
        if (safefs.marker_of(path) or {}).get("kind") != "agent":
            return None
    return {"kind": "root", "adopted": "it holds only remotemac's agent"}


def _finish_root(
    lexical: str, real_root: str, gone: Set[str], dry_run: bool, counted: int = 0
) -> CleanupEntry:
    """Remove the root when nothing but remotemac's own entries is left in it.

    ``gone``: paths removed (or, in a dry run, that would be). Empty containers
    (runs/, envs/, agent/) and the bookkeeping files go with the root; anything
    else keeps the root, and its marker and inventory, for a later cleanup.
    """
    return CleanupEntry(
        "root",
        lexical,
        sources=["playbook"],
        fate=_root_fate(lexical, real_root, gone, dry_run, counted),
    )


def _root_fate(lexical: str, real_root: str, gone: Set[str], dry_run: bool, counted: int) -> Fate:
    if os.path.islink(lexical):
        return Fate("failed", why="remote_root is a symlink: not followed, remove it by hand")
    if not os.path.lexists(real_root):
        return Fate("not found")
    foreign: List[str] = []
    for name in listdir_or_empty(real_root):
        path = os.path.join(real_root, name)
        if (
            path in gone
            or name in BOOKKEEPING
            or name.startswith(("inventory.json.tmp-", safefs.MARKER + ".tmp-"))
        ):
            continue
        if name in CONTAINERS and os.path.isdir(path) and not os.path.islink(path):
            foreign += [
                os.path.join(path, n)
                for n in listdir_or_empty(path)
                if os.path.join(path, n) not in gone
            ]
            continue
        foreign.append(path)
    if foreign:
        shown = ", ".join(os.path.relpath(p, real_root) for p in foreign[:5])
        more = " and %d more" % (len(foreign) - 5) if len(foreign) > 5 else ""
        return Fate(
            "left alone",
            foreign=foreign[:50],
            why="kept: it holds %d entr%s remotemac did not make (%s%s); remove them "
            "by hand, then run cleanup again"
            % (len(foreign), "y" if len(foreign) == 1 else "ies", shown, more),
        )
    size, _count = tree_size(real_root)
    if dry_run:  # its runs and envs are listed with their own bytes: count them once
        return Fate("would remove", max(0, size - counted))
    try:
        fd = safefs.open_path(real_root)
    except (safefs.NotOurs, OSError) as exc:
        return Fate("failed", why=str(exc))
    try:
        # the marker goes last: a root that cannot be finished stays recognisable
        for name in sorted(safefs.names_at(fd), key=lambda n: (n == safefs.MARKER, n)):
            try:
                if name in CONTAINERS:  # empty by now: rmdir fails on anything new in it
                    os.rmdir(name, dir_fd=fd)
                elif name in BOOKKEEPING or name.startswith(
                    ("inventory.json.tmp-", safefs.MARKER + ".tmp-")
                ):
                    os.unlink(name, dir_fd=fd)
                else:
                    return Fate("failed", why="%s appeared meanwhile" % name)
            except OSError as exc:
                return Fate("failed", why="%s: %s" % (name, exc.strerror or exc))
    finally:
        os.close(fd)
    try:
        os.rmdir(real_root)
    except OSError as exc:
        return Fate("failed", why="%s: %s" % (real_root, exc.strerror or exc))
    return Fate("removed", size)


def _dispose(
    item: CleanupEntry,
    real_root: str,
    lexical: str,
    root_marker: Optional[Dict[str, Any]],
    dry_run: bool,
    steps: Steps,
) -> Fate:
    kind, path = item.kind, item.path
    if kind == "deadman":
        job = item.job
        if job is None:
            jobs = [j for j in deadman.find_jobs([lexical, real_root]) if j.what == path]
            job = jobs[0] if jobs else None
        if job is None:
            return Fate("not found", why="no longer scheduled (fired or cancelled by a wipe)")
        if dry_run:
            return Fate("would remove")
        return deadman.remove_job(job, steps)
    if kind == "tmux":
        alive = any(s["name"] == path for s in tmux_sessions())
        if not alive:
            return Fate("not found")
        if dry_run:
            return Fate("would remove")
        return Fate("removed" if kill_session(path, steps) else "failed")
    if kind == "ramstore":
        info = RamStore(path, item.ram_kind or "shm")
        if not os.path.lexists(path):
            return Fate("not found")
        if dry_run:
            refused = ram_refusal(info)
            return (
                Fate("failed", why=refused) if refused else Fate("would remove", tree_size(path)[0])
            )
        return destroy_ram(info, steps)
    if below(real_root, path) is None:
        return Fate("failed", why="outside remote_root: refused")
    if not os.path.lexists(path):
        return Fate("not found")
    not_ours = ownership(
        path, DIR_KINDS.get(kind, kind), root_marker, item.run_id if kind == "run" else None
    )
    if not_ours is not None and kind == "runtime" and _is_upload_dir(path):
        not_ours = None
    if not_ours is not None:
        return Fate("left alone", why=not_ours)
    if kind == "run" and not dry_run:
        stop_run_processes(path, steps, None, [path, _relocate_back(path, lexical, real_root)])
    return (
        remove_item(real_root, path, dry_run, overwrite=False)
        if kind != "run"
        else _remove_run(real_root, path, dry_run)
    )


def _relocate_back(path: str, lexical: str, real_root: str) -> str:
    return lexical + path[len(real_root) :] if procid.is_below(path, real_root) else path


def _remove_run(real_root: str, path: str, dry_run: bool) -> Fate:
    """A run dir; its tmp (the on-disk plaintext store) is zeroed first."""
    if not dry_run:
        tmp = remove_item(real_root, os.path.join(path, "tmp"), False, overwrite=True)
        if tmp.failed:
            return tmp
    return remove_item(real_root, path, dry_run)


def verify(lexical: str, real_root: str, run_ids: List[str]) -> List[Leftover]:
    """What is still there after cleanup, each with why it matters."""
    left: List[Leftover] = []
    if os.path.lexists(real_root):
        size, count = tree_size(real_root)
        left.append(
            Leftover("root", real_root, "still exists (%d entries, %d bytes)" % (count, size))
        )
    for run_id in run_ids:
        ram = find_ram_store(run_id)
        if ram:
            left.append(Leftover("ramstore", ram.path, "still exists"))
    for session in tmux_sessions():
        if (
            any(session["name"].startswith(session_name(r)) for r in run_ids)
            or procid.names_path(session["command"], real_root)
            or procid.names_path(session["command"], lexical)
        ):
            left.append(Leftover("tmux", session["name"], "still running"))
    for job in deadman.find_jobs([lexical, real_root]):
        left.append(Leftover("deadman", job.what, "still scheduled"))
    agents = [os.path.join(r, "agent") for r in (real_root, lexical)]
    for pid in strays_naming([real_root, lexical]):
        if any(procid.names_path(procid.cmdline(pid), a) for a in agents):
            continue  # remotemac's own agent on a link (this one's resident): ends with it
        left.append(
            Leftover(
                "process",
                "%s (%s)" % (pid, procid.cmdline(pid)[:120]),
                "still running: its command line names remote_root",
            )
        )
    return left


def _host_facts() -> JsonObject:
    """Who and where the host is, for the cleanup record (part of the answer)."""
    import platform

    return {
        "platform": sys.platform,
        "machine": platform.machine(),
        "user": os.environ.get("USER") or str(os.getuid()),
        "home": os.path.expanduser("~"),
        "time": time.time(),
    }
