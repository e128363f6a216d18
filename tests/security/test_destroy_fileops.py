"""Issue 15: wipe, cleanup and the dead-man cannot be turned against the user's files
by what the workload left in its run dir (items 3 and 5).

The host side (cleanupops, deadman, ramstore) runs here for real on this machine's
filesystem: hard links, symlinks and FIFOs are real ones.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from remotemac.agent import cleanupops, ramstore, wipeops
from remotemac.transport.local import LocalTransport
from tests.hostlayout import make_run, mark_root

AGENT = str(Path(__file__).resolve().parents[2] / "remotemac" / "agent")

RUN = "w-20260101-000000-cccc"
SUBS = ("data", "tmp", "cache", "out", "logs", "status", "project")


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "outside" / "thesis.tex"
    victim.parent.mkdir()
    victim.write_text("precious words")
    return victim


def test_item03_wipe_never_zeroes_a_hard_linked_file(tmp_path: Path):
    """``os.link(victim, run_dir/tmp/x)``: the link goes, the victim keeps its bytes."""
    victim = _victim(tmp_path)
    root = mark_root(tmp_path / "root")
    run_dir = make_run(root, RUN, SUBS)
    os.link(victim, run_dir / "tmp" / "x")
    (run_dir / "tmp" / "y").symlink_to(victim)
    (run_dir / "tmp" / "plain.csv").write_bytes(b"plaintext" * 10)
    answer = wipeops.wipe_run_data({"root": str(root), "run_id": RUN})
    assert victim.read_text() == "precious words"
    assert not (run_dir / "tmp").exists() and answer["verified"] is True
    assert any("hard-linked (2 names): unlinked, not overwritten" in n for n in answer["notes"])


def test_item03_cleanup_and_tmp_store_never_zero_a_hard_linked_file(tmp_path: Path):
    victim = _victim(tmp_path)
    root = mark_root(tmp_path / "root")
    run_dir = make_run(root, RUN, SUBS)
    os.link(victim, run_dir / "tmp" / "x")
    store = run_dir / "tmp" / f"data-{RUN}"
    store.mkdir()
    os.link(victim, store / "z")
    secret = store / "secret.bin"
    secret.write_bytes(b"s" * 64)
    with open(secret, "rb") as handle:  # keep the inode to read it after the unlink
        assert ramstore.destroy_ram_store({"kind": "tmp", "path": str(store)})["removed"]
        assert handle.read() == b"\0" * 64, "a singly linked tmp file is still zeroed"
    assert victim.read_text() == "precious words"
    answer = cleanupops.op_cleanup_host({"roots": [str(root)], "run_ids": [RUN]})
    assert answer["roots"][0]["verified"] is True and not root.exists()
    assert victim.read_text() == "precious words"


def _in_child(code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run host-side code in its own process: a hang is a timeout, not a stuck test."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(Path(AGENT).parent.parent)!r})\n" + code,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_item05_fifos_never_hang_wipe_deadman_or_cleanup(tmp_path: Path):
    """FIFOs as status files, as the dead-man spec and as inventory.json."""
    root = mark_root(tmp_path / "root")
    run_dir = make_run(root, RUN, SUBS)
    os.mkfifo(run_dir / "status" / "cpu.json")
    os.mkfifo(run_dir / "status" / "mps.json")
    os.mkfifo(run_dir / "tmp" / "pipe")
    (root / "deadman").mkdir()
    os.mkfifo(root / "deadman" / f"{RUN}.json")
    req = json.dumps({"root": str(root), "run_id": RUN})
    started = time.monotonic()
    wipe = _in_child(
        f"from remotemac.agent import wipeops; import json; r = wipeops.wipe_run_data({req})\nprint(json.dumps(r['verified']))"
    )
    assert wipe.returncode == 0 and wipe.stdout.strip() == "true", wipe.stderr
    fire = _in_child(
        f"from remotemac.agent import deadman; print(deadman.fire({str(root / 'deadman' / (RUN + '.json'))!r}))"
    )
    assert fire.returncode == 0 and fire.stdout.strip() == "None", fire.stderr
    sleeper = _in_child(
        "from remotemac.agent import deadman; print(deadman.sleep_then_fire("
        f"{str(root / 'deadman' / (RUN + '.json'))!r}))"
    )
    assert sleeper.returncode == 0 and sleeper.stdout.strip() == "0", sleeper.stderr
    os.mkfifo(root / "inventory.json")
    creq = json.dumps({"roots": [str(root)], "run_ids": [RUN]})
    clean = _in_child(
        f"from remotemac.agent import cleanupops; import json; a = cleanupops.op_cleanup_host({creq})\n"
        "print(json.dumps(a['roots'][0]['notes']))"
    )
    assert clean.returncode == 0, clean.stderr
    assert "inventory.json unreadable (not a regular JSON file)" in json.loads(clean.stdout)
    assert time.monotonic() - started < 60
    assert not run_dir.exists()


def test_item05_pull_skips_a_fifo_in_status(tmp_path: Path):
    """With the local transport, a FIFO where the harness's observations belong is
    skipped (it was "internal error: SpecialFileError")."""
    from remotemac.engine.pull import fetch_evidence

    run_dir = make_run(mark_root(tmp_path / "root"), RUN, SUBS)
    os.mkfifo(run_dir / "status" / "cpu.obs.json")
    (run_dir / "logs" / "cpu.rss.jsonl").write_text('{"t": 0}\n')
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    said: list = []
    ctx = SimpleNamespace(
        host_for=lambda side: SimpleNamespace(transport=LocalTransport()),
        out_dir=out,
        run_id="r",
        emit=said.append,
    )
    got = asyncio.run(
        asyncio.wait_for(fetch_evidence(ctx, SimpleNamespace(label="cpu"), str(run_dir)), 20)
    )
    assert got == ["cpu.rss.jsonl"]
    assert not (out / "logs" / "cpu.obs.json").exists()
    assert any("cpu.obs.json not read" in w.message for w in said)  # and the user is told
