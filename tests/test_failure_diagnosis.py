"""Issue 31 items 8 and 9: a failure is diagnosed as what it is, and a run that never
reached its host leaves nothing behind.

As the user meets it: the real CLI, the real local host (its real disk, real
processes), a host name that does not resolve.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import remotemac


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("remotemac: error:")]


def test_not_enough_disk_on_the_host_is_exit_6_host_environment(
    make_playbook, rm_home: Path, tmp_path: Path
):
    """The host's real free space (statvfs) is below what the run asks to keep free."""
    book = make_playbook("disk", stop_when={"memory_growth": False, "min_free_disk": "1000TiB"})
    proc = remotemac("run", str(book), cwd=tmp_path)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    [line] = _error_lines(proc.stderr)
    assert "not enough disk" in line and "min_free_disk" in line, line


def test_a_host_name_that_does_not_resolve_leaves_no_run_behind(
    make_playbook, rm_home: Path, tmp_path: Path
):
    book = make_playbook("typo")
    work = tmp_path / "cwd"
    work.mkdir()
    proc = remotemac("run", str(book), "--host", "labmc", cwd=work)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = _error_lines(proc.stderr)
    assert "labmc" in line and "nothing was started" in line, line
    assert not (work / "runs").exists() or not any((work / "runs").iterdir())
    shown = remotemac("status", "--json")
    assert shown.returncode == 0 and shown.stdout.strip() == "", shown.stdout
    latest = remotemac("status", "latest")
    assert latest.returncode == 2, latest.stdout + latest.stderr
    # the TUI's hosts come from the journal's runs: labmc is not among them
    from remotemac.journal import Journal

    assert [r.host for r in Journal(rm_home / "journal.sqlite3").list_runs()] == []
    # --json says the same, as its last event
    proc = remotemac("run", str(book), "--host", "labmc", "--json", cwd=work)
    last = json.loads(proc.stdout.splitlines()[-1])
    assert last["exit_code"] == 3 and "nothing was started" in last["detail"], last
    assert Journal(rm_home / "journal.sqlite3").list_runs() == []
