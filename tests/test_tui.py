"""The Textual TUI driven by Pilot (App.run_test) over the real engine.

Runs use the fast stdlib workload (tests/fixtures/projects/lines) on host ``local``,
or on the real sshd of tests/harness behind the fault proxy; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import html
import re
import sys
import time
from pathlib import Path

import pytest
from textual.css.query import NoMatches

from remotemac.events import LogLine, PhaseProgress
from remotemac.journal import Journal
from remotemac.settings import LocalSettings
from remotemac.tui.app import RemotemacApp
from remotemac.tui.model import LineStore, LogRecord, PhaseState, RunLive
from remotemac.tui.screens.dialogs import ConfirmScreen, MarkdownScreen
from remotemac.tui.screens.hosts import HostsScreen
from remotemac.tui.screens.run import RunScreen
from remotemac.tui.widgets.connection_badge import ConnectionBadge
from remotemac.tui.widgets.log_view import LogView

pytestmark = pytest.mark.timeout(180)
SIZE = (140, 40)


def expected_log(lines: int, torch: bool = False) -> list[str]:
    """What emit.py prints (stdout and stderr interleaved), as in test_pipeline_local."""
    out = ["tensor on cpu"] if torch else []
    out.append("device=cpu data_files=2")
    for i in range(1, lines + 1):
        out.append(f"line {i:06d} of {lines}")
        if i % 7 == 0:
            out.append(f"stderr line {i:06d}")
    return out


def fast_workload(lines: int, seconds: float) -> dict:
    return {
        "command": f"python3 emit.py --device {{device}} --data {{data_dir}} "
        f"--out {{output_dir}} --lines {lines} --seconds {seconds}",
        "reference": {"device": "cpu"},
        "target": {"device": "cpu"},
        "timeout": "5m",
    }


def view_lines(app: RemotemacApp, device: str) -> list[str]:
    try:
        log = app.screen.query_one("#log", LogView)
    except NoMatches:  # the run screen is not composed yet
        return []
    out = []
    for line in log.lines:  # "hh:mm:ss device     │ text" (time blank for preloaded lines)
        head, sep, text = line.partition(" │ ")
        if sep and head.split()[-1] == device:
            out.append(text)
    return out


def screen_text(app: RemotemacApp) -> str:
    svg = app.export_screenshot()
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


async def wait_for(pilot, predicate, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def make_app(home: Path, tmp_path: Path, playbooks=(), **kw) -> RemotemacApp:
    settings = LocalSettings.from_options(str(home), kw.pop("ssh_config", None))
    return RemotemacApp(
        settings, [str(p) for p in playbooks], out_root=tmp_path / "runs", blink=False, **kw
    )


def run_screen(app: RemotemacApp) -> RunScreen:
    assert isinstance(app.screen, RunScreen), type(app.screen).__name__
    return app.screen


# ---------------------------------------------------------------- the quickstart on local


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_quickstart_on_local_shows_log_and_verdict(
    make_preinstalled_playbook, rm_home, tmp_path
):
    pb = (
        make_preinstalled_playbook()
    )  # the quickstart-like run: 40 lines, a tensor on cpu, accepted
    app = make_app(rm_home, tmp_path, [pb])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")  # the picker lists the PLAYBOOK args
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, RunScreen) and app.screen.acceptance is not None,
            120,
            "the verdict",
        )
        screen = run_screen(app)
        await pilot.pause(0.2)
        assert screen.acceptance.verdict == "accepted"
        for device in ("cpu", "cpu-target"):
            assert view_lines(app, device) == expected_log(40, torch=True)
        text = screen_text(app)
        assert "ACCEPTED" in text and "within tolerance" in text
        assert all(p.state == "done" for p in screen.live.phases.values())
        assert app.errors == []
        await pilot.press("a")  # acceptance.md in the markdown viewer
        await pilot.pause()
        assert isinstance(app.screen, MarkdownScreen)
        assert app.screen.text.startswith("# Acceptance")
        await pilot.press("escape", "escape")
        await pilot.pause(0.3)
        assert "accepted" in screen_text(app)  # the runs table, verdict column


# ---------------------------------------------------------------- real sshd, link cut


@pytest.mark.asyncio
async def test_link_cut_badge_reconnects_and_no_line_is_lost(
    sshd, fault_proxy, ssh_env, make_preinstalled_playbook, tmp_path
):
    proxy = fault_proxy(sshd)
    home, cfg, alias = ssh_env(sshd, proxy)
    pb = make_preinstalled_playbook(
        host=alias,
        # 4 s a side: the cut comes 0.3 s into the target's run, the outage lasts ~1.5 s
        workload=fast_workload(300, 4),
        environment=None,
        remote_root=str(sshd.home / "host-root"),
    )
    app = make_app(home, tmp_path, [pb], ssh_config=str(cfg))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 10, "the run screen")
        screen = run_screen(app)
        badge = screen.query_one("#badge", ConnectionBadge)
        await wait_for(pilot, lambda: badge.state == "connected", 30, "connected")
        await wait_for(pilot, lambda: len(view_lines(app, "cpu-target")) > 20, 90, "target lines")
        proxy.refuse(True)  # the host is "down" for a while: reconnects fail until restore
        await asyncio.to_thread(proxy.cut)
        cut_at = time.monotonic()
        await wait_for(pilot, lambda: badge.state == "reconnecting", 5, "reconnecting")
        assert time.monotonic() - cut_at < 2.0
        assert "attempt" in screen_text(app)
        await pilot.pause(1.0)
        proxy.restore()
        await wait_for(pilot, lambda: badge.state == "connected", 60, "reconnected")
        await wait_for(pilot, lambda: screen.acceptance is not None, 90, "the record")
        await pilot.pause(0.2)
        shown = [s for s in badge.shown if s != "unknown"]  # "unknown": before connecting
        assert shown[0] == "connected" and shown[-1] == "connected"
        assert "reconnecting" in shown[shown.index("connected") + 1 :]
        assert proxy.accepted >= 2
        out = Path(screen.live.out_dir)
        for device in ("cpu", "cpu-target"):
            got = view_lines(app, device)
            assert got == expected_log(300), f"{device}: lost or repeated lines in the view"
            assert got == (out / "logs" / f"{device}.log").read_text().splitlines()
        assert app.errors == []


# ---------------------------------------------------------------- wipe, with confirmation


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_wipe_asks_first_and_wipes_on_yes(make_preinstalled_playbook, rm_home, tmp_path):
    pb = make_preinstalled_playbook(workload=fast_workload(5, 0.1))
    app = make_app(rm_home, tmp_path, [pb])
    async with app.run_test(size=SIZE) as pilot:
        run_id = app.driver.start(str(pb), keep_data=True)
        app.open_run(run_id)
        await wait_for(pilot, lambda: not app.driver.attached(run_id), 60, "the run's end")
        run_dir = tmp_path / "host-root" / "runs" / run_id
        assert (run_dir / "data").exists()  # kept: --keep-data
        assert list((rm_home / "keys").glob("*.key"))

        await pilot.press("w")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause(0.5)
        assert (run_dir / "data").exists(), "wiped without a yes"

        # the second time through the command palette
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Wipe")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 5, "the question")
        await pilot.press("y")
        journal = Journal(rm_home / "journal.sqlite3")
        await wait_for(
            pilot,
            lambda: (journal.phase_state(run_id, "wipe") or ("", {}))[1].get("done") is True,
            30,
            "the wipe",
        )
        assert not (run_dir / "data").exists() and not (run_dir / "out").exists()
        assert not list((rm_home / "keys").glob("*.key"))
        assert app.errors == []


# ---------------------------------------------------------------- quit, reopen, re-attach


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_quit_keeps_the_job_and_reopening_reattaches(
    make_preinstalled_playbook, rm_home, tmp_path
):
    # 12 s: the job must outlast the quit on a loaded machine (at 4 s it ended first in CI)
    pb = make_preinstalled_playbook(workload=fast_workload(120, 12))
    app = make_app(rm_home, tmp_path, [pb])
    async with app.run_test(size=SIZE) as pilot:
        run_id = app.driver.start(str(pb))
        app.open_run(run_id)
        await wait_for(pilot, lambda: len(view_lines(app, "cpu")) >= 5, 60, "first lines")
        await pilot.press("q")  # mid-run: it asks (keep the job running / stay here)
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the question")
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, 30, "the exit")
    assert app.return_code == 130  # as the CLI's Ctrl-C
    assert app.exit_lines == [
        "remotemac: stopped following; the job keeps running on the host. "
        f"Resume with: remotemac attach {run_id}"
    ]
    journal = Journal(rm_home / "journal.sqlite3")
    assert journal.get_run(run_id).state == "interrupted"
    remote_log = tmp_path / "host-root" / "runs" / run_id / "logs" / "cpu.log"
    size = remote_log.stat().st_size
    await asyncio.sleep(1.0)
    assert remote_log.stat().st_size > size, "the job stopped when the TUI quit"

    again = make_app(rm_home, tmp_path, [pb])  # reattach=True: the default
    async with again.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: again.driver.attached(run_id), 10, "re-attach")
        await wait_for(pilot, lambda: "re-attached" in screen_text(again), 10, "it says so")
        assert again.reattached == [run_id]
        again.open_run(run_id)
        await wait_for(
            pilot, lambda: journal.get_run(run_id).state == "finished", 120, "the run's end"
        )
        await pilot.pause(0.3)
        skipped = [p for p, s in run_screen(again).live.phases.items() if s.state == "skipped"]
        assert "provision" in skipped and "sync" in skipped
        for device in ("cpu", "cpu-target"):
            assert view_lines(again, device) == expected_log(120), device
        assert again.errors == []


# ---------------------------------------------------------------- hosts: doctor, trust, cleanup


@pytest.mark.asyncio
async def test_trust_shows_the_fingerprint_and_pins_only_on_yes(sshd, ssh_env, tmp_path):
    home, cfg, alias = ssh_env(sshd, trust=False)
    app = make_app(home, tmp_path, ssh_config=str(cfg), reattach=False)
    known = home / "known_hosts"
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app.screen, HostsScreen)
        await pilot.click("#add-host")
        await pilot.press(*alias, "enter")
        await pilot.pause()
        assert app.screen.selected_host() == alias
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 15, "the question")
        assert sshd.fingerprint in app.screen.details
        await pilot.press("n")
        await pilot.pause(0.3)
        assert (
            not known.exists() or sshd.host_pubkey.read_text().split()[1] not in known.read_text()
        )
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), 15, "the question")
        await pilot.press("y")
        await wait_for(
            pilot,
            lambda: known.exists() and sshd.host_pubkey.read_text().split()[1] in known.read_text(),
            15,
            "the pin",
        )
        assert app.errors == []


@pytest.mark.slow
@pytest.mark.asyncio
async def test_doctor_on_local_and_cleanup_unavailable_is_one_error_line(
    rm_home, tmp_path, monkeypatch
):
    monkeypatch.setitem(sys.modules, "remotemac.engine.cleanup", None)  # not importable
    app = make_app(rm_home, tmp_path, reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, HostsScreen) and screen.selected_host() == "local"
        await pilot.press("d")
        await wait_for(pilot, lambda: "local" in screen.reports, 120, "the doctor report")
        report = screen.reports["local"]
        assert report.check("macos").status == "fail"
        assert report.fit is False  # this Linux box is no Mac: the report says so, no crash
        assert "not fit" in screen_text(app)
        await pilot.press("c")
        await wait_for(pilot, lambda: app.errors, 10, "the error line")
        assert len(app.errors) == 1 and "\n" not in app.errors[0]
        assert app.errors[0].startswith("cleanup local: cleanup is not available")
        assert isinstance(app.screen, HostsScreen)  # still running, no crash


@pytest.mark.slow
@pytest.mark.asyncio
async def test_errors_are_lines_not_crashes(rm_home, tmp_path):
    app = make_app(rm_home, tmp_path, reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await pilot.pause()
        await pilot.press(*"/nope.yaml", "enter")
        await wait_for(pilot, lambda: app.errors, 5, "the error line")
        assert "nope.yaml" in app.errors[0] and "\n" not in app.errors[0]
        await pilot.press("t")  # attach with no run selected: a warning, nothing else
        await pilot.pause()
        assert app.is_running and len(app.errors) == 1


# ---------------------------------------------------------------- widgets and model


def test_line_store_hands_out_each_line_once_and_bounds_memory():
    store = LineStore(keep=100)
    seen = 0
    got: list[str] = []
    for i in range(1000):
        store.append(LogRecord("cpu", str(i)))
        if i % 37 == 0:
            got += [r.text for r in store.since(seen)]
            seen = store.total
    got += [r.text for r in store.since(seen)]
    assert got == [str(i) for i in range(1000)]
    assert len(store._lines) < 200


def test_transfer_rate_comes_from_event_timestamps():
    row = PhaseState("sync")
    row.progress(PhaseProgress("r", phase="sync", done=0, total=100, ts=10.0))
    row.progress(PhaseProgress("r", phase="sync", done=50, total=100, ts=12.0))
    assert row.rate == 25.0 and row.done == 50


def test_fallback_ops_are_found_in_the_log():
    live = RunLive("r", host="mac")
    live.apply(
        LogLine(
            "r",
            device="mps",
            line="UserWarning: The operator 'aten::_linalg_svd' "
            "is not currently supported on the MPS backend and will fall back",
        )
    )
    live.apply(
        LogLine(
            "r",
            device="mps",
            line="The operator 'aten::_linalg_svd' is not currently supported on the MPS backend",
        )
    )
    assert live.fallback_ops == ["aten::_linalg_svd"]


@pytest.mark.slow
@pytest.mark.asyncio
async def test_log_view_batches_bounds_and_searches(rm_home, tmp_path):
    app = make_app(rm_home, tmp_path, reattach=False, log_max_lines=1000)
    async with app.run_test(size=SIZE) as pilot:
        live = app.driver.lives["r1"] = RunLive("r1")
        live.active = True  # driven here: lines keep coming
        app.open_run("r1")
        await pilot.pause()
        log = app.screen.query_one("#log", LogView)
        for i in range(5000):
            live.add_line("cpu", f"line {i}")
        await wait_for(pilot, lambda: log.lines and log.lines[-1].endswith("4999"), 10, "5000")
        assert log.batches <= 2 and len(log.lines) == 1000
        assert log.lines[-1].endswith("│ line 4999") and log.following
        assert log.search("line 4500") is not None and not log.following
        await pilot.press("n")  # older match: none for this exact term
        assert log.lines[log.match_line].endswith("│ line 4500")
        live.add_line("cpu", "late line")
        await wait_for(pilot, lambda: log.lines[-1].endswith("late line"), 10, "the late line")
        assert log.lines[-1].endswith("│ late line") and not log.following  # paused: no jump
        await pilot.press("f")
        await pilot.pause()
        assert log.following


@pytest.mark.asyncio
async def test_fleet_screen_shows_every_host_of_the_summary(rm_home, tmp_path):
    """The fleet screen reads the fleet.json the engine writes (engine.fleet.write_summary)."""
    from remotemac.engine.fleet import FleetRun, write_summary
    from remotemac.engine.inventoryfile import HostVars
    from remotemac.playbook import parse_playbook
    from remotemac.tui.screens.fleet import FleetScreen

    pb = parse_playbook(
        "name: sweep\nhosts: [mac-a, mac-b]\nmatrix: {bs: [1, 2]}\n"
        "workload: {command: 'python t.py --bs {matrix.bs}'}\n"
    )
    out = tmp_path / "runs" / "sweep-fleet"
    out.mkdir(parents=True)
    runs = [
        FleetRun(
            i,
            host,
            {"bs": bs},
            HostVars(),
            out / host,
            verdict=verdict,
            duration_s=12.5 + i,
            cost=0.25,
            reason=reason,
        )
        for i, (host, bs, verdict, reason) in enumerate(
            [("mac-a", 1, "accepted", ""), ("mac-b", 2, "lost", "tmux session gone")]
        )
    ]
    write_summary(
        out,
        pb,
        runs,
        fleet_id="sweep-fleet",
        exit_code=4,
        started=1_790_000_000.0,
        forks=8,
        connections=2,
    )
    app = make_app(rm_home, tmp_path, reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, FleetScreen)
        text = screen_text(app)
        for fragment in (
            "sweep-fleet",
            "mac-a",
            "mac-b",
            "bs=1",
            "bs=2",
            "accepted",
            "lost",
            "tmux session gone",
            "exit 4",
        ):
            assert fragment in text, fragment
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, FleetScreen)


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_runs_screen_shows_what_the_host_says_about_a_detached_run(
    make_preinstalled_playbook, rm_home, tmp_path
):
    """A run driven by nobody here (detached from the CLI): the state column asks its host."""
    import json

    from tests.conftest import remotemac

    # long enough that the screen often finds the reference side still running (either
    # answer comes from the host); attach then waits out both sides, so no longer
    pb = make_preinstalled_playbook(workload=fast_workload(lines=20, seconds=3))
    proc = remotemac("run", str(pb), "--out", str(tmp_path / "out"), "--detach", "--json")
    assert proc.returncode == 0, proc.stderr
    run_id = json.loads(proc.stdout.splitlines()[-1])["run_id"]
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0.5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot,
            lambda: (
                "host: cpu running" in screen_text(app) or "host: cpu finished" in screen_text(app)
            ),
            60,
            "the host's answer",
        )
        assert run_id[:20] in screen_text(app)
    # leave nothing running: finish the run
    assert remotemac("attach", run_id).returncode in (0, 1)


@pytest.mark.asyncio
async def test_a_runs_refresh_that_finds_its_table_gone_is_not_a_crash(rm_home, tmp_path):
    """The runs table reads the journal on a thread; the app can close meanwhile and
    take the table with it (CI saw the worker then fail and the app die with
    WorkerFailed). Here the table goes first, then a refresh runs to its end."""
    from textual.worker import WorkerCancelled

    from remotemac.tui.screens.runs import RunsScreen

    app = make_app(rm_home, tmp_path, reattach=False)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        await screen.query_one("#runs").remove()
        for _ in range(20):  # (a periodic refresh may cancel ours: it is exclusive)
            worker = screen.refresh_runs()
            try:
                await worker.wait()
                break
            except WorkerCancelled:
                continue
        await pilot.pause()
        assert worker.error is None and worker.is_finished and app.is_running
