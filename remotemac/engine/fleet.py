"""Fleet runs: one playbook over many hosts and matrix variants, on one asyncio loop.

Why one loop and not a thread or a process per host: every run spends its time
waiting on SSH, so a coroutine per run costs a few hundred KiB where a process
would cost tens of MiB; 16 Macs are watched by one small orchestrator. A
semaphore (``--forks``) bounds how many runs are active at once, the transport
pool gives every host one SSH connection shared by all runs on it, and a run
that fails (host unreachable, job lost, a bug) is recorded and never stops the
others.

Each run is an ordinary run in the journal (its own run id, record and out dir
``<out>/<host>[/<variant>]``), so ``attach``, ``status`` and ``logs`` work on it
alone. The fleet adds ``fleet.json`` on top; remotemac.frontend.fleet prints the lines and
the summary table.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import JsonObject, Message
from remotemac.engine.context import RunOptions, specialize
from remotemac.engine.inventoryfile import HostVars, Inventory
from remotemac.engine.pool import TransportPool
from remotemac.engine.runs import register_run
from remotemac.engine.session import RunSession
from remotemac.errors import (
    EXIT_ACCEPTED,
    EXIT_BAD_INPUT,
    EXIT_HOST,
    EXIT_HOST_ENV,
    EXIT_INTEGRITY,
    EXIT_INTERRUPTED,
    EXIT_JOB_LOST,
    EXIT_REJECTED,
    BadInput,
    Declined,
    RemotemacError,
)
from remotemac.events import Event, PhaseFinished, Warning
from remotemac.journal import Journal, new_run_id
from remotemac.playbook import MAX_HOSTS, MatrixValue, Playbook
from remotemac.transport.options import SSHOptions
from remotemac.units import iso_utc

DEFAULT_FORKS = 8
#: a fleet polls each job's status every 2 s (a single run: every 0.25 s); with
#: 16 runs the faster pace would cost the hosts more agent calls than it is worth
FLEET_FOLLOW_POLL_S = 2.0
#: worst first: the fleet's exit code is the first of these any run ended with
EXIT_PRECEDENCE = (
    EXIT_INTERRUPTED,
    EXIT_JOB_LOST,
    EXIT_HOST,
    EXIT_INTEGRITY,
    EXIT_HOST_ENV,
    EXIT_BAD_INPUT,
    EXIT_REJECTED,
)
EXIT_RULE = (
    "0 every run accepted; 1 any run rejected or incomplete; 3 a host was unreachable; "
    "4 a job was lost (4 wins over 3, 3 over 1; 5 integrity, 6 host environment, "
    "2 bad input, "
    "130 interrupted as for one run)"
)
VERDICT_BY_CODE = {EXIT_JOB_LOST: "lost", EXIT_HOST: "unreachable", EXIT_INTERRUPTED: "interrupted"}

#: one combination of the playbook's matrix: its keys and this run's values (each a
#: MatrixValue; typed as context.specialize and fill_matrix take it)
Variant = dict[str, object]


@dataclass
class FleetRun:
    """One (host, variant) of the fleet and, once it ran, its outcome."""

    index: int
    host: str
    variant: Variant | None
    vars: HostVars
    out_dir: Path
    run_id: str = ""
    verdict: str = "pending"
    exit_code: int | None = None
    state: str = ""
    reason: str = ""
    started: float = 0.0
    duration_s: float | None = None
    cost: float | None = None
    currency: str = "USD"

    @property
    def label(self) -> str:
        return self.host + (f" [{variant_label(self.variant)}]" if self.variant else "")

    def row(self) -> JsonObject:
        """The run's row in ``fleet.json``."""
        return {
            "index": self.index,
            "host": self.host,
            "variant": self.variant,
            "run_id": self.run_id,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "state": self.state,
            "duration_s": self.duration_s,
            "cost": self.cost,
            "currency": self.currency,
            "reason": self.reason,
            "out_dir": str(self.out_dir),
        }


@dataclass
class FleetResult:
    fleet_id: str
    runs: list[FleetRun]
    exit_code: int
    duration_s: float
    connections: int
    summary_path: Path


@dataclass
class StoppingCondition(Message):
    """One of a record's ``stopping_conditions`` (acceptance/record.py writes them)."""

    code: str = ""
    detail: str | None = None


@dataclass
class RecordOutcome(Message):
    """What a fleet reads back from a run's ``acceptance.json``: why it was not accepted,
    and what it cost (the rest of the record stays in ``extra``)."""

    stopping_conditions: list[JsonObject] | None = None
    missing_observations: list[str] | None = None
    cost: JsonObject | None = None

    def reason(self) -> str:
        """The first stopping condition, else the observations missing, else ``""``."""
        if self.stopping_conditions:
            first = StoppingCondition.from_json(self.stopping_conditions[0])
            return first.detail or first.code
        missing = self.missing_observations or []
        return f"missing: {', '.join(missing)}" if missing else ""

    def amount(self) -> float | None:
        amount = CostLine.from_json(self.cost or {}).amount
        return float(amount) if amount is not None else None


@dataclass
class CostLine(Message):
    """A record's ``cost``."""

    amount: float | None = None
    currency: str | None = None


@dataclass
class CleanupHost:
    """One host of ``cleanup --all`` in ``cleanup-all.json``: where its record went, its
    exit code, and its error or record."""

    host: str
    remote_root: str
    out: str
    exit_code: int
    error: str | None = None
    record: JsonObject | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "host": self.host,
            "remote_root": self.remote_root,
            "out": self.out,
            "exit_code": self.exit_code,
        }
        if self.error is not None:
            out["error"] = self.error
        if self.record is not None:
            out["record"] = self.record
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> CleanupHost:
        return cls(**data)


# ---------------------------------------------------------------- planning


def variants(matrix: dict[str, list[MatrixValue]] | None) -> list[Variant | None]:
    """Every combination of the matrix, in key order; ``[None]`` without a matrix."""
    if not matrix:
        return [None]
    keys = list(matrix)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*matrix.values())]


def variant_label(variant: Variant | None) -> str:
    return ",".join(f"{k}={v}" for k, v in (variant or {}).items())


def _dir_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=,@-]", "_", text).strip(".") or "_"


def fleet_hosts(
    playbook: Playbook, hosts: list[str] | None, inventory: Inventory | None
) -> list[str]:
    """``--hosts`` over the playbook's hosts; inventory groups expand; all of it if none given."""
    names = hosts or (list(playbook.hosts) if playbook.hosts else None)
    if inventory is not None:
        return inventory.resolve(names)
    return names or [playbook.host]


def plan_runs(
    playbook: Playbook, hosts: list[str], inventory: Inventory | None, out_root: Path
) -> list[FleetRun]:
    """One run per host; with a matrix, the variants are spread round-robin over the hosts."""
    if not hosts:
        raise BadInput("the fleet has no hosts", hint="give --hosts, hosts: or an inventory")
    if len(set(hosts)) != len(hosts):
        raise BadInput("a host appears twice in the fleet")
    if len(hosts) > MAX_HOSTS:
        raise BadInput(f"{len(hosts)} hosts: a fleet has at most {MAX_HOSTS} hosts")
    runs = []
    combos = variants(playbook.matrix)
    pairs = (
        [(h, None) for h in hosts]
        if combos == [None]
        else [(hosts[i % len(hosts)], v) for i, v in enumerate(combos)]
    )
    for i, (host, variant) in enumerate(pairs):
        out = out_root / _dir_name(host)
        if variant is not None:
            out = out / _dir_name(variant_label(variant))
        hv = inventory.host_vars(host) if inventory else HostVars()
        runs.append(
            FleetRun(
                index=i,
                host=host,
                variant=variant,
                vars=hv,
                out_dir=out,
                currency=playbook.cost.currency,
            )
        )
    return runs


def is_fleet(playbook: Playbook, hosts: list[str] | None, inventory: Inventory | None) -> bool:
    """More than one (host, variant), or an inventory: the fleet path, else a plain run."""
    count = len(fleet_hosts(playbook, hosts, inventory))
    return inventory is not None or count > 1 or len(variants(playbook.matrix)) > 1


def fleet_exit_code(runs: list[FleetRun]) -> int:
    codes = {r.exit_code for r in runs}
    for code in EXIT_PRECEDENCE:
        if code in codes:
            return code
    if any(r.exit_code not in (EXIT_ACCEPTED,) for r in runs):
        return EXIT_REJECTED
    return EXIT_ACCEPTED


# ---------------------------------------------------------------- running


class _HostGate:
    """The first run on a host provisions alone (agent upload, venv build); the rest follow.

    Two runs creating the same venv at once on one Mac would race; after the first
    provision the venv is reused by its hash and everything else is per run.
    """

    def __init__(self) -> None:
        self._first: dict[str, asyncio.Event] = {}

    async def enter(self, host: str) -> asyncio.Event | None:
        """None for the host's first run (it must call ``open``), else wait for it."""
        event = self._first.get(host)
        if event is None:
            self._first[host] = asyncio.Event()
            return self._first[host]
        await event.wait()
        return None


async def run_fleet(
    playbook: Playbook,
    runs: list[FleetRun],
    *,
    journal: Journal,
    home: Path,
    out_root: Path,
    options: RunOptions | None = None,
    ssh: SSHOptions | None = None,
    forks: int = DEFAULT_FORKS,
    sink: Callable[[Event], None] | None = None,
    fleet_id: str | None = None,
    max_channels: int = 8,
) -> FleetResult:
    """Run every planned run, at most ``forks`` at once; write fleet.json; never raise for one."""
    if forks < 1:
        raise BadInput("--forks must be at least 1")
    fleet_id = fleet_id or new_run_id(playbook.name)
    options = options or RunOptions(follow_poll_s=FLEET_FOLLOW_POLL_S)
    out_root.mkdir(parents=True, exist_ok=True)
    ssh = (ssh or SSHOptions()).for_playbook(playbook.connection.reconnect_deadline)
    pool = TransportPool(home, ssh, max_channels=max_channels)
    limit = asyncio.Semaphore(forks)
    gate = _HostGate()
    started = time.time()

    async def one(run: FleetRun) -> None:
        opened = await gate.enter(run.host)
        async with limit:
            try:
                await _one_run(
                    run,
                    playbook,
                    fleet_id,
                    journal=journal,
                    home=home,
                    options=options,
                    ssh=ssh,
                    pool=pool,
                    sink=sink,
                    provisioned=opened,
                )
            finally:
                if opened is not None:
                    opened.set()

    try:
        await asyncio.gather(*(one(r) for r in runs))
    finally:
        await pool.close_all()
    code = fleet_exit_code(runs)
    summary = write_summary(
        out_root,
        playbook,
        runs,
        fleet_id=fleet_id,
        exit_code=code,
        started=started,
        forks=forks,
        connections=pool.opened,
    )
    return FleetResult(fleet_id, runs, code, round(time.time() - started, 3), pool.opened, summary)


async def _one_run(
    run: FleetRun,
    playbook: Playbook,
    fleet_id: str,
    *,
    journal: Journal,
    home: Path,
    options: RunOptions,
    ssh: SSHOptions | None,
    pool: TransportPool,
    sink,
    provisioned: asyncio.Event | None,
) -> None:
    """One (host, variant): its own journal row, session and record; failures stay here."""
    run.run_id = f"{fleet_id}-{run.index:02d}"
    run.started = time.monotonic()
    base = specialize(playbook, remote_root=run.vars.remote_root, hourly_rate=run.vars.hourly_rate)
    stored = specialize(base, host=run.host, matrix=run.variant)
    run.currency = stored.cost.currency
    session = RunSession(
        run.run_id, base, journal, home, run.out_dir, options, ssh, run.host, run.variant, pool
    )
    if sink is not None:
        session.subscribe(sink)
    if provisioned is not None:
        session.subscribe(
            lambda e: (
                provisioned.set()
                if isinstance(e, PhaseFinished) and e.phase == "provision"
                else None
            )
        )
    register_run(
        journal,
        run.run_id,
        stored,
        run.out_dir,
        source=playbook,
        host=run.host,
        options={"keep_data": options.keep_data, "fleet": fleet_id, "variant": run.variant},
    )
    if _rental_over(run, stored, session):
        return
    try:
        code = await session.run()
    except asyncio.CancelledError:
        _finish(
            run,
            "interrupted",
            EXIT_INTERRUPTED,
            f"stopped locally; resume with remotemac attach {run.run_id}",
        )
        raise
    except Exception as exc:  # one run's failure (or bug) must not sink the fleet
        end = session.ending(exc)
        if isinstance(exc, RemotemacError):
            _finish(run, VERDICT_BY_CODE.get(end.exit_code, "failed"), end.exit_code, end.detail)
        else:
            _finish(run, "failed", EXIT_REJECTED, f"internal error: {end.detail}")
        _record_without_run(run, stored, fleet_id, run.reason)
        return
    _finish_from_record(run, fleet_id, journal, code)


def _rental_over(run: FleetRun, stored: Playbook, session: RunSession) -> bool:
    """A host whose rental has ended is skipped (the run failed at its start); one that
    ends before the workload's timeout is warned about."""
    if run.vars.rental_end is None:
        return False
    left = run.vars.rental_end.timestamp() - time.time()
    if left <= 0:
        why = f"rental ended {run.vars.rental_end.isoformat()}"
        session.journal.set_run_state(
            run.run_id, "failed", exit_code=EXIT_HOST, phase="start", error=why
        )
        _finish(run, "skipped", EXIT_HOST, why)
        return True
    if left < stored.workload.timeout:
        session.bus.emit(
            Warning(
                run.run_id,
                message=f"{run.host}: the rental ends in {left / 60:.0f}"
                " min, before the workload's timeout",
                code="rental-ending",
            )
        )
    return False


def _finish_from_record(run: FleetRun, fleet_id: str, journal: Journal, code: int) -> None:
    """A run that ended: its verdict from the journal, its reason and cost from its record."""
    row = journal.get_run(run.run_id)
    record = _annotate_record(run, fleet_id)
    verdict = row.verdict if row and row.verdict else "incomplete"
    if code == EXIT_JOB_LOST:
        verdict = "lost"
    reason = ""
    if record:
        outcome = RecordOutcome.from_json(record)
        reason = outcome.reason()
        run.cost = outcome.amount()
    run.state = row.state if row else ""
    _finish(run, verdict, code, reason)


def _finish(run: FleetRun, verdict: str, code: int, reason: str) -> None:
    run.verdict, run.exit_code, run.reason = verdict, code, reason
    run.duration_s = round(time.monotonic() - run.started, 3) if run.started else 0.0
    if run.cost is None and run.vars.hourly_rate is not None:
        run.cost = round(run.duration_s / 3600 * run.vars.hourly_rate, 4)


def _annotate_record(run: FleetRun, fleet_id: str) -> JsonObject | None:
    """Put the fleet id, host and matrix variant into the run's own record."""
    from remotemac.acceptance.record import write_record

    path = run.out_dir / "acceptance.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    record["fleet"] = {"fleet_id": fleet_id, "index": run.index, "host": run.host}
    record["matrix"] = run.variant
    write_record(run.out_dir, record)
    return record


def _record_without_run(run: FleetRun, playbook: Playbook, fleet_id: str, error: str) -> None:
    """A host that never ran the job still gets a record: incomplete, with the reason."""
    from remotemac.acceptance.record import build_record, write_record

    if (run.out_dir / "acceptance.json").exists():
        _annotate_record(run, fleet_id)
        return
    run.out_dir.mkdir(parents=True, exist_ok=True)
    record = build_record(
        run_id=run.run_id,
        playbook=playbook.name,
        host=run.host,
        error=error,
        fleet={"fleet_id": fleet_id, "index": run.index, "host": run.host},
        matrix=run.variant,
    )
    write_record(run.out_dir, record)


# ---------------------------------------------------------------- summary


def write_summary(
    out_root: Path,
    playbook: Playbook,
    runs: list[FleetRun],
    *,
    fleet_id: str,
    exit_code: int,
    started: float,
    forks: int,
    connections: int,
) -> Path:
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    costs = [r.cost for r in runs if r.cost is not None]
    data = {
        "fleet_id": fleet_id,
        "playbook": playbook.name,
        "started_at": iso_utc(started),
        "finished_at": iso_utc(time.time()),
        "duration_s": round(time.time() - started, 3),
        "forks": forks,
        "hosts": sorted({r.host for r in runs}),
        "matrix": playbook.matrix,
        "connections": connections,
        "counts": counts,
        "cost": {
            "amount": round(sum(costs), 4) if costs else None,
            "currency": playbook.cost.currency,
        },
        "exit_code": exit_code,
        "exit_code_rule": EXIT_RULE,
        "runs": [r.row() for r in runs],
    }
    path = out_root / "fleet.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)
    return path


# ---------------------------------------------------------------- cleanup --all


async def cleanup_all(
    *,
    journal: Journal,
    home: Path,
    ssh: SSHOptions | None = None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    out: str | Path | None = None,
    cleanup_fn=None,
    confirm: Callable[[str], bool] | None = None,
) -> int:
    """``cleanup --all``: clean every host the journal knows; one combined record.

    Each host is cleaned by ``cleanup_fn`` (remotemac.engine.cleanup.main_cleanup,
    which also finds every other remote_root the journal knows for that host) into
    ``<out>/<host>/``; ``<out>/cleanup-all.json`` holds every host's record and the
    worst exit code. One confirmation covers all hosts.
    """
    if cleanup_fn is None:
        from remotemac.engine.cleanup import main_cleanup

        cleanup_fn = main_cleanup
    targets: dict[str, str] = {}
    for host, root in known_hosts(journal):
        targets.setdefault(host, root)
    if not targets:
        print("cleanup --all: the journal knows no host; nothing to do")
        return 0
    if not (yes or dry_run):
        # the front end asks (click in the CLI); without a way to ask, nothing is removed
        question = (
            f"Remove everything remotemac put on {len(targets)} host(s): {', '.join(targets)}?"
        )
        if confirm is None or not confirm(question):
            raise Declined("cleanup not confirmed: nothing was removed")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_root = Path(out) if out else Path(home) / "cleanups" / f"cleanup-all-{stamp}"
    results = []
    for host, root in targets.items():
        folder = out_root / _dir_name(host)
        results.append(
            await _clean_one(cleanup_fn, host, root, folder, journal, home, ssh, dry_run, as_json)
        )
    codes = {r.exit_code for r in results}
    code = next((c for c in EXIT_PRECEDENCE if c in codes), EXIT_ACCEPTED)
    if dry_run:
        return code
    path = _write_cleanup_all(out_root, results, code)
    line = {"event": "cleanup_all_finished", "record": str(path), "exit_code": code}
    print(
        json.dumps(line)
        if as_json
        else f"cleanup --all: {len(results)} host(s), exit {code}; record {path}",
        flush=True,
    )
    return code


async def _clean_one(
    cleanup_fn: Any,
    host: str,
    root: str,
    folder: Path,
    journal: Journal,
    home: Path,
    ssh: SSHOptions | None,
    dry_run: bool,
    as_json: bool,
) -> CleanupHost:
    """One host of ``cleanup --all``: its exit code, error and record (never raises for it)."""
    entry = CleanupHost(host, root, str(folder), 0)
    try:
        code = await cleanup_fn(
            host,
            journal=journal,
            home=home,
            ssh=ssh,
            dry_run=dry_run,
            yes=True,
            as_json=as_json,
            remote_root=root,
            out=folder,
        )
        entry.exit_code = int(code or 0)
    except RemotemacError as exc:  # one host's failure never stops the others
        entry.exit_code, entry.error = exc.exit_code, exc.line()
    record_file = folder / "cleanup.json"
    if record_file.exists():
        entry.record = json.loads(record_file.read_text(encoding="utf-8"))
    return entry


def _write_cleanup_all(out_root: Path, results: list[CleanupHost], code: int) -> Path:
    """``<out>/cleanup-all.json``: every host's record and the worst exit code."""
    record = {
        "kind": "cleanup-all",
        "at": iso_utc(time.time()),
        "hosts": [r.to_json() for r in results],
        "exit_code": code,
        "exit_code_rule": "the worst host's: 4, 3, 5, 2, 1, else 0",
    }
    out_root.mkdir(parents=True, exist_ok=True)
    path = out_root / "cleanup-all.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    return path


@dataclass
class StoredReference(Message):
    """A stored playbook's ``workload.reference``: where the reference runs."""

    host: str | None = None
    on: str | None = None


@dataclass
class StoredWorkload(Message):
    reference: JsonObject | None = None


@dataclass
class StoredPlaybook(Message):
    """What ``cleanup --all`` reads of a journal row's playbook: the root and the
    reference's host (a row may hold a partial playbook: the rest stays in ``extra``)."""

    remote_root: str | None = None
    workload: JsonObject | None = None

    def hosts(self, host: str) -> list[tuple[str, str]]:
        """(host, remote_root) of the run's target and its remote reference."""
        root = self.remote_root or "~/remotemac"
        pairs = [(host, root)]
        workload = StoredWorkload.from_json(self.workload or {})
        ref = StoredReference.from_json(workload.reference or {})
        if ref.host and ref.on != "local":
            pairs.append((ref.host, root))
        return pairs


def known_hosts(journal: Journal) -> list[tuple[str, str]]:
    """(host, remote_root) of every run's target and reference host, in first-seen order."""
    seen: list[tuple[str, str]] = []
    for row in reversed(journal.list_runs(limit=1_000_000)):
        pairs = StoredPlaybook.from_json(row.playbook).hosts(row.host)
        for pair in pairs:
            if pair not in seen and pair[0] != "local":
                seen.append(pair)
    return seen
