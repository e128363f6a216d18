"""Commands that do not need them never import torch, textual or asyncssh."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "textual", "asyncssh")


@pytest.mark.parametrize(
    "args", [["--help"], ["run", "--help"], ["schema"], ["check", "playbooks/quickstart.yaml"]]
)
def test_light_commands_stay_light(args):
    code = (
        "import sys\nfrom remotemac.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    line = [x for x in out.splitlines() if x.startswith("HEAVY=")][-1]
    assert line == "HEAVY=", f"{args} imported {line}"


def test_help_lists_every_spec_command():
    out = subprocess.run(
        [sys.executable, "-m", "remotemac", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for command in (
        "run",
        "attach",
        "status",
        "logs",
        "pull",
        "wipe",
        "cleanup",
        "doctor",
        "trust",
        "audit",
        "preflight",
        "check",
        "schema",
        "tui",
    ):
        assert f"  {command} " in out or f"  {command}\n" in out, command
