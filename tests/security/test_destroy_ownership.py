"""Issue 15, ownership before destruction: cleanup and run never take a directory
remotemac did not make (items 1, 7, 11, 15).

All through the real CLI on the ``local`` host (LocalTransport): the promise is the
same as over SSH, the host side runs the same agent code from memory, and
``~`` is the HOME the test gives the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from remotemac.agent import cleanupops
from remotemac.journal import Journal
from tests.conftest import LINES_PROJECT, remotemac
from tests.harness import hostbuilt
from tests.hostlayout import make_run, mark_root


def tree(path: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(path.rglob("*"))
    }


@pytest.fixture
def env(tmp_path: Path) -> dict:
    home = tmp_path / "home"
    home.mkdir()
    rm_home = tmp_path / "rmhome"
    tmux = tmp_path / "tmux"
    tmux.mkdir(mode=0o700)
    return {
        "home": home,
        "rm_home": rm_home,
        "cwd": tmp_path,
        # the host's own interpreters, not the test venv (tests/harness/hostbuilt.py)
        "vars": {
            "HOME": str(home),
            "REMOTEMAC_HOME": str(rm_home),
            "TMUX_TMPDIR": str(tmux),
            **hostbuilt.host_env(),
        },
    }


def playbook(tmp_path: Path, root: str, name: str = "own", **extra) -> Path:
    data = {
        "name": name,
        "host": "local",
        "remote_root": root,
        "project": {"path": str(LINES_PROJECT), "exclude": ["data/"]},
        # torch-free: the host builds an empty venv from a 3.11 it has
        "environment": {"python": hostbuilt.PYTHON_VERSION},
        "data": {"path": str(LINES_PROJECT / "data"), "classification": "public", "encrypt": True},
        "workload": {
            "command": "python3 emit.py --device {device} --data {data_dir} "
            "--out {output_dir} --lines 3 --seconds 0.1",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        },
        "outputs": {"path": ".", "compare": [{"file": "result.json", "rtol": 1e-6, "atol": 1e-9}]},
        "stop_when": {"memory_growth": False},
    }
    data.update(extra)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_item01_cleanup_refuses_unmarked_root(env):
    """The reproduction of the issue: ~/Documents was never remotemac's."""
    docs = env["home"] / "Documents"
    (docs / "thesis").mkdir(parents=True)
    (docs / "thesis" / "ch1.tex").write_text("\\chapter{One}")
    (docs / "notes.txt").write_text("mine")
    before = tree(docs)
    proc = remotemac(
        "cleanup", "local", "--remote-root", "~/Documents", "--yes", cwd=env["cwd"], env=env["vars"]
    )
    assert tree(docs) == before, "cleanup touched a directory remotemac never made"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [folder] = list((env["rm_home"] / "cleanups").glob("cleanup-local-*"))
    record = json.loads((folder / "cleanup.json").read_text())
    [root] = record["remote_roots"]
    assert f"{docs}: not made by remotemac (no marker; 3 entries) - left alone" == root["refused"]
    assert record["status"] == "not clean" and record["bytes_freed"] == 0


def test_item01_cleanup_keeps_user_files_in_a_marked_root(env):
    """A root remotemac made, where the user later put files: only remotemac's go."""
    root = env["home"] / "remotemac"
    run_dir = make_run(root, "r-20260101-000000-aaaa")
    (run_dir / "data" / "x.rmenc").write_bytes(b"c" * 10)
    (root / "my-results").mkdir()
    (root / "my-results" / "table.csv").write_text("1,2\n")
    (root / "runs" / "copied-by-hand").mkdir()  # no marker: not remotemac's
    (root / "runs" / "copied-by-hand" / "keep.txt").write_text("k")
    proc = remotemac(
        "cleanup",
        "local",
        "--remote-root",
        str(root),
        "--yes",
        "--json",
        cwd=env["cwd"],
        env=env["vars"],
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    fates = {Path(i["path"]).name: i for i in record["items"]}
    assert fates[run_dir.name]["fate"] == "removed" and not run_dir.exists()
    assert fates["copied-by-hand"]["fate"] == "left alone"
    assert "no marker; 1 entries" in fates["copied-by-hand"]["why"]
    assert fates["remotemac"]["fate"] == "left alone"
    assert "2 entries remotemac did not make" in fates["remotemac"]["why"]
    assert (root / "my-results" / "table.csv").read_text() == "1,2\n"
    assert (root / "runs" / "copied-by-hand" / "keep.txt").read_text() == "k"
    assert (root / ".remotemac-owned").exists(), "the marker stays for a later cleanup"


@pytest.mark.slow
def test_item07_check_refuses_home_shaped_roots(tmp_path: Path, env):
    for root in ("/Users/alice", "/home/bob", "/var/root"):
        proc = remotemac("check", str(playbook(tmp_path, root)), cwd=tmp_path, env=env["vars"])
        assert proc.returncode == 2, (root, proc.stdout, proc.stderr)
        assert "looks like a home directory" in proc.stderr, proc.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["home", "above-home", "users-files"])
def test_item07_run_refuses_home_or_foreign_root_before_writing(tmp_path: Path, env, where):
    """The host's home, a dir above it, or a dir of the user's files: refused in
    provision, before anything is written there (exit 2), so no wipe can be stuck."""
    home = env["home"]
    (home / "Documents").mkdir()
    (home / "Documents" / "cv.pdf").write_bytes(b"%PDF")
    root = {
        "home": str(home),
        "above-home": str(home.parent),
        "users-files": str(home / "Documents"),
    }[where]
    before = tree(home)
    proc = remotemac(
        "run",
        str(playbook(tmp_path, root)),
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
        env=env["vars"],
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert tree(home) == before, "provision wrote into the refused root"
    line = proc.stderr.strip().splitlines()[-1]
    assert {
        "home": "home dir",
        "above-home": "home dir",
        "users-files": "1 entry remotemac did not write (cv.pdf)",
    }[where] in line, line
    assert (
        not list((env["rm_home"] / "keys").glob("*.key"))
        if (env["rm_home"] / "keys").exists()
        else True
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_item11_cleanup_finds_root_of_run_failed_in_provision(tmp_path: Path, env):
    """A run that died in provision (no such interpreter for the venv) left its root;
    cleanup with the default --remote-root still finds and removes it."""
    root = tmp_path / "elsewhere" / "rmroot"
    book = playbook(tmp_path, str(root), environment={"python": "python-nope-3.99", "venv": True})
    proc = remotemac(
        "run", str(book), "--out", str(tmp_path / "out"), cwd=tmp_path, env=env["vars"]
    )
    assert proc.returncode != 0 and root.is_dir(), proc.stdout + proc.stderr
    journal = Journal(env["rm_home"] / "journal.sqlite3")
    [run] = journal.list_runs()
    assert journal.phases(run.run_id)["provision"]["state"] == "failed"
    journal.close()
    clean = remotemac("cleanup", "local", "--yes", "--json", cwd=tmp_path, env=env["vars"])
    assert clean.returncode == 0, clean.stdout + clean.stderr
    record = json.loads(clean.stdout.strip().splitlines()[-1])
    assert str(root) in [r["root"] for r in record["remote_roots"]]
    assert not root.exists() and record["status"] == "clean"
    assert (tmp_path / "elsewhere").is_dir(), "only the root goes, not its parent"


def _hostile_root(root: Path) -> Path:
    """A marked root with one run of remotemac's, a RAM store and what it did not make."""
    run_dir = make_run(root, "h-20260101-000000-bbbb", ("data", "tmp", "logs", "status"))
    (run_dir / "data" / "x.rmenc").write_bytes(b"c" * 100)
    (root / "runs" / "stray").mkdir()
    (root / "runs" / "stray" / "f").write_text("not ours")
    (root / "runs" / "link").symlink_to(root.parent)
    (root / "envs").mkdir()
    (root / "envs" / "half").mkdir()  # no marker
    (root / "user.txt").write_text("u")
    return run_dir


def test_item15_dry_run_lists_exactly_what_cleanup_removes(tmp_path: Path, env):
    root = mark_root(tmp_path / "rr")
    run_dir = _hostile_root(root)
    shm = Path("/dev/shm") / f"remotemac-{run_dir.name}"
    shm.mkdir(mode=0o700)
    (shm / "plain.csv").write_text("p")
    try:
        known = [{"kind": "ramstore", "path": str(shm), "run_id": run_dir.name}]
        req = {"roots": [str(root)], "known": known, "run_ids": [run_dir.name]}
        dry = cleanupops.op_cleanup_host(dict(req, dry_run=True))["roots"][0]
        real = cleanupops.op_cleanup_host(dict(req, dry_run=False))["roots"][0]
    finally:
        if shm.exists():
            import shutil

            shutil.rmtree(shm)
    would = {(i["kind"], i["path"]) for i in dry["items"] if i["fate"] == "would remove"}
    removed = {(i["kind"], i["path"]) for i in real["items"] if i["fate"] == "removed"}
    assert would == removed
    assert ("ramstore", str(shm)) in would and ("run", str(run_dir)) in would
    left_dry = {
        (i["kind"], i["path"], i["fate"])
        for i in dry["items"]
        if i["fate"] not in ("would remove", "not found")
    }
    left_real = {
        (i["kind"], i["path"], i["fate"])
        for i in real["items"]
        if i["fate"] not in ("removed", "not found")
    }
    assert left_dry == left_real
    assert ("root", str(root), "left alone") in left_real
    assert {("run", str(root / "runs" / n), "left alone") for n in ("stray", "link")} <= left_real
    assert (root / "user.txt").exists() and (root / "runs" / "stray" / "f").exists()
    assert root.is_dir() and (root.parent / "home").is_dir()
