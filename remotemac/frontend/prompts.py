"""Questions asked on the terminal (click), passed to the engine as plain callables."""

from __future__ import annotations

import click


def confirm(question: str) -> bool:
    """Ask yes/no, default no; an aborted prompt (Ctrl-C, end of input) is a no."""
    try:
        return click.confirm(question, default=False)
    except click.Abort:
        click.echo()  # end the question's line: the error that follows gets its own
        return False
