"""``run``, ``attach``, ``pull`` and ``wipe``: the commands that drive a run's phases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from remotemac.cli.core import (
    JSON_SENT,
    MAX_BYTES_HELP,
    RAW_HELP,
    RUN_ID_HELP,
    asyncio_run,
    deadline_option,
    main,
    renderer,
    with_max_bytes,
)
from remotemac.errors import EXIT_INTERRUPTED, BadInput, Declined
from remotemac.settings import LocalSettings


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


def _drive(session, settings: LocalSettings, as_json: bool, raw: bool = False) -> int:
    """Run ``session`` to its end with the renderer subscribed; a run that raised ends
    its JSON stream with a ``run_finished`` that says why (and Ctrl-C says how to resume)."""
    render = renderer(as_json, settings.verbose, raw)
    session.subscribe(render)
    try:
        return asyncio_run(session.run())
    except KeyboardInterrupt as stop:
        launched = session.launched()
        if as_json:
            render(session.ending(stop))
        render.close()
        click.echo("\n" + "\n".join(interrupted_lines(launched, session.run_id)), err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:
        if as_json:  # the event stream ends with why, the run id and the exit code
            from remotemac.termsafe import escape_controls

            end = session.ending(err)
            end.detail = escape_controls(end.detail)
            render(end)
            setattr(err, JSON_SENT, True)
        raise
    finally:
        render.close()


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
@deadline_option
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
    from remotemac.engine.session import RunOptions, RunSession
    from remotemac.journal import new_run_id

    pb = _playbook(playbook, host, reproduce, trace_steps)
    host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None
    if host_list or inventory or pb.hosts or pb.matrix:
        if _fleet(
            settings,
            pb,
            host_list,
            inventory,
            forks,
            out,
            as_json,
            dry_run,
            keep_data,
            one_run_only=detach or drill or raw or show_secrets,
        ):
            return
        if host_list or pb.hosts:  # one host, no variants: a plain run on it
            pb = pb.model_copy(update={"host": (host_list or pb.hosts)[0], "hosts": None})
    if dry_run:
        from remotemac.engine.session import make_plan
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
    from remotemac.engine.session import remove_made_dirs

    made = [p for p in (out_dir, *out_dir.parents) if not p.exists()]  # deepest first
    session = RunSession.start(
        journal,
        pb,
        out_dir,
        home=settings.home,
        options=options,
        ssh=settings.ssh_options(),
        stored={"keep_data": keep_data, "drill": drill, "show_secrets": show_secrets},
        run_id=run_id,
        refuse_used=True,
    )
    if not as_json:
        click.echo(f"run {run_id} → {out_dir}")
    try:
        sys.exit(_drive(session, settings, as_json, raw))
    finally:
        if journal.get_run(run_id) is None:  # never reached its host: forgotten, leave no dir
            remove_made_dirs(made)


def _playbook(path: str, host: str | None, reproduce: bool, trace_steps: int | None):
    """The playbook of ``run``, with its command line's overrides."""
    from remotemac.playbook import load_playbook

    pb = load_playbook(path, overrides={"host": host} if host else None)
    if reproduce:
        pb = pb.model_copy(update={"reproduce": True})
    if trace_steps:
        from remotemac.playbook import Trace

        trace = Trace(steps=trace_steps)
        pb = pb.model_copy(update={"workload": pb.workload.model_copy(update={"trace": trace})})
    return pb


def _fleet(
    settings: LocalSettings,
    pb,
    host_list: list[str] | None,
    inventory: str | None,
    forks: int,
    out: str | None,
    as_json: bool,
    dry_run: bool,
    keep_data: bool,
    *,
    one_run_only: object,
) -> bool:
    """Run (or plan) PLAYBOOK as a fleet when it is one; False for a plain run."""
    from remotemac.engine.session import is_fleet, load_inventory
    from remotemac.frontend.fleet import main_fleet

    inv = load_inventory(inventory) if inventory else None
    if not is_fleet(pb, host_list, inv):
        return False
    if dry_run:
        from remotemac.engine.session import make_fleet_plan
        from remotemac.frontend.plan import print_fleet_plan

        plans = make_fleet_plan(pb, host_list, inv)
        click.echo(json.dumps(plans)) if as_json else print_fleet_plan(plans)
        return True
    if one_run_only:
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


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines.")
@deadline_option
@click.option("--raw", is_flag=True, help=RAW_HELP)
@click.option("--max-bytes", "max_bytes", metavar="SIZE", help=MAX_BYTES_HELP)
@click.pass_obj
def attach(
    settings: LocalSettings, run_id: str, as_json: bool, raw: bool, max_bytes: str | None = None
) -> None:
    """Re-attach to RUN_ID and finish its pipeline."""
    from remotemac.engine.session import RunSession

    session = RunSession.resume(
        settings.journal(), run_id, home=settings.home, ssh=settings.ssh_options()
    )
    session.playbook = with_max_bytes(session.playbook, max_bytes)
    sys.exit(_drive(session, settings, as_json, raw))


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id")
@click.option("--max-bytes", "max_bytes", metavar="SIZE", help=MAX_BYTES_HELP)
@click.pass_obj
def pull(settings: LocalSettings, run_id: str, max_bytes: str | None = None) -> None:
    """Pull RUN_ID's results by hand."""
    sys.exit(_one_phase(settings, run_id, "pull", max_bytes))


@main.command(epilog=RUN_ID_HELP)
@click.argument("run_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def wipe(settings: LocalSettings, run_id: str, yes: bool) -> None:
    """Wipe RUN_ID's data on the host and destroy its data key."""
    from remotemac.engine.session import phase_already_done, resolve_run_id

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
    from remotemac.engine.session import AlreadyDone, RunOptions, RunSession

    session = RunSession.resume(
        settings.journal(),
        run_id,
        home=settings.home,
        ssh=settings.ssh_options(),
        options=RunOptions(),
    )
    session.playbook = with_max_bytes(session.playbook, max_bytes)
    render = renderer(False, settings.verbose)
    session.subscribe(render)
    try:
        return asyncio_run(session.run_phase(phase))
    except AlreadyDone as done:
        click.echo(done.line)
        return 0
    finally:
        render.close()
