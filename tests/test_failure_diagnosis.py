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
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    """The host's real free space (statvfs) is below what the run asks to keep free."""
    book = make_preinstalled_playbook(
        "disk", stop_when={"memory_growth": False, "min_free_disk": "1000TiB"}
    )
    proc = remotemac("run", str(book), cwd=tmp_path)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    [line] = _error_lines(proc.stderr)
    assert "not enough disk" in line and "min_free_disk" in line, line


def test_a_host_name_that_does_not_resolve_leaves_no_run_behind(
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    book = make_preinstalled_playbook("typo")
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


def test_a_failed_reference_does_not_launch_the_target_and_the_last_line_says_why(
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    """A typo'd script: python exits 2 on the reference. The target's result would be
    meaningless (nothing to compare it with), so it is not launched, not by the laptop
    and not by the host's chain; compare and record are not shown as successes; the
    last line says why the run is rejected."""
    book = make_preinstalled_playbook(
        "typo",
        workload={"command": "python3 emitt.py --device {device} --out {output_dir}"},
    )
    proc = remotemac("run", str(book), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    shown = proc.stdout.splitlines()
    assert not any(ln.startswith("✓ launch:target") for ln in shown), proc.stdout
    assert not any(ln.startswith("✓ compare") or ln.startswith("✓ record") for ln in shown)
    assert any("not launched" in ln and "reference failed (exit 2)" in ln for ln in shown)
    last = shown[-1]
    assert last.startswith("REJECTED (exit 1): the reference failed (exit 2)"), last
    assert "emitt.py" in last, last  # the job's own last line: what to fix
    # the host never started it: no target session, no target log, no target status
    run_dir = next((tmp_path / "host-root" / "runs").iterdir())
    assert not (run_dir / "logs" / "cpu-target.log").exists()
    assert not (run_dir / "status" / "cpu-target.json").exists(), sorted(
        p.name for p in (run_dir / "status").iterdir()
    )
    record = json.loads((tmp_path / "out" / "acceptance.json").read_text())
    assert record["verdict"] == "rejected"
    assert record["stopping_conditions"][0]["code"] == "workload-failed"
    assert "reference" in record["stopping_conditions"][0]["detail"]
    assert [c for c in record["stopping_conditions"] if "target" in c["detail"]] == []
    # --json carries the reason in the last event too
    proc = remotemac("run", str(book), "--out", str(tmp_path / "out2"), "--json", cwd=tmp_path)
    final = json.loads(proc.stdout.splitlines()[-1])
    assert final["event"] == "run_finished" and "reference failed (exit 2)" in final["reason"]
