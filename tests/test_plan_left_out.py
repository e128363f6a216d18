"""`run --dry-run` names every dataset file the slice leaves out, and why.

A user's include matched a 100 GiB file over ``data.max_bytes``, a FIFO and a symlink
pointing out of the data dir; the slice left them out, but the human plan listed only
the files it kept (the reasons were in ``--dry-run --json`` alone) and the run said
"3 left out" without naming them: a dataset silently smaller than the user meant.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tests.conftest import remotemac


def test_dry_run_lists_the_dataset_files_left_out_with_why(tmp_path: Path):
    project = tmp_path / "my proj é"
    train = project / "data" / "train"
    train.mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (train / "a.npy").write_bytes(b"x" * 100)
    with open(train / "huge.npy", "wb") as fh:  # sparse: 3 GiB, over max_bytes
        fh.truncate(3 << 30)
    os.mkfifo(train / "pipe.npy")
    (train / "passwd.npy").symlink_to("/etc/passwd")
    book = project / "pb.yaml"
    book.write_text(
        yaml.safe_dump(
            {
                "name": "left-out",
                "host": "local",
                "remote_root": str(tmp_path / "root"),
                "data": {
                    "path": "./data",
                    "include": ["train/*.npy"],
                    "max_bytes": "2GiB",
                    "classification": "public",
                },
                "workload": {"command": "python3 train.py", "target": {"device": "cpu"}},
            }
        )
    )
    proc = remotemac(
        "--home", str(tmp_path / "home"), "run", str(book), "--dry-run", env={"COLUMNS": "200"}
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "train/a.npy" in out
    left = [line for line in out.splitlines() if "left out of the dataset slice" in line]
    assert left and "3 files" in left[0], out
    for name, why in (
        ("train/huge.npy", "over max_bytes"),
        ("train/pipe.npy", "not a regular file"),
        ("train/passwd.npy", "symlink escapes the data root"),
    ):
        assert any(name in line and why in line for line in out.splitlines()), (name, out)
    assert not (tmp_path / "root").exists()  # a dry run touches nothing
