"""Issue 15 item 2: a sensitive dataset inside the project folder never travels in clear.

The README's own layout (``project: {path: .}``, ``data: {path: ./data,
classification: sensitive}``) used to put ``runs/<id>/project/data/...`` on the
host's disk in plaintext, kept after the wipe, while the dry run said only
"project: 3 files". Now the project upload leaves the dataset out (it travels
encrypted through sync), the plan says so, and a copy of a sensitive file
elsewhere in the project is refused.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import LINES_PROJECT, remotemac
from tests.harness import hostbuilt

MARKER = b"PLAINTEXT-MARKER-7f3a9c"


def readme_layout(tmp_path: Path, **data_extra) -> Path:
    """The README's layout: the playbook in the project, the data in ./data."""
    project = tmp_path / "project"
    shutil.copytree(LINES_PROJECT, project)
    for f in (project / "data").iterdir():
        f.write_bytes(f.read_bytes() + b"\n" + MARKER + b" " + f.name.encode() + b"\n")
    book = {
        "name": "readme",
        "host": "local",
        "remote_root": str(tmp_path / "host-root"),
        "project": {"path": "."},
        # torch-free: the host builds an empty venv from a 3.11 it has
        "environment": {"python": hostbuilt.PYTHON_VERSION},
        "data": {
            "path": "./data",
            "classification": "sensitive",
            "approved_for_remote": True,
            **data_extra,
        },
        "workload": {
            "command": "python3 emit.py --device {device} --data {data_dir} "
            "--out {output_dir} --lines 3 --seconds 0.1",
            "reference": None,
            "target": {"device": "cpu"},
            "timeout": "2m",
        },
        "outputs": {"path": "."},
        "stop_when": {"memory_growth": False},
    }
    path = project / "remotemac.yaml"
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    return path


def files_with_marker(root: Path) -> list[str]:
    found = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            full = Path(dirpath) / name
            if full.is_file() and not full.is_symlink() and MARKER in full.read_bytes():
                found.append(str(full.relative_to(root)))
    return found


@pytest.mark.e2e
def test_dataset_inside_the_project_never_lands_on_the_host_in_clear(
    tmp_path, rm_home, host_pythons
):
    book = readme_layout(tmp_path)
    out = tmp_path / "out"
    proc = remotemac("run", str(book), "--out", str(out), "--keep-data")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    host = tmp_path / "host-root"
    [run_dir] = list((host / "runs").iterdir())
    assert not (run_dir / "project" / "data").exists()
    assert (run_dir / "project" / "emit.py").exists()
    # with the data kept (no wipe), the only plaintext is in the RAM store, never on disk
    assert files_with_marker(host) == []
    record = json.loads((out / "acceptance.json").read_text())
    assert record["dataset"]["encrypted"] is True
    hostbuilt.assert_host_built(record, host, ("target",), torch=False)
    assert remotemac("wipe", run_dir.name, "--yes").returncode == 0  # the RAM store goes too
    assert files_with_marker(host) == []


def test_plan_says_what_was_left_out_of_the_project_upload(tmp_path):
    book = readme_layout(tmp_path)
    proc = remotemac("run", "--dry-run", "--json", str(book))
    assert proc.returncode == 0, proc.stderr
    project = json.loads(proc.stdout)["project"]
    [group] = project["left_out"]
    assert group["files"] == 2 and "data.path" in group["why"]
    assert sorted(group["examples"]) == ["data/one.csv", "data/two.txt"]
    human = remotemac("run", "--dry-run", str(book))
    assert "left out of the project upload: 2 files" in human.stdout


def test_project_inside_the_data_dir_leaves_out_the_include_matches(tmp_path):
    book = readme_layout(tmp_path)
    spec = yaml.safe_load(book.read_text())
    spec["data"]["path"] = "."
    spec["data"]["include"] = ["data/*.csv", "data/*.txt"]
    book.write_text(yaml.safe_dump(spec))
    proc = remotemac("run", "--dry-run", "--json", str(book))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    [group] = plan["project"]["left_out"]
    assert "data.include" in group["why"] and group["files"] == 2


def test_a_copy_of_a_sensitive_file_in_the_project_is_refused(tmp_path):
    book = readme_layout(tmp_path)
    shutil.copy(book.parent / "data" / "one.csv", book.parent / "backup.csv")
    proc = remotemac("run", "--dry-run", str(book))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "backup.csv is a copy of sensitive dataset file one.csv" in proc.stderr
    assert "Traceback" not in proc.stderr
