"""Dual-track: the reference runs on one host (the Linux GPU box), the target on another.

Simulation: both hosts are real sshd instances on this machine; the reference's
``device: cpu`` stands in for ``cuda`` (there is no GPU here), and host A's
environment is made to differ by one extra installed package (a dist-info on its
PYTHONPATH, set by its sshd), so the record has a real mismatch to name. The record
must be accepted, which needs torch on both hosts: they run the lab host's torch
interpreter (hence ``host_torch``).
"""

from __future__ import annotations

import json

from remotemac.engine.context import host_for_key, make_sides
from remotemac.playbook import parse_playbook
from tests import fleetkit as fk


def test_reference_side_gets_its_own_host_key():
    pb = parse_playbook(
        "name: d\nhost: mac\nworkload:\n  command: python3 t.py\n"
        "  reference: {device: cuda, host: linux-gpu}\n"
    )
    sides = make_sides(pb)
    assert [(s.role, s.host_key) for s in sides] == [
        ("reference", "reference"),
        ("target", "remote"),
    ]
    assert host_for_key(pb, "reference") == "linux-gpu" and host_for_key(pb, "remote") == "mac"
    same = parse_playbook(
        "name: d\nhost: mac\nworkload:\n  command: python3 t.py\n"
        "  reference: {device: cpu, host: mac}\n"
    )
    assert {s.host_key for s in make_sides(same)} == {"remote"}


def test_host_torch_reference_on_host_a_target_on_host_b(sshd_factory, tmp_path, host_torch_python):
    config = tmp_path / "ssh_config"
    empty = tmp_path / "user_known_hosts"
    empty.touch()
    host_a = sshd_factory()
    marker = host_a.host_dir("linux-site")  # host A's user must read it
    dist = marker / "linux_only_marker-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: linux-only-marker\nVersion: 1.0\n")
    host_a.extra_config.append(f"SetEnv PYTHONPATH={marker}")
    host_a.restart()
    host_b = sshd_factory()
    host_a.write_ssh_config(config, "linux-gpu", known_hosts=empty)
    host_b.write_ssh_config(config, "mac-b", known_hosts=empty)
    home = tmp_path / "home"
    home.mkdir()
    (home / "known_hosts").write_text(host_a.known_hosts_line() + host_b.known_hosts_line())
    pb = fk.write_playbook(
        tmp_path / "dual.yaml",
        host="mac-b",
        python=host_torch_python,
        workload={"reference": {"device": "cpu", "host": "linux-gpu"}},
    )
    out = tmp_path / "out"
    proc = fk.cli(
        "--ssh-config",
        str(config),
        "run",
        str(pb),
        "--out",
        str(out),
        home=home,
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:])
    record = json.loads((out / "acceptance.json").read_text())
    assert record["verdict"] == "accepted"
    env = record["environment"]
    assert env["reference"]["host"] == f"{host_a.user}@127.0.0.1:{host_a.port}"
    assert env["target"]["host"] == f"{host_b.user}@127.0.0.1:{host_b.port}"
    assert env["reference"]["device"] == "cpu" and env["target"]["device"] == "cpu"
    assert {"key": "package:linux-only-marker", "reference": "1.0", "target": None} in env[
        "mismatches"
    ]
    # each job ran on its own host: the reference's log came over host A's link
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    launches = {e["host"] for e in ledger if e["op"] == "launch"}
    assert launches == {env["reference"]["host"], env["target"]["host"]}
    assert (out / "results" / "cpu" / "result.json").exists()
    assert (out / "results" / "cpu-target" / "result.json").exists()
    assert host_a.log().count("Accepted publickey") >= 1
    assert host_b.log().count("Accepted publickey") >= 1
