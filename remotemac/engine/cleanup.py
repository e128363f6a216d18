"""End of rental: remove everything remotemac put on a host, verify, write a record.

What is removed comes from three sources, merged: the host's ``inventory.json``,
the laptop's journal (its inventory table and every run on this host, with the
paths its phases recorded) and a scan of ``remote_root`` (runs/, envs/, agent/, runtime/),
of ``remotemac-*`` tmux sessions, /dev/shm or /Volumes RAM stores and dead-man
jobs that can be attributed to a known run or to the root. So it still works
when inventory.json is partly gone, or when the journal knows runs the host
forgot (and the other way round).

Nothing is written on the host to do this: the agent's code travels on stdin to
``python3 -c <bootstrap>`` and runs from memory (engine/agentship.py). Installing the
agent first would create the very ``remote_root`` a second cleanup must find gone, and
leave a copy.

The record goes to ``--out`` when given, else ``<home>/cleanups/cleanup-<host>-<UTC time>/``:
``cleanup.json``, ``cleanup.md`` and ``ledger.jsonl`` (every command run on the
host). ``--dry-run`` prints the plan and writes nothing, locally or on the host.
Exit codes: 0 clean and verified (also: nothing to do), 1 something could not be
removed (the record says what and why), 2 bad input or no answer, 3 host
unreachable (the record says "not verified").
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from remotemac.agent.protocol import JsonObject, Op
from remotemac.engine.agentclient import call_in_memory
from remotemac.engine.context import expand_root
from remotemac.engine.jsonpart import JsonPart
from remotemac.engine.ledger import Ledger
from remotemac.engine.phaseresults import ProvisionResult, SyncResult
from remotemac.errors import EXIT_HOST, BadInput, Declined, HostError, RemotemacError
from remotemac.journal import Journal
from remotemac.transport.base import Transport
from remotemac.transport.options import SSHOptions
from remotemac.units import format_size, iso_utc


@dataclass
class Item(JsonPart):
    """One thing cleanup knows of, plans for or removed: a run dir, a venv, a RAM store,
    a dead-man job, a tmux session, a data key …; where it was known from and its fate.

    The same object travels as the journal's knowledge (kind, path, run_id) to the host,
    comes back in the host's plan with its fate, bytes and why, and goes into
    ``cleanup.json`` as it came (its keys, in order: the record reads the same)."""

    kind: str = ""
    path: str = ""
    run_id: str | None = None
    root: str | None = None
    fate: str | None = None
    bytes: int | None = None
    why: str | None = None
    sources: list[str] | None = None


@dataclass
class Knowledge:
    """What the laptop's journal knows about one host."""

    runs: list[str] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)
    run_roots: dict[str, str] = field(default_factory=dict)
    items: list[Item] = field(default_factory=list)


@dataclass
class RootAnswer(JsonPart):
    """The host's plan (or deed) for one remote_root: its items, or why it refused the
    root; what remains after, the bytes freed and whether it checked it is gone."""

    root: str = ""
    real_root: str | None = None
    refused: str | None = None
    notes: list[str] | None = None
    bytes_freed: int | None = None
    verified: bool | None = None
    items: list[Item] = field(default_factory=list)
    remaining: list[Item] = field(default_factory=list)

    PARTS = {"items": Item, "remaining": Item}

    def summary(self) -> RootAnswer:
        """The record's ``remote_roots`` entry: the root without its item lists."""
        return RootAnswer.with_keys(
            root=self.root,
            real_root=self.real_root,
            refused=self.refused,
            notes=self.notes,
            bytes_freed=self.bytes_freed,
            verified=self.verified,
        )


@dataclass
class CleanupAnswer(JsonPart):
    """The agent's ``cleanup_host`` answer: per root, and the host's facts."""

    roots: list[RootAnswer] = field(default_factory=list)
    host: JsonObject | None = None

    PARTS = {"roots": RootAnswer}


@dataclass
class JournalSeen(JsonPart):
    """The record's ``journal``: the runs the laptop knew on the host, and how many items."""

    runs: list[str] = field(default_factory=list)
    items: int = 0


@dataclass
class CleanupRecord(JsonPart):
    """``cleanup.json``: every item and its fate, bytes freed, what remains and why."""

    schema: str = "remotemac-cleanup/1"
    host: str = ""
    host_name: str = ""
    host_key_fingerprint: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    dry_run: bool = False
    status: str = ""
    verified: bool = False
    error: str | None = None
    remote_roots: list[RootAnswer] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    bytes_freed: int = 0
    bytes_to_free: int = 0
    not_removed: list[Item] = field(default_factory=list)
    remaining: list[Item] = field(default_factory=list)
    journal: JournalSeen = field(default_factory=JournalSeen)
    host_facts: JsonObject | None = None

    PARTS = {
        "remote_roots": RootAnswer,
        "items": Item,
        "not_removed": Item,
        "remaining": Item,
        "journal": JournalSeen,
    }


def _same_host(a: str, b: str, name: str) -> bool:
    if a in (b, name):
        return True
    if "local" in (a, b):
        return False
    try:
        from remotemac.transport.sshconfig import resolve

        return resolve(a).display == name
    except Exception:  # an unresolvable old spec is simply another host
        return False


def journal_knowledge(journal: Journal, host: str, name: str) -> Knowledge:
    """Runs on ``host`` and every path their phases and the inventory table recorded."""
    know = Knowledge()
    for row in journal.list_runs(limit=1_000_000):
        if not _same_host(row.host, host, name):
            continue
        know.runs.append(row.run_id)
        phases = journal.phases(row.run_id)
        info = ProvisionResult.from_row(phases.get("provision")).host("remote")
        if info.root:
            know.run_roots[row.run_id] = info.root
            if info.root not in know.roots:
                know.roots.append(info.root)
        if info.run_dir:
            know.items.append(Item.with_keys(kind="run", path=info.run_dir, run_id=row.run_id))
        ram = SyncResult.from_row(phases.get("sync")).ram("remote")
        if ram.kind in ("shm", "ramdisk") and ram.path:
            know.items.append(Item.with_keys(kind="ramstore", path=ram.path, run_id=row.run_id))
    seen = {(i.kind, i.path) for i in know.items}
    for alias in {host, name}:
        for row_json in journal.inventory(alias):
            entry = Item.from_json(row_json)
            if entry.kind == "root":  # recorded before provision wrote anything
                if entry.path not in know.roots:
                    know.roots.append(entry.path)
                if entry.run_id:
                    know.run_roots.setdefault(entry.run_id, entry.path)
                continue
            if (entry.kind, entry.path) not in seen:
                seen.add((entry.kind, entry.path))
                know.items.append(
                    Item.with_keys(kind=entry.kind, path=entry.path, run_id=entry.run_id)
                )
    return know


def _assign_roots(know: Knowledge, roots: list[str]) -> tuple[list[Item], list[Item]]:
    """Give each journal item its root; items under no root cannot be removed safely."""
    assigned, orphans = [], []
    for item in know.items:
        path = item.path
        root = next((r for r in roots if path == r or path.startswith(r.rstrip("/") + "/")), None)
        if root is None and item.kind in ("ramstore", "deadman", "tmux"):
            root = know.run_roots.get(item.run_id or "", roots[0])
            root = root if root in roots else roots[0]
        if root is None:
            orphans.append(
                item.but(
                    sources=["journal"],
                    fate="failed",
                    bytes=0,
                    why="outside every remote_root: not touched",
                )
            )
        else:
            assigned.append(item.but(root=root))
    return assigned, orphans


def host_key_fingerprint(transport: Transport) -> str:
    """SHA256 fingerprint of the key the host showed on this connection."""
    if not transport.has_link():
        return "n/a (local host, no SSH)"
    return transport.host_key_fingerprint() or "unknown"


def default_out_dir(host: str, when: float, home: Path) -> Path:
    """``<home>/cleanups/cleanup-<host>-<UTC time>``: with the journal, not in the cwd."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(when))
    return Path(home) / "cleanups" / f"cleanup-{safe}-{stamp}"


def _flatten(answer: CleanupAnswer) -> list[Item]:
    items = []
    for root in answer.roots:
        if root.refused:
            items.append(
                Item.with_keys(
                    kind="root",
                    path=root.root,
                    fate="failed",
                    bytes=0,
                    why=root.refused,
                    sources=["playbook"],
                    root=root.root,
                )
            )
            continue
        items += [item.but(root=root.root) for item in root.items]
    return items


def build_record(
    *,
    host: str,
    name: str,
    fingerprint: str,
    started: float,
    dry_run: bool,
    answer: CleanupAnswer | JsonObject | None,
    know: Knowledge,
    extra_items: list[Item],
    error: str | None = None,
) -> CleanupRecord:
    """cleanup.json: every item and its fate, bytes freed, what remains and why."""
    answer = CleanupAnswer.from_json(answer) if answer is not None else None
    items = (_flatten(answer) if answer else []) + extra_items
    roots = [root.summary() for root in answer.roots] if answer else []
    remaining = (
        [r.but(root=root.root) for root in answer.roots for r in root.remaining] if answer else []
    )
    not_removed = [
        Item.with_keys(kind=i.kind, path=i.path, why=i.why or "failed")
        for i in items
        if i.fate == "failed"
    ]
    not_removed += [Item.with_keys(kind=r.kind, path=r.path, why=r.why) for r in remaining]
    if error is not None:
        status, verified = "not verified", False
    elif dry_run:
        status, verified = "dry run", False
    else:
        verified = not not_removed and all(r.verified for r in roots)
        status = "clean" if verified else "not clean"
    return CleanupRecord(
        host=host,
        host_name=name,
        host_key_fingerprint=fingerprint,
        started_at=iso_utc(started),
        finished_at=iso_utc(time.time()),
        dry_run=dry_run,
        status=status,
        verified=verified,
        error=error,
        remote_roots=roots,
        items=items,
        bytes_freed=_bytes(items, "removed"),
        bytes_to_free=_bytes(items, "would remove"),
        not_removed=not_removed,
        remaining=remaining,
        journal=JournalSeen(runs=know.runs, items=len(know.items)),
        host_facts=answer.host if answer else None,
    )


def _bytes(items: list[Item], fate: str) -> int:
    return sum(int(i.bytes or 0) for i in items if i.fate == fate)


def render_markdown(record: CleanupRecord | JsonObject) -> str:
    """``cleanup.md`` of a record (as built, or as ``cleanup.json`` has it)."""
    record = CleanupRecord.from_json(record)
    lines = [
        f"# Cleanup of {record.host}",
        "",
        f"- status: **{record.status}**",
        f"- host: {record.host_name}",
        f"- host key: {record.host_key_fingerprint}",
        f"- started: {record.started_at}, finished: {record.finished_at}",
        f"- freed: {format_size(record.bytes_freed)} ({record.bytes_freed} bytes)",
    ]
    if record.error:
        lines.append(f"- not verified: {record.error}")
    for root in record.remote_roots:
        lines.append(
            f"- remote_root: {root.root}" + (f" (refused: {root.refused})" if root.refused else "")
        )
        for note in root.notes or []:
            lines.append(f"  - note: {note}")
    lines += ["", "| kind | item | fate | bytes | why | known from |", "|---|---|---|---:|---|---|"]
    for item in record.items:
        lines.append(
            f"| {item.kind} | `{item.path}` | {_fate(item)} | "
            f"{item.bytes or 0} | {item.why or ''} | "
            f"{', '.join(item.sources or [])} |"
        )
    lines += ["", "## Not removed", ""]
    if record.not_removed:
        lines += [f"- {r.kind} `{r.path}`: {r.why}" for r in record.not_removed]
    elif record.status == "not verified":
        lines.append("- unknown: the host could not be checked")
    else:
        lines.append("- nothing")
    return "\n".join(lines) + "\n"


def _fate(item: Item) -> str:
    """An item's fate as shown; ``?`` for one written without (the key absent)."""
    return "?" if item.fate is None and "fate" not in (item.row_keys or ()) else str(item.fate)


def write_record(out_dir: Path, record: CleanupRecord) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record.to_json(), indent=2) + "\n"
    (out_dir / "cleanup.json").write_text(text, encoding="utf-8")
    (out_dir / "cleanup.md").write_text(render_markdown(record), encoding="utf-8")


def _summary(record: CleanupRecord, out_dir: Path | None) -> str:
    counts: dict[str, int] = {}
    for item in record.items:
        counts[_fate(item)] = counts.get(_fate(item), 0) + 1
    parts = ", ".join(f"{n} {fate}" for fate, n in sorted(counts.items())) or "nothing found"
    # the record's path on a line of its own: the summary then fits 80 columns
    where = f"\n  record: {out_dir}" if out_dir else ""
    return (
        f"cleanup {record.host}: {record.status} ({parts}, "
        f"{format_size(record.bytes_freed)} freed){where}"
    )


def _plan_lines(record: CleanupRecord) -> list[str]:
    """The dry run's lines; names come from the host's listings, so they are shown escaped."""
    from remotemac.termsafe import escape_controls as esc

    lines = [f"dry run: cleanup of {esc(record.host)} would remove:"]
    for item in record.items:
        if item.fate == "would remove":
            # size first, path last: a long path only runs past the edge at its end,
            # never pushing "16.4 MiB" onto two lines
            size = format_size(item.bytes or 0)
            lines.append(f"  {item.kind:9} {size:>10}  {esc(item.path)}")
    for item in record.items:
        if item.fate == "failed":
            lines.append(f"  NOT {item.kind:5} {esc(item.path)}: {esc(str(item.why))}")
        elif item.fate == "left alone":
            lines.append(f"  KEEP {item.kind:4} {esc(item.path)}: {esc(str(item.why))}")
    lines.append(f"  total {format_size(record.bytes_to_free)}; nothing was touched")
    return lines


def _local_keys(home: Path, runs: list[str], dry_run: bool) -> list[Item]:
    """The laptop's data keys of runs on this host: crypto-shred what is left."""
    from remotemac.data.keys import destroy_data_key, key_path

    items = []
    for run_id in runs:
        try:
            path = key_path(home, run_id)
        except BadInput:
            continue
        if not path.exists():
            continue
        if dry_run:
            fate = "would remove"
        else:
            fate = "removed" if destroy_data_key(home, run_id) else "not found"
        items.append(
            Item.with_keys(
                kind="local-key",
                path=str(path),
                run_id=run_id,
                fate=fate,
                bytes=0,
                sources=["local"],
                root=None,
            )
        )
    return items


def _has_work(answer: CleanupAnswer) -> bool:
    return any(i.fate == "would remove" for i in _flatten(answer))


async def main_cleanup(
    host: str,
    *,
    journal: Journal,
    home: Path,
    ssh: SSHOptions | None = None,
    dry_run: bool = False,
    yes: bool = False,
    as_json: bool = False,
    remote_root: str = "~/remotemac",
    out: str | Path | None = None,
    confirm: Callable[[str], bool] | None = None,
    echo: Callable[[str], None] | None = None,
) -> int:
    """``remotemac cleanup HOST``; returns the exit code (see the module docstring).

    ``journal`` and ``home`` are the laptop's (what runs it knows of, where the record
    and the data keys are); ``ssh`` says how to reach ``host``.
    """
    from remotemac.engine.hosts import open_transport
    from remotemac.playbook import check_remote_root

    echo = echo or _print_line
    try:
        check_remote_root(remote_root)
    except ValueError as exc:
        raise BadInput(f"--remote-root: {exc}") from None
    started = time.time()
    transport = open_transport(host, home, ssh)
    know = journal_knowledge(journal, host, transport.name)
    out_dir = Path(out) if out else default_out_dir(host, started, home)
    ledger = Ledger(out_dir / "ledger.jsonl", hold=True)  # written with the record only
    asked = _Asked(host, started)
    try:
        await _ask_host(
            asked, transport, ledger, know, home, remote_root, yes, echo, confirm, dry_run=dry_run
        )
    except (HostError, OSError) as exc:
        asked.error = (
            exc.line() if isinstance(exc, RemotemacError) else f"{type(exc).__name__}: {exc}"
        )
    finally:
        await transport.close()
    if asked.error is not None:
        return _unreachable(
            asked,
            transport.name,
            know,
            out_dir,
            ledger,
            dry_run=dry_run,
            as_json=as_json,
            echo=echo,
        )
    keys = _local_keys(home, know.runs, dry_run)
    record = asked.record(
        transport.name, dry_run=dry_run, know=know, extra_items=asked.orphans + keys
    )
    if dry_run:
        echo(json.dumps(record.to_json()) if as_json else "\n".join(_plan_lines(record)))
        return 0
    _update_journal(journal, host, transport.name, record)
    write_record(out_dir, record)
    ledger.flush()
    echo(json.dumps(record.to_json()) if as_json else _summary(record, out_dir))
    return 0 if record.verified else 1


@dataclass
class _Asked:
    """What the host answered (or why it did not) during one cleanup."""

    host: str
    started: float
    answer: CleanupAnswer | None = None
    fingerprint: str = "unknown"
    error: str | None = None
    orphans: list[Item] = field(default_factory=list)

    def record(
        self,
        name: str,
        *,
        dry_run: bool,
        know: Knowledge,
        extra_items: list[Item],
        answer: CleanupAnswer | None = None,
    ) -> CleanupRecord:
        """build_record with the facts of the host and of this cleanup: what the host
        answered (``answer``: its plan instead) or, with an error, why it did not."""
        return build_record(
            host=self.host,
            name=name,
            fingerprint=self.fingerprint,
            started=self.started,
            dry_run=dry_run,
            # with an error the host did not do what it answered before: no answer
            answer=None if self.error is not None else answer or self.answer,
            know=know,
            extra_items=extra_items,
            error=self.error,
        )


async def _ask_host(
    asked: _Asked,
    transport: Transport,
    ledger: Ledger,
    know: Knowledge,
    home: Path,
    remote_root: str,
    yes: bool,
    echo: Callable[[str], None],
    confirm: Callable[[str], bool] | None,
    *,
    dry_run: bool,
) -> None:
    """Plan on the host (a dry run there), ask the user when there is work and no
    ``--yes``, then clean; fills ``asked`` as it goes (a link error leaves it partial)."""
    await transport.connect()
    asked.fingerprint = host_key_fingerprint(transport)
    host_home = await transport.home()
    primary = expand_root(remote_root, host_home)
    roots = [primary] + [r for r in know.roots if r != primary]
    known, asked.orphans = _assign_roots(know, roots)
    request = {"roots": roots, "known": [i.to_json() for i in known], "run_ids": know.runs}
    plan = CleanupAnswer.from_json(
        await call_in_memory(transport, ledger, Op.CLEANUP_HOST, dict(request, dry_run=True))
    )
    if dry_run:
        asked.answer = plan
        return
    if (_has_work(plan) or _local_key_work(home, know.runs)) and not yes:
        record = asked.record(
            transport.name,
            dry_run=True,
            answer=plan,
            know=know,
            extra_items=_local_keys(home, know.runs, True),
        )
        for line in _plan_lines(record):
            echo(line)
        # the front end asks; without a way to ask, nothing is removed
        question = f"Remove all of this from {transport.name}?"
        if confirm is None or not confirm(question):
            raise Declined("cleanup not confirmed: nothing was removed")
    asked.answer = CleanupAnswer.from_json(
        await call_in_memory(transport, ledger, Op.CLEANUP_HOST, dict(request, dry_run=False))
    )


def _unreachable(
    asked: _Asked,
    name: str,
    know: Knowledge,
    out_dir: Path,
    ledger: Ledger,
    *,
    dry_run: bool,
    as_json: bool,
    echo: Callable[[str], None],
) -> int:
    """The host could not be reached (or answered a link error): a record that says
    "not verified", each journal item "not attempted"; exit 3."""
    journal_items = [
        i.but(fate="not attempted", why="host unreachable", bytes=0, sources=["journal"])
        for i in know.items
    ]
    record = asked.record(name, dry_run=dry_run, know=know, extra_items=journal_items)
    if not dry_run:
        write_record(out_dir, record)
        ledger.flush()
    echo(
        json.dumps(record.to_json())
        if as_json
        else f"cleanup {asked.host}: not verified: {asked.error}"
        + ("" if dry_run else f"\n  record: {out_dir}")
    )
    return EXIT_HOST


def _local_key_work(home: Path, runs: list[str]) -> bool:
    return bool(_local_keys(home, runs, True))


def _update_journal(journal: Journal, host: str, name: str, record: CleanupRecord) -> None:
    """Mark what the host no longer has as removed in the journal's inventory."""
    gone = {(i.kind, i.path) for i in record.items if i.fate in ("removed", "not found")}
    for alias in {host, name}:
        for row in journal.inventory(alias):
            if record.verified or (row["kind"], row["path"]) in gone:
                journal.record_removed(alias, row["kind"], row["path"])


def _print_line(text: str) -> None:
    """Default output: one line on stdout (the CLI passes its own, the TUI a buffer)."""
    print(text, flush=True)
