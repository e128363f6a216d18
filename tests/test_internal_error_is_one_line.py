"""An error raised outside any command is one line on stderr and exit 1, not a silent exit 2.

``python -m remotemac.cli`` once turned any exception click never saw (raised while the
command line is parsed) into exit 2 with no message; both entry modules are checked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A failure click never sees: raised while the command line is parsed, outside any command.
BOOM = """
import runpy, sys, click
def boom(self, *a, **k):
    raise RuntimeError("boom while parsing")
click.Command.make_context = boom
sys.argv = ["remotemac", "status"]
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("module", ["remotemac.cli", "remotemac"])
def test_an_error_outside_a_command_is_one_line_not_a_silent_exit_2(module: str) -> None:
    code = BOOM.replace(
        'sys.argv = ["remotemac", "status"]', f'sys.argv = ["remotemac", "{module}", "status"]'
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stderr.strip().splitlines() == [
        "remotemac: internal error: RuntimeError: boom while parsing (rerun with -v for the "
        "traceback)"
    ], proc.stderr
