"""Issue 15 item 12: bad input is one line with the key path and line, exit 2.

Each case ran before the fix: ``timeout: .nan`` was accepted (the job never timed
out), absurd sizes and ports were accepted, a missing requirements file was an
"internal error" halfway through provisioning, ``preflight --seconds 1e309`` an
OverflowError, a bad ``--home`` an internal error, ``wipe`` asked before checking
the id, a 300 KB command took over a minute in ``--dry-run``, and ``run --dry-run``
ignored ``--hosts``/``--inventory``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import remotemac, remotemac_in_process


def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True, exist_ok=True)
    (proj / "train.py").write_text("print('hi')\n")
    (proj / "afile").write_text("not a directory\n")
    return proj


def book(tmp_path: Path, **overrides) -> Path:
    proj = project(tmp_path)
    data = {
        "name": "t",
        "host": "local",
        "project": {"path": str(proj)},
        "workload": {"command": "python train.py"},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path = tmp_path / "book.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=10**9))
    return path


def assert_one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], err[-2000:])
    assert "internal error" not in err and "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("remotemac: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


CASES = {
    "timeout-nan": ({"workload": {"timeout": float("nan")}}, "workload.timeout"),
    "timeout-inf": ({"workload": {"timeout": float("inf")}}, "workload.timeout"),
    "timeout-huge-text": ({"workload": {"timeout": "9" * 400 + "h"}}, "workload.timeout"),
    "size-absurd": (
        {"data": {"path": "proj/data", "max_bytes": "9" * 40 + "TiB"}},
        "data.max_bytes",
    ),
    "size-1e29": ({"data": {"path": "proj/data", "max_bytes": "1e29TiB"}}, "data.max_bytes"),
    "size-int-huge": ({"stop_when": {"max_memory": 10**40}}, "stop_when.max_memory"),
    "rate-inf": ({"cost": {"hourly_rate": float("inf")}}, "cost.hourly_rate"),
    "port-99999": ({"host": "mac:99999"}, "host"),
    "port-abc": ({"host": "mac:abc"}, "host"),
    "ipv6-unclosed": ({"host": "[::1"}, "host"),
    "hosts-port": ({"hosts": ["a", "b:0"]}, "hosts"),
    "requirements-missing": (
        {"environment": {"requirements": "requirements.lock"}},
        "environment.requirements",
    ),
    "project-missing": ({"project": {"path": "nope"}}, "project.path"),
    "project-not-dir": ({"project": {"path": "proj/afile"}}, "project.path"),
    "data-missing": ({"data": {"path": "nope"}}, "data.path"),
    "data-not-dir": ({"data": {"path": "proj/afile"}}, "data.path"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_playbook_values_are_one_line_with_key_and_line(case, tmp_path):
    overrides, key = CASES[case]
    path = book(tmp_path, **overrides)
    proc = remotemac_in_process("check", str(path))  # real processes: --home, dry runs below
    line = assert_one_line_exit_2(proc, key, f"{path}:")
    assert line.split(f"{path}:")[1].split(":")[0].isdigit()  # the line number


def test_preflight_seconds_out_of_range_is_exit_2(tmp_path):
    path = book(tmp_path)
    for value in ("1e309", "nan", "-5", "0"):
        proc = remotemac_in_process("preflight", str(path), "--seconds", value)
        assert_one_line_exit_2(proc, "--seconds")


def test_bad_home_is_exit_2(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for home in (afile, afile / "sub"):
        assert_one_line_exit_2(remotemac("--home", str(home), "status"), str(afile))


def test_wipe_checks_the_run_id_before_asking(tmp_path, rm_home):
    proc = subprocess.run(
        ["python", "-m", "remotemac", "wipe", "no-such-run"],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Wipe the data" not in proc.stdout + proc.stderr
    assert_one_line_exit_2(proc, "unknown run id")


def test_dry_run_of_a_300kb_command_is_quick(tmp_path):
    path = book(tmp_path, workload={"command": "echo " + "a" * 300_000})
    started = time.monotonic()
    proc = remotemac("run", "--dry-run", str(path), timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert took < 15, f"--dry-run took {took:.1f} s"
    assert "300005 characters" in proc.stdout


def test_dry_run_honours_hosts_and_inventory(tmp_path):
    path = book(tmp_path)
    proc = remotemac("run", "--dry-run", "--json", "--hosts", "local,alice@mac-a:2222", str(path))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert [r["host"] for r in plan["runs"]] == ["local", "alice@mac-a:2222"]
    assert plan["runs"][1]["plan"]["host"] == "alice@mac-a:2222"
    inventory = tmp_path / "inv.yaml"
    inventory.write_text(yaml.safe_dump({"macs": {"hosts": ["mac-b", "mac-c"]}}))
    proc = remotemac("run", "--dry-run", "--inventory", str(inventory), str(path))
    assert proc.returncode == 0, proc.stderr
    assert "mac-b" in proc.stdout and "mac-c" in proc.stdout
