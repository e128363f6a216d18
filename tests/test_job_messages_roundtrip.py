"""The job's messages read once into dataclasses write back the JSON they were read from.

Tier: fast (no marker). The launch's ``disk`` and ``relaunch``, the runner's status file
as a ``status`` answer carries it, and the drill's findings in the follow result are
typed on the laptop (engine/jobs.py); the JSON the host reads and the journal keeps is
unchanged: ``to_json(from_json(x)) == x`` for what remotemac writes, and an older or
newer status file keeps the keys the laptop does not name.
"""

from __future__ import annotations

from remotemac.engine.jobs import DiskWatch, DrillResult, Relaunch, RunnerStatus


def test_the_disk_watch_is_the_runners_json_and_reads_back() -> None:
    wire = {
        "paths": {"root": "/rr/runs/r1", "ram": None},
        "min_free": 1 << 30,
        "warn_free": 2 << 30,
    }
    watch = DiskWatch.from_json(wire)
    assert watch == DiskWatch("/rr/runs/r1", None, 1 << 30)
    assert watch.to_json() == wire


def test_a_relaunch_round_trips_and_the_record_gets_its_four_keys() -> None:
    wire = {"reason": "runner gone", "marker": "=== m ===", "command": "command", "at": 12.5}
    again = Relaunch.from_json(wire)
    assert again.to_json() == wire
    assert Relaunch(reason="r", marker="m", command="c", at=1.0).to_json() == {
        "reason": "r",
        "marker": "m",
        "command": "c",
        "at": 1.0,
    }
    # a status file from a runner that stored less: the record still has every key
    assert Relaunch.from_json({"reason": "x"}).for_record() == {
        "reason": "x",
        "marker": None,
        "command": None,
        "at": None,
    }


def test_the_runners_status_file_keeps_what_the_laptop_does_not_name() -> None:
    wire = {
        "state": "finished",
        "device": "mps",
        "runner_pid": 4242,
        "runner_start": "Mon 12:00",
        "mode": "tmux",
        "started_at": 10.0,
        "heartbeat_at": 20.0,
        "ended_at": 30.0,
        "exit_code": 0,
        "peak_rss_bytes": 1 << 20,
        "command": "python t.py",
        "session": "rm-r1-mps",
        "relaunched": {"reason": "runner gone", "marker": "m", "command": "command", "at": 5.0},
    }
    status = RunnerStatus.from_json(wire)
    assert status.to_json() == wire
    assert status.state == "finished" and status.exit_code == 0 and status.runner_pid == 4242
    assert status.extra["device"] == "mps" and status.extra["runner_start"] == "Mon 12:00"
    assert status.relaunch == Relaunch.from_json(wire["relaunched"])
    assert not status.empty


def test_no_status_file_is_empty_and_writes_back_as_nothing() -> None:
    none = RunnerStatus.from_json({})
    assert none.empty and none.to_json() == {} and none.relaunch is None
    assert RunnerStatus().empty
    # ``relaunch: true`` (a finished job started again) is no lost-job relaunch
    assert RunnerStatus.from_json({"relaunched": True}).relaunch is None


def test_the_drills_findings_keep_their_shape_in_the_follow_result() -> None:
    fresh = DrillResult()
    assert fresh.to_json() == {
        "kind": "disconnect",
        "job_kept_running": None,
        "log_complete": None,
        "reconnect_s": None,
    }
    cut = {
        "kind": "disconnect",
        "job_kept_running": True,
        "log_complete": True,
        "reconnect_s": 0.42,
        "lines_before": 20,
        "dropped": True,
    }
    assert DrillResult.from_json(cut).to_json() == cut
    skipped = {
        "kind": "disconnect",
        "job_kept_running": None,
        "log_complete": None,
        "reconnect_s": None,
        "lines_before": 21,
        "skipped": "local has no link to cut",
    }
    assert DrillResult.from_json(skipped).to_json() == skipped
