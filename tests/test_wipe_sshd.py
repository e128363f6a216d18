"""``remotemac wipe RUN`` over real SSH: data gone, key shredded, record updated, ledger clean.

The host is the fresh-host lab (bare python3 3.9, default ``environment``): an encrypted
run completes there with the agent's own runtime, then is wiped.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from remotemac.agent import datarecords, streamcrypt
from remotemac.data.keys import load_data_key
from remotemac.errors import IntegrityError
from tests.test_cleanup_sshd import make_target, write_playbook


@pytest.mark.timeout(300)
def test_wipe_after_run_shreds_data_and_key(tmp_path: Path, sshd_factory, ssh_env):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    book = write_playbook(tmp_path, t.alias, t.root, "wipeme", wipe="manual")
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out), "--json")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    [run_id] = [p.name for p in (t.root / "runs").iterdir()]
    run_dir = t.root / "runs" / run_id
    shm = Path("/dev/shm") / f"remotemac-{run_id}"
    assert shm.is_dir(), "encrypted data is decrypted into /dev/shm on Linux"
    # a copy of the ciphertext taken before the wipe, and the key as it was
    copies = tmp_path / "stolen"
    shutil.copytree(run_dir / "data", copies)
    records = datarecords.load_records(str(copies))
    assert records
    key = load_data_key(t.rm_home, run_id)
    rel = sorted(records)[0]
    # its stored ciphertext: a span of a pack (small files) or a file of its own
    span = datarecords.stored_span(str(copies), records[rel], True)
    streamcrypt.decrypt_file(key, rel, span[0], str(tmp_path / "plain-before"), *span[1:])
    assert (tmp_path / "plain-before").read_bytes() == (
        Path(__file__).parent / "fixtures/projects/lines/data" / rel
    ).read_bytes()
    # it ran on the bare host: its own python3 (3.9, a venv of it), no cryptography there
    target_env = json.loads((out / "env" / "target.json").read_text())
    assert target_env["python"].startswith("3.9."), target_env["python"]
    assert "cryptography" not in target_env.get("packages", {})
    # the data key never appears in the ledger, not even as hex
    ledger_text = (out / "ledger.jsonl").read_text()
    assert key.hex() not in ledger_text and key.hex().upper() not in ledger_text

    wiped = t.cli("wipe", run_id, "--yes")
    assert wiped.returncode == 0, wiped.stdout + wiped.stderr
    for sub in ("data", "tmp", "cache", "out"):
        assert not (run_dir / sub).exists(), sub
    assert not shm.exists()
    assert t.sessions() == []
    # crypto-shredding: the key file is gone, and no other key opens the copy
    assert not (t.rm_home / "keys" / f"{run_id}.key").exists()
    with pytest.raises(IntegrityError):
        load_data_key(t.rm_home, run_id)
    with pytest.raises(streamcrypt.DecryptError):
        streamcrypt.decrypt_file(os.urandom(32), rel, span[0], str(tmp_path / "p2"), *span[1:])
    assert not (tmp_path / "p2").exists()
    record = json.loads((out / "acceptance.json").read_text())
    wipe = record["wipe"]
    assert wipe["done"] is True and wipe["verified"] is True
    assert any(r.endswith(f"{run_dir}/data") for r in wipe["removed"]), wipe
    assert any("crypto-shredded" in r for r in wipe["removed"])
    assert any(f"ram:{shm}" in r for r in wipe["removed"])
    remaining = " ".join(wipe["remaining"])
    assert "logs" in remaining and "kept until cleanup" in remaining
    assert "/data" not in remaining
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    assert key.hex() not in json.dumps(ledger)
    assert any(e["op"] == "wipe_run_data" and e["via"] in ("ssh", "resident") for e in ledger)
    assert any(
        e["via"] == "agent" and "rm -rf" in e["command"] and str(shm) in e["command"]
        for e in ledger
    )
    shown = t.cli("status", run_id, "--ledger")
    assert "wipe_run_data" in shown.stdout
