"""The command ledger: redaction, privileged marks, agent steps, held entries."""

from __future__ import annotations

import json
import os
from pathlib import Path

from remotemac.engine.ledger import Ledger, format_entry, is_privileged, redact
from remotemac.engine.record import read_jsonl


def test_redact_hides_secret_shapes():
    key_hex = os.urandom(32).hex()
    line = (
        f"tool --key-hex {key_hex} password=hunter2 TOKEN=abc --passphrase s3cret "
        f"Authorization: Bearer-xyz cat /runs/lines-20261130-035331-7547/status/cpu.json"
    )
    out = redact(line)
    for secret in (key_hex, "hunter2", "abc ", "s3cret", "Bearer-xyz"):
        assert secret not in out + " "
    assert "/runs/lines-20261130-035331-7547/status/cpu.json" in out  # paths survive
    assert redact("upload agent 6089d5c5edbb2cd4 to /r") == "upload agent 6089d5c5edbb2cd4 to /r"
    assert "<redacted>" in redact("x " + "A" * 43 + "=")  # base64-looking blob


def test_registered_secret_is_scrubbed(tmp_path: Path):
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.add_secret("swordfish-42")
    ledger.append("h", ["echo", "swordfish-42"], 0, op="x")
    assert "swordfish-42" not in (tmp_path / "ledger.jsonl").read_text()


def test_privileged_marking(tmp_path: Path):
    assert is_privileged("sudo hdiutil detach /dev/disk4")
    assert is_privileged(["/usr/bin/sudo", "-n", "true"])
    assert is_privileged(["env", "A=1", "sudo", "x"])
    assert not is_privileged(["python3", "hostagent.py", "sudo"])
    ledger = Ledger(tmp_path / "l.jsonl")
    ledger.append("mac", "sudo purge", 0, op="purge")
    ledger.append("mac", ["tmux", "kill-session"], 1, op="wipe")
    entries = read_jsonl(tmp_path / "l.jsonl")
    assert [e["privileged"] for e in entries] == [True, False]
    assert "[sudo]" in format_entry(entries[0]) and "[sudo]" not in format_entry(entries[1])


def test_agent_steps_and_hold(tmp_path: Path):
    path = tmp_path / "sub" / "ledger.jsonl"
    ledger = Ledger(path, hold=True)
    ledger.append("mac", ["python3", "-c", "<bootstrap>"], 0, op="cleanup")
    ledger.append_steps(
        "mac", "cleanup", [{"argv": ["tmux", "kill-session", "-t", "=s"], "code": 0, "time": 5.0}]
    )
    assert not path.exists(), "held entries are not written before flush"
    ledger.flush()
    entries = [json.loads(x) for x in path.read_text().splitlines()]
    assert [e["via"] for e in entries] == ["ssh", "agent"]
    assert entries[1]["time"] == 5.0 and entries[1]["command"] == "tmux kill-session -t =s"
    ledger.append("mac", "after", 0)
    assert len(read_jsonl(path)) == 3
    assert Ledger(None).append("h", "x", 0) is None


def test_redact_keeps_an_ssh_host_key_fingerprint():
    """A host key's SHA256 fingerprint is public (the provider publishes it) and is what
    the user compares: `remotemac status RUN` of a run stopped by a changed host key
    showed "it offered SHA256:<redacted>"."""
    line = (
        "HOST KEY CHANGED for [127.0.0.1]:52131: it offered "
        "SHA256:BSy437qzlOK3hMbBefbGhywdNVagqRf6SM+7B4ZA8rY, which differs"
    )
    assert redact(line) == line
    # the same run of characters without the fingerprint label is still a secret shape
    assert "BSy437" not in redact("token BSy437qzlOK3hMbBefbGhywdNVagqRf6SM+7B4ZA8rY")
    assert "BSy437" not in redact("x BSy437qzlOK3hMbBefbGhywdNVagqRf6SM+7B4ZA8rY")
