"""What a fleet, a session and the resident agent's link read back is parsed once, and
writes back the JSON it was read from.

Tier: fast (no marker). A run's record as a fleet reads it (why it stopped, its cost),
``cleanup --all``'s per-host entry, the journal row's playbook and options, and the
resident agent's frames are dataclasses (engine/fleet.py, engine/session.py,
engine/resident.py); ``cleanup-all.json``, the journal and the frames keep their keys.
"""

from __future__ import annotations

from remotemac.engine.fleet import CleanupHost, RecordOutcome, StoredPlaybook
from remotemac.engine.resident import Frame
from remotemac.engine.session import StoredOptions, options_of
from remotemac.journal import RunRow


def test_a_records_outcome_reads_its_reason_and_cost_and_keeps_the_rest() -> None:
    record = {
        "verdict": "rejected",
        "stopping_conditions": [{"code": "tolerance", "detail": "out/y.pt differs"}],
        "missing_observations": [],
        "cost": {"amount": 0.42, "currency": "USD"},
    }
    outcome = RecordOutcome.from_json(record)
    assert outcome.to_json() == record and outcome.extra == {"verdict": "rejected"}
    assert outcome.reason() == "out/y.pt differs" and outcome.amount() == 0.42
    coded = RecordOutcome.from_json({"stopping_conditions": [{"code": "job-failed"}]})
    assert coded.reason() == "job-failed" and coded.amount() is None
    missing = RecordOutcome.from_json({"missing_observations": ["peak_rss", "mps_ops"]})
    assert missing.reason() == "missing: peak_rss, mps_ops"
    assert RecordOutcome.from_json({}).reason() == ""


def test_a_cleanup_all_entry_keeps_its_shape() -> None:
    ok = {"host": "mac-a", "remote_root": "~/rm", "out": "/o/mac-a", "exit_code": 0, "record": {}}
    assert CleanupHost.from_json(ok).to_json() == ok
    failed = {
        "host": "mac-b",
        "remote_root": "~/rm",
        "out": "/o/mac-b",
        "exit_code": 3,
        "error": "mac-b: unreachable",
    }
    assert CleanupHost.from_json(failed).to_json() == failed


def test_a_stored_playbook_names_its_hosts_even_when_partial() -> None:
    full = {
        "remote_root": "~/rr",
        "workload": {"reference": {"host": "linux-box", "on": "remote"}, "command": "x"},
        "name": "t",
    }
    stored = StoredPlaybook.from_json(full)
    assert stored.to_json() == full
    assert stored.hosts("mac-a") == [("mac-a", "~/rr"), ("linux-box", "~/rr")]
    local_ref = dict(full, workload={"reference": {"host": "linux-box", "on": "local"}})
    assert StoredPlaybook.from_json(local_ref).hosts("mac-a") == [("mac-a", "~/rr")]
    assert StoredPlaybook.from_json({}).hosts("mac-a") == [("mac-a", "~/remotemac")]


def test_the_stored_options_round_trip_and_give_the_run_options() -> None:
    for stored in (
        {"keep_data": True, "drill": "disconnect", "show_secrets": False},
        {"keep_data": False, "drill": None},
        {"keep_data": False, "fleet": "f-1", "variant": {"dtype": "float16"}},
        {},
    ):
        assert StoredOptions.from_json(stored).to_json() == stored
    row = RunRow(
        run_id="r1",
        name="t",
        host="mac",
        state="running",
        playbook_path=None,
        playbook={},
        out_dir="/o",
        options={"keep_data": True, "drill": "disconnect", "show_secrets": True},
        verdict=None,
        exit_code=None,
        created_at=0.0,
        updated_at=0.0,
        finished_at=None,
    )
    opts = options_of(row)
    assert (opts.keep_data, opts.drill, opts.show_secrets) == (True, "disconnect", True)
    assert options_of(row, show_secrets=False).show_secrets is False


def test_a_resident_frame_round_trips_and_gives_its_cpu_figure() -> None:
    answer = {"id": "1-ab-3", "answer": {"ok": True, "result": {}}, "cpu_s": 0.25, "pid": 41}
    frame = Frame.from_json(answer)
    assert frame.to_json() == answer and frame.cpu == (41, 0.25)
    hello = {"hello": 1, "id": "x", "pid": 41, "cpu_s": 0.1, "python": "3.9.6", "protocol": 1}
    assert Frame.from_json(hello).to_json() == hello and Frame.from_json(hello).hello == 1
    assert Frame.from_json({"id": "2", "pid": "41", "cpu_s": 1.0}).cpu is None
