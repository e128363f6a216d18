"""The TUI's cleanup leaves the process's ``sys.stdout`` alone while it awaits (it once
swapped it for the whole process, so other tasks' output went missing)."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path

import pytest

from remotemac.settings import LocalSettings
from remotemac.tui.driver import RunDriver


@pytest.mark.asyncio
async def test_tui_cleanup_leaves_the_process_stdout_alone(tmp_path: Path, monkeypatch) -> None:
    """While the TUI's cleanup awaits, other tasks on the loop still print to the terminal."""
    root = tmp_path / "hosthome" / "remotemac"
    root.mkdir(parents=True)
    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))
    settings = LocalSettings.from_options(str(tmp_path / "rmhome"))
    driver = RunDriver(
        app=None, settings=settings, journal=settings.journal(), out_root=tmp_path / "runs"
    )
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    done = asyncio.Event()

    async def neighbour() -> int:
        ticks = 0
        while not done.is_set():
            print("tick", flush=True)
            ticks += 1
            await asyncio.sleep(0)
        return ticks

    other = asyncio.create_task(neighbour())
    try:
        code, text = await driver.cleanup("local", dry_run=True, remote_root=str(root))
    finally:
        done.set()
    ticks = await other
    assert ticks > 0 and terminal.getvalue().count("tick") == ticks  # none went missing
    assert code == 0 and "tick" not in text
    assert json.loads(text)["host"] == "local"
