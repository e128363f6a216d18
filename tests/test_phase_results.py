"""Phase results are typed, keep the journal's dict form key for key, and journals
written before the types (no ``result_schema``) still read."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from remotemac.acceptance.observations import Observations
from remotemac.engine.context import RunContext, RunOptions
from remotemac.engine.phaseresults import (
    RESULT_SCHEMA,
    CompareResult,
    DeadmanJob,
    FollowResult,
    LaunchResult,
    OtherResult,
    ProvisionHost,
    ProvisionResult,
    PullResult,
    RecordResult,
    SyncHost,
    SyncResult,
    WipeResult,
    from_journal,
)
from remotemac.engine.pipeline import phase_ok
from remotemac.events import EventBus
from remotemac.journal import SCHEMA, Journal
from remotemac.phases import Phase, PhaseKey

#: journal rows as the dict-result code wrote them, one or more per phase
OLD_ROWS: list[tuple[str, dict]] = [
    (
        "provision",
        {
            "hosts": {"remote": {"root": "/r", "run_dir": "/r/runs/x", "probe": {"os": "Darwin"}}},
            "devices": {"reference": "cpu", "target": "mps"},
            "project": {"git": "abc"},
            "summary": "reference=cpu, target=mps",
            "seconds": 1.5,
        },
    ),
    (
        "sync",
        {
            "hosts": {"remote": {"data_dir": "/r/data", "files": 3, "bytes": 10, "ram": None}},
            "summary": "3 files, 10 bytes",
            "seconds": 0.2,
        },
    ),
    (
        "launch:target",
        {"session": "s", "mode": "tmux", "already": False, "access": None, "summary": "s"},
    ),
    (
        "follow:target",
        {
            "state": "finished",
            "exit_code": 0,
            "started_at": 1.0,
            "ended_at": 2.0,
            "peak_rss_bytes": 100,
            "lines": 4,
            "bytes": 40,
            "reason": None,
            "disk": {"root": {"min_free_seen": 5}},
            "disk_warning": None,
            "relaunched": {"reason": "r", "marker": "m", "command": "command", "at": 3.0},
            "continuity": {"disconnects": 1, "reconnects": 1},
            "summary": "finished (exit 0), 4 lines",
            "seconds": 3.0,
        },
    ),
    (
        "follow:reproduce",
        {"state": "not-launched", "exit_code": None, "lines": 0, "summary": "not launched: x"},
    ),
    (
        "launch:reproduce",
        {"state": "not-launched", "exit_code": None, "lines": 0, "summary": "not launched: x"},
    ),
    ("pull", {"sides": {"mps": {"files": [{"path": "a", "size": 1}]}}, "summary": "1 files"}),
    (
        "compare",
        {
            "within_tolerance": True,
            "files": [{"path": "a", "ok": True}],
            "summary": "1/1 files within tolerance",
            "converted": ["a"],
            "reproducibility": {"reproduces": True, "files": []},
        },
    ),
    (
        "compare",
        {
            "within_tolerance": None,
            "files": [],
            "nothing_compared": True,
            "summary": "nothing to compare",
        },
    ),
    ("record", {"verdict": "accepted", "summary": "accepted", "conditions": []}),
    (
        "wipe",
        {
            "done": True,
            "verified": True,
            "removed": ["x"],
            "remaining": [],
            "key_destroyed": True,
            "outputs_wiped": True,
            "summary": "wiped",
            "error": "e",
        },
    ),
    ("wipe", {"done": False, "summary": "kept (wipe: manual or --keep-data)"}),
]


@pytest.mark.parametrize(("name", "row"), OLD_ROWS, ids=[n for n, _ in OLD_ROWS])
def test_each_phase_reads_its_row_typed_and_writes_it_back_key_for_key(name, row):
    result = from_journal(name, row)
    kinds = {
        "provision": ProvisionResult,
        "sync": SyncResult,
        "launch": LaunchResult,
        "follow": FollowResult,
        "pull": PullResult,
        "compare": CompareResult,
        "record": RecordResult,
        "wipe": WipeResult,
    }
    want = FollowResult if row.get("state") == "not-launched" else kinds[PhaseKey.group(name)]
    assert type(result) is want
    assert json.dumps(result.to_dict()) == json.dumps(row)  # the same keys, in the same order
    assert result.extra == {}


def test_a_key_this_version_does_not_know_is_kept():
    row = {"hosts": {}, "summary": "s", "from_a_later_version": [1]}
    result = from_journal("sync", row)
    assert result.extra == {"from_a_later_version": [1]}
    assert result.to_dict() == row
    assert type(from_journal("deploy", {"summary": "x"})) is OtherResult


def test_minimal_rows_read_with_defaults():
    """Rows the tests (and older versions) wrote with only some keys."""
    prov = from_journal("provision", {})
    assert isinstance(prov, ProvisionResult) and prov.hosts == {} and prov.summary == ""
    wipe = from_journal("wipe", {"summary": "2 files"})
    assert isinstance(wipe, WipeResult) and wipe.done is True
    pull = from_journal("pull", {"summary": "2 files verified"})
    assert isinstance(pull, PullResult) and pull.sides == {} and pull.files("mps") == []
    assert pull.line == "2 files verified"


@pytest.mark.parametrize(
    ("name", "row", "ok"),
    [
        ("follow:target", {"state": "finished"}, True),
        ("follow:target", {}, True),
        ("follow:target", {"state": "failed", "exit_code": 2}, False),
        ("follow:target", {"state": "timeout"}, False),
        ("follow:target", {"state": "not-launched"}, False),
        ("compare", {"within_tolerance": False}, False),
        ("compare", {"within_tolerance": None, "nothing_compared": True}, False),
        ("compare", {"within_tolerance": True}, True),
        ("compare", {"within_tolerance": None}, True),
        ("record", {"verdict": "rejected"}, False),
        ("record", {"verdict": "incomplete"}, False),
        ("record", {"verdict": "accepted"}, True),
        ("record", {}, True),
        ("provision", {"summary": "x"}, True),
        ("sync", {"ok": False}, False),
        ("launch:target", {"session": "s"}, True),
        ("pull", {"sides": {}}, True),
        ("wipe", {"done": False}, True),
        ("wipe", {"ok": False}, False),
    ],
)
def test_phase_ok_is_the_result_s_own_rule(name, row, ok):
    key = PhaseKey.parse(name)
    assert from_journal(name, row).ok() is ok
    assert phase_ok(key, row) is ok  # the journal form decides the same


OLD_PHASES_TABLE = """CREATE TABLE IF NOT EXISTS phases (
  run_id TEXT NOT NULL,
  phase TEXT NOT NULL,
  state TEXT NOT NULL,
  result_json TEXT NOT NULL DEFAULT '{}',
  started_at REAL,
  finished_at REAL,
  PRIMARY KEY (run_id, phase)
);"""


def _context(journal: Journal, tmp_path: Path) -> RunContext:
    return RunContext(
        run_id="r1",
        playbook=None,  # type: ignore[arg-type]
        journal=journal,
        bus=EventBus(),
        home=tmp_path,
        out_dir=tmp_path,
        options=RunOptions(),
        hosts={},
        sides=[],
        ledger=None,  # type: ignore[arg-type]
    )


def test_a_journal_from_before_result_versions_resumes_typed(tmp_path: Path):
    """A journal whose phases table has no ``result_schema`` (rows in today's dict form)."""
    path = tmp_path / "journal.sqlite3"
    old_schema = SCHEMA.replace("  result_schema INTEGER,\n", "")
    assert "result_schema" not in old_schema and OLD_PHASES_TABLE in old_schema
    db = sqlite3.connect(path)
    db.executescript(old_schema)
    for at, (name, row) in enumerate(OLD_ROWS[:4]):
        db.execute(
            "INSERT INTO phases (run_id, phase, state, result_json, started_at, finished_at)"
            " VALUES ('r1', ?, 'done', ?, ?, ?)",
            (name, json.dumps(row), at, at + 0.5),
        )
    db.commit()
    db.close()
    journal = Journal(path)
    phases = journal.phases("r1")
    assert [info["schema"] for info in phases.values()] == [None] * 4
    ctx = _context(journal, tmp_path)
    assert ctx.restore_results(phases) == [n for n, _ in OLD_ROWS[:4]]
    prov = ctx.result(Phase.PROVISION)
    assert isinstance(prov, ProvisionResult) and prov.device("reproduce") == "mps"
    assert ctx.provision().hosts["remote"].run_dir == "/r/runs/x"
    sync = ctx.result(Phase.SYNC)
    assert (
        sync is not None
        and sync.data_dir("remote") == "/r/data"
        and sync.ram("remote").to_json() == {}
    )
    launch = ctx.launch_result("target")
    assert launch is not None and launch.session == "s"
    follow = ctx.follow_result("target")
    assert follow is not None and follow.finished and follow.min_free_seen() == 5
    assert ctx.result(Phase.COMPARE) is None and ctx.follow_result("reference") is None


def test_a_finished_phase_is_written_with_its_version(tmp_path: Path):
    journal = Journal(tmp_path / "journal.sqlite3")
    journal.create_run(
        "r1",
        name="x",
        host="local",
        playbook_path=None,
        playbook={},
        out_dir=str(tmp_path),
        options={},
    )
    ctx = _context(journal, tmp_path)
    journal.start_phase("r1", "follow:target")
    ctx.finish_result("follow:target", FollowResult.not_launched("the reference failed"))
    info = journal.phases("r1")["follow:target"]
    assert info["schema"] == RESULT_SCHEMA
    assert info["result"] == {
        "state": "not-launched",
        "exit_code": None,
        "lines": 0,
        "summary": "not launched: the reference failed",
    }
    again = _context(journal, tmp_path)
    again.restore_results(journal.phases("r1"))
    follow = again.follow_result("target")
    assert follow is not None and not follow.launched and again.launch_result("target") is None


def test_observations_read_a_record_and_write_it_back():
    obs = {
        "tensors_on_device": True,
        "operators": {"fallback_ops": [], "unsupported_ops": ["x"], "dtype_errors": None},
        "torch_imported": True,
        "memory": {"peak_bytes": 5, "stable": True, "slope_bytes_per_s": 1.0, "trend": "stable"},
        "processes": [{"pid": 1}],
        "results": {"within_tolerance": False, "files": [{"ok": None}], "converted": []},
        "reproducibility": None,
    }
    typed = Observations.from_dict(obs)
    assert json.dumps(typed.to_dict()) == json.dumps(obs)
    assert typed.operators.count() == 1 and not typed.operators.observed
    assert typed.memory.stable and not typed.memory.too_short
    assert typed.results.not_compared() == 1 and typed.results.failed() == 1
    empty = Observations.from_dict(None)
    assert empty.memory.peak_bytes is None and empty.results.files == []


#: a host's provision entry as provision_host and the pipeline wrote it, every key
PROVISION_HOST = {
    "root": "/r",
    "root_as_given": "~/r",
    "root_id": "id1",
    "run_dir": "/r/runs/x",
    "paths": {"logs": "/r/runs/x/logs"},
    "venv_python": "/r/envs/e/bin/python",
    "venv_reused": True,
    "probe": {"os": "Darwin", "packages": {"torch": "2.5"}},
    "interpreter": {"interpreter": "/usr/bin/python3", "version": "3.12"},
    "project_files": 4,
    "project_bytes": 100,
    "lock_hash": None,
    "fingerprint": {"torch": "2.5"},
    "space": {"ok": True},
}

#: a host's sync entry with data, and the five keys of a run without ``data``
SYNC_HOST = {
    "data_dir": "/r/data",
    "files": 3,
    "bytes": 10,
    "encrypted": True,
    "revision": "abc",
    "ram": None,
    "transfer": {"sent_files": 3},
    "selection": [{"path": "a", "size": 1, "reason": "include"}],
    "summary": "3 sent, 0 already on the host",
    "runtime": None,
    "deadman": {"method": "sleeper", "pid": 7, "deadline": 1.0},
}
NO_DATA_HOST = {
    "data_dir": "/r/runs/x/data",
    "files": 0,
    "bytes": 0,
    "encrypted": False,
    "revision": None,
}


@pytest.mark.parametrize(
    ("cls", "row"),
    [
        (ProvisionHost, PROVISION_HOST),
        (SyncHost, SYNC_HOST),
        (SyncHost, NO_DATA_HOST),
        (SyncHost, {"data_dir": "/r/data", "files": 3, "bytes": 10, "ram": None}),
        (ProvisionHost, {"root": "/r"}),
        (ProvisionHost, {}),
    ],
)
def test_a_host_entry_reads_typed_and_writes_back_key_for_key(cls, row):
    """Keys a row lacks stay absent and a ``null`` stays written: the row, byte for byte."""
    entry = cls.from_dict(row)
    assert json.dumps(entry.to_dict()) == json.dumps(row)
    assert entry.extra == {}


def test_host_entries_built_here_write_the_dicts_the_code_wrote():
    """A fresh entry writes every field in the old dict's order; a set dead-man job last."""
    prov = ProvisionHost(**{k: v for k, v in PROVISION_HOST.items()})
    assert json.dumps(prov.to_dict()) == json.dumps(PROVISION_HOST)
    sync = SyncHost(**{k: v for k, v in SYNC_HOST.items() if k != "deadman"})
    assert "deadman" not in sync.to_dict()
    sync.deadman = DeadmanJob.from_json(SYNC_HOST["deadman"])
    assert json.dumps(sync.to_dict()) == json.dumps(SYNC_HOST)
    bare = SyncHost.without_data("/r/runs/x/data")
    assert json.dumps(bare.to_dict()) == json.dumps(NO_DATA_HOST)
    bare.deadman = DeadmanJob.from_json({"method": "sleeper"})
    assert list(bare.to_dict()) == [*NO_DATA_HOST, "deadman"]


def test_a_host_key_this_version_does_not_know_is_kept():
    row = {"root": "/r", "from_a_later_version": 1, "run_dir": "/r/runs/x"}
    entry = ProvisionHost.from_dict(row)
    assert entry.extra == {"from_a_later_version": 1} and entry.run_dir == "/r/runs/x"
    assert json.dumps(entry.to_dict()) == json.dumps(row)


def test_results_read_their_hosts_typed_and_write_the_row_back():
    prov_row = {"hosts": {"remote": PROVISION_HOST}, "devices": {}, "project": None, "summary": "s"}
    prov = from_journal("provision", prov_row)
    assert isinstance(prov, ProvisionResult)
    host = prov.host("remote")
    assert isinstance(host, ProvisionHost) and host.venv_python == "/r/envs/e/bin/python"
    assert host.probe.os == "Darwin" and host.fingerprint is not None
    assert host.fingerprint.to_json() == {"torch": "2.5"}
    assert prov.host("elsewhere") == ProvisionHost() and prov.host("elsewhere").root == ""
    assert json.dumps(prov.to_dict()) == json.dumps(prov_row)
    row = {"hosts": {"remote": SYNC_HOST, "local": NO_DATA_HOST}, "summary": "3 files, 10 bytes"}
    sync = from_journal("sync", row)
    assert isinstance(sync, SyncResult) and isinstance(sync.host("local"), SyncHost)
    deadman = sync.host("remote").deadman
    assert deadman is not None and deadman.to_json() == SYNC_HOST["deadman"]
    assert sync.ram("remote").to_json() == {}
    assert sync.dataset().revision == "abc" and sync.data_dir("nowhere") is None
    assert SyncResult().dataset().files is None  # the record's dataset without a sync: nulls
    assert json.dumps(sync.to_dict()) == json.dumps(row)
    # a result built with dict hosts (as callers and tests do) reads them typed too
    built = SyncResult(hosts={"remote": {"data_dir": "/d", "ram": {"kind": "shm"}}})
    assert built.data_dir("remote") == "/d" and built.ram("remote").to_json() == {"kind": "shm"}
    assert built.to_dict()["hosts"] == {"remote": {"data_dir": "/d", "ram": {"kind": "shm"}}}
