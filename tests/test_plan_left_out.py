"""`run --dry-run` names every dataset file the slice leaves out, and why.

A user's include matched a 100 GiB file over ``data.max_bytes``, a FIFO and a symlink
pointing out of the data dir; the slice left them out, but the human plan listed only
the files it kept (the reasons were in ``--dry-run --json`` alone) and the run said
"3 left out" without naming them: a dataset silently smaller than the user meant.
"""

from __future__ import annotations

import json
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


def test_project_upload_leaves_out_remotemac_s_own_runs_dir(tmp_path: Path, monkeypatch):
    """``project: {path: .}`` run from the project dir: remotemac's own default --out
    (``./runs/``, earlier runs' records and checkpoints) is not uploaded, and the dry
    run says so; so is an earlier run's record given another --out inside the project
    (was: 228 files, 2.1 MiB of earlier results carried to the host)."""
    import json

    from remotemac.engine.plan import make_plan
    from remotemac.playbook import load_playbook

    project = tmp_path / "proj"
    (project / "runs" / "old-1" / "results" / "cpu").mkdir(parents=True)
    (project / "runs" / "old-1" / "acceptance.json").write_text("{}")
    (project / "runs" / "old-1" / "results" / "cpu" / "model.ckpt").write_bytes(b"x" * 64)
    (project / "elsewhere" / "r2").mkdir(parents=True)
    (project / "elsewhere" / "r2" / "acceptance.json").write_text("{}")
    (project / "elsewhere" / "r2" / "ledger.jsonl").write_text("")
    (project / "train.py").write_text("print('hi')\n")
    (project / "pb.yaml").write_text(
        json.dumps(
            {
                "name": "own-out",
                "host": "local",
                "remote_root": str(tmp_path / "root"),
                "project": {"path": "."},
                "workload": {"command": "python3 train.py", "target": {"device": "cpu"}},
            }
        )
    )
    monkeypatch.chdir(project)
    plan = make_plan(load_playbook(project / "pb.yaml"))
    left = {g["why"]: g["files"] for g in plan["project"]["left_out"]}
    assert plan["project"]["files"] == 2, plan["project"]  # train.py, pb.yaml
    assert left == {
        "remotemac's own default --out (./runs/: earlier runs' records)": 2,
        "an earlier remotemac run's record (its acceptance.json and ledger.jsonl)": 2,
    }, left
    proc = remotemac("--home", str(tmp_path / "home"), "run", "pb.yaml", "--dry-run", cwd=project)
    assert "left out of the project upload: 2 files remotemac's own default --out" in " ".join(
        proc.stdout.split()
    ), proc.stdout


def test_dry_run_says_the_most_the_run_can_cost(tmp_path: Path):
    """Before renting hours: with ``cost.hourly_rate`` the dry run prints the bound
    (each job on the host up to ``workload.timeout``; the reference here runs on the
    host too), in one line that fits 80 columns."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "train.py").write_text("print('hi')\n")
    book = project / "pb.yaml"
    book.write_text(
        yaml.safe_dump(
            {
                "name": "costly",
                "host": "mac-rental",
                "remote_root": "~/rm",
                "workload": {
                    "command": "python3 train.py",
                    "reference": {"device": "cpu", "on": "remote"},
                    "target": {"device": "mps"},
                    "timeout": "2h",
                },
                "cost": {"hourly_rate": 1.1, "currency": "USD"},
            }
        )
    )
    proc = remotemac("--home", str(tmp_path / "home"), "run", str(book), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("cost:"))
    assert line == "cost: at most 4.40 USD (2 jobs up to workload.timeout, 4 h × 1.1/h)", line
    assert len(line) <= 80
    plan = json.loads(
        remotemac("--home", str(tmp_path / "home"), "run", str(book), "--dry-run", "--json").stdout
    )
    assert plan["cost"] == {
        "jobs": 2,
        "max_hours": 4.0,
        "hourly_rate": 1.1,
        "currency": "USD",
        "max_amount": 4.4,
    }
