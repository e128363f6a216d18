"""Issue 15 item 13: a run that dies of an exception that is not remotemac's own is
marked failed in the journal, with the phase and the error, and its data is wiped.

The exception is a real one, not injected: ``--out/results`` is a plain file, so
the pull's ``mkdir`` raises NotADirectoryError (an OSError, no RemotemacError). Before
the fix the run stayed "running" in the journal forever and kept its data.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import remotemac


@pytest.mark.e2e
def test_a_foreign_exception_marks_the_run_failed_with_phase_and_error(
    make_preinstalled_playbook, rm_home: Path, tmp_path: Path
):
    book = make_preinstalled_playbook(
        "foreign",
        workload={
            "command": "python3 emit.py --device {device} "
            "--out {output_dir} --lines 3 "
            "--seconds 0.1",
            "reference": None,
        },
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "results").write_text("in the way\n")
    proc = remotemac("run", str(book), "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("remotemac:")]
    assert len(errors) == 1 and "NotADirectoryError" in errors[0], proc.stderr
    run_id = next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("run "))

    status = remotemac("status", run_id, "--json")
    row = json.loads(status.stdout)
    assert row["state"] == "failed", row
    assert row["exit_code"] == 1
    assert row["failed_phase"] == "pull", row
    assert "NotADirectoryError" in row["error"] and "wiped after the failure" in row["error"]
    assert row["phases"]["pull"]["state"] == "failed"
    assert row["phases"]["wipe"]["state"] == "done"
    # the data did not stay behind because the pull failed
    run_dir = next((tmp_path / "host-root" / "runs").iterdir())
    assert not (run_dir / "data").exists()
    assert (run_dir / "out").exists()  # not pulled: kept for ``remotemac pull``
    assert not list((rm_home / "keys").glob("*.key"))
    shown = remotemac("status", run_id)
    assert re.search(r"failed in +pull", shown.stdout), shown.stdout
