"""The ``remotemac`` command line.

Only click and the error classes are imported at start-up: every command
imports what it needs when it runs, so ``remotemac --help`` and ``check`` never
pay for torch, textual or asyncssh.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from remotemac.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, BadInput, RemotemacError


def _asyncio_run(coro):
    import asyncio

    return asyncio.run(coro)


class Settings:
    def __init__(self, home: str | None, ssh_config: str | None, identity: str | None,
                 verbose: bool) -> None:
        self._home = home
        self.ssh_config = Path(ssh_config) if ssh_config else None
        self.identity = Path(identity) if identity else None
        self.verbose = verbose

    @property
    def home(self) -> Path:
        from remotemac.home import resolve_home

        return resolve_home(self._home)

    def journal(self):
        from remotemac.journal import Journal

        return Journal(self.home / "journal.sqlite3")

    def ssh_options(self):
        from remotemac.engine.hosts import SSHOptions

        return SSHOptions(ssh_config=self.ssh_config, identity=self.identity)


def _fail(err: BaseException, verbose: bool) -> None:
    if verbose:
        import traceback

        traceback.print_exception(err)
    from remotemac.termsafe import escape_controls

    if isinstance(err, RemotemacError):
        # an error's text may quote the host's answer: shown, never obeyed
        click.echo(f"remotemac: error: {escape_controls(err.line())}", err=True)
        sys.exit(err.exit_code)
    click.echo(f"remotemac: internal error: {type(err).__name__}: {escape_controls(str(err))} "
               "(rerun with -v for the traceback)", err=True)
    sys.exit(1)


class Group(click.Group):
    """Turns every RemotemacError into its one line and exit code."""

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
        except Exception as err:
            verbose = bool(ctx.obj and ctx.obj.verbose)
            _fail(err, verbose)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--home", envvar="REMOTEMAC_HOME", help="State dir: journal, known_hosts, data keys.")
@click.option("--ssh-config", type=click.Path(dir_okay=False), help="An ssh_config file to use.")
@click.option("-i", "--identity", type=click.Path(dir_okay=False), help="A private key file.")
@click.option("-v", "--verbose", is_flag=True, help="Tracebacks and more detail.")
@click.version_option(package_name="remotemac")
@click.pass_context
def main(ctx: click.Context, home: str | None, ssh_config: str | None, identity: str | None,
         verbose: bool) -> None:
    """Run a PyTorch workload on a rented Apple-Silicon Mac, decide on evidence, leave it clean."""
    ctx.obj = Settings(home, ssh_config, identity, verbose)


def _renderer(as_json: bool, verbose: bool, raw: bool = False):
    from remotemac.render import JsonRenderer, RichRenderer

    return JsonRenderer() if as_json else RichRenderer(verbose, raw=raw)


RAW_HELP = "Pass the job's terminal control sequences through (colours; also OSC/CSI: unsafe)."


def _run_engine(settings: Settings, run_id: str, playbook, journal, out_dir: Path,
                options, as_json: bool, raw: bool = False) -> int:
    from remotemac.engine.pipeline import build_context, run_pipeline
    from remotemac.events import EventBus

    bus = EventBus()
    render = _renderer(as_json, settings.verbose, raw)
    bus.subscribe(render)
    ctx = build_context(run_id=run_id, playbook=playbook, journal=journal, bus=bus,
                        home=settings.home, out_dir=out_dir, options=options,
                        ssh=settings.ssh_options())
    try:
        return _asyncio_run(run_pipeline(ctx))
    except KeyboardInterrupt:
        render.close()
        click.echo(f"\nremotemac: stopped locally; the job keeps running on the host. "
                   f"Resume with: remotemac attach {run_id}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    finally:
        render.close()


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option("--host", help="Override the playbook's host.")
@click.option("--out", "out", type=click.Path(file_okay=False), help="Output dir (default ./runs/<run-id>).")
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines.")
@click.option("--detach", is_flag=True, help="Return once the job is launched; attach later.")
@click.option("--keep-data", is_flag=True, help="Do not wipe the run's data after the pull.")
@click.option("--dry-run", is_flag=True, help="Print the plan and touch nothing.")
@click.option("--drill", type=click.Choice(["disconnect"]), help="Cut the link on purpose during the target run.")
@click.option("--reproduce", is_flag=True,
              help="Run the target twice (fresh process) and compare the two outputs.")
@click.option("--hosts", "hosts", help="Fleet: run on these hosts or inventory groups (a,b,c).")
@click.option("--inventory", type=click.Path(dir_okay=False), help="Fleet: a YAML inventory file.")
@click.option("--forks", type=click.IntRange(min=1), default=8, show_default=True,
              help="Fleet: at most this many runs at once.")
@click.option("--raw", is_flag=True, help=RAW_HELP)
@click.option("--show-secrets", is_flag=True,
              help="Keep the workload command and env values unredacted in the records.")
@click.pass_obj
def run(settings: Settings, playbook: str, host: str | None, out: str | None, as_json: bool,
        detach: bool, keep_data: bool, dry_run: bool, drill: str | None, hosts: str | None,
        inventory: str | None, forks: int, reproduce: bool = False, raw: bool = False,
        show_secrets: bool = False) -> None:
    """Run the whole pipeline of PLAYBOOK (on many hosts with --hosts/--inventory)."""
    from remotemac.engine.context import RunOptions
    from remotemac.journal import new_run_id
    from remotemac.playbook import load_playbook

    pb = load_playbook(playbook, overrides={"host": host} if host else None)
    if reproduce:
        pb = pb.model_copy(update={"reproduce": True})
    host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None
    if host_list or inventory or pb.hosts or pb.matrix:
        from remotemac.engine.fleet import is_fleet, main_fleet
        from remotemac.engine.inventoryfile import load_inventory

        inv = load_inventory(inventory) if inventory else None
        if is_fleet(pb, host_list, inv):
            if dry_run:
                from remotemac.engine.plan import make_fleet_plan, print_fleet_plan

                plans = make_fleet_plan(pb, host_list, inv)
                click.echo(json.dumps(plans, indent=2)) if as_json else print_fleet_plan(plans)
                return
            if detach or drill:
                raise BadInput("--detach and --drill work on one run, not on a fleet")
            sys.exit(main_fleet(settings, pb, hosts=host_list, inventory_path=inventory,
                                forks=forks, out=out, as_json=as_json, keep_data=keep_data))
        if host_list or pb.hosts:  # one host, no variants: a plain run on it
            pb = pb.model_copy(update={"host": (host_list or pb.hosts)[0], "hosts": None})
    if dry_run:
        from remotemac.engine.plan import make_plan, print_plan

        plan = make_plan(pb)
        if as_json:
            click.echo(json.dumps(plan, indent=2))
        else:
            print_plan(plan)
        return
    journal = settings.journal()
    run_id = new_run_id(pb.name)
    out_dir = Path(out) if out else Path.cwd() / "runs" / run_id
    out_dir = out_dir.resolve()
    options = RunOptions(keep_data=keep_data, detach=detach, drill=drill,
                         show_secrets=show_secrets)
    from remotemac.engine.runs import register_run

    register_run(journal, run_id, pb, out_dir, options={"keep_data": keep_data, "drill": drill,
                                                        "show_secrets": show_secrets})
    if not as_json:
        click.echo(f"run {run_id} → {out_dir}")
    sys.exit(_run_engine(settings, run_id, pb, journal, out_dir, options, as_json, raw))


def _load_run(journal, run_id: str):
    from remotemac.engine.runs import load_run

    return load_run(journal, run_id)


@main.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines.")
@click.option("--raw", is_flag=True, help=RAW_HELP)
@click.pass_obj
def attach(settings: Settings, run_id: str, as_json: bool, raw: bool) -> None:
    """Re-attach to RUN_ID and finish its pipeline."""
    from remotemac.engine.context import RunOptions

    journal = settings.journal()
    row, pb = _load_run(journal, run_id)
    options = RunOptions(keep_data=bool(row.options.get("keep_data")), drill=row.options.get("drill"),
                         show_secrets=bool(row.options.get("show_secrets")))
    sys.exit(_run_engine(settings, run_id, pb, journal, Path(row.out_dir), options, as_json,
                         raw))


@main.command()
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option("--ledger", is_flag=True, help="Show every command run on the host.")
@click.pass_obj
def status(settings: Settings, run_id: str | None, as_json: bool, ledger: bool) -> None:
    """Runs from the journal (one run in detail with RUN_ID)."""
    import time

    journal = settings.journal()
    if run_id:
        row, _ = _load_run(journal, run_id)
        phases = journal.phases(run_id)
        if ledger:
            path = Path(row.out_dir) / "ledger.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            if as_json:
                click.echo("\n".join(lines))
            else:
                from remotemac.engine.ledger import format_entry
                from remotemac.termsafe import escape_controls

                for line in lines:  # agent steps carry the host's words: shown, not obeyed
                    click.echo(escape_controls(format_entry(json.loads(line))))
            return
        data = {"run_id": row.run_id, "name": row.name, "host": row.host, "state": row.state,
                "verdict": row.verdict, "exit_code": row.exit_code, "out_dir": row.out_dir,
                "phases": {k: v["state"] for k, v in phases.items()}}
        if row.failed_phase or row.error:
            data.update(failed_phase=row.failed_phase, error=row.error)
        if row.state not in ("finished", "failed"):
            from remotemac.engine.livestatus import live_status

            _, pb = _load_run(journal, run_id)
            data["live"] = _asyncio_run(live_status(
                run_id=run_id, playbook=pb, journal=journal, home=settings.home,
                out_dir=Path(row.out_dir), ssh=settings.ssh_options()))
        if as_json:
            click.echo(json.dumps(data))
        else:
            from remotemac.termsafe import escape_controls

            for key, value in data.items():
                click.echo(f"{key:10} {escape_controls(str(value))}")
        return
    rows = journal.list_runs()
    if as_json:
        for r in rows:
            click.echo(json.dumps({"run_id": r.run_id, "name": r.name, "host": r.host,
                                   "state": r.state, "verdict": r.verdict,
                                   "created_at": r.created_at}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("run", "host", "state", "verdict", "age")
    for r in rows:
        age = int(time.time() - r.created_at)
        table.add_row(r.run_id, r.host, r.state, r.verdict or "-", f"{age // 3600}h{age % 3600 // 60:02d}m")
    Console().print(table)


@main.command()
@click.argument("run_id")
@click.option("--device", help="One device's log (default: all).")
@click.option("--follow", is_flag=True, help="Keep following while the run is attached.")
@click.option("--raw", is_flag=True, help=RAW_HELP)
@click.pass_obj
def logs(settings: Settings, run_id: str, device: str | None, follow: bool, raw: bool) -> None:
    """Print a run's log (terminal controls shown escaped unless --raw)."""
    import time

    from remotemac.termsafe import escape_controls

    journal = settings.journal()
    row, _ = _load_run(journal, run_id)
    log_dir = Path(row.out_dir) / "logs"
    files = sorted(log_dir.glob("*.log")) if log_dir.exists() else []
    if device:
        files = [f for f in files if f.stem == device]
        if not files:
            raise BadInput(f"run {run_id} has no log for device {device!r}")
    offsets = {f: 0 for f in files}
    while True:
        for f in files:
            with f.open("rb") as fh:
                fh.seek(offsets[f])
                data = fh.read()
            offsets[f] += len(data)
            if data:
                text = data.decode("utf-8", "replace")
                sys.stdout.write(text if raw else escape_controls(text))
                sys.stdout.flush()
        current = journal.get_run(run_id)
        if not follow or (current and current.state not in ("running", "detached", "created")):
            break
        time.sleep(0.5)


@main.command()
@click.argument("run_id")
@click.pass_obj
def pull(settings: Settings, run_id: str) -> None:
    """Pull RUN_ID's results by hand."""
    sys.exit(_one_phase(settings, run_id, "pull"))


@main.command()
@click.argument("run_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def wipe(settings: Settings, run_id: str, yes: bool) -> None:
    """Wipe RUN_ID's data on the host and destroy its data key."""
    _load_run(settings.journal(), run_id)  # an unknown id is exit 2 before any question
    if not yes and not click.confirm(f"Wipe the data of {run_id} on its host and destroy its key?"):
        raise BadInput("wipe not confirmed")
    sys.exit(_one_phase(settings, run_id, "wipe"))


def _one_phase(settings: Settings, run_id: str, phase: str) -> int:
    from remotemac.engine.context import RunOptions
    from remotemac.engine.pipeline import run_phase

    journal = settings.journal()
    row, pb = _load_run(journal, run_id)
    if phase == "wipe" and pb.wipe == "manual":
        pb = pb.model_copy(update={"wipe": "after_pull"})
    return _asyncio_run(run_phase(
        run_id=run_id, phase=phase, playbook=pb, journal=journal, home=settings.home,
        out_dir=Path(row.out_dir), options=RunOptions(), ssh=settings.ssh_options(),
        render=_renderer(False, settings.verbose)))


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
def check(playbook: str) -> None:
    """Validate a playbook."""
    from remotemac.playbook import load_playbook

    pb = load_playbook(playbook)
    click.echo(f"{playbook}: ok ({pb.name}, host {pb.host})")


@main.command()
def schema() -> None:
    """Print the playbook's JSON Schema."""
    from remotemac.playbook import playbook_json_schema

    click.echo(json.dumps(playbook_json_schema(), indent=2))


@main.command()
@click.argument("host")
@click.option("--json", "as_json", is_flag=True)
@click.option("--remote-root", default="~/remotemac", show_default=True)
@click.option("--playbook", type=click.Path(dir_okay=False),
              help="Check free disk against what this playbook needs (and use its remote_root).")
@click.pass_obj
def doctor(settings: Settings, host: str, as_json: bool, remote_root: str,
           playbook: str | None) -> None:
    """Is HOST fit: OS, arch, VM, Python, tmux, disk, MPS."""
    from remotemac.checks.doctor import main_doctor
    from remotemac.engine.hosts import open_transport

    needs = None
    if playbook:
        from remotemac.engine.plan import disk_needed
        from remotemac.playbook import load_playbook

        pb = load_playbook(playbook)
        remote_root, needs = pb.remote_root, disk_needed(pb)
    transport = open_transport(host, settings.home, settings.ssh_options())
    sys.exit(main_doctor(host, as_json, transport, remote_root=remote_root,
                         needs_disk_bytes=needs))


@main.command()
@click.argument("host")
@click.option("--fingerprint", help="Pin this SHA256:… fingerprint (as the provider published it).")
@click.option("--yes", is_flag=True, help="Trust what the host shows without asking.")
@click.pass_obj
def trust(settings: Settings, host: str, fingerprint: str | None, yes: bool) -> None:
    """Pin HOST's key in remotemac's own known_hosts (trust on first use, explicitly)."""
    from remotemac.transport.hostkeys import trust_host

    def confirm(question: str) -> bool:
        return yes or click.confirm(question, default=False)

    result = trust_host(host, settings.home, fingerprint, confirm,
                        ssh_config=settings.ssh_config, identity=settings.identity)
    state = "already trusted" if result.already_trusted else "trusted"
    click.echo(f"{result.name}: {state} {result.fingerprint} ({result.path})")


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
def audit(path: str, as_json: bool) -> None:
    """Scan a project for CUDA-only dependencies and code paths."""
    from remotemac.checks.audit import main_audit

    sys.exit(main_audit(Path(path), as_json))


@main.command()
@click.argument("playbook", type=click.Path(dir_okay=False))
@click.option("--seconds", type=float, default=30.0, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def preflight(playbook: str, seconds: float, as_json: bool) -> None:
    """Run the workload briefly on the local CPU and predict MPS coverage."""
    from remotemac.checks.preflight import main_preflight
    from remotemac.units import parse_duration

    try:
        seconds = parse_duration(seconds)
    except ValueError as exc:
        raise BadInput(f"--seconds: {exc}") from None

    sys.exit(main_preflight(Path(playbook), seconds, as_json))


@main.command()
@click.argument("host", required=False)
@click.option("--dry-run", is_flag=True)
@click.option("--yes", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
@click.option("--remote-root", default="~/remotemac", show_default=True)
@click.option("--all", "all_hosts", is_flag=True, help="Every host the journal knows; one record.")
@click.option("--out", type=click.Path(file_okay=False),
              help="Where cleanup.json/.md go (default ./cleanup-<host>-<time>/).")
@click.pass_obj
def cleanup(settings: Settings, host: str | None, dry_run: bool, yes: bool, as_json: bool,
            remote_root: str, all_hosts: bool, out: str | None) -> None:
    """End of rental: remove everything remotemac put on HOST, verify, write a record."""
    if all_hosts:
        if host:
            raise BadInput("give a HOST or --all, not both")
        from remotemac.engine.fleet import cleanup_all

        sys.exit(_asyncio_run(cleanup_all(settings, dry_run=dry_run, yes=yes, as_json=as_json,
                                          out=Path(out) if out else None)))
    if not host:
        raise BadInput("cleanup needs a HOST (or --all)")
    from remotemac.engine.cleanup import main_cleanup

    sys.exit(_asyncio_run(main_cleanup(host, settings=settings, dry_run=dry_run, yes=yes,
                                      as_json=as_json, remote_root=remote_root,
                                      out=Path(out) if out else None)))


@main.command()
@click.argument("playbooks", nargs=-1, type=click.Path(dir_okay=False))
@click.pass_obj
def tui(settings: Settings, playbooks: tuple[str, ...]) -> None:
    """The terminal UI."""
    try:
        from remotemac.tui.app import run_tui
    except ImportError as exc:
        raise BadInput(f"the TUI is not available in this build: {exc}") from None
    sys.exit(run_tui(settings, list(playbooks)))


if __name__ == "__main__":  # pragma: no cover
    try:
        main()
    except SystemExit as exc:
        sys.exit(exc.code if exc.code is not None else 0)
    except Exception:  # noqa: BLE001
        sys.exit(EXIT_BAD_INPUT)
