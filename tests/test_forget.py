"""``remotemac forget``: old runs leave the journal, so a typo'd host's runs stop
being ``latest``, without touching any host or --out dir.

A user who ran the quickstart with ``--host mac-rentl`` had a failed run as
``latest`` for good: ``status``, ``logs latest`` and ``wipe latest`` all meant it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from remotemac.journal import Journal
from tests.conftest import remotemac, remotemac_in_process


def make_runs(home: Path) -> Journal:
    journal = Journal(home / "journal.sqlite3")
    for run_id, host, state, age_days in (
        ("qs-20261101-100000-aaaa", "local", "finished", 30),
        ("qs-20261130-100000-bbbb", "mac-rental", "finished", 1),
        ("qs-20261201-100000-cccc", "mac-rentl", "failed", 0),
        ("qs-20261001-100000-dddd", "mac-rental", "detached", 60),
    ):
        journal.create_run(
            run_id,
            name="qs",
            host=host,
            playbook_path=None,
            playbook={"name": "qs"},
            out_dir=str(home / "out" / run_id),
            options={},
        )
        journal.set_run_state(run_id, state)
        with journal._write() as db:
            db.execute(
                "UPDATE runs SET created_at = ? WHERE run_id = ?",
                (time.time() - age_days * 86400 - (run_id[-1] == "c") * -60, run_id),
            )
    return journal


def latest(home: Path) -> str:
    proc = remotemac_in_process("--home", str(home), "status", "latest", "--json")
    return json.loads(proc.stdout.splitlines()[0])["run_id"]


def test_forgetting_the_typo_d_host_s_run_makes_the_one_before_latest(tmp_path: Path):
    home = tmp_path / "home"
    make_runs(home)
    assert latest(home) == "qs-20261201-100000-cccc"
    proc = remotemac("--home", str(home), "forget", "cccc")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "forgot qs-20261201-100000-cccc",
        "1 run forgotten; the host and --out untouched",
    ]
    assert latest(home) == "qs-20261130-100000-bbbb"
    again = remotemac_in_process("--home", str(home), "forget", "cccc")
    assert again.returncode == 2 and again.stderr.startswith("remotemac: error: unknown run id"), (
        again.stderr
    )


def test_forget_before_drops_only_finished_runs_older_than_the_day(tmp_path: Path):
    """``--before`` takes every finished run started before the day; a detached run
    (its job on the host) is kept: forgetting it would lose attach and wipe."""
    home = tmp_path / "home"
    journal = make_runs(home)
    day = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 10 * 86400))
    proc = remotemac_in_process("--home", str(home), "forget", "--before", day, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"forgotten": ["qs-20261101-100000-aaaa"]}
    left = sorted(r.run_id for r in journal.list_runs())
    assert left == [
        "qs-20261001-100000-dddd",
        "qs-20261130-100000-bbbb",
        "qs-20261201-100000-cccc",
    ]


def test_forget_refuses_a_run_in_progress_and_forgets_nothing(tmp_path: Path):
    home = tmp_path / "home"
    journal = make_runs(home)
    proc = remotemac_in_process("--home", str(home), "forget", "aaaa", "dddd")
    assert proc.returncode == 2
    assert "run qs-20261001-100000-dddd is detached" in proc.stderr
    assert "nothing was forgotten" in proc.stderr
    assert len(journal.list_runs()) == 4


def test_forget_needs_something_to_forget(tmp_path: Path):
    proc = remotemac_in_process("--home", str(tmp_path / "home"), "forget")
    assert proc.returncode == 2 and "give run ids, or --before" in proc.stderr
    bad = remotemac_in_process("--home", str(tmp_path / "home"), "forget", "--before", "soon")
    assert bad.returncode == 2 and "not a day" in bad.stderr
