"""Every typed part of a phase result, of the record's inputs, of the drift log, of the
cleanup record and of status's live answer writes back the JSON it was read from, byte
for byte: the same keys, in the same order, a ``null`` kept, a key this version does not
know kept, a key the object lacked left out.

Tier: fast (pure unit tests, no marker). The rows are the shapes the code writes: the
agent's answers (freeze_env, env_fingerprint, check_space, deadman_schedule, cleanup_host,
status) and what the laptop's phases build from them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from remotemac.engine.cleanup import CleanupAnswer, CleanupRecord, Item, Knowledge, build_record
from remotemac.engine.doctorgather import WorkloadPython, judge_found
from remotemac.engine.drift import DriftEntry, compare_fingerprints, drift_summary, load_drift
from remotemac.engine.jsonpart import JsonPart
from remotemac.engine.phaseresults import (
    Access,
    ComparedFile,
    CompareResult,
    Condition,
    DeadmanJob,
    Disk,
    Drill,
    Fingerprint,
    FollowResult,
    Interpreter,
    LaunchResult,
    PhaseRow,
    Probe,
    PulledSide,
    PullResult,
    RamStore,
    RecordResult,
    Relaunch,
    Reproducibility,
    RuntimeUsed,
    Selected,
    SpaceCheck,
    SyncHost,
    Transfer,
    from_journal,
)
from remotemac.engine.record import Harness, Sample, memory_samples
from remotemac.engine.statusview import LiveView
from remotemac.engine.syncplan import SyncStats
from remotemac.journal import Journal
from tests.test_phase_results import PROVISION_HOST

PROBE = {
    "python": "3.12.4",
    "torch": "2.5.1",
    "numpy": "2.1.0",
    "mps_built": True,
    "mps_available": True,
    "cuda_available": False,
    "packages": {"torch": "2.5.1", "numpy": "2.1.0"},
    "os": "Darwin",
    "arch": "arm64",
    "hostname": "mac-1",
    "os_version": "15.1",
    "chip": "Apple M2",
    "translated": False,
    "vm": False,
    "pytorch_env": {"PYTORCH_ENABLE_MPS_FALLBACK": "1"},
    "freeze_cached": True,
}
FINGERPRINT = {
    "python": "3.12.4",
    "executable": "/r/envs/e/bin/python",
    "packages": {"torch": "2.5.1"},
    "lock_hash": "ab12",
    "torch": "2.5.1",
    "torch_origin": "/r/envs/e/lib/python3.12/site-packages/torch/__init__.py",
    "os": "Darwin",
    "os_version": "15.1",
}
SPACE = {
    "path": "/r/runs/x",
    "free": 10 << 30,
    "total": 100 << 30,
    "need": 2 << 30,
    "items": {"slice": 1 << 30, "outputs (est.)": 1 << 30},
    "venv": None,
    "min_free": 1 << 30,
    "fits": True,
}
INTERPRETER = {
    "interpreter": "/usr/bin/python3",
    "version": "3.12.4",
    "interpreter_is_venv": False,
    "parent_site": None,
    "installer": "uv",
    "brought": {"dir": "/r/runtime/cpython-3.12", "method": "host"},
}
RAM = {
    "path": "/Volumes/rm-x",
    "kind": "ramdisk",
    "device": "/dev/disk4",
    "steps": [],
    "warning": None,
}
DEADMAN_LAUNCHD = {
    "method": "launchd",
    "label": "com.remotemac.deadman.x",
    "plist": "/Users/u/Library/LaunchAgents/com.remotemac.deadman.x.plist",
    "domain": "gui/501",
    "verified": "launchctl print gui/501/com.remotemac.deadman.x",
    "created_dir": None,
    "spec": "launchd:com.remotemac.deadman.x",
    "deadline": 1764000000.0,
}
DEADMAN_SLEEPER = {"method": "sleeper", "pid": 4242, "start": [1, 2], "spec": "pid:4242"}

#: one side's pull as engine/pull.pull_side returns it
PULLED_SIDE = {
    "dir": "/o/results/cpu",
    "files": [{"path": "a", "size": 1, "sha256": "f" * 64}],
    "skipped": [{"path": "big.bin", "why": "over outputs.max_bytes"}],
    "downloaded": 1,
    "bytes": {"total": 1, "moved": 1, "reused": 0},
}


def _same(part: JsonPart, row: dict) -> None:
    """The part writes back the row: the same text, so the same keys in the same order."""
    assert json.dumps(part.to_json()) == json.dumps(row)


@pytest.mark.parametrize(
    ("cls", "row"),
    [
        (Probe, PROBE),
        (Probe, {}),
        (Fingerprint, FINGERPRINT),
        (Fingerprint, {"error": "the workload interpreter /x does not start: gone"}),
        (SpaceCheck, SPACE),
        (Interpreter, INTERPRETER),
        (Interpreter, {k: v for k, v in INTERPRETER.items() if k != "brought"}),
        (RamStore, RAM),
        (DeadmanJob, DEADMAN_LAUNCHD),
        (DeadmanJob, DEADMAN_SLEEPER),
        (
            RuntimeUsed,
            {"dir": "/r/runtime/x", "reused": True, "method": "pip", "cryptography": "43"},
        ),
        (Selected, {"path": "a/b.bin", "size": 3, "reason": "include a/**"}),
        (Relaunch, {"reason": "lost", "marker": "== relaunched ==", "command": "tmux", "at": 1.5}),
        (Drill, {"kind": "disconnect", "by": "tui", "cuts": 2, "dropped": 1, "at": ["t1", "t2"]}),
        (Disk, {"root": {"min_free_seen": 5e9, "free": 6e9}, "ram": None}),
        (Access, {"checked": [{"path": "/r/cache/torch", "ok": True}], "probe_s": 0.1}),
        (ComparedFile, {"path": "out.pt", "ok": False, "detail": "max diff 1e-2", "max_abs": 0.01}),
        (Condition, {"code": "cuda-dependency", "detail": "x", "lines": [{"line_no": 3}]}),
        (PulledSide, PULLED_SIDE),
    ],
)
def test_a_part_reads_typed_and_writes_back_its_object_byte_for_byte(cls, row):
    part = cls.from_json(row)
    _same(part, row)
    _same(cls.from_json(part.to_json()), row)


def test_parts_read_their_fields_and_keep_what_they_do_not_name():
    probe = Probe.from_json(PROBE)
    assert probe.mps_available is True and probe.packages == {"torch": "2.5.1", "numpy": "2.1.0"}
    assert probe.fact("chip") == "Apple M2" and probe.fact("hostname") == "mac-1"
    assert DeadmanJob.from_json(DEADMAN_LAUNCHD).guard() == {
        "method": "launchd",
        "domain": "gui/501",
        "verified": "launchctl print gui/501/com.remotemac.deadman.x",
        "label": "com.remotemac.deadman.x",
        "deadline": 1764000000.0,
    }
    assert DeadmanJob.from_json(DEADMAN_SLEEPER).guard() == {
        "method": "sleeper",
        "pid": 4242,
        "deadline": None,
    }
    assert DeadmanJob.empty().guard() is None
    access = Access.from_json({"checked": [{"path": "/c", "ok": False}]})
    assert LaunchResult(access=access).checked_paths() == {"/c": False}
    follow = FollowResult.from_json({"state": "finished", "disk": {"root": {"min_free_seen": 7}}})
    assert isinstance(follow.disk, Disk) and follow.min_free_seen() == 7
    assert FollowResult().min_free_seen() is None


def test_a_provision_and_a_sync_row_with_every_part_go_through_the_journal_unchanged(tmp_path):
    """The journal stores the typed result's JSON: read back and written again, the same."""
    # every key provision_host and the pipeline write, each part as the agent answers it
    host = dict(
        PROVISION_HOST, probe=PROBE, interpreter=INTERPRETER, fingerprint=FINGERPRINT, space=SPACE
    )
    stats = SyncStats(files=2, bytes=20, sent_files=2, sent_bytes=40, attempts=1, per_attempt=[40])
    sync_host = SyncHost(
        data_dir="/r/runs/x/data",
        files=2,
        bytes=20,
        encrypted=True,
        revision="rev",
        ram=RamStore.from_json(RAM),
        transfer=Transfer.from_json(stats.to_dict()),
        selection=[Selected(path="a", size=10, reason="include"), Selected(path="b", size=10)],
        summary="2 sent",
        runtime=RuntimeUsed.from_json({"dir": "/d", "reused": False}),
    )
    sync_host.deadman = DeadmanJob.from_json(DEADMAN_SLEEPER)
    rows = {
        "provision": {
            "hosts": {"remote": host},
            "devices": {"target": "mps"},
            "project": None,
            "summary": "s",
        },
        "sync": {"hosts": {"remote": sync_host.to_json()}, "summary": "2 files, 20 bytes"},
    }
    journal = Journal(tmp_path / "j.db")
    journal.create_run(
        "r1", name="n", host="h", playbook_path=None, playbook={}, out_dir="o", options={}
    )
    for name, row in rows.items():
        journal.start_phase("r1", name)
        journal.finish_phase("r1", name, from_journal(name, row).to_dict(), schema=1)
    for name, info in journal.phases("r1").items():
        row = PhaseRow.from_json(info)
        assert row.done and row.schema == 1
        typed = from_journal(name, row.result or {}, row.schema)
        assert json.dumps(typed.to_dict()) == json.dumps(rows[name]), name
    sync = from_journal("sync", rows["sync"])
    remote = sync.hosts["remote"]  # type: ignore[attr-defined]
    assert remote.transfer.attempts == 1 and remote.transfer.per_attempt == [40]
    assert [s.to_json() for s in remote.selection] == [
        {"path": "a", "size": 10, "reason": "include"},
        {"path": "b", "size": 10, "reason": None},
    ]
    assert list(remote.to_json())[-1] == "deadman" and remote.deadman.pid == 4242


def test_compare_pull_and_record_results_keep_their_parts_and_their_form():
    compare_row = {
        "within_tolerance": False,
        "files": [{"path": "a.pt", "ok": True}, {"path": "b.pt", "ok": None, "not_compared": "x"}],
        "summary": "1/2 files within tolerance",
        "reproducibility": {
            "reproduces": False,
            "first": "mps",
            "second": "mps-again",
            "files": [{"path": "a.pt", "ok": False, "detail": "differs"}],
        },
    }
    compare = from_journal("compare", compare_row)
    assert isinstance(compare, CompareResult) and not compare.ok()
    assert isinstance(compare.reproducibility, Reproducibility)
    assert compare.reproducibility.files[0].detail == "differs"
    assert json.dumps(compare.to_dict()) == json.dumps(compare_row)
    built = Reproducibility(reproduces=True, first="a", second="b", files=compare.files)
    assert list(built.to_json()) == ["reproduces", "first", "second", "files"]
    pull_row = {
        "sides": {"cpu": PULLED_SIDE},
        "summary": "1 files verified",
    }
    pull = from_journal("pull", pull_row)
    assert isinstance(pull, PullResult) and [f.path for f in pull.files("cpu")] == ["a"]
    cpu = pull.sides["cpu"]
    assert cpu.downloaded == 1 and cpu.bytes is not None and cpu.bytes.reused == 0
    assert pull.files("mps") == []
    assert json.dumps(pull.to_dict()) == json.dumps(pull_row)
    record_row = {
        "verdict": "rejected",
        "summary": "rejected",
        "conditions": [{"code": "job-lost", "detail": "gone"}],
    }
    record = from_journal("record", record_row)
    assert isinstance(record, RecordResult) and record.conditions[0].code == "job-lost"
    assert json.dumps(record.to_dict()) == json.dumps(record_row)


def test_the_drift_log_reads_typed_and_its_lines_write_back(tmp_path: Path):
    before = Fingerprint.from_json(FINGERPRINT)
    after = Fingerprint.from_json(
        dict(FINGERPRINT, packages={"torch": "2.6.0"}, lock_hash="cd34", torch="2.6.0")
    )
    entry = DriftEntry(when="before-target", at=1.0, host="remote", host_name="mac", changes=[])
    entry.changes = compare_fingerprints(before, after)
    line = entry.to_json()
    assert list(line) == ["when", "at", "host", "host_name", "changes"]
    assert [list(c) for c in line["changes"]] == [
        ["key", "before", "after", "touches_torch"],
        ["key", "before", "after", "touches_torch", "packages"],
    ]
    env = tmp_path / "env"
    env.mkdir()
    (env / "drift.jsonl").write_text(json.dumps(line) + "\n{torn\n", encoding="utf-8")
    (read,) = load_drift(tmp_path)
    assert json.dumps(read.to_json()) == json.dumps(line)
    summary = drift_summary([read])
    assert [d.key for d in summary.torch] == ["torch", "lock_hash"]
    form = summary.record_form()
    assert form["checks"] == [{"when": "before-target", "host": "mac", "changes": 2}]
    assert list(form["warnings"][1]) == [
        "when",
        "host",
        "key",
        "before",
        "after",
        "touches_torch",
        "packages",
        "detail",
    ]
    assert form["warnings"][1]["detail"] == "packages torch 2.5.1 → 2.6.0"


def test_a_cleanup_record_reads_back_as_it_was_written():
    answer = {
        "roots": [
            {
                "root": "/r",
                "real_root": "/private/r",
                "refused": None,
                "notes": ["a note"],
                "bytes_freed": 0,
                "verified": False,
                "items": [
                    {"kind": "run", "path": "/r/runs/x", "fate": "would remove", "bytes": 9},
                    {"kind": "dir", "path": "/r/tmp", "fate": "left alone", "why": "open"},
                ],
                "remaining": [{"kind": "run", "path": "/r/runs/y", "why": "busy"}],
            },
            {"root": "/", "refused": "the filesystem root"},
        ],
        "host": {"os": "Darwin"},
    }
    know = Knowledge(runs=["x"], items=[Item.with_keys(kind="run", path="/r/runs/x", run_id="x")])
    orphan = know.items[0].but(sources=["journal"], fate="failed", bytes=0, why="outside")
    assert list(orphan.to_json()) == ["kind", "path", "run_id", "sources", "fate", "bytes", "why"]
    record = build_record(
        host="h",
        name="mac",
        fingerprint="SHA256:x",
        started=time.time(),
        dry_run=True,
        answer=answer,
        know=know,
        extra_items=[orphan],
    )
    written = record.to_json()
    assert list(written) == [
        "schema",
        "host",
        "host_name",
        "host_key_fingerprint",
        "started_at",
        "finished_at",
        "dry_run",
        "status",
        "verified",
        "error",
        "remote_roots",
        "items",
        "bytes_freed",
        "bytes_to_free",
        "not_removed",
        "remaining",
        "journal",
        "host_facts",
    ]
    assert written["items"][0] == {
        "kind": "run",
        "path": "/r/runs/x",
        "fate": "would remove",
        "bytes": 9,
        "root": "/r",
    }
    assert written["items"][2]["why"] == "the filesystem root" and written["bytes_to_free"] == 9
    assert written["remaining"] == [
        {"kind": "run", "path": "/r/runs/y", "why": "busy", "root": "/r"}
    ]
    assert written["journal"] == {"runs": ["x"], "items": 1}
    assert written["host_facts"] == {"os": "Darwin"}
    text = json.dumps(written)
    assert json.dumps(CleanupRecord.from_json(json.loads(text)).to_json()) == text
    assert json.dumps(CleanupAnswer.from_json(answer).to_json()) == json.dumps(answer)


def test_status_live_answer_and_doctor_workload_python_write_back_their_json():
    live = {
        "answered": True,
        "sides": {"mps": {"state": "running", "exit_code": None, "log_bytes": 10, "tmux": True}},
        "asked_at": 2.0,
    }
    view = LiveView.of(live)
    assert view.side_states() == [("mps", "running")] and view.sides["mps"].log_bytes == 10
    _same(view, live)
    found = {
        "spec": None,
        "pythons": [{"path": "/usr/bin/python3", "version": "3.9.6"}],
        "brought_dirs": [],
    }
    out = judge_found(found, "python3", None)
    assert isinstance(out, WorkloadPython) and out.version == "3.9.6"
    assert out.to_json() == {
        "request": "python3",
        "pythons": found["pythons"],
        "brought_dirs": [],
        "python": "/usr/bin/python3",
        "version": "3.9.6",
        "describe": "3.9.6 (/usr/bin/python3)",
    }
    missing = judge_found(found, "python3.13", None).to_json()
    assert list(missing)[-2:] == ["describe", "problem"] and missing["python"] is None


def test_the_observer_report_and_the_runner_samples_read_typed(tmp_path: Path):
    report = {
        "torch_version": "2.5.1",
        "tensors_on_device": True,
        "operators": {"fallback_ops": [], "unsupported_ops": [], "dtype_errors": []},
        "stopping_conditions": [{"code": "fallback-op", "detail": "aten::x"}],
        "peak_rss_bytes": 5,
    }
    harness = Harness.from_json(report)
    assert harness.torch_seen and harness.stopping_conditions is not None
    assert harness.stopping_conditions[0].code == "fallback-op"
    _same(harness, report)
    logs = tmp_path
    rows = [
        {"t": 1.0, "rss_bytes": 100, "own_bytes": 80, "own_kind": "pss"},
        {"t": 2.0, "rss_bytes": 120, "own_bytes": 90, "own_kind": "pss"},
    ]
    (logs / "cpu.rss.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [Sample.from_json(r).own_bytes for r in rows] == [80, 90]
    assert memory_samples(logs, "cpu") == ([(1.0, 80.0), (2.0, 90.0)], "process-tree-pss")
