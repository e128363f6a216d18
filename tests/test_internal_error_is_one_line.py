"""Live defects found while reading the architecture (issue 21), each pinned by a test.

- ``python -m remotemac.cli`` turned any exception into exit 2 with no message;
- ``cleanup.json`` wrote ``+00:00`` timestamps where every other record writes ``Z``;
- docstrings pointed at files outside the repository (SPEC.md, ../shared);
- the TUI's cleanup swapped ``sys.stdout`` for the whole process while it awaited.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remotemac.engine.cleanup import Knowledge, build_record
from remotemac.settings import LocalSettings
from remotemac.tui.driver import RunDriver

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


def test_cleanup_record_timestamps_are_utc_with_z_like_every_record() -> None:
    record = build_record(
        host="h",
        name="h",
        fingerprint="SHA256:x",
        started=time.time() - 5,
        dry_run=False,
        answer=None,
        know=Knowledge(),
        extra_items=[],
    )
    for key in ("started_at", "finished_at"):
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record[key]), record[key]


OUTSIDE = ("SPEC.md", "/work/shared", "../shared", "mps-facts")


def test_docs_and_docstrings_point_only_at_files_in_the_repository() -> None:
    files = [p for p in (REPO / "remotemac").rglob("*") if p.suffix in (".py", ".json", ".md")]
    files += [p for p in (REPO / "scripts").iterdir() if p.is_file()]
    files += [p for p in (REPO / "tests").glob("*.py") if p.name != Path(__file__).name]
    files += [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    bad = []
    for path in files:
        text = path.read_text(errors="replace")
        bad += [f"{path.relative_to(REPO)}: {word}" for word in OUTSIDE if word in text]
        for ref in set(re.findall(r"\bdocs/[\w-]+\.md\b", text)):
            if not (REPO / ref).is_file():
                bad.append(f"{path.relative_to(REPO)}: {ref} does not exist")
    assert bad == []


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
