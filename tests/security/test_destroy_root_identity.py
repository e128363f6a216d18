"""Issue 31 item 12: what counts as a remote_root.

A root nested in another root was accepted, and one cleanup then left the outer
root "kept: it holds 2 entries remotemac did not make" although they were
remotemac's. A directory of user files plus a ``.remotemac-owned`` marker copied
from a real root was accepted as a root (a later cleanup may delete what it finds
there). Now the marker is bound to its directory (its inode), and a root inside
another root is refused before anything is written. As the user meets it: the real
CLI on the local host, a real first run making the real marker.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import remotemac

QUICK = {
    "command": "python3 emit.py --device {device} --out {output_dir} --lines 2 --seconds 0.1",
    "reference": None,
    "target": {"device": "cpu"},
}


@pytest.fixture
def first_root(make_preinstalled_playbook, rm_home: Path, tmp_path: Path) -> Path:
    """A remote_root made by a real run (marker, agent/, runs/)."""
    book = make_preinstalled_playbook("first", workload=QUICK, outputs={"path": ".", "compare": []})
    proc = remotemac("run", str(book), "--out", str(tmp_path / "out1"), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    root = tmp_path / "host-root"
    assert (root / ".remotemac-owned").is_file()
    return root


def _one_error(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("remotemac: error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]


def test_a_root_inside_another_root_is_refused_before_anything_is_written(
    first_root: Path, make_preinstalled_playbook, tmp_path: Path
):
    inner = first_root / "inner"
    book = make_preinstalled_playbook(
        "nested",
        remote_root=str(inner),
        workload=QUICK,
        outputs={"path": ".", "compare": []},
    )
    line = _one_error(remotemac("run", str(book), "--out", str(tmp_path / "o2"), cwd=tmp_path))
    assert "inside" in line and str(first_root) in line, line
    assert not inner.exists()
    # the outer root is still wholly remotemac's: cleanup removes it, verified
    done = remotemac("cleanup", "local", "--remote-root", str(first_root), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not first_root.exists()


def test_a_copied_marker_does_not_make_a_directory_of_user_files_a_root(
    first_root: Path, make_preinstalled_playbook, tmp_path: Path
):
    mine = tmp_path / "my-project-files"
    mine.mkdir()
    (mine / "thesis.tex").write_text("three years of work\n")
    shutil.copy2(first_root / ".remotemac-owned", mine / ".remotemac-owned")
    book = make_preinstalled_playbook(
        "copied", remote_root=str(mine), workload=QUICK, outputs={"path": ".", "compare": []}
    )
    line = _one_error(remotemac("run", str(book), "--out", str(tmp_path / "o3"), cwd=tmp_path))
    assert str(mine) in line and "copied" in line, line
    assert sorted(p.name for p in mine.iterdir()) == [".remotemac-owned", "thesis.tex"]
    # the real root is still accepted by the next run (its marker is its own)
    again = make_preinstalled_playbook(
        "again", workload=QUICK, outputs={"path": ".", "compare": []}
    )
    proc = remotemac("run", str(again), "--out", str(tmp_path / "o4"), cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
