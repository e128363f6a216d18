"""``status``, ``logs`` and ``forget``: the commands that read (and prune) the journal."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from remotemac.cli.core import (
    RAW_HELP,
    RUN_ID_HELP,
    asyncio_run,
    load_run,
    main,
)
from remotemac.errors import BadInput
from remotemac.settings import LocalSettings


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object (per run).")
@click.option("--ledger", is_flag=True, help="Show every command run on the host.")
@click.pass_obj
def status(settings: LocalSettings, run_id: str | None, as_json: bool, ledger: bool) -> None:
    """Runs from the journal (one run in detail with RUN_ID)."""
    from remotemac.engine.statusview import run_row

    journal = settings.journal()
    if run_id and ledger:
        _ledger(run_row(journal, run_id), as_json)
    elif run_id:
        _one_status(settings, journal, run_id, as_json)
    else:
        _run_list(journal, as_json)


def _ledger(row: Any, as_json: bool) -> None:
    """``status RUN --ledger``: every command run on the host, one per line."""
    path = Path(row.out_dir) / "ledger.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    if as_json:
        for line in lines:
            click.echo(line)
        return
    from remotemac.engine.session import format_entry
    from remotemac.termsafe import escape_controls

    for line in lines:  # agent steps carry the host's words: shown, not obeyed
        click.echo(escape_controls(format_entry(json.loads(line))))


def _one_status(settings: LocalSettings, journal: Any, run_id: str, as_json: bool) -> None:
    """``status RUN``: the run's facts, its phases and (in flight) what its host says."""
    from remotemac.engine.statusview import ask_live, run_view
    from remotemac.render import fit_table
    from remotemac.termsafe import escape_controls

    view = run_view(journal, run_id)
    if view.in_flight:
        from remotemac.render import progress

        with progress(f"status: asking {view.row.host} what the job is doing"):
            view.live = asyncio_run(
                ask_live(journal, view.row.run_id, home=settings.home, ssh=settings.ssh_options())
            )
    if as_json:
        click.echo(json.dumps(view.to_json(), default=str))
        return
    for key, value in view.facts():
        click.echo(f"{key:10} {escape_controls(str(value))}")
    if view.phases:
        click.echo("phases")
        for line in fit_table(
            ("  phase", "state", "result"),
            [(f"  {p.name}", p.state, escape_controls(p.summary or "")) for p in view.phases],
        ):
            click.echo(line)
    live = view.live_view()
    for side, state in live.side_states() if live else []:
        click.echo(f"live      {escape_controls(side)}: {escape_controls(state)}")


def _run_list(journal: Any, as_json: bool) -> None:
    """``status``: every run, newest first, one line (or JSON object) each."""
    import time

    from remotemac.engine.statusview import run_list, short_id_hint
    from remotemac.render import fit_table
    from remotemac.vocab import human_age

    lines = run_list(journal)
    if as_json:
        for line in lines:
            click.echo(json.dumps(line.to_json()))
        return
    if not lines:
        click.echo("no runs yet: remotemac run PLAYBOOK starts one")
        return
    now = time.time()
    for text in fit_table(
        ("run", "host", "state", "verdict", "age"),
        [
            (
                r.run_id,
                r.row.host,
                r.state_word,
                r.row.verdict or "—",
                human_age(now - r.row.created_at),
            )
            for r in lines
        ],
    ):
        click.echo(text)
    click.echo(short_id_hint(lines))


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id")
@click.option("--device", help="One device's log (default: all).")
@click.option(
    "--follow",
    is_flag=True,
    help="Keep printing new lines until the job ends (of a detached run: live from the host).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line: device, line.")
@click.option("--raw", is_flag=True, help=RAW_HELP)
@click.pass_obj
def logs(
    settings: LocalSettings, run_id: str, device: str | None, follow: bool, as_json: bool, raw: bool
) -> None:
    """Print a run's log, each line labelled with its device (terminal controls shown
    escaped unless --raw)."""
    import time

    from remotemac.engine.session import shown_state
    from remotemac.engine.statusview import run_row
    from remotemac.termsafe import escape_controls
    from remotemac.vocab import log_prefix

    journal = settings.journal()
    row = run_row(journal, run_id)
    run_id = row.run_id
    log_dir = Path(row.out_dir) / "logs"
    files = sorted(log_dir.glob("*.log"), key=lambda f: f.stem) if log_dir.exists() else []
    if device:
        known = [f.stem for f in files]
        files = [f for f in files if f.stem == device]
        if not files:
            raise BadInput(
                f"run {run_id} has no log for device {device!r}",
                hint=f"its devices: {', '.join(known)}" if known else "it has no logs yet",
            )
    if not files and not follow:
        click.echo(f"run {run_id} has no logs yet (in {log_dir})", err=True)
    offsets = {f: 0 for f in files}
    partial = {f: b"" for f in files}
    while True:
        for f in files:
            with f.open("rb") as fh:
                fh.seek(offsets[f])
                data = fh.read()
            offsets[f] += len(data)
            *lines, partial[f] = (partial[f] + data).split(b"\n")
            for chunk in lines:
                text = chunk.decode("utf-8", "replace")
                if as_json:
                    sys.stdout.write(json.dumps({"device": f.stem, "line": text}) + "\n")
                else:
                    sys.stdout.write(
                        log_prefix(f.stem) + (text if raw else escape_controls(text)) + "\n"
                    )
            sys.stdout.flush()
        current = journal.get_run(run_id)
        if not follow or (current and current.state not in ("running", "detached", "created")):
            break
        shown = shown_state(journal, current) if current else ""
        if shown in ("detached", "interrupted"):  # nothing appends to the laptop's copy
            had = {f.stem: (offsets[f] - len(partial[f]), 0) for f in files}
            _tail_live(settings, row, shown, had, device, as_json, raw)
            return
        time.sleep(0.5)
    for f, rest in partial.items():  # a last line without a newline
        if rest:
            text = rest.decode("utf-8", "replace")
            sys.stdout.write(
                json.dumps({"device": f.stem, "line": text}) + "\n"
                if as_json
                else log_prefix(f.stem) + (text if raw else escape_controls(text)) + "\n"
            )


def _tail_live(
    settings: LocalSettings,
    row: Any,
    shown: str,
    had: dict[str, tuple[int, int]],
    device: str | None,
    as_json: bool,
    raw: bool,
) -> None:
    """`logs RUN --follow` of a run no remotemac follows: its jobs' new lines, read live
    from the host (read-only: nothing launched, pulled, wiped or journalled), until every
    job is final; then say that `remotemac attach RUN` finishes the run."""
    from remotemac.engine.session import tail_logs
    from remotemac.termsafe import escape_controls
    from remotemac.vocab import log_prefix

    run_id = row.run_id
    click.echo(
        f"remotemac: run {run_id} is {shown}: tailing its jobs live from {row.host} "
        f"(read-only; Ctrl-C stops this command, not the job; remotemac attach {run_id} "
        "finishes the run)",
        err=True,
    )

    def show(event: Any) -> None:
        text = event.line
        sys.stdout.write(
            json.dumps({"device": event.device, "line": text}) + "\n"
            if as_json
            else log_prefix(event.device) + (text if raw else escape_controls(text)) + "\n"
        )
        sys.stdout.flush()

    journal = settings.journal()
    _, pb = load_run(journal, run_id)
    ended = asyncio_run(
        tail_logs(
            run_id=run_id,
            playbook=pb,
            journal=journal,
            home=settings.home,
            out_dir=Path(row.out_dir),
            ssh=settings.ssh_options(),
            starts=had,
            on_line=show,
            devices={device} if device else None,
        )
    )
    states = ", ".join(
        f"{label}: {r.state}" + ("" if r.exit_code is None else f", exit {r.exit_code}")
        for label, r in ended.items()
    )
    click.echo(
        f"remotemac: the job finished ({states or 'nothing left to tail'}); "
        f"remotemac attach {run_id} finishes the run: pull, compare, record",
        err=True,
    )


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_ids", nargs=-1)
@click.option(
    "--before",
    metavar="YYYY-MM-DD",
    help="Forget every finished run started before this day (UTC).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the runs forgotten.")
@click.pass_obj
def forget(
    settings: LocalSettings, run_ids: tuple[str, ...], before: str | None, as_json: bool
) -> None:
    """Drop runs from the journal (a typo'd host's runs stop being 'latest').

    The host and the runs' --out dirs are not touched: wipe or clean up first."""
    from remotemac.engine.session import forgettable_runs

    journal = settings.journal()
    ids = forgettable_runs(journal, list(run_ids), before)
    journal.forget_runs(ids)
    if as_json:
        click.echo(json.dumps({"forgotten": ids}))
        return
    for run_id in ids:
        click.echo(f"forgot {run_id}")
    click.echo(
        f"{len(ids)} run{'s' if len(ids) != 1 else ''} forgotten; the host and --out untouched"
    )
