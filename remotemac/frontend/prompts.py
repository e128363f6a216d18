"""Questions asked on the terminal (click), passed to the engine as plain callables."""

from __future__ import annotations

import click

from remotemac.errors import BadInput


def confirm(question: str) -> bool:
    """Ask yes/no, default no. An answer of no is False (the caller says nothing was
    done, exit 0); no answer at all (end of input: a script without ``--yes``, or
    Ctrl-C) is bad input, exit 2, so a script cannot take "not asked" for done."""
    try:
        return click.confirm(question, default=False)
    except click.Abort:
        click.echo()  # end the question's line: the error that follows gets its own
        raise BadInput(
            "no answer to the question (end of input): nothing was done",
            hint="give --yes to skip the question",
        ) from None
