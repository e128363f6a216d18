"""Quitting mid-run (issue 30): keep the job running, or stop it on its host, then quit.

The quit dialog offers both besides "stay here". The local-host tests run a real job
(the ``lines`` workload) and check its processes by the pids its status file names:
gone after "stop & quit", alive after "keep running, quit".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from remotemac.journal import Journal
from remotemac.tui.model import RunLive
from remotemac.tui.screens.dialogs import ConfirmScreen, QuitScreen
from tests import tuiscene
from tests.test_tui import fast_workload, make_app, view_lines, wait_for

pytestmark = pytest.mark.timeout(180)
SIZE = (120, 40)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose: it runs nothing
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def job_pids(run_dir: Path, label: str = "cpu") -> list[int]:
    status = json.loads((run_dir / "status" / f"{label}.json").read_text(encoding="utf-8"))
    return [int(status[k]) for k in ("child_pid", "runner_pid") if status.get(k)]


@pytest.mark.asyncio
async def test_the_quit_dialog_offers_stop_and_says_what_it_did(tmp_path):
    """``s`` in the quit dialog: the driver stops the jobs, exit 130, the wipe command said."""
    app, _ = tuiscene.finished_run(tmp_path)
    stopped: list[list[str]] = []

    async def stop_jobs(run_ids: list[str]) -> dict[str, str]:
        stopped.append(list(run_ids))
        return {}

    app.driver.stop_jobs = stop_jobs  # type: ignore[method-assign]
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.screen.query("#runs"), 10, "the runs")
        live = app.driver.lives[tuiscene.LIVE_ID] = RunLive(tuiscene.LIVE_ID, host="mac-rental")
        live.active = True
        await pilot.press("q")
        await wait_for(pilot, lambda: isinstance(app.screen, QuitScreen), 10, "the question")
        assert "Stop & quit" in app.screen.details
        for button in ("#yes", "#stop", "#no"):  # all three on screen at 80x24, whole
            widget = app.screen.query_one(button)
            x, y = widget.region.offset
            assert app.screen.get_widget_at(x + 2, y + 1)[0] is widget, button
        await pilot.press("s")
        await wait_for(pilot, lambda: not app.is_running, 10, "the exit")
    assert stopped == [[tuiscene.LIVE_ID]]
    assert app.return_code == 130
    assert app.exit_lines == [
        f"remotemac: stopped the job of {tuiscene.LIVE_ID} on its host; its data stays "
        f"there until: remotemac wipe {tuiscene.LIVE_ID}"
    ]


async def _quit_mid_run(app, pilot, run_id: str, key: str, run_dir: Path) -> list[int]:
    try:
        await wait_for(pilot, lambda: len(view_lines(app, "cpu")) >= 3, 60, "first lines")
    except AssertionError as exc:  # say what the app was showing, not only that it timed out
        row = app.journal.get_run(run_id)
        raise AssertionError(
            f"{exc}; screen {type(app.screen).__name__}, run {row.state if row else None}"
            f" ({row.error if row else ''}), cpu lines {view_lines(app, 'cpu')!r}"
        ) from None
    await wait_for(pilot, lambda: len(job_pids(run_dir)) == 2, 30, "the job's pids")
    pids = job_pids(run_dir)
    assert all(alive(p) for p in pids), pids
    await pilot.press("q")
    await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the question")
    await pilot.press(key)
    await wait_for(pilot, lambda: not app.is_running, 60, "the exit")
    return pids


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_stop_and_quit_ends_the_jobs_processes(make_preinstalled_playbook, rm_home, tmp_path):
    pb = make_preinstalled_playbook(workload=fast_workload(60, 30))
    app = make_app(rm_home, tmp_path, [pb])
    async with app.run_test(size=SIZE) as pilot:
        run_id = app.driver.start(str(pb))
        app.open_run(run_id)
        run_dir = tmp_path / "host-root" / "runs" / run_id
        pids = await _quit_mid_run(app, pilot, run_id, "s", run_dir)
    assert app.return_code == 130
    assert app.exit_lines == [
        f"remotemac: stopped the job of {run_id} on its host; its data stays "
        f"there until: remotemac wipe {run_id}"
    ]
    await wait_for_gone(pids)
    journal = Journal(rm_home / "journal.sqlite3")
    row = journal.get_run(run_id)
    assert row.state == "failed"  # never re-attached by the next TUI
    assert "stopped on the host" in (row.error or "")
    assert not (run_dir / "status" / "cpu-target.json").exists()  # the target never started


async def wait_for_gone(pids: list[int], timeout: float = 15.0) -> None:
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, [p for p in pids if alive(p)]
        await asyncio.sleep(0.1)


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_keep_running_and_quit_leaves_the_jobs_processes(
    make_preinstalled_playbook, rm_home, tmp_path
):
    pb = make_preinstalled_playbook(workload=fast_workload(60, 30))
    app = make_app(rm_home, tmp_path, [pb])
    async with app.run_test(size=SIZE) as pilot:
        run_id = app.driver.start(str(pb))
        app.open_run(run_id)
        run_dir = tmp_path / "host-root" / "runs" / run_id
        pids = await _quit_mid_run(app, pilot, run_id, "y", run_dir)
    assert app.return_code == 130
    journal = Journal(rm_home / "journal.sqlite3")
    try:
        assert journal.get_run(run_id).state == "interrupted"
        assert all(alive(p) for p in pids), pids
    finally:  # the job is not left behind by the test: stopped as the dialog's "stop" does
        from remotemac.engine.session import RunSession
        from remotemac.settings import LocalSettings

        settings = LocalSettings.from_options(str(rm_home))
        session = RunSession.resume(journal, run_id, home=settings.home, show_secrets=False)
        await session.stop_jobs("test over")
        await wait_for_gone(pids)
