"""The host's records and answers keep their JSON when the agent reads them as dataclasses.

The agent parses what it is sent and what it wrote (the wipe's request and report, the
dead-man's arming record and job, the cleanup plan's entries, the job's spec and status
file) once, into dataclasses. The laptop and older files read the same JSON as before:
each shape the agent writes comes back unchanged through ``from_json``/``to_json``, keys
it does not name included, and a real wipe's answer is one of those shapes.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import pytest

from remotemac.agent import cleanupops, deadman, hostagent, runner, safefs, wipeops

IDENT = {"start": "linux:123:456", "boot": "b"}

FATES = [
    {"fate": "not found", "bytes": 0},
    {"fate": "removed", "bytes": 12, "notes": ["x: 2 links, not zeroed"]},
    {"fate": "failed", "bytes": 0, "why": "outside remote_root: refused"},
    {"fate": "left alone", "bytes": 0, "why": "kept: …", "foreign": ["/r/stray"]},
]


@pytest.mark.parametrize("data", FATES)
def test_a_fate_keeps_its_json(data):
    assert wipeops.Fate.from_json(data).to_json() == data


def test_a_ram_store_keeps_its_json_and_the_keys_it_does_not_name():
    data = {"path": "/dev/shm/remotemac-r1", "kind": "shm", "device": None, "warning": None}
    assert wipeops.RamStore.from_json(data).to_json() == data


@pytest.mark.parametrize(
    "data",
    [
        {"root": "/r", "run_id": "r1", "sessions": [], "wipe_outputs": True},
        {
            "root": "/r",
            "run_id": "r1",
            "sessions": ["remotemac-r1-ref"],
            "ram": {"path": "/dev/shm/remotemac-r1", "kind": "shm", "device": None},
            "wipe_outputs": False,
            "keep": ["project", "logs"],
            "cancel_deadman": True,
        },
    ],
)
def test_a_wipe_request_keeps_its_json(data):
    assert wipeops.WipeRequest.from_json(data).to_json() == data


def test_a_wipe_request_reads_the_old_defaults():
    req = wipeops.WipeRequest.from_json({"root": "/r", "run_id": "r1"})
    assert req.sessions == [] and req.ram is None and req.wipe_outputs is True
    assert req.keep is None and req.cancel_deadman is False


#: the run of the real wipes and cleanups below: they look for its RAM store by name in
#: the machine-global /dev/shm (``remotemac-<run id>``), so the id is this process's
#: own; a fixed "r1" found (and refused, or removed) another session's store
RUN = f"rec-{os.getpid()}-{secrets.token_hex(3)}"


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    safefs.mark_dir(str(root), {"kind": "root", "root_id": "abc"})
    run = root / "runs" / RUN
    run.mkdir(parents=True)
    safefs.mark_dir(str(run), {"kind": "run", "run_id": RUN, "root_id": "abc"})
    for sub in ("data", "tmp", "out", "status", "logs"):
        (run / sub).mkdir()
    (run / "data" / "secret.bin").write_bytes(b"x" * 100)
    return root


def test_a_real_wipe_answers_with_a_report_that_keeps_its_json(tmp_path: Path):
    """A wipe of a real run dir (marked, with data): its answer is a WipeReport's JSON,
    with every key the laptop reads, and the data is gone."""
    root = _root(tmp_path)
    answer = wipeops.wipe_run_data({"root": str(root), "run_id": RUN})
    assert json.loads(json.dumps(answer)) == answer
    assert wipeops.WipeReport.from_json(answer).to_json() == answer
    assert set(answer) == {
        "removed",
        "remaining",
        "steps",
        "verified",
        "failed",
        "run_dir",
        "time",
        "notes",
        "scrubbed",
    }
    assert answer["verified"] is True and not (root / "runs" / RUN / "data").exists()


def test_the_dead_mans_report_adds_when_it_fired(tmp_path: Path):
    root = _root(tmp_path)
    report = wipeops.wipe_run(wipeops.WipeRequest(str(root), RUN))
    report.fired_at, report.deadline = 2.0, 1.0
    data = report.to_json()
    assert data["fired_at"] == 2.0 and data["deadline"] == 1.0
    assert wipeops.WipeReport.from_json(data).to_json() == data


JOBS = [
    {
        "method": "launchd",
        "label": "com.remotemac.deadman.r1",
        "plist": "/Users/u/Library/LaunchAgents/com.remotemac.deadman.r1.plist",
        "domain": "gui/501",
        "verified": "launchctl print gui/501/com.remotemac.deadman.r1",
        "created_dir": None,
        "deadline": 1700000000.0,
        "spec": "/r/deadman/r1.json",
        "run_id": "r1",
    },
    {
        "method": "sleeper",
        "pid": 4242,
        "start": IDENT,
        "deadline": 1700000000.0,
        "spec": "/r/deadman/r1.json",
        "run_id": "r1",
    },
]


@pytest.mark.parametrize("job", JOBS)
def test_a_dead_man_arming_record_and_its_job_keep_their_json(job):
    assert deadman.DeadmanJob.from_json(job).to_json() == job
    record = {
        "root": "/r",
        "run_id": "r1",
        "deadline": 1700000000.0,
        "sessions": ["remotemac-r1-ref"],
        "created_at": 1699990000.0,
        "platform": "darwin",
    }
    assert deadman.ArmingRecord.from_json(record).to_json() == record
    armed = dict(record, job=job)
    assert deadman.ArmingRecord.from_json(armed).to_json() == armed


def test_the_sleeper_reads_an_arming_record_file(tmp_path: Path):
    """What the sleeper and the fire read back from disk is what schedule wrote."""
    spec = tmp_path / "r1.json"
    record = deadman.ArmingRecord(
        "/r",
        "r1",
        5.0,
        ["s"],
        1.0,
        "linux",
        deadman.DeadmanJob(
            "sleeper", pid=7, start=IDENT, deadline=5.0, spec=str(spec), run_id="r1"
        ),
    )
    safefs.write_json_atomic(str(spec), record.to_json())
    assert deadman.read_record(str(spec)) == record
    os.unlink(spec)
    assert deadman.read_record(str(spec)) is None


ENTRIES = [
    {
        "kind": "run",
        "path": "/r/runs/r1",
        "run_id": "r1",
        "sources": ["inventory", "found"],
        "created_at": 1.0,
        "fate": "removed",
        "bytes": 100,
    },
    {
        "kind": "ramstore",
        "path": "/dev/shm/remotemac-r1",
        "run_id": "r1",
        "sources": ["found"],
        "ram_kind": "shm",
        "fate": "would remove",
        "bytes": 4096,
    },
    {
        "kind": "deadman",
        "path": "spec:/r/deadman/r1.json",
        "run_id": "r1",
        "sources": ["journal"],
        "fate": "not found",
        "bytes": 0,
        "why": "no longer scheduled (fired or cancelled by a wipe)",
    },
    {
        "kind": "root",
        "path": "/r",
        "sources": ["playbook"],
        "fate": "left alone",
        "bytes": 0,
        "why": "kept: …",
        "foreign": ["/r/mine"],
    },
]


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_cleanup_plan_entry_keeps_its_json(entry):
    assert cleanupops.CleanupEntry.from_json(entry).to_json() == entry


def test_a_cleanup_root_report_keeps_its_json_refused_or_done():
    refused = {
        "root": "/",
        "refused": "remote_root '/' is a system dir",
        "items": [],
        "remaining": [],
        "bytes_freed": 0,
        "verified": False,
    }
    assert cleanupops.RootReport.from_json(refused).to_json() == refused
    done = {
        "root": "/r",
        "real_root": "/r",
        "items": ENTRIES,
        "notes": ["inventory.json missing"],
        "remaining": [{"kind": "tmux", "path": "remotemac-r1-ref", "why": "still running"}],
        "bytes_freed": 100,
        "bytes_to_free": 4096,
        "verified": False,
        "run_ids": ["r1"],
    }
    assert cleanupops.RootReport.from_json(done).to_json() == done


def test_a_listed_item_keeps_its_json():
    for item in (
        {"kind": "run", "path": "/r/runs/r1", "run_id": "r1", "created_at": 1.0},
        {"kind": "deadman", "path": "/r/deadman/r1.json", "run_id": "r1", "root": "/r", "pid": 3},
    ):
        assert cleanupops.Listed.from_json(item).to_json() == item


def test_a_real_cleanup_answers_with_entries_that_keep_their_json(tmp_path: Path):
    """A dry run and a real cleanup of a real root: every root part of the answer is a
    RootReport's JSON (the shape the laptop's cleanup record reads)."""
    root = _root(tmp_path)
    for dry in (True, False):
        answer = cleanupops.op_cleanup_host({"roots": [str(root)], "dry_run": dry})
        (part,) = answer["roots"]
        assert cleanupops.RootReport.from_json(part).to_json() == part
        fates = {i["kind"]: i["fate"] for i in part["items"]}
        assert fates["run"] == ("would remove" if dry else "removed"), part
    assert not root.exists()


LAUNCH = {  # engine/jobs.py's launch request, as the laptop sends it
    "run_dir": "/r/runs/r1",
    "device": "cpu",
    "session": "remotemac-r1-ref",
    "command": "mkdir -p /r/runs/r1/out/ref && python train.py",
    "metrics_path": "/r/runs/r1/logs/ref.rss.jsonl",
    "cwd": "/r/runs/r1/project",
    "env": {"REMOTEMAC_DEVICE": "cpu"},
    "timeout": 600,
    "mode": "tmux",
    "disk": {"paths": {"root": "/r/runs/r1", "ram": None}, "min_free": 1, "warn_free": 2},
    "convert": {"python": "/v/bin/python", "dir": "/r/runs/r1/out/ref", "patterns": ["**/*"]},
    "observe": {
        "dir": "/r/runs/r1/status/ref.observe",
        "obs_path": "/r/runs/r1/status/ref.obs.json",
        "device": "cpu",
        "fallback": "diagnostic",
        "interval": 1.0,
        "trace": {"steps": 3, "path": "/r/runs/r1/out/.trace/ref.trace.jsonl"},
    },
    "skip_access_check": True,
    "relaunch": {"reason": "lost", "marker": "--- relaunched ---"},
}


def test_a_launch_request_reads_into_the_job_spec_and_back():
    spec = runner.JobSpec.from_json(LAUNCH)
    assert spec.to_json() == LAUNCH
    assert spec.skip_access_check is True and spec.use_tmux is True and spec.caffeinate is True
    observe = runner.ObserveSpec.from_json(spec.observe or {})
    assert observe.to_json() == LAUNCH["observe"]
    assert observe.trace_target() == (3, "/r/runs/r1/out/.trace/ref.trace.jsonl")
    assert runner.ConvertSpec.from_json(spec.convert or {}).to_json() == LAUNCH["convert"]
    # what op_launch adds for the runner is written; what the request lacked stays out
    spec.status_path, spec.mode = "/r/runs/r1/status/cpu.json", "daemon"
    assert spec.to_json() == dict(LAUNCH, status_path=spec.status_path, mode="daemon")
    bare = runner.JobSpec.from_json({"command": "true"})
    assert bare.to_json() == {"command": "true"} and bare.env == {} and bare.observe is None


STATUSES = [
    {"state": "starting", "device": "cpu", "created_at": 1.0},
    {
        "state": "running",
        "device": "cpu",
        "runner_pid": 10,
        "runner_start": IDENT,
        "mode": "tmux",
        "started_at": 2.0,
        "heartbeat_at": 3.0,
        "command": "python train.py",
        "session": "remotemac-r1-ref",
        "child_pid": 11,
        "child_start": IDENT,
        "child_argv": ["/bin/sh", "-c", "python train.py"],
        "child_cmdline": "python train.py",
        "peak_rss_bytes": 5,
        "processes": 1,
        "disk": {
            "min_free": 1,
            "warn_free": 2,
            "root": {"path": "/r", "free": 9, "total": 10, "min_free_seen": 8},
        },
    },
    {  # an older runner's file: no runner_start, a key this agent does not know
        "state": "finished",
        "device": "mps",
        "runner_pid": 10,
        "exit_code": 0,
        "ended_at": 4.0,
        "converted": {"converted": ["model.pt"], "failed": {}},
        "relaunched": {"reason": "lost", "marker": "m", "previous": None},
        "legacy_field": 1,
    },
    {"state": "stopped", "device": "cpu", "reason": "signal 15", "session": None},
]


@pytest.mark.parametrize("data", STATUSES)
def test_a_job_status_file_keeps_its_json(data):
    status = runner.JobStatusFile.from_json(data)
    assert status.to_json() == data
    assert status.final == (data["state"] in ("finished", "stopped"))


def test_a_status_the_runner_builds_writes_only_what_it_set(tmp_path: Path):
    path = tmp_path / "cpu.json"
    status = runner.JobStatusFile(state="running", device="cpu", runner_pid=1, mode="")
    runner._write_status(str(path), status)
    assert json.loads(path.read_text()) == {
        "state": "running",
        "device": "cpu",
        "runner_pid": 1,
        "mode": "",
    }
    assert hostagent.read_status(str(path)) == status
    assert hostagent.read_status(str(tmp_path / "none.json")) is None


def test_a_volume_reading_keeps_its_json():
    data = {"path": "/r", "free": 9, "total": 10, "min_free_seen": 8}
    assert runner.VolumeFree.from_json(data).to_json() == data
