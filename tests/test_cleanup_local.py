"""Cleanup on the ``local`` host: partial inventory, forgotten runs, safety, confirmation.

The host state is built by hand (what the agent and the journal would have
left), so these tests are fast; the full pipeline is covered in test_cleanup_sshd.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from remotemac.agent import wipeops
from remotemac.journal import Journal
from tests.conftest import remotemac, remotemac_in_process
from tests.hostlayout import make_run, mark


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A fake host home with a remote_root, a canary outside it and a private tmux dir."""
    home = tmp_path / "hosthome"
    root = home / "remotemac"
    root.mkdir(parents=True)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("mine")
    tmux = tmp_path / "tmux"
    tmux.mkdir(mode=0o700)
    rm_home = tmp_path / "rmhome"
    env = {"REMOTEMAC_HOME": str(rm_home), "TMUX_TMPDIR": str(tmux)}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return {
        "home": home,
        "root": root,
        "canary": canary,
        "env": env,
        "rm_home": rm_home,
        "cwd": tmp_path,
    }


def _make_run(root: Path, run_id: str) -> Path:
    run_dir = make_run(root, run_id)
    (run_dir / "data" / "x.rmenc").write_bytes(b"\0" * 100)
    return run_dir


def _journal_run(rm_home: Path, run_id: str, root: Path) -> None:
    journal = Journal(rm_home / "journal.sqlite3")
    journal.create_run(
        run_id,
        name="lines",
        host="local",
        playbook_path=None,
        playbook={},
        out_dir=str(rm_home / "out"),
        options={},
    )
    journal.start_phase(run_id, "provision")
    journal.finish_phase(
        run_id,
        "provision",
        {"hosts": {"remote": {"root": str(root), "run_dir": str(root / "runs" / run_id)}}},
    )
    journal.record_created("local", "run", str(root / "runs" / run_id), run_id)
    journal.close()


def _cleanup(host, *args: str):
    return remotemac(
        "cleanup",
        "local",
        "--remote-root",
        str(host["root"]),
        *args,
        cwd=host["cwd"],
        env=host["env"],
    )


def test_partial_inventory_and_forgotten_runs(host):
    root = host["root"]
    kept = _make_run(root, "a-1")
    _make_run(root, "b-2")  # only found by scanning runs/: inventory and journal forgot it
    mark(root / "envs" / "0123abcd", "venv")
    mark(root / "agent" / "feedbeef", "agent")
    # inventory.json knows only one run (the rest of the file was lost)
    (root / "inventory.json").write_text(
        json.dumps(
            {
                "version": 1,
                "items": [{"kind": "run", "path": str(kept), "run_id": "a-1", "created_at": 1.0}],
            }
        )
    )
    # the journal knows a run the host has already forgotten
    _journal_run(host["rm_home"], "gone-3", root)
    _journal_run(host["rm_home"], "a-1", root)
    proc = _cleanup(host, "--yes", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    fates = {(i["kind"], Path(i["path"]).name): (i["fate"], i["sources"]) for i in record["items"]}
    assert fates[("run", "a-1")] == ("removed", ["inventory", "journal", "found"])
    assert fates[("run", "b-2")] == ("removed", ["found"])
    assert fates[("run", "gone-3")][0] == "not found"
    assert fates[("venv", "0123abcd")][0] == "removed"
    assert fates[("agent", "feedbeef")][0] == "removed"
    assert record["status"] == "clean" and not root.exists()
    assert host["home"].is_dir() and list(host["home"].iterdir()) == []


def test_corrupt_inventory_and_symlinks_never_followed(host):
    root = host["root"]
    canary = host["canary"]
    run_dir = _make_run(root, "c-1")
    (root / "inventory.json").write_text("{not json")
    (run_dir / "data" / "to-canary").symlink_to(canary)
    (root / "escape").symlink_to(canary)
    (root / "runs" / "evil").symlink_to(canary)  # a "run" that is a link out
    proc = _cleanup(host, "--yes")
    # the two links at the top were not made by remotemac: left alone, so the root
    # stays (with its marker, for a later cleanup) and the cleanup is "not clean"
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (canary / "keep.txt").read_text() == "mine"
    assert not run_dir.exists()
    assert sorted(p.name for p in root.rglob("*") if p.name != ".remotemac-owned") == [
        "escape",
        "evil",
        "inventory.json",
        "runs",
    ]
    assert not list(host["cwd"].glob("cleanup-*")), "the record went into the cwd"
    [folder] = list((host["rm_home"] / "cleanups").glob("cleanup-local-*"))
    record = json.loads((folder / "cleanup.json").read_text())
    fates = {Path(i["path"]).name: i for i in record["items"]}
    assert fates["evil"]["fate"] == "left alone" and "symlink" in fates["evil"]["why"]
    assert fates["remotemac"]["fate"] == "left alone" and "escape" in fates["remotemac"]["why"]
    assert any("inventory.json unreadable" in n for r in record["remote_roots"] for n in r["notes"])


def test_dry_run_touches_nothing_and_confirmation_is_required(host):
    root = host["root"]
    _make_run(root, "d-1")
    snapshot = sorted(str(p) for p in root.rglob("*"))
    dry = _cleanup(host, "--dry-run")
    assert dry.returncode == 0 and "would remove" in dry.stdout and "runs/d-1" in dry.stdout
    assert sorted(str(p) for p in root.rglob("*")) == snapshot
    assert not list(host["cwd"].glob("cleanup-*"))
    # human sizes, before the path (a long path runs past the edge only at its end)
    assert "bytes" not in dry.stdout and re.search(
        r"^  run +\d+(\.\d)? (B|KiB|MiB)  /\S+/runs/d-1$", dry.stdout, re.M
    ), dry.stdout
    no = _cleanup(host)  # stdin is not a terminal: no answer, nothing done, exit 2
    assert no.returncode == 2 and "no answer to the question" in no.stderr
    assert "nothing was done" in no.stderr
    assert sorted(str(p) for p in root.rglob("*")) == snapshot
    # answered no: said on stdout, exit 0, no error line
    declined = subprocess.run(
        [sys.executable, "-m", "remotemac", "cleanup", "local", "--remote-root", str(root)],
        cwd=host["cwd"],
        env={**os.environ, **host["env"]},
        input="n\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert declined.returncode == 0, declined.stdout + declined.stderr
    assert "remotemac: error" not in declined.stderr
    # (the question's own line ends where the terminal would echo the answer)
    assert (
        declined.stdout.strip()
        .splitlines()[-1]
        .endswith("? [y/N]: cleanup not confirmed: nothing was removed")
    ), declined.stdout
    assert sorted(str(p) for p in root.rglob("*")) == snapshot
    assert not list(host["cwd"].glob("cleanup-*"))
    assert not (host["rm_home"] / "cleanups").exists()


@pytest.mark.parametrize("bad", ["/", "~", "", "/usr", "/etc", "~/"])
def test_unsafe_remote_root_refused_by_cli(host, bad, monkeypatch):
    monkeypatch.chdir(host["cwd"])  # host's env is set in this process already
    proc = remotemac_in_process("cleanup", "local", "--remote-root", bad, "--yes")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (host["canary"] / "keep.txt").exists()


def test_agent_refuses_unsafe_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for bad in (
        "",
        "/",
        "~",
        "~/",
        str(home),
        str(tmp_path),
        "/usr/local",
        "/tmp",
        "rel/dir",
        "/a/../etc",
    ):
        with pytest.raises(wipeops.UnsafeRoot):
            wipeops.check_root(bad)
    (home / "sneaky").symlink_to("/usr")
    with pytest.raises(wipeops.UnsafeRoot):
        wipeops.check_root(str(home / "sneaky"))
    assert wipeops.check_root("~/remotemac")[0] == str(home / "remotemac")


def test_remove_item_never_leaves_the_root(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("x")
    (root / "link").symlink_to(outside)
    real = os.path.realpath(root)
    # through a symlinked parent: refused; the link itself: only the link goes
    assert wipeops.remove_item(real, str(root / "link" / "f"), False).fate == "failed"
    assert wipeops.remove_item(real, str(outside / "f"), False).fate == "failed"
    assert wipeops.remove_item(real, str(root / "link"), False).fate == "removed"
    assert (outside / "f").read_text() == "x"
    ram = wipeops.RamStore.from_json({"kind": "shm", "path": str(outside)})
    assert wipeops.destroy_ram(ram, []).fate == "failed"
    assert (outside / "f").exists()


def test_a_ram_store_is_listed_once_whatever_the_number_of_roots(host, tmp_path: Path):
    """A host used with two remote_roots: the RAM store of a run (host-wide, under
    /dev/shm) was listed once per root, its size counted in the total each time
    (the dry run of a first rental said 640 MiB three times, total 8.3 GiB)."""
    other = host["home"] / "second root"
    run_id = f"ram-{os.getpid()}-{tmp_path.name[-12:]}"
    _make_run(host["root"], run_id)
    _make_run(other, "other-1")
    _journal_run(host["rm_home"], run_id, host["root"])
    _journal_run(host["rm_home"], "other-1", other)
    ram = Path("/dev/shm") / f"remotemac-{run_id}"
    ram.mkdir(mode=0o700)
    (ram / "x").write_bytes(b"\0" * 4096)
    try:
        dry = _cleanup(host, "--dry-run", "--json")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        items = json.loads(dry.stdout.strip().splitlines()[-1])["items"]
        rams = [i for i in items if i["kind"] == "ramstore"]
        assert len(rams) == 1 and rams[0]["path"] == str(ram), rams
        done = _cleanup(host, "--yes", "--json")
        record = json.loads(done.stdout.strip().splitlines()[-1])
        rams = [i for i in record["items"] if i["kind"] == "ramstore"]
        assert [i["fate"] for i in rams] == ["removed"], rams
        assert not ram.exists() and record["status"] == "clean", record
    finally:
        if ram.exists():
            import shutil

            shutil.rmtree(ram)


def test_an_upload_dir_a_stopped_upload_left_unmarked_is_removed(host):
    """A runtime upload the host's full disk (or a cut, or a killed laptop) stopped
    leaves ``runtime/upload-<sha>-<pid>`` with a partial wheel and no marker (the
    marker could not be written either): it is remotemac's, and cleanup removes it
    (it once stayed "left alone", the root with it, the host "not clean" for good).
    A look-alike that is not named like one stays."""
    root = host["root"]
    _make_run(root, "a-1")
    _journal_run(host["rm_home"], "a-1", root)
    upload = root / "runtime" / "upload-d5012feb2841fa8b-30293"
    upload.mkdir(parents=True)
    (upload / "cryptography-44.0.0-cp39-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"PK\3\4")
    stranger = root / "runtime" / "uploads-of-mine"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine")
    proc = _cleanup(host, "--yes", "--json")
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    fates = {Path(i["path"]).name: i["fate"] for i in record["items"]}
    assert fates["upload-d5012feb2841fa8b-30293"] == "removed", record["items"]
    assert fates["uploads-of-mine"] == "left alone", record["items"]
    assert not upload.exists() and (stranger / "keep.txt").exists()
