"""The whole pipeline on the embedded host ``local`` (this machine), through the real CLI.

The workload's environment is the one the host builds (conftest's ``make_playbook``:
``python: "3.11"`` and a lock file with torch, a venv built by uv in this worker's
root and reused); the records say so (``hostbuilt.assert_host_built``).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from remotemac.engine.pull import safe_relpath
from remotemac.errors import UnsafePath
from tests.conftest import remotemac
from tests.harness.hostbuilt import assert_host_built

pytestmark = pytest.mark.e2e


def _expected_log(lines: int) -> list[str]:
    out = ["tensor on cpu", "device=cpu data_files=2"]
    for i in range(1, lines + 1):
        out.append(f"line {i:06d} of {lines}")
        if i % 7 == 0:
            out.append(f"stderr line {i:06d}")
    return out


def test_run_local_end_to_end(make_playbook, rm_home: Path, tmp_path: Path):
    pb = make_playbook()
    out = tmp_path / "out"
    proc = remotemac("run", str(pb), "--out", str(out), "--json")
    events = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert proc.returncode == 0, proc.stderr
    finished = [e for e in events if e["event"] == "run_finished"]
    assert finished and finished[-1]["verdict"] == "accepted"
    record = json.loads((out / "acceptance.json").read_text())
    assert record["verdict"] == "accepted"
    # both sides ran in the venv the host built (python 3.11 matched, torch by uv)
    assert_host_built(record, make_playbook.root)
    assert record["observations"]["results"]["within_tolerance"] is True
    assert record["dataset"]["files"] == 2 and record["dataset"]["encrypted"] is True
    assert (out / "acceptance.md").read_text().startswith("# Acceptance")
    # every line the workload printed, once, in order (stdout and stderr interleaved)
    for device in ("cpu", "cpu-target"):
        assert (out / "logs" / f"{device}.log").read_text().splitlines() == _expected_log(40)
        assert json.loads((out / "results" / device / "result.json").read_text())["value"] == 1.0
    manifest = json.loads((out / "manifest.json").read_text())
    assert {e["path"] for e in manifest["entries"]} == {"one.csv", "two.txt"}
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    assert any(e["op"] == "launch" for e in ledger)
    assert all("key_hex" not in e["command"] for e in ledger)
    # phase events in order, each phase once
    started = [e["phase"] for e in events if e["event"] == "phase_started"]
    assert started == [
        "provision",
        "sync",
        "launch:reference",
        "follow:reference",
        "launch:target",
        "follow:target",
        "pull",
        "compare",
        "record",
        "wipe",
    ]
    # wipe: the run's data is gone on the host, the key is destroyed
    run_dir = make_playbook.root / "runs" / finished[-1]["run_id"]
    assert run_dir.is_dir()
    assert not (run_dir / "data").exists() and not (run_dir / "out").exists()
    assert record["wipe"]["done"] is True
    assert not list((rm_home / "keys").glob("*.key"))


def test_rejected_when_target_differs(make_playbook, rm_home: Path, tmp_path: Path):
    pb = make_playbook(
        workload={
            "command": "python3 emit.py --device {device} --out {output_dir} --lines 5 "
            "--seconds 0.1 --noise 0.5 --torch",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        }
    )
    out = tmp_path / "out"
    proc = remotemac("run", str(pb), "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = json.loads((out / "acceptance.json").read_text())
    assert record["verdict"] == "rejected"
    assert_host_built(record, make_playbook.root)
    assert any(
        c["code"] == "results_outside_tolerance" and "result.json" in c["detail"]
        for c in record["stopping_conditions"]
    )


def test_failed_workload_is_a_stopping_condition(make_playbook, rm_home: Path, tmp_path: Path):
    pb = make_playbook(
        workload={
            "command": "python3 emit.py --out {output_dir} --lines 3 --seconds 0.1 --exit 3",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        }
    )
    out = tmp_path / "out"
    proc = remotemac("run", str(pb), "--out", str(out))
    assert proc.returncode == 1
    record = json.loads((out / "acceptance.json").read_text())
    assert any(
        c["code"] == "workload-failed" and "exit 3" in c["detail"]
        for c in record["stopping_conditions"]
    )


def test_dry_run_touches_nothing(make_playbook, rm_home: Path, tmp_path: Path):
    pb = make_playbook()
    root = make_playbook.root
    before = (
        sorted(p.name for p in root.iterdir()),
        sorted(p.name for p in (root / "runs").iterdir()),
    )
    proc = remotemac("run", str(pb), "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["phases"][0] == "provision" and plan["phases"][-1] == "wipe"
    assert {f["path"] for f in plan["data"]["files"]} == {"one.csv", "two.txt"}
    assert plan["bytes_to_send"] > 0
    assert "emit.py" in plan["commands"]["target"]["command"]
    after = (
        sorted(p.name for p in root.iterdir()),
        sorted(p.name for p in (root / "runs").iterdir()),
    )
    assert after == before
    assert not (rm_home / "journal.sqlite3").exists()
    human = remotemac("run", str(pb), "--dry-run")
    assert human.returncode == 0 and "dry run" in human.stdout


def test_two_concurrent_runs_share_the_journal(make_playbook, rm_home: Path, tmp_path: Path):
    pb = make_playbook()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "remotemac",
                "run",
                str(pb),
                "--out",
                str(tmp_path / f"out{i}"),
                "--json",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    db = sqlite3.connect(rm_home / "journal.sqlite3")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    runs = db.execute("SELECT run_id, state, verdict FROM runs").fetchall()
    assert len(runs) == 2 and all(r[1:] == ("finished", "accepted") for r in runs)
    for run_id, _, _ in runs:
        phases = db.execute(
            "SELECT count(*) FROM phases WHERE run_id = ? AND state = 'done'", (run_id,)
        ).fetchone()[0]
        assert phases == 10
    status = remotemac("status", "--json")
    assert len(status.stdout.strip().splitlines()) == 2


def test_attach_skips_finished_phases(make_playbook, rm_home: Path, tmp_path: Path):
    pb = make_playbook()
    out = tmp_path / "out"
    assert remotemac("run", str(pb), "--out", str(out)).returncode == 0
    run_id = json.loads(remotemac("status", "--json").stdout.splitlines()[0])["run_id"]
    proc = remotemac("attach", run_id, "--json")
    assert proc.returncode == 0
    events = [json.loads(x) for x in proc.stdout.splitlines()]
    skipped = [e["phase"] for e in events if e["event"] == "phase_finished" and e["skipped"]]
    assert len(skipped) == 10


def test_unknown_run_id_is_bad_input(rm_home: Path):
    for args in (["attach", "nope"], ["status", "nope"], ["logs", "nope"]):
        proc = remotemac(*args)
        assert proc.returncode == 2 and "unknown run id" in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "", "a\\b", "a//b", "x\0y"])
def test_hostile_result_names_refused(name):
    with pytest.raises(UnsafePath):
        safe_relpath(name)


def test_plain_result_names_pass():
    assert str(safe_relpath("preds/a.pt")) == "preds/a.pt"


def test_detach_then_live_status_then_attach(make_playbook, rm_home: Path, tmp_path: Path):
    pb = make_playbook(
        workload={
            "command": "python3 emit.py --device {device} --out {output_dir} --lines 30 "
            "--seconds 3 --torch",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        }
    )
    out = tmp_path / "out"
    proc = remotemac("run", str(pb), "--out", str(out), "--detach", "--json")
    assert proc.returncode == 0, proc.stderr
    finished = [json.loads(x) for x in proc.stdout.splitlines()][-1]
    assert finished["verdict"] == "detached" and "remotemac attach" in finished["detail"]
    run_id = finished["run_id"]
    status = json.loads(remotemac("status", run_id, "--json").stdout)
    assert status["state"] == "detached"
    assert status["live"]["answered"] is True
    assert status["live"]["sides"]["cpu"]["state"] in ("running", "finished")
    proc = remotemac("attach", run_id)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for device in ("cpu", "cpu-target"):
        lines = (out / "logs" / f"{device}.log").read_text().splitlines()
        assert [x for x in lines if x.startswith("line ")] == [
            f"line {i:06d} of 30" for i in range(1, 31)
        ]
    assert_host_built(json.loads((out / "acceptance.json").read_text()), make_playbook.root)


def test_a_run_has_one_driver_at_a_time(make_playbook, rm_home: Path, tmp_path: Path):
    """Two processes following one run would write its local log twice: the second is refused."""
    import time

    # one side only: its 6 s job keeps the first process driving while the second one
    # asks (a reference run before it would only add 6 s of waiting at the end)
    pb = make_playbook(
        workload={
            "command": "python3 emit.py --device {device} --out {output_dir} --lines 20 --seconds 6",
            "reference": None,
            "target": {"device": "cpu"},
            "timeout": "5m",
        }
    )
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-m", "remotemac", "run", str(pb), "--out", str(out), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    db = rm_home / "journal.sqlite3"
    deadline = time.monotonic() + 60
    run_id = None
    while time.monotonic() < deadline and run_id is None:
        time.sleep(0.2)
        if db.exists():
            try:
                row = sqlite3.connect(db).execute("SELECT run_id FROM owners").fetchone()
            except sqlite3.OperationalError:  # the file is there, its schema not yet
                continue  # (CI on two loaded workers saw "no such table: owners")
            run_id = row[0] if row else None
    assert run_id, "the first process never claimed the run"
    second = remotemac("attach", run_id)
    assert second.returncode == 2 and "already being driven" in second.stderr
    first.communicate(timeout=240)
    assert first.returncode in (0, 1)
    assert sqlite3.connect(db).execute("SELECT count(*) FROM owners").fetchone()[0] == 0


def test_doctor_checks_disk_against_the_playbook(make_playbook, rm_home: Path):
    """`doctor local --playbook`: a playbook needing more disk than there is fails the disk check."""
    import shutil

    free = shutil.disk_usage(Path.home()).free
    small = make_playbook("small", stop_when={"memory_growth": False, "min_free_disk": 1024})
    huge = make_playbook("huge", stop_when={"memory_growth": False, "min_free_disk": free * 4})
    checks = {}
    for name, pb in (("small", small), ("huge", huge)):
        proc = remotemac("doctor", "local", "--playbook", str(pb), "--json", timeout=180)
        report = json.loads(proc.stdout)
        checks[name] = {c["name"]: c for c in report["checks"]}["disk"]
    assert checks["small"]["status"] == "ok", checks["small"]
    assert checks["huge"]["status"] == "fail", checks["huge"]


def test_crlf_and_progress_bar_output_is_followed_byte_exact(
    make_playbook, rm_home: Path, tmp_path: Path
):
    """A job printing CRLF line ends and ``\\r`` progress bars (tqdm-style): the local log
    is the host's byte for byte, each line once. The follower once counted line ends
    with ``splitlines()``, whose "\\r\\n" is one byte short: its offset lagged by one byte
    per line and the next read fetched those bytes again."""
    emit = (
        "python3 -c 'import sys; [sys.stdout.write(\"epoch %d  10%%|#\\r 100%%|##########|"
        " step %06d\\r\\n\" % (i // 100, i)) for i in range(3000)]' && python3 -c 'import "
        'json; json.dump(dict(v=1), open("{output_dir}/result.json", "w"))\''
    )
    pb = make_playbook(workload={"command": emit})
    out = tmp_path / "out"
    proc = remotemac("run", str(pb), "--out", str(out))
    # (no torch in this job: nothing observed on the device, so "incomplete", exit 1)
    assert proc.returncode == 1 and "INCOMPLETE" in proc.stdout, proc.stdout + proc.stderr
    expected = b"".join(
        b"epoch %d  10%%|#\r 100%%|##########| step %06d\r\n" % (i // 100, i) for i in range(3000)
    )
    for device in ("cpu", "cpu-target"):
        assert (out / "logs" / f"{device}.log").read_bytes() == expected, device
