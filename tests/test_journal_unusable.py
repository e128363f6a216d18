"""Issue 31 item 10: a journal that cannot be used says which file, why, and what to do.

As the user meets it: the real CLI over a real ``--home`` whose journal file was
overwritten, truncated, or is held in a write transaction by another real process.
Before: ``internal error: DatabaseError: file is not a database``, exit 1 (the code of
"not accepted"), no path, no advice; a held journal made ``run`` wait 60 s in silence.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import remotemac


def _one_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("remotemac: error:")]
    assert len(lines) == 1, proc.stderr
    assert "internal error" not in proc.stderr and "DatabaseError" not in proc.stderr
    return lines[0]


@pytest.fixture
def journal_file(rm_home: Path) -> Path:
    remotemac("status", check=True)  # a real, healthy journal first
    path = rm_home / "journal.sqlite3"
    assert path.stat().st_size > 0
    return path


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b"not sqlite at all\n" * 200, id="overwritten"),
        pytest.param(lambda b: b[: len(b) // 2], id="truncated"),
        pytest.param(lambda b: b[:100] + b"\0" * 4000 + b[4100:], id="header-kept-pages-zeroed"),
    ],
)
def test_a_damaged_journal_names_its_path_and_says_move_it_aside(journal_file: Path, damage):
    journal_file.write_bytes(damage(journal_file.read_bytes()))
    for args in (("status",), ("status", "--json")):
        proc = remotemac(*args)
        assert proc.returncode == 2, proc.stderr
        line = _one_error(proc)
        assert str(journal_file) in line and "move it aside" in line, line
    assert json.loads(proc.stdout.splitlines()[-1])["exit_code"] == 2


def test_a_journal_held_by_another_process_says_it_waits_and_who_holds_it(
    journal_file: Path, make_preinstalled_playbook
):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time\n"
            f"db = sqlite3.connect({str(journal_file)!r}, isolation_level=None)\n"
            "db.execute('BEGIN IMMEDIATE')\n"
            "db.execute('CREATE TABLE IF NOT EXISTS held (a)')\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        started = time.monotonic()
        proc = remotemac(
            "run",
            str(make_preinstalled_playbook()),
            env={"REMOTEMAC_JOURNAL_WAIT": "3"},
            timeout=60,
        )
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr
    waiting = [ln for ln in proc.stderr.splitlines() if "waiting" in ln]
    assert waiting and str(journal_file) in waiting[0] and f"pid {holder.pid}" in waiting[0]
    line = _one_error(proc)
    assert str(journal_file) in line and f"pid {holder.pid}" in line, line
    assert took < 30, took
    # nothing was registered while the journal was held
    db = sqlite3.connect(journal_file)
    assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
