"""A matrix sweep: 4 variants spread over 2 real sshd hosts, through the real CLI.

The records must be accepted, which needs torch on the host: the lab host's torch
interpreter stands in for a host with torch preinstalled (hence ``host_torch``).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests import fleetkit as fk


def test_host_torch_four_variants_over_two_hosts(sshd_factory, tmp_path, host_torch_python):
    macs, config = fk.start_macs(2, tmp_path, sshd_factory)
    home = tmp_path / "home"
    fk.trust(home, macs)
    inventory = fk.write_inventory(tmp_path / "inventory.yaml", macs, rate=2.0)
    pb = fk.write_playbook(
        tmp_path / "sweep.yaml",
        python=host_torch_python,
        workload={
            "command": "python3 emit.py --device {device} --out {output_dir} "
            "--lines {matrix.lines} --seconds {matrix.seconds} --torch"
        },
        matrix={"lines": [3, 5], "seconds": [0.1, 0.2]},
    )
    out = tmp_path / "out"
    logins = [m.sshd.log().count("Accepted publickey") for m in macs]
    proc = fk.cli(
        "--ssh-config",
        str(config),
        "run",
        str(pb),
        "--inventory",
        str(inventory),
        "--out",
        str(out),
        home=home,
        cwd=tmp_path,
        timeout=600,
    )
    summary = json.loads((out / "fleet.json").read_text())
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-2000:], summary["runs"])
    assert summary["matrix"] == {"lines": [3, 5], "seconds": [0.1, 0.2]}
    assert summary["counts"] == {"accepted": 4}
    expected = [
        {"lines": 3, "seconds": 0.1},
        {"lines": 3, "seconds": 0.2},
        {"lines": 5, "seconds": 0.1},
        {"lines": 5, "seconds": 0.2},
    ]
    assert [r["variant"] for r in summary["runs"]] == expected
    # spread across the fleet: two variants per host
    assert [r["host"] for r in summary["runs"]] == ["h00", "h01", "h00", "h01"]
    records = sorted(out.glob("*/*/acceptance.json"))
    assert len(records) == 4
    for row in summary["runs"]:
        variant = row["variant"]
        folder = out / row["host"] / f"lines={variant['lines']},seconds={variant['seconds']}"
        record = json.loads((folder / "acceptance.json").read_text())
        assert record["verdict"] == "accepted" and record["run_id"] == row["run_id"]
        assert record["matrix"] == variant
        command = record["environment"]["target"]["command"]
        assert f"--lines {variant['lines']} --seconds {variant['seconds']}" in command
        # the variant reached the workload itself: it printed that many lines
        result = json.loads((folder / "results" / "cpu-target" / "result.json").read_text())
        assert result["lines"] == variant["lines"]
        assert row["cost"] is not None and row["cost"] > 0
    # the summary table shows each variant with its verdict
    for variant in expected:
        label = f"lines={variant['lines']},seconds={variant['seconds']}"
        assert any(label in line and "accepted" in line for line in proc.stdout.splitlines()), (
            proc.stdout[-3000:]
        )
    # two runs on each host shared one SSH connection
    assert [
        m.sshd.log().count("Accepted publickey") - n for m, n in zip(macs, logins, strict=True)
    ] == [1, 1]
    # end of rental: `cleanup --all` finds both hosts in the journal, one combined record
    done = fk.cli(
        "--ssh-config",
        str(config),
        "cleanup",
        "--all",
        "--yes",
        "--json",
        home=home,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    final = json.loads(done.stdout.strip().splitlines()[-1])
    combined = json.loads(Path(final["record"]).read_text())
    assert [h["host"] for h in combined["hosts"]] == ["h00", "h01"]
    assert all(h["exit_code"] == 0 and h["record"] for h in combined["hosts"])
    for mac in macs:
        assert not (mac.root / "runs").exists(), list(mac.root.rglob("*"))[:10]
