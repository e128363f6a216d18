"""The first hour of the TUI (issue 20), driven by Pilot.

Keys and the palette, ``tui PLAYBOOK`` starting the run, the run dialog's host
override and dry run, the log view (time, aligned device column, device filter,
elapsed time), the memory figure from the record, fleets from the journal and the
hosts screen at 80 and 120 columns. Runs are real (the ``lines`` workload on
``local``) where a run is needed; screens of finished runs read a real journal.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from textual.widgets import DataTable

from remotemac.checks.doctor import Check, DoctorReport
from remotemac.events import LogLine, Metric, PhaseStarted
from remotemac.journal import Journal
from remotemac.tui.app import RemotemacApp
from remotemac.tui.driver import AlreadyDone
from remotemac.tui.model import RunLive
from remotemac.tui.screens.dialogs import HelpScreen, MarkdownScreen, PlaybookPicker
from remotemac.tui.screens.fleet import FleetScreen
from remotemac.tui.screens.hosts import HostsScreen
from remotemac.tui.screens.run import RunScreen
from remotemac.tui.screens.runs import RunsScreen
from remotemac.tui.widgets.log_view import LogView
from tests.test_tui import make_app, screen_text, wait_for

pytestmark = pytest.mark.timeout(180)
SIZE = (120, 40)
PB = {
    "name": "tiny",
    "host": "local",
    "workload": {"command": "true"},
    "cost": {"hourly_rate": 2.0, "currency": "USD"},
}


def journal_run(
    home: Path,
    run_id: str,
    out_dir: Path,
    *,
    options: dict | None = None,
    state: str = "finished",
    verdict: str | None = "accepted",
    host: str = "local",
) -> Journal:
    journal = Journal(home / "journal.sqlite3")
    journal.create_run(
        run_id,
        name=run_id.rsplit("-", 3)[0],
        host=host,
        playbook_path=None,
        playbook=PB,
        out_dir=str(out_dir),
        options=options or {},
    )
    if state != "created":
        journal.set_run_state(run_id, state, verdict=verdict, exit_code=0)
    return journal


def has(app: RemotemacApp, screen: type, selector: str) -> bool:
    """Whether ``screen`` is up and has mounted ``selector`` (what a fixed pause waited for)."""
    return isinstance(app.screen, screen) and bool(app.screen.query(selector))


def runs_listed(app: RemotemacApp) -> bool:
    """The runs table has read the journal (a worker thread does, after the screen is up)."""
    return has(app, RunsScreen, "#runs") and app.screen.query_one("#runs", DataTable).row_count > 0


# ---------------------------------------------------------------- keys and palette


@pytest.mark.asyncio
async def test_question_mark_lists_every_key_of_the_screen(rm_home, tmp_path):
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for binding in RunsScreen.BINDINGS:
            assert binding.description in text, binding.description
        assert "enter" in text and "ctrl+p" in text
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_footer_shows_open_and_next_match(rm_home, tmp_path):
    journal_run(rm_home, "tiny-20261130-120000-ab12", tmp_path / "out").close()
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0)
    async with app.run_test(size=(160, 30)) as pilot:
        await wait_for(pilot, lambda: runs_listed(app), 10, "the run in the table")
        await wait_for(pilot, lambda: "Open" in screen_text(app), 10, "Open in the footer")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 10, "the run screen")
        keys = ("n Next match", "l Device", "q Quit")
        await wait_for(
            pilot, lambda: all(k in screen_text(app) for k in keys), 10, "the run's footer"
        )


def test_every_key_has_a_palette_entry(rm_home, tmp_path):
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0)
    entries = list(app.get_system_commands(RunsScreen()))
    helps = " ".join(f"{c.title} {c.help}" for c in entries)
    for screen in (RunsScreen, RunScreen, HostsScreen, FleetScreen):
        for binding in screen.BINDINGS:
            if binding.action in ("back", "app.pop_screen", "clear_filter", "top") or (
                binding.action.startswith("scroll_log")
            ):
                continue  # escape and moving about are not actions
            keys = binding.key.split(",")
            shown = {"slash": "/"}.get(keys[0], keys[0])
            assert f"({shown}" in helps or f"{shown} on the" in helps or f", {shown})" in helps, (
                screen.__name__,
                binding.key,
                binding.description,
            )


@pytest.mark.slow
@pytest.mark.asyncio
async def test_palette_entries_act_on_their_screen(rm_home, tmp_path):
    """A screen's own key from the palette runs there (and elsewhere says where it lives)."""
    run_id = "tiny-20261130-120000-ab12"
    journal_run(rm_home, run_id, tmp_path / "out", state="running", verdict=None).close()
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0)
    async with app.run_test(size=SIZE) as pilot:
        entries = {c.title: c.callback for c in app.get_system_commands(app.screen)}
        app.call_later(entries["Device filter"])
        await pilot.pause()  # the call_later is handled before the app is idle
        assert isinstance(app.screen, RunsScreen)  # not here: a warning, no crash
        app.driver.lives[run_id] = two_device_live(run_id, 1_790_000_000.0)
        await wait_for(pilot, lambda: runs_listed(app), 10, "the run in the table")
        app.call_later(entries["Open run"])
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 10, "the run")
        await wait_for(pilot, lambda: len(app.screen.query_one("#log", LogView).lines), 10, "log")
        app.call_later(entries["Device filter"])
        await wait_for(
            pilot, lambda: app.screen.query_one("#log", LogView).device == "cpu", 10, "cpu only"
        )
        app.call_later(entries["Keys"])
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), 10, "the keys")
        assert app.errors == []


# ---------------------------------------------------------------- starting runs


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_tui_with_a_playbook_runs_it(make_preinstalled_playbook, rm_home, tmp_path):
    pb = make_preinstalled_playbook(
        workload={
            "command": "python3 emit.py --device {device} --data "
            "{data_dir} --out {output_dir} --lines 5 "
            "--seconds 0.2",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        }
    )
    app = make_app(rm_home, tmp_path, [pb], reattach=False, live_poll_s=0, start_playbooks=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, RunScreen) and app.screen.acceptance is not None,
            120,
            "the run's record",
        )
        assert app.errors == []
    assert [r.name for r in Journal(rm_home / "journal.sqlite3").list_runs()] == ["lines"]


@pytest.mark.e2e
@pytest.mark.asyncio
async def test_run_dialog_dry_run_and_host_override(make_preinstalled_playbook, rm_home, tmp_path):
    # the promise is the dialog's dry run and host override, not the verdict: a small
    # torch-free workload (two torch imports cost ~10 s of this test on a loaded machine)
    pb = make_preinstalled_playbook(
        host="mac-nowhere.invalid",
        workload={
            "command": "python3 emit.py --device {device} --data {data_dir} "
            "--out {output_dir} --lines 5 --seconds 0.2"
        },
    )
    app = make_app(rm_home, tmp_path, [pb], reattach=False, live_poll_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await pilot.pause()
        picker = app.screen
        assert isinstance(picker, PlaybookPicker)
        picker.query_one("#host").value = "local"
        picker.query_one("#dry-run").value = True
        picker.query_one("#start").press()
        await wait_for(pilot, lambda: isinstance(app.screen, MarkdownScreen), 30, "the plan")
        assert "Plan for lines on local" in app.screen.text
        assert "Dry run: nothing was touched" in app.screen.text
        assert Journal(rm_home / "journal.sqlite3").list_runs() == []  # nothing started
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("r")
        await pilot.pause()
        app.screen.query_one("#host").value = "local"
        app.screen.query_one("#start").press()
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, RunScreen) and app.screen.acceptance is not None,
            120,
            "the run on local",
        )
        [row] = Journal(rm_home / "journal.sqlite3").list_runs()
        assert row.host == "local" and app.errors == []


# ---------------------------------------------------------------- the log view


def two_device_live(run_id: str, t0: float) -> RunLive:
    live = RunLive(run_id, host="local", name="tiny")
    live.active = True  # as the driver marks a run it drives: lines keep coming
    live.apply(PhaseStarted(run_id, phase="follow:reference", ts=t0))
    for i in range(6):
        live.apply(LogLine(run_id, device="cpu", line=f"cpu step {i}", ts=t0 + i))
        live.apply(LogLine(run_id, device="mps", line=f"mps step {i}", ts=t0 + i + 0.5))
    return live


@pytest.mark.slow
@pytest.mark.asyncio
async def test_log_lines_are_timestamped_aligned_and_filterable(rm_home, tmp_path):
    run_id = "tiny-20261130-120000-ab12"
    journal_run(rm_home, run_id, tmp_path / "out", state="running", verdict=None).close()
    t0 = 1_790_000_000.0
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0, now=lambda: t0 + 125)
    async with app.run_test(size=SIZE) as pilot:
        app.driver.lives[run_id] = two_device_live(run_id, t0)
        app.open_run(run_id)
        await wait_for(pilot, lambda: has(app, RunScreen, "#log"), 10, "the run screen")
        log = app.screen.query_one("#log", LogView)
        await wait_for(pilot, lambda: len(log.lines) == 12, 10, "12 lines")
        lines = list(log.lines)
        assert all(re.match(r"\d\d:\d\d:\d\d (cpu|mps) +│ ", line) for line in lines), lines
        assert len({line.index("│") for line in lines}) == 1
        status = str(app.screen.query_one("#log-status").render())
        assert "elapsed 2m05s" in status and "device: all" in status
        await pilot.press("l")
        await wait_for(pilot, lambda: log.device == "cpu" and len(log.lines) == 6, 10, "cpu")
        assert [line.split("│")[1].strip() for line in log.lines] == [
            f"cpu step {i}" for i in range(6)
        ]
        await pilot.press("l")
        await wait_for(pilot, lambda: log.device == "mps" and len(log.lines) == 6, 10, "mps")
        assert all("mps step" in line for line in log.lines)
        app.driver.lives[run_id].apply(LogLine(run_id, device="cpu", line="late", ts=t0 + 9))
        app.driver.lives[run_id].apply(LogLine(run_id, device="mps", line="later", ts=t0 + 9))
        await wait_for(pilot, lambda: log.lines[-1].endswith("│ later"), 10, "the new mps line")
        await pilot.pause(2 * app.flush_s)  # a flush after it: the cpu line still stays out
        assert not any(x[-4:] == "late" for x in log.lines)
        await pilot.press("l")
        await wait_for(pilot, lambda: log.device is None, 10, "all devices")
        assert len(log.lines) == 14


# ---------------------------------------------------------------- memory, fleet, hosts


def write_record(out_dir: Path, peak: int) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "acceptance.json").write_text(
        json.dumps(
            {
                "verdict": "accepted",
                "stopping_conditions": [],
                "observations": {"memory": {"peak_bytes": peak, "stable": True}},
            }
        )
    )


@pytest.mark.asyncio
async def test_finished_run_shows_memory_from_the_record(rm_home, tmp_path):
    run_id = "tiny-20261130-120000-ab12"
    out = tmp_path / "out"
    write_record(out, 306 * 2**20)
    journal_run(rm_home, run_id, out).close()
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0)
    async with app.run_test(size=SIZE) as pilot:
        app.open_run(run_id)
        await wait_for(
            pilot,
            lambda: isinstance(app.screen, RunScreen) and app.screen.acceptance is not None,
            10,
            "the record",
        )
        mem = app.screen.query_one("#mem-label")
        await wait_for(pilot, lambda: "306.0 MiB" in str(mem.render()), 10, "the gauge")
        label = str(mem.render())
        assert "306.0 MiB" in label and "record" in label, label


@pytest.mark.asyncio
async def test_live_gauge_agrees_with_the_record_once_written(rm_home, tmp_path):
    run_id = "tiny-20261130-120000-ab12"
    out = tmp_path / "out"
    journal_run(rm_home, run_id, out, state="running", verdict=None).close()
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0)
    async with app.run_test(size=SIZE) as pilot:
        live = RunLive(run_id, host="local")
        live.out_dir = str(out)
        live.apply(Metric(run_id, device="cpu-target", name="peak_rss_bytes", value=1.6 * 2**20))
        app.driver.lives[run_id] = live
        app.open_run(run_id)
        await wait_for(pilot, lambda: has(app, RunScreen, "#mem-label"), 10, "the run screen")
        mem = app.screen.query_one("#mem-label")
        await wait_for(pilot, lambda: "cpu-target 1.6 MiB" in str(mem.render()), 10, "live")
        write_record(out, 306 * 2**20)
        await app.screen.load_acceptance()
        await wait_for(pilot, lambda: "306.0 MiB" in str(mem.render()), 10, "the record's")


@pytest.mark.slow
@pytest.mark.asyncio
async def test_fleet_screen_reads_the_journal_not_the_cwd(rm_home, tmp_path):
    elsewhere = tmp_path / "elsewhere" / "sweep-20261130-120000-f1f1"
    fleet = "sweep-20261130-120000-f1f1"
    journal = None
    for i, (host, verdict) in enumerate((("mac-a", "accepted"), ("mac-b", "rejected"))):
        journal = journal_run(
            rm_home,
            f"{fleet}-{i:02d}",
            elsewhere / f"{fleet}-{i:02d}",
            options={"fleet": fleet, "variant": {"bs": i + 1}},
            verdict=verdict,
            host=host,
        )
    journal_run(
        rm_home,
        "other-20261130-130000-0a0a-00",
        tmp_path / "x" / "r",
        options={"fleet": "other-20261130-130000-0a0a"},
        state="running",
        verdict=None,
        host="mac-c",
    )
    journal.close()
    app = make_app(rm_home, tmp_path / "cwd-runs", reattach=False, live_poll_s=0)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen), 10, "the fleets")
        await wait_for(pilot, lambda: "mac-c" in screen_text(app), 10, "the newest fleet")
        text = screen_text(app)
        assert "no fleet runs" not in text
        assert "other-20261130-130000-0a0a" in text and "running" in text and "mac-c" in text
        await pilot.press("n")
        await wait_for(pilot, lambda: "bs=2" in screen_text(app), 10, "the next fleet")
        text = screen_text(app)
        for fragment in (fleet, "mac-a", "mac-b", "bs=1", "bs=2", "accepted", "rejected"):
            assert fragment in text, fragment


REPORT = DoctorReport(
    "mac-rental",
    [
        Check(
            "macos",
            "fail",
            "Linux",
            "MPS exists only on macOS (14 or newer)",
            "use an Apple-Silicon Mac as HOST",
        ),
        Check(
            "tmux",
            "fail",
            "missing",
            "jobs survive disconnects only inside tmux sessions",
            "brew install tmux, or let remotemac bring its own",
        ),
        Check("disk", "ok", "212.0 GiB free of 500.0 GiB at /Users/me"),
    ],
)


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.asyncio
async def test_hosts_screen_keeps_why_and_fix_whole(rm_home, tmp_path, width):
    app = make_app(rm_home, tmp_path, reattach=False, live_poll_s=0)
    async with app.run_test(size=(width, 40)) as pilot:
        await pilot.press("h")
        await pilot.pause()
        app.screen.reports["local"] = REPORT
        app.screen.show_report("local")

        def flat() -> str:
            return re.sub(r"[│┃\s]+", " ", screen_text(app))

        await wait_for(pilot, lambda: REPORT.checks[0].why in flat(), 10, "the report")
        text = flat()
        for check in REPORT.checks:
            assert check.why in text, (width, check.why)
            if check.fix:
                assert check.fix in text, (width, check.fix)
        assert "add: alias or user@host:port" in text


# ---------------------------------------------------------------- pull/wipe again


@pytest.mark.asyncio
async def test_pull_again_in_the_tui_is_said_not_redone(rm_home, tmp_path):
    run_id = "tiny-20261130-120000-ab12"
    journal = journal_run(rm_home, run_id, tmp_path / "out")
    for phase, result in (("provision", {}), ("pull", {"summary": "2 files verified"})):
        journal.start_phase(run_id, phase)
        journal.finish_phase(run_id, phase, result)
    app = RemotemacApp(
        make_app(rm_home, tmp_path).settings, journal=journal, reattach=False, live_poll_s=0
    )
    async with app.run_test(size=SIZE):
        with pytest.raises(AlreadyDone, match="already pulled"):
            await app.driver.one_phase("ab12", "pull")
    assert journal.phases(run_id)["pull"]["result"] == {"summary": "2 files verified"}
