"""The laptop-side settings (remotemac/settings.py): one frozen, typed object, no front end."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from remotemac.settings import LocalSettings

REPO = Path(__file__).resolve().parent.parent


def test_settings_are_frozen_and_typed(tmp_path: Path) -> None:
    settings = LocalSettings.from_options(str(tmp_path / "home"), "cfg", "key", True)
    assert settings.ssh_config == Path("cfg") and settings.identity == Path("key")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.verbose = False  # type: ignore[misc]
    options = dataclasses.replace(settings, reconnect_deadline=6.0).ssh_options()
    assert (options.ssh_config, options.identity, options.reconnect_deadline) == (
        Path("cfg"),
        Path("key"),
        6.0,
    )
    assert settings.home == (tmp_path / "home").resolve() and settings.home.is_dir()
    assert settings.journal().path == settings.home / "journal.sqlite3"


def test_home_is_resolved_only_when_used(tmp_path: Path) -> None:
    """Building the settings touches nothing: a command that never needs the home
    (``check``) never fails on an unusable one."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    settings = LocalSettings.from_options(str(blocker / "home"))
    from remotemac.errors import BadInput

    with pytest.raises(BadInput):
        _ = settings.home


def test_importing_settings_pulls_in_no_front_end_and_nothing_heavy() -> None:
    code = (
        "import json, sys, remotemac.settings; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('click', 'rich', 'textual', 'asyncssh', 'sqlite3') or m == 'remotemac.journal')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(proc.stdout) == []


def test_reconnect_deadline_reaches_that_commands_settings_only() -> None:
    """``--reconnect-deadline`` replaces the command's (frozen) settings; the group's
    object is left as it was."""
    from remotemac.cli import deadline_option as _deadline_option

    seen: dict[str, LocalSettings] = {}
    group_settings = LocalSettings.from_options(None, "cfg")

    @click.group()
    @click.pass_context
    def group(ctx: click.Context) -> None:
        ctx.obj = group_settings

    @group.command()
    @_deadline_option
    @click.pass_obj
    def cmd(settings: LocalSettings) -> None:
        seen["settings"] = settings

    result = CliRunner().invoke(group, ["cmd", "--reconnect-deadline", "6s"])
    assert result.exit_code == 0, result.output
    assert seen["settings"].ssh_options().reconnect_deadline == 6.0
    assert seen["settings"].ssh_config == Path("cfg")
    assert group_settings.reconnect_deadline is None
    bad = CliRunner().invoke(group, ["cmd", "--reconnect-deadline", "soon"])
    assert bad.exit_code == 2
