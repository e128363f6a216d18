"""The ``remotemac`` command line.

Only click and the error classes are imported at start-up: every command
imports what it needs when it runs, so ``remotemac --help`` and ``check`` never
pay for torch, textual or asyncssh.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click

from remotemac.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    BadInput,
    Declined,
    RemotemacError,
)
from remotemac.settings import LocalSettings


def _asyncio_run(coro):
    import asyncio

    return asyncio.run(coro)


def _deadline_option(fn):
    """``--reconnect-deadline`` (run, attach): how long a dropped link is retried."""

    def store(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value is not None:
            from remotemac.units import parse_duration

            try:
                deadline = parse_duration(value)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
            # this command's settings only (the group's object is frozen and shared)
            ctx.obj = dataclasses.replace(
                ctx.find_object(LocalSettings) or LocalSettings(), reconnect_deadline=deadline
            )

    return click.option(
        "--reconnect-deadline",
        "reconnect_deadline",
        metavar="DURATION",
        expose_value=False,
        callback=store,
        help="Keep reconnecting a dropped link this long (e.g. 10m, the "
        "default; playbook: connection.reconnect_deadline); past it, "
        "stop with exit 3 and leave the job running.",
    )(fn)


#: ``ctx.meta`` key: the command line asked for ``--json`` (see :meth:`Group.parse_args`)
JSON_WANTED = "remotemac.json"
#: set on an error whose JSON answer is already on stdout (``run``/``attach``' last event)
JSON_SENT = "_remotemac_json_sent"


def _fail(err: BaseException, verbose: bool, as_json: bool = False) -> None:
    """The error's one line on stderr and its exit code; with ``--json`` also on stdout,
    as ``{"error": line, "exit_code": code}``, so a script reading stdout learns why."""
    if verbose:
        import traceback

        traceback.print_exception(err)
    from remotemac.termsafe import escape_controls

    if isinstance(err, RemotemacError):
        # an error's text may quote the host's answer: shown, never obeyed
        line, code = escape_controls(err.line()), err.exit_code
        for part in line.splitlines() or [""]:
            click.echo(f"remotemac: error: {part}", err=True)
    else:
        line = (
            f"internal error: {type(err).__name__}: {escape_controls(str(err))} "
            "(rerun with -v for the traceback)"
        )
        code = 1
        click.echo(f"remotemac: {line}", err=True)
    if as_json and not getattr(err, JSON_SENT, False):
        click.echo(json.dumps({"error": line, "exit_code": code}))
    sys.exit(code)


def _declined(no: Declined, as_json: bool) -> None:
    """A question answered no: one line on stdout saying nothing was done, exit 0."""
    click.echo(json.dumps({"declined": no.line(), "exit_code": 0}) if as_json else no.line())
    sys.exit(0)


def _by_place(values: list[str], paths: list[str], filename: str) -> list[str]:
    """Value errors and path problems in the file's order (``file:line:col:`` first);
    a path whose key already has a value error is that error's, not a second line."""
    import re

    def place(line: str) -> tuple[int, int]:
        found = re.match(re.escape(filename) + r":(\d+):(\d+):", line)
        return (int(found[1]), int(found[2])) if found else (0, 0)

    taken = {place(line) for line in values}
    extra = [line for line in paths if place(line) not in taken]
    return sorted(values + extra, key=place)


def interrupted_lines(launched: bool, run_id: str) -> list[str]:
    """What Ctrl-C during ``run`` says: short lines (80 columns), the run id whole on
    the resume line (it was one 122-character line that wrapped the id)."""
    if launched:
        where = ["remotemac: stopped locally; the job keeps running on the host."]
    else:
        where = [
            "remotemac: stopped locally before a job was launched;",
            "what reached the host stays there for the run.",
        ]
    return [*where, f"resume with: remotemac attach {run_id}"]


def _quiet_broken_pipe() -> None:
    """The reader went away (``| head``): stop quietly, as cat and git do."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    sys.exit(0)


class Group(click.Group):
    """Turns every RemotemacError into its one line and exit code."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # only a command's own option is called --json: before ``--``, it is that option
        ctx.meta[JSON_WANTED] = "--json" in (args[: args.index("--")] if "--" in args else args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except SystemExit:
            raise
        except KeyboardInterrupt:
            click.echo("remotemac: stopped", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            _quiet_broken_pipe()
        except Declined as no:
            _declined(no, bool(ctx.meta.get(JSON_WANTED)))
        except Exception as err:
            verbose = bool(ctx.obj and ctx.obj.verbose)
            _fail(err, verbose, bool(ctx.meta.get(JSON_WANTED)))


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--home", envvar="REMOTEMAC_HOME", help="State dir: journal, known_hosts, data keys.")
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="An ssh_config file to use.")
@click.option(
    "-i", "--identity", type=click.Path(exists=True, dir_okay=False), help="A private key file."
)
@click.option("-v", "--verbose", is_flag=True, help="Tracebacks and more detail.")
@click.version_option(package_name="remotemac")
@click.pass_context
def main(
    ctx: click.Context,
    home: str | None,
    ssh_config: str | None,
    identity: str | None,
    verbose: bool,
) -> None:
    """Run a PyTorch workload on a rented Apple-Silicon Mac, decide on evidence, leave it clean."""
    ctx.obj = LocalSettings.from_options(home, ssh_config, identity, verbose)


def _renderer(as_json: bool, verbose: bool, raw: bool = False):
    from remotemac.render import JsonRenderer, RichRenderer

    return JsonRenderer() if as_json else RichRenderer(verbose, raw=raw)


RAW_HELP = "Pass the job's terminal control sequences through (colours; also OSC/CSI: unsafe)."


def _run_engine(
    settings: LocalSettings,
    run_id: str,
    playbook,
    journal,
    out_dir: Path,
    options,
    as_json: bool,
    raw: bool = False,
) -> int:
    from remotemac.engine.pipeline import build_context, run_pipeline
    from remotemac.events import EventBus

    bus = EventBus()
    render = _renderer(as_json, settings.verbose, raw)
    bus.subscribe(render)
    ctx = build_context(
        run_id=run_id,
        playbook=playbook,
        journal=journal,
        bus=bus,
        home=settings.home,
        out_dir=out_dir,
        options=options,
        ssh=settings.ssh_options(),
    )
    try:
        return _asyncio_run(run_pipeline(ctx))
    except KeyboardInterrupt:
        launched = any(name.startswith("launch") for name in journal.phases(run_id))
        if as_json:
            _last_event(
                render,
                run_id,
                out_dir,
                "interrupted",
                EXIT_INTERRUPTED,
                f"remotemac attach {run_id}",
            )
        render.close()
        click.echo("\n" + "\n".join(interrupted_lines(launched, run_id)), err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:
        if as_json:  # the event stream ends with why, the run id and the exit code
            from remotemac.errors import TransientHostError
            from remotemac.termsafe import escape_controls

            known = isinstance(err, RemotemacError)
            _last_event(
                render,
                run_id,
                out_dir,
                "detached" if isinstance(err, TransientHostError) else "failed",
                err.exit_code if known else 1,
                escape_controls(err.line() if known else f"{type(err).__name__}: {err}"),
            )
            setattr(err, JSON_SENT, True)
        raise
    finally:
        render.close()


def _last_event(render, run_id: str, out_dir: Path, verdict: str, code: int, detail: str) -> None:
    """``run_finished`` for a run that ended without a record (failed, detached, stopped)."""
    from remotemac.events import RunFinished

    render(
        RunFinished(run_id, verdict=verdict, exit_code=code, out_dir=str(out_dir), detail=detail)
    )


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option("--host", help="Override the playbook's host.")
@click.option(
    "--out", "out", type=click.Path(file_okay=False), help="Output dir (default ./runs/<run-id>)."
)
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines.")
@click.option("--detach", is_flag=True, help="Return once the job is launched; attach later.")
@click.option("--keep-data", is_flag=True, help="Do not wipe the run's data after the pull.")
@click.option("--dry-run", is_flag=True, help="Print the plan and touch nothing.")
@click.option(
    "--drill",
    type=click.Choice(["disconnect"]),
    help="Cut the link on purpose during the target run.",
)
@click.option(
    "--reproduce",
    is_flag=True,
    help="Run the target twice (fresh process) and compare the two outputs.",
)
@click.option(
    "--trace",
    "trace_steps",
    type=click.IntRange(min=1, max=1000),
    help="Trace each module call on both sides for the first N forwards (workload.trace).",
)
@click.option("--hosts", "hosts", help="Fleet: run on these hosts or inventory groups (a,b,c).")
@click.option("--inventory", type=click.Path(dir_okay=False), help="Fleet: a YAML inventory file.")
@click.option(
    "--forks",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Fleet: at most this many runs at once.",
)
@_deadline_option
@click.option("--raw", is_flag=True, help=RAW_HELP)
@click.option(
    "--show-secrets",
    is_flag=True,
    help="Keep the workload command and env values unredacted in the records.",
)
@click.pass_obj
def run(
    settings: LocalSettings,
    playbook: str,
    host: str | None,
    out: str | None,
    as_json: bool,
    detach: bool,
    keep_data: bool,
    dry_run: bool,
    drill: str | None,
    hosts: str | None,
    inventory: str | None,
    forks: int,
    reproduce: bool = False,
    raw: bool = False,
    show_secrets: bool = False,
    trace_steps: int | None = None,
) -> None:
    """Run the whole pipeline of PLAYBOOK (on many hosts with --hosts/--inventory)."""
    from remotemac.engine.context import RunOptions
    from remotemac.journal import new_run_id
    from remotemac.playbook import load_playbook

    pb = load_playbook(playbook, overrides={"host": host} if host else None)
    if reproduce:
        pb = pb.model_copy(update={"reproduce": True})
    if trace_steps:
        from remotemac.playbook import Trace

        trace = Trace(steps=trace_steps)
        pb = pb.model_copy(update={"workload": pb.workload.model_copy(update={"trace": trace})})
    host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None
    if host_list or inventory or pb.hosts or pb.matrix:
        from remotemac.engine.fleet import is_fleet
        from remotemac.engine.inventoryfile import load_inventory
        from remotemac.frontend.fleet import main_fleet

        inv = load_inventory(inventory) if inventory else None
        if is_fleet(pb, host_list, inv):
            if dry_run:
                from remotemac.engine.plan import make_fleet_plan
                from remotemac.frontend.plan import print_fleet_plan

                plans = make_fleet_plan(pb, host_list, inv)
                click.echo(json.dumps(plans)) if as_json else print_fleet_plan(plans)
                return
            if detach or drill or raw or show_secrets:
                raise BadInput(
                    "--detach, --drill, --raw and --show-secrets work on one run, not on a fleet"
                )
            sys.exit(
                main_fleet(
                    settings,
                    pb,
                    hosts=host_list,
                    inventory_path=inventory,
                    forks=forks,
                    out=out,
                    as_json=as_json,
                    keep_data=keep_data,
                )
            )
        if host_list or pb.hosts:  # one host, no variants: a plain run on it
            pb = pb.model_copy(update={"host": (host_list or pb.hosts)[0], "hosts": None})
    if dry_run:
        from remotemac.engine.plan import make_plan
        from remotemac.frontend.plan import print_plan

        plan = make_plan(pb, settings.home)
        if as_json:
            click.echo(json.dumps(plan))
        else:
            print_plan(plan)
        return
    journal = settings.journal()
    run_id = new_run_id(pb.name)
    out_dir = Path(out) if out else Path.cwd() / "runs" / run_id
    out_dir = out_dir.resolve()
    options = RunOptions(keep_data=keep_data, detach=detach, drill=drill, show_secrets=show_secrets)
    from remotemac.engine.runs import refuse_used_out_dir, register_run, remove_made_dirs

    made = [p for p in (out_dir, *out_dir.parents) if not p.exists()]  # deepest first
    refuse_used_out_dir(out_dir, run_id)

    register_run(
        journal,
        run_id,
        pb,
        out_dir,
        options={"keep_data": keep_data, "drill": drill, "show_secrets": show_secrets},
    )
    if not as_json:
        click.echo(f"run {run_id} → {out_dir}")
    try:
        sys.exit(_run_engine(settings, run_id, pb, journal, out_dir, options, as_json, raw))
    finally:
        if journal.get_run(run_id) is None:  # never reached its host: forgotten, leave no dir
            remove_made_dirs(made)


def _load_run(journal, run_id: str):
    from remotemac.engine.runs import load_run

    return load_run(journal, run_id)


def _run_row(journal, run_id: str):
    """The journal row of RUN_ID (any unique part, or latest), without its playbook."""
    from remotemac.engine.runs import resolve_run_id

    return journal.get_run(resolve_run_id(journal, run_id))


RUN_ID_HELP = (
    "RUN_ID is the full id, any unique part of it (its last 4 characters, a prefix) or 'latest'."
)


MAX_BYTES_HELP = (
    "Pull at most this much (e.g. 8GiB): outputs.max_bytes for this run, after a pull it refused."
)


def _with_max_bytes(pb, max_bytes: str | None):
    """The run's playbook with ``outputs.max_bytes`` raised for this command."""
    if max_bytes is None:
        return pb
    from remotemac.units import parse_size

    try:
        limit = parse_size(max_bytes)
    except ValueError as exc:
        raise BadInput(f"--max-bytes {max_bytes!r}: {exc}") from None
    return pb.model_copy(update={"outputs": pb.outputs.model_copy(update={"max_bytes": limit})})


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines.")
@_deadline_option
@click.option("--raw", is_flag=True, help=RAW_HELP)
@click.option("--max-bytes", "max_bytes", metavar="SIZE", help=MAX_BYTES_HELP)
@click.pass_obj
def attach(
    settings: LocalSettings, run_id: str, as_json: bool, raw: bool, max_bytes: str | None = None
) -> None:
    """Re-attach to RUN_ID and finish its pipeline."""
    from remotemac.engine.context import RunOptions

    journal = settings.journal()
    row, pb = _load_run(journal, run_id)
    pb = _with_max_bytes(pb, max_bytes)
    options = RunOptions(
        keep_data=bool(row.options.get("keep_data")),
        drill=row.options.get("drill"),
        show_secrets=bool(row.options.get("show_secrets")),
    )
    sys.exit(
        _run_engine(settings, row.run_id, pb, journal, Path(row.out_dir), options, as_json, raw)
    )


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="One JSON object (per run).")
@click.option("--ledger", is_flag=True, help="Show every command run on the host.")
@click.pass_obj
def status(settings: LocalSettings, run_id: str | None, as_json: bool, ledger: bool) -> None:
    """Runs from the journal (one run in detail with RUN_ID)."""
    import time

    from remotemac.render import fit_table
    from remotemac.vocab import human_age, human_duration, human_time, phase_word, run_word

    journal = settings.journal()
    if run_id:
        row = _run_row(journal, run_id)
        run_id = row.run_id
        phases = journal.phases(run_id)
        if ledger:
            path = Path(row.out_dir) / "ledger.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            if as_json:
                for line in lines:
                    click.echo(line)
            else:
                from remotemac.engine.ledger import format_entry
                from remotemac.termsafe import escape_controls

                for line in lines:  # agent steps carry the host's words: shown, not obeyed
                    click.echo(escape_controls(format_entry(json.loads(line))))
            return
        from remotemac.engine.runs import shown_state

        state = shown_state(journal, row)
        data: dict[str, Any] = {
            "run_id": row.run_id,
            "name": row.name,
            "host": row.host,
            "state": run_word(state),
            "verdict": row.verdict,
            "exit_code": row.exit_code,
            "out_dir": row.out_dir,
            "created_at": row.created_at,
            "finished_at": row.finished_at,
            "phases": {
                k: {
                    "state": phase_word(v["state"]),
                    "summary": (v.get("result") or {}).get("summary"),
                }
                for k, v in phases.items()
            },
        }
        if row.failed_phase or row.error:
            data.update(failed_phase=row.failed_phase, error=row.error)
        if row.state not in ("finished", "failed"):
            from remotemac.engine.livestatus import live_status
            from remotemac.render import progress

            _, pb = _load_run(journal, run_id)
            with progress(f"status: asking {row.host} what the job is doing"):
                data["live"] = _asyncio_run(
                    live_status(
                        run_id=run_id,
                        playbook=pb,
                        journal=journal,
                        home=settings.home,
                        out_dir=Path(row.out_dir),
                        ssh=settings.ssh_options(),
                    )
                )
        if as_json:
            click.echo(json.dumps(data, default=str))
            return
        ended = row.finished_at or time.time()
        from remotemac.termsafe import escape_controls

        facts = [
            ("run", row.run_id),
            ("name", row.name),
            ("host", row.host),
            ("state", data["state"]),
            ("verdict", row.verdict or "—"),
            ("exit code", "—" if row.exit_code is None else str(row.exit_code)),
            ("started", human_time(row.created_at)),
            ("finished", human_time(row.finished_at)),
            ("duration", human_duration(ended - row.created_at)),
            ("out", row.out_dir),
        ]
        if row.failed_phase or row.error:
            facts += [("failed in", row.failed_phase or "—"), ("error", row.error or "—")]
        if state in ("interrupted", "detached"):  # nothing follows it: say how to go on
            facts.append(("resume", f"remotemac attach {row.run_id}"))
        for key, value in facts:
            click.echo(f"{key:10} {escape_controls(str(value))}")
        if phases:
            click.echo("phases")
            for line in fit_table(
                ("  phase", "state", "result"),
                [
                    (f"  {name}", info["state"], escape_controls(info["summary"] or ""))
                    for name, info in data["phases"].items()
                ],
            ):
                click.echo(line)
        for side, info in ((data.get("live") or {}).get("sides") or {}).items():
            click.echo(
                f"live      {escape_controls(str(side))}: {escape_controls(str(info.get('state')))}"
            )
        return
    from remotemac.engine.runs import shown_state

    rows = journal.list_runs()
    states = {r.run_id: shown_state(journal, r) for r in rows}
    if as_json:
        for r in rows:
            click.echo(
                json.dumps(
                    {
                        "run_id": r.run_id,
                        "name": r.name,
                        "host": r.host,
                        "state": run_word(states[r.run_id]),
                        "verdict": r.verdict,
                        "created_at": r.created_at,
                        "finished_at": r.finished_at,
                    }
                )
            )
        return
    if not rows:
        click.echo("no runs yet: remotemac run PLAYBOOK starts one")
        return
    now = time.time()
    for line in fit_table(
        ("run", "host", "state", "verdict", "age"),
        [
            (
                r.run_id,
                r.host,
                run_word(states[r.run_id]),
                r.verdict or "—",
                human_age(now - r.created_at),
            )
            for r in rows
        ],
    ):
        click.echo(line)
    click.echo(
        f"(any unique part of a run id works, e.g. remotemac logs "
        f"{rows[0].run_id.rsplit('-', 1)[-1]}; or 'latest')"
    )


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

    from remotemac.engine.runs import shown_state
    from remotemac.termsafe import escape_controls
    from remotemac.vocab import log_prefix

    journal = settings.journal()
    row = _run_row(journal, run_id)
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
    from remotemac.engine.logtail import tail_logs
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
    _, pb = _load_run(journal, run_id)
    ended = _asyncio_run(
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
        f"{label}: {r['state']}" + ("" if r["exit_code"] is None else f", exit {r['exit_code']}")
        for label, r in ended.items()
    )
    click.echo(
        f"remotemac: the job finished ({states or 'nothing left to tail'}); "
        f"remotemac attach {run_id} finishes the run: pull, compare, record",
        err=True,
    )


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id")
@click.option("--max-bytes", "max_bytes", metavar="SIZE", help=MAX_BYTES_HELP)
@click.pass_obj
def pull(settings: LocalSettings, run_id: str, max_bytes: str | None = None) -> None:
    """Pull RUN_ID's results by hand."""
    sys.exit(_one_phase(settings, run_id, "pull", max_bytes))


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
    from remotemac.engine.runs import forgettable_runs

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


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def wipe(settings: LocalSettings, run_id: str, yes: bool) -> None:
    """Wipe RUN_ID's data on the host and destroy its data key."""
    from remotemac.engine.runs import phase_already_done, resolve_run_id

    journal = settings.journal()
    run_id = resolve_run_id(journal, run_id)
    done = phase_already_done(journal, run_id, "wipe")
    if done:
        click.echo(done)
        return
    from remotemac.frontend.prompts import confirm

    if not yes and not confirm(f"Wipe the data of {run_id} on its host and destroy its key?"):
        raise Declined(f"wipe not confirmed: nothing was done ({run_id} keeps its data)")
    sys.exit(_one_phase(settings, run_id, "wipe"))


def _one_phase(
    settings: LocalSettings, run_id: str, phase: str, max_bytes: str | None = None
) -> int:
    from remotemac.engine.context import RunOptions
    from remotemac.engine.pipeline import run_phase
    from remotemac.engine.runs import phase_already_done

    journal = settings.journal()
    row, pb = _load_run(journal, run_id)
    pb = _with_max_bytes(pb, max_bytes)
    run_id = row.run_id
    done = phase_already_done(journal, run_id, phase)
    if done:
        click.echo(done)
        return 0
    if phase == "wipe" and pb.wipe == "manual":
        pb = pb.model_copy(update={"wipe": "after_pull"})
    return _asyncio_run(
        run_phase(
            run_id=run_id,
            phase=phase,
            playbook=pb,
            journal=journal,
            home=settings.home,
            out_dir=Path(row.out_dir),
            options=RunOptions(),
            ssh=settings.ssh_options(),
            render=_renderer(False, settings.verbose),
        )
    )


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: ok, problems (one line each), name, host.",
)
def check(playbook: str, as_json: bool) -> None:
    """Validate a playbook: its keys, and that the paths it names exist."""
    from remotemac.acceptance.decide import memory_growth_note
    from remotemac.checks.paths import playbook_path_problems, raw_path_problems
    from remotemac.playbook import PlaybookErrors, load_playbook

    pb = None
    try:
        pb = load_playbook(playbook)
        problems = playbook_path_problems(pb, playbook)
    except PlaybookErrors as exc:
        # the paths too, in the same pass, each in its place in the file's order
        problems = _by_place(list(exc.lines), raw_path_problems(playbook), playbook)
    except BadInput as exc:
        problems = [exc.line()]
    notes = [n for n in [memory_growth_note(pb.stop_when.memory_growth)] if n] if pb else []
    if as_json:
        click.echo(
            json.dumps(
                {
                    "playbook": playbook,
                    "ok": not problems,
                    "problems": problems,
                    "name": pb.name if pb else None,
                    "host": pb.host if pb else None,
                    "notes": notes,
                }
            )
        )
        if problems:
            sys.exit(EXIT_BAD_INPUT)
        return
    if problems:
        raise PlaybookErrors(problems)
    click.echo(f"{playbook}: ok ({pb.name}, host {pb.host})")
    for note in notes:
        click.echo(f"  note: {note}")


@main.command()
def schema() -> None:
    """Print the playbook's JSON Schema."""
    from remotemac.playbook import playbook_json_schema

    click.echo(json.dumps(playbook_json_schema(), indent=2))


@main.command()
@click.argument("host")
@click.option("--json", "as_json", is_flag=True, help="The checks as one JSON object.")
@click.option(
    "--remote-root",
    default="~/remotemac",
    show_default=True,
    help="The remote_root whose disk and runtime to check (--playbook: its own).",
)
@click.option(
    "--playbook",
    type=click.Path(dir_okay=False),
    help="Check free disk against what this playbook needs (and use its remote_root).",
)
@click.pass_obj
def doctor(
    settings: LocalSettings, host: str, as_json: bool, remote_root: str, playbook: str | None
) -> None:
    """Is HOST fit: OS, arch, VM, Python, tmux, disk, MPS.

    Exit 0 when the host is fit, 1 when it is not (a check failed), 3 when it
    cannot be reached.
    """
    from remotemac.checks.doctor import WorkloadAsk
    from remotemac.engine.hosts import open_transport
    from remotemac.frontend.doctor import main_doctor

    needs = None
    workload = WorkloadAsk(None, home=settings.home)
    if playbook:
        from remotemac.engine.plan import disk_needed
        from remotemac.playbook import load_playbook

        pb = load_playbook(playbook)
        remote_root, needs = pb.remote_root, disk_needed(pb)
        env = pb.environment
        reqs = (pb.project_dir() / env.requirements).read_bytes() if env.requirements else None
        workload = WorkloadAsk(env.python, reqs, settings.home)
    from remotemac.render import progress

    transport = open_transport(host, settings.home, settings.ssh_options())
    with progress(f"doctor: asking {host} about its OS, Python, tmux, disk and MPS"):
        code = main_doctor(
            host,
            as_json,
            transport,
            remote_root=remote_root,
            needs_disk_bytes=needs,
            workload=workload,
        )
    sys.exit(code)


@main.command()
@click.argument("host")
@click.option("--fingerprint", help="Pin this SHA256:… fingerprint (as the provider published it).")
@click.option("--yes", is_flag=True, help="Trust what the host shows without asking.")
@click.pass_obj
def trust(settings: LocalSettings, host: str, fingerprint: str | None, yes: bool) -> None:
    """Pin HOST's key in remotemac's own known_hosts (trust on first use, explicitly)."""
    if host == "local":
        click.echo("local needs no trust: it is this machine, reached without SSH")
        return
    from remotemac.frontend.prompts import confirm as ask
    from remotemac.transport.hostkeys import trust_host

    def confirm(question: str) -> bool:
        if yes:
            return True
        try:
            return ask(question)
        except BadInput:  # no answer (end of input, Ctrl-C): the key is not trusted, exit 3
            return False

    result = trust_host(
        host,
        settings.home,
        fingerprint,
        confirm,
        ssh_config=settings.ssh_config,
        identity=settings.identity,
    )
    state = "already trusted" if result.already_trusted else "trusted"
    click.echo(f"{result.name}: {state} {result.fingerprint} ({result.path})")


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="The findings as one JSON object.")
@click.option(
    "--exclude",
    multiple=True,
    metavar="GLOB",
    help="Paths not to read, gitignore syntax (repeatable).",
)
def audit(path: str, as_json: bool, exclude: tuple[str, ...]) -> None:
    """Scan a project for CUDA-only dependencies and code paths."""
    from remotemac.frontend.audit import main_audit
    from remotemac.render import progress

    with progress(f"audit: reading {path}"):
        code = main_audit(Path(path), as_json, exclude=exclude)
    sys.exit(code)


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option(
    "--seconds",
    type=float,
    default=30.0,
    show_default=True,
    help="Run the workload on the CPU at most this long.",
)
@click.option("--json", "as_json", is_flag=True, help="The prediction as one JSON object.")
def preflight(playbook: str, seconds: float, as_json: bool) -> None:
    """Run the workload briefly on the local CPU and predict MPS coverage."""
    from remotemac.frontend.preflight import main_preflight
    from remotemac.render import progress
    from remotemac.units import parse_duration

    try:
        seconds = parse_duration(seconds)
    except ValueError as exc:
        raise BadInput(f"--seconds: {exc}") from None

    with progress(
        f"preflight: running the workload on the local CPU for up to {seconds:g}s "
        "and tracing its operators"
    ):
        code = main_preflight(Path(playbook), seconds, as_json)
    sys.exit(code)


@main.command()
@click.argument("host", required=False)
@click.option("--dry-run", is_flag=True, help="List what would go; touch nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="The cleanup record as JSON.")
@click.option(
    "--remote-root",
    default="~/remotemac",
    show_default=True,
    help="A root to clean besides every remote_root the journal knows for HOST "
    "(all of them are cleaned).",
)
@click.option("--all", "all_hosts", is_flag=True, help="Every host the journal knows; one record.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Where cleanup.json/.md go (default <home>/cleanups/cleanup-<host>-<time>/).",
)
@click.pass_obj
def cleanup(
    settings: LocalSettings,
    host: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    remote_root: str,
    all_hosts: bool,
    out: str | None,
) -> None:
    """End of rental: remove everything remotemac put on HOST, verify, write a record."""
    if all_hosts:
        if host:
            raise BadInput("give a HOST or --all, not both")
        from remotemac.engine.fleet import cleanup_all
        from remotemac.frontend.prompts import confirm

        sys.exit(
            _asyncio_run(
                cleanup_all(
                    journal=settings.journal(),
                    home=settings.home,
                    ssh=settings.ssh_options(),
                    dry_run=dry_run,
                    yes=yes,
                    as_json=as_json,
                    out=Path(out) if out else None,
                    confirm=confirm,
                )
            )
        )
    if not host:
        raise BadInput("cleanup needs a HOST (or --all)")
    from remotemac.engine.cleanup import main_cleanup
    from remotemac.frontend.prompts import confirm
    from remotemac.render import progress

    with progress(f"cleanup: listing what remotemac put on {host}") as stop:

        def echo(text: str) -> None:
            stop()  # the spinner ends before the plan, the question or the summary
            click.echo(text)

        code = _asyncio_run(
            main_cleanup(
                host,
                journal=settings.journal(),
                home=settings.home,
                ssh=settings.ssh_options(),
                dry_run=dry_run,
                yes=yes,
                as_json=as_json,
                remote_root=remote_root,
                out=Path(out) if out else None,
                echo=echo,
                confirm=confirm,
            )
        )
    sys.exit(code)


@main.command()
@click.argument("playbooks", nargs=-1, type=click.Path(dir_okay=False))
@click.option(
    "--pick",
    is_flag=True,
    help="Do not start the PLAYBOOKs: only offer them in the run dialog (r).",
)
@click.pass_obj
def tui(settings: LocalSettings, playbooks: tuple[str, ...], pick: bool) -> None:
    """The terminal UI; each PLAYBOOK given starts a run at once (as `run` would)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # a pipe, a cron job, /dev/null
        raise BadInput(
            "the TUI needs a terminal: stdin or stdout is not one",
            hint="open it in a terminal; a script runs `remotemac run PLAYBOOK --json`",
        )
    try:
        from remotemac.tui.app import run_tui
    except ImportError as exc:
        raise BadInput(f"the TUI is not available in this build: {exc}") from None
    sys.exit(run_tui(settings, list(playbooks), start=not pick))


def entry(argv: list[str] | None = None, prog_name: str | None = None) -> None:
    """``python -m remotemac`` / ``python -m remotemac.cli``: ``main`` plus the errors raised
    before a command runs (while click parses), each as its one line and exit code."""
    args = sys.argv[1:] if argv is None else argv
    verbose = any(arg in ("-v", "--verbose") for arg in args)
    try:
        code = main(args, prog_name=prog_name, standalone_mode=False)
    except KeyboardInterrupt:
        click.echo("remotemac: stopped", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `remotemac`: the help
        exc.show()
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        _fail(
            _click_error(exc),
            verbose,
            "--json" in args[: args.index("--") if "--" in args else None],
        )
    except click.exceptions.Abort:
        click.echo("remotemac: stopped", err=True)
        sys.exit(1)
    except Exception as err:  # noqa: BLE001 - never a silent exit code
        _fail(err, verbose)
    sys.exit(code if isinstance(code, int) else 0)  # --help, --version: click's Exit


def _click_error(exc: click.ClickException) -> RemotemacError:
    """click's own error (an unknown option or command, a bad value) as remotemac's one
    line: ``remotemac: error: No such option '--hostt' (see remotemac status --help)``,
    and JSON under ``--json``, with click's exit code (2 for usage)."""
    ctx = getattr(exc, "ctx", None)
    hint = f"see {ctx.command_path} --help" if ctx is not None else None
    err = BadInput(exc.format_message().rstrip("."), hint=hint)
    err.exit_code = exc.exit_code
    return err


if __name__ == "__main__":  # pragma: no cover
    entry()
