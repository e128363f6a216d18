"""``check``, ``schema``, ``doctor``, ``trust``, ``audit``, ``preflight``, ``cleanup``
and ``tui``: the playbook, the host and the project, each judged or cleaned."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from remotemac.cli.core import asyncio_run, main
from remotemac.errors import EXIT_BAD_INPUT, BadInput
from remotemac.settings import LocalSettings


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
    from remotemac.engine.session import open_transport
    from remotemac.frontend.doctor import main_doctor

    needs = None
    workload = WorkloadAsk(None, home=settings.home)
    if playbook:
        from remotemac.engine.session import disk_needed
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
        from remotemac.engine.session import cleanup_all
        from remotemac.frontend.prompts import confirm

        sys.exit(
            asyncio_run(
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
    from remotemac.engine.session import main_cleanup
    from remotemac.frontend.prompts import confirm
    from remotemac.render import progress

    with progress(f"cleanup: listing what remotemac put on {host}") as stop:

        def echo(text: str) -> None:
            stop()  # the spinner ends before the plan, the question or the summary
            click.echo(text)

        code = asyncio_run(
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
