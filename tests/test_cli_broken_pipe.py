"""A BrokenPipeError is a closed stdout only when stdout's reader is gone.

CI saw a run whose claim's channel closed under it (the host had no such python)
end with exit 0 and nothing said: the CLI took the host channel's BrokenPipeError
for ``| head`` closing its stdout. (The ``| head`` case itself: test_cli_ux.)
"""

from __future__ import annotations

import subprocess
import sys

import click
from click.testing import CliRunner

from remotemac.cli.core import Group

SCRIPT = """
import click, sys
from remotemac.cli.core import Group

@click.group(cls=Group)
def g():
    pass

@g.command()
def boom():
    raise BrokenPipeError("Channel not open for sending")

g()
"""


def test_a_hosts_broken_pipe_with_stdout_fine_is_a_failure_with_its_line():
    @click.group(cls=Group)
    def g() -> None:
        pass

    @g.command()
    def boom() -> None:
        raise BrokenPipeError("Channel not open for sending")

    result = CliRunner().invoke(g, ["boom"])
    assert result.exit_code == 1, result.output
    assert "Channel not open for sending" in result.output


def test_the_same_error_with_stdout_a_file_is_exit_1_with_its_line(tmp_path):
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, "boom"], stdout=fh, stderr=subprocess.PIPE, text=True
        )
    assert proc.returncode == 1, proc.stderr
    assert "Channel not open for sending" in proc.stderr
