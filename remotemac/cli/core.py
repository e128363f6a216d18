"""The ``remotemac`` command group and what every command shares.

Only click and the error classes are imported at start-up: every command
imports what it needs when it runs, so ``remotemac --help`` and ``check`` never
pay for torch, textual or asyncssh.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import click

from remotemac.errors import (
    EXIT_INTERRUPTED,
    BadInput,
    Declined,
    RemotemacError,
)
from remotemac.settings import LocalSettings


def asyncio_run(coro):
    import asyncio

    return asyncio.run(coro)


def deadline_option(fn):
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


def fail(err: BaseException, verbose: bool, as_json: bool = False) -> None:
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


def declined(no: Declined, as_json: bool) -> None:
    """A question answered no: one line on stdout saying nothing was done, exit 0."""
    click.echo(json.dumps({"declined": no.line(), "exit_code": 0}) if as_json else no.line())
    sys.exit(0)


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader went away (``| head``).

    Why ask: a BrokenPipeError may also come from a host's channel (a command that
    exited before taking its stdin); taken for a closed stdout, a failed run ended
    exit 0 with nothing said (review of issue 36). The write end of a pipe whose
    reader is gone polls POLLERR; a terminal or a file never does."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def quiet_broken_pipe() -> None:
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
        except BrokenPipeError as err:
            if stdout_reader_gone():
                quiet_broken_pipe()
            fail(err, bool(ctx.obj and ctx.obj.verbose), bool(ctx.meta.get(JSON_WANTED)))
        except Declined as no:
            declined(no, bool(ctx.meta.get(JSON_WANTED)))
        except Exception as err:
            verbose = bool(ctx.obj and ctx.obj.verbose)
            fail(err, verbose, bool(ctx.meta.get(JSON_WANTED)))


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


def renderer(as_json: bool, verbose: bool, raw: bool = False):
    from remotemac.render import JsonRenderer, RichRenderer

    return JsonRenderer() if as_json else RichRenderer(verbose, raw=raw)


RAW_HELP = "Pass the job's terminal control sequences through (colours; also OSC/CSI: unsafe)."


def load_run(journal, run_id: str):
    from remotemac.engine.session import load_run

    return load_run(journal, run_id)


RUN_ID_HELP = (
    "RUN_ID is the full id, any unique part of it (its last 4 characters, a prefix) or 'latest'."
)


MAX_BYTES_HELP = (
    "Pull at most this much (e.g. 8GiB): outputs.max_bytes for this run, after a pull it refused."
)


def with_max_bytes(pb, max_bytes: str | None):
    """The run's playbook with ``outputs.max_bytes`` raised for this command."""
    if max_bytes is None:
        return pb
    from remotemac.units import parse_size

    try:
        limit = parse_size(max_bytes)
    except ValueError as exc:
        raise BadInput(f"--max-bytes {max_bytes!r}: {exc}") from None
    return pb.model_copy(update={"outputs": pb.outputs.model_copy(update={"max_bytes": limit})})


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
        fail(
            click_error(exc),
            verbose,
            "--json" in args[: args.index("--") if "--" in args else None],
        )
    except click.exceptions.Abort:
        click.echo("remotemac: stopped", err=True)
        sys.exit(1)
    except Exception as err:  # noqa: BLE001 - never a silent exit code
        fail(err, verbose)
    sys.exit(code if isinstance(code, int) else 0)  # --help, --version: click's Exit


def click_error(exc: click.ClickException) -> RemotemacError:
    """click's own error (an unknown option or command, a bad value) as remotemac's one
    line: ``remotemac: error: No such option '--hostt' (see remotemac status --help)``,
    and JSON under ``--json``, with click's exit code (2 for usage)."""
    ctx = getattr(exc, "ctx", None)
    hint = f"see {ctx.command_path} --help" if ctx is not None else None
    err = BadInput(exc.format_message().rstrip("."), hint=hint)
    err.exit_code = exc.exit_code
    return err
