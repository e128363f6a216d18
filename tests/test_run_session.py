"""Every front end drives a run through one RunSession and shows one status view.

The CLI, the TUI and fleets used to turn a run that raised into a ``run_finished`` each
their own way, and ``status`` built its view in the CLI while the TUI built another;
these tests hold the one session's and the one view's answers (no host needed).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from remotemac.engine.session import AlreadyDone, RunOptions, RunSession, options_of
from remotemac.engine.statusview import LiveView, run_list, run_view
from remotemac.errors import EXIT_HOST, EXIT_INTERRUPTED, HostError, TransientHostError
from remotemac.journal import Journal
from remotemac.playbook import Playbook

PB = {"name": "tiny", "host": "local", "workload": {"command": "true"}}
RUN_ID = "tiny-20261202-010000-ab12"


def _journal(home: Path, out_dir: Path, options: dict | None = None) -> Journal:
    journal = Journal(home / "journal.sqlite3")
    journal.create_run(
        RUN_ID,
        name="tiny",
        host="local",
        playbook_path=None,
        playbook=PB,
        out_dir=str(out_dir),
        options=options or {},
    )
    return journal


def _session(tmp_path: Path) -> RunSession:
    journal = _journal(tmp_path, tmp_path / "out")
    return RunSession(RUN_ID, Playbook.model_validate(PB), journal, tmp_path, tmp_path / "out")


def test_a_stopped_run_ends_interrupted_with_the_command_that_resumes_it(tmp_path):
    session = _session(tmp_path)
    end = session.ending(KeyboardInterrupt())
    assert (end.verdict, end.exit_code) == ("interrupted", EXIT_INTERRUPTED)
    assert end.detail == f"remotemac attach {RUN_ID}"
    assert session.ending(asyncio.CancelledError()).verdict == "interrupted"


def test_a_link_down_past_its_deadline_ends_detached_and_a_failure_failed(tmp_path):
    session = _session(tmp_path)
    detached = session.ending(TransientHostError("link down"))
    assert detached.verdict == "detached" and detached.detail.startswith("link down")
    failed = session.ending(HostError("no route"))
    assert (failed.verdict, failed.exit_code) == ("failed", EXIT_HOST)
    bug = session.ending(ValueError("boom"))
    assert (bug.verdict, bug.exit_code, bug.detail) == ("failed", 1, "ValueError: boom")
    assert bug.out_dir == str(tmp_path / "out")


def test_attach_gets_the_options_the_run_started_with(tmp_path):
    stored = {"keep_data": True, "drill": "disconnect", "show_secrets": True}
    journal = _journal(tmp_path, tmp_path / "out", stored)
    session = RunSession.resume(journal, "ab12", home=tmp_path)
    assert session.run_id == RUN_ID and session.out_dir == tmp_path / "out"
    assert session.options == RunOptions(keep_data=True, drill="disconnect", show_secrets=True)
    row = journal.get_run(RUN_ID)
    assert row is not None and options_of(row, show_secrets=False).show_secrets is False


def test_a_phase_already_done_is_said_not_redone(tmp_path):
    journal = _journal(tmp_path, tmp_path / "out")
    journal.start_phase(RUN_ID, "pull")
    journal.finish_phase(RUN_ID, "pull", {"summary": "2 files verified"})
    session = RunSession.resume(journal, RUN_ID, home=tmp_path)
    with pytest.raises(AlreadyDone, match="already pulled"):
        asyncio.run(session.run_phase("pull"))


def test_one_status_view_gives_the_list_the_detail_and_the_json(tmp_path):
    journal = _journal(tmp_path, tmp_path / "out")
    journal.start_phase(RUN_ID, "provision")
    journal.finish_phase(RUN_ID, "provision", {"summary": "target=cpu"})
    journal.set_run_state(RUN_ID, "failed", exit_code=3, phase="sync", error="no route")
    (line,) = run_list(journal)
    assert line.to_json()["state"] == line.state_word and line.run_id == RUN_ID
    view = run_view(journal, "latest")
    data = view.to_json()
    assert data["phases"] == {"provision": {"state": "done", "summary": "target=cpu"}}
    assert (data["failed_phase"], data["error"]) == ("sync", "no route")
    assert "live" not in data and not view.in_flight
    facts = dict(view.facts())
    assert facts["exit code"] == "3" and facts["failed in"] == "sync"


def test_every_name_the_front_ends_may_ask_the_engine_for_is_there():
    from remotemac.engine import session

    for name in session.FRONT_DOOR:
        assert getattr(session, name) is not None, name
    with pytest.raises(AttributeError):
        session.build_context  # noqa: B018 - not for front ends: RunSession opens runs


def test_the_live_answer_reads_the_same_in_every_front_end():
    answer = {"answered": True, "sides": {"mps": {"state": "running"}, "cpu": {"state": "done"}}}
    assert LiveView.of(answer).summary() == "host: mps running, cpu done"
    assert LiveView.of(answer).side_states() == [("mps", "running"), ("cpu", "done")]
    assert LiveView.of({"answered": False}).summary() == "host did not answer"
