"""Keys as a lazygit/k9s user expects them (issue 30), driven by Pilot.

Every key the ``?`` screen lists runs its action; j/k/g/G/Home/End move the
selection; ``/`` filters the runs, the hosts and the log (esc clears); a
destructive letter typed into a filter is text, never a wipe or a cleanup;
actions are offered only where they apply; quitting mid-run asks, then leaves as
the CLI's Ctrl-C does (exit 130, the ``attach`` command). Scenes are the fixed
ones of tests/tuiscene.py (a finished run's log and record on disk).
"""

from __future__ import annotations

import time

import pytest
from textual.command import CommandPalette
from textual.widgets import DataTable

from remotemac.tui.fit import CleanupPlan
from remotemac.tui.model import RunLive
from remotemac.tui.screens.dialogs import (
    CleanupScreen,
    ConfirmScreen,
    HelpScreen,
    MarkdownScreen,
    key_rows,
)
from remotemac.tui.screens.fleet import FleetScreen
from remotemac.tui.screens.hosts import HostsScreen
from remotemac.tui.screens.run import RunScreen
from remotemac.tui.screens.runs import RunsScreen
from remotemac.tui.widgets.keybar import KeyBar
from remotemac.tui.widgets.lists import FilterBar
from remotemac.tui.widgets.log_view import LogView
from tests import tuiscene

pytestmark = pytest.mark.timeout(120)

_PRESS = {"/": "slash", "?": "question_mark", "esc": "escape", ":": "colon"}
# keys whose action reaches a host (or leaves): recorded, not run, in the help test
_NOT_RUN = {
    "app.attach",
    "app.pull",
    "app.drill",
    "app.cleanup",
    "doctor",
    "trust",
    "app.quit",
    "quit",
}


async def until(pilot, predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)


def table_ids(app, selector: str) -> list[str]:
    table = app.screen.query_one(selector, DataTable)
    return [str(key.value) for key in table.rows]


def cursor_id(app, selector: str) -> str:
    table = app.screen.query_one(selector, DataTable)
    key, _ = table.coordinate_to_cell_key(table.cursor_coordinate)
    return str(key.value)


async def open_scene(pilot, app, where: str) -> None:
    """The screen under test, settled: its table filled or its log loaded."""
    await until(pilot, lambda: len(table_ids(app, "#runs")) == 3, "the runs table")
    if where == "hosts":
        await pilot.press("h")
        await until(pilot, lambda: isinstance(app.screen, HostsScreen), "the hosts screen")
    elif where == "fleet":
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, FleetScreen), "the fleet screen")
    elif where in ("run", "record"):
        app.open_run(tuiscene.DONE_ID)
        await until(
            pilot,
            lambda: isinstance(app.screen, RunScreen) and bool(app.screen.query("#log")),
            "the run screen",
        )
        log = app.screen.query_one("#log", LogView)
        await until(pilot, lambda: len(log.lines) == 241, "the finished run's log")
        if where == "record":  # the run's acceptance.md, opened with a
            await pilot.press("a")
            await until(pilot, lambda: isinstance(app.screen, MarkdownScreen), "the record")
    await pilot.pause()


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["runs", "run", "record", "hosts", "fleet"])
async def test_every_key_the_help_lists_runs_its_action(tmp_path, where):
    """Each key of the ``?`` screen, pressed, reaches the action the help names for it."""
    app, _ = tuiscene.finished_run(tmp_path)
    if where == "fleet":
        app = tuiscene.app(tmp_path, tuiscene.fleet_journal())
    ran: list[str] = []
    real_run_action = app.run_action

    async def recording(action, default_namespace=None):
        ran.append(str(action))
        if str(action) in _NOT_RUN:
            return True
        return await real_run_action(action, default_namespace)

    app.run_action = recording  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        if where == "fleet":
            await pilot.pause(0.2)
            await pilot.press("f")
            await until(pilot, lambda: isinstance(app.screen, FleetScreen), "the fleet screen")
        else:
            await open_scene(pilot, app, where)
        home = app.screen
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        rows = app.screen.rows
        assert rows == key_rows(home, app.BINDINGS)
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is home, "the help closed")
        bindings = {}
        for b in [*type(home).BINDINGS, *app.BINDINGS]:
            for k in b.key.split(","):
                bindings.setdefault(k.strip(), b.action)
        from remotemac.tui.widgets.lists import ListTable

        for b in ListTable.BINDINGS if home.query(ListTable) else []:
            for k in b.key.split(","):
                bindings.setdefault(k.strip(), b.action)
        presses: list[tuple[str, str]] = []
        for keys, _what in rows:
            for shown in keys.split(" / "):
                key = _PRESS.get(shown, shown)
                if key == "ctrl+c":
                    continue  # the same quit action as q (a priority binding of the app)
                expected = bindings.get(key)
                assert expected, (where, shown)
                presses.append((key, expected))
        leaving = [p for p in presses if p[1] in ("back", "app.pop_screen")]
        presses = [p for p in presses if p not in leaving] + leaving[:1]  # leave once, last
        for key, expected in presses:
            ran.clear()
            await pilot.press(key)
            await pilot.pause()
            if (key, ran) in (("end", ["scroll_end"]), ("home", ["scroll_home"])):
                pass  # the focused log scrolls itself there: the same as the screen's key
            elif expected not in ("cursor_down", "cursor_up", "first", "last"):
                # (those the table handles itself; that they move: the test below)
                assert expected in ran, (where, key, expected, ran)
            if (key, expected) in leaving:
                assert app.screen is not home  # esc went back
                break
            while app.screen is not home:  # back to the screen under test
                if isinstance(app.screen, CommandPalette):
                    await pilot.press("escape")
                else:
                    app.pop_screen()
                await pilot.pause()
            bar = home.query(FilterBar)
            if bar and bar.first().display:
                bar.first().action_clear()
                await pilot.pause()
        assert len(presses) >= len(rows)


@pytest.mark.asyncio
@pytest.mark.parametrize("where", ["runs", "hosts", "fleet"])
async def test_j_k_g_G_home_end_move_the_selection(tmp_path, where):
    app, _ = tuiscene.finished_run(tmp_path)
    if where == "fleet":
        app = tuiscene.app(tmp_path, tuiscene.fleet_journal())
    async with app.run_test(size=(120, 40)) as pilot:
        if where == "fleet":
            await pilot.pause(0.2)
            await pilot.press("f")
            await until(pilot, lambda: isinstance(app.screen, FleetScreen), "the fleet")
        else:
            await open_scene(pilot, app, where)
        selector = {"runs": "#runs", "hosts": "#hosts", "fleet": "#fleet"}[where]
        ids = table_ids(app, selector)
        assert len(ids) >= 2, ids
        steps = [
            ("j", ids[1]),
            ("k", ids[0]),
            ("G", ids[-1]),
            ("g", ids[0]),
            ("end", ids[-1]),
            ("home", ids[0]),
        ]
        for key, expected in steps:
            await pilot.press(key)
            await pilot.pause()
            assert cursor_id(app, selector) == expected, (key, cursor_id(app, selector))


@pytest.mark.asyncio
async def test_slash_filters_the_runs_and_esc_clears(tmp_path):
    app, _ = tuiscene.finished_run(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_scene(pilot, app, "runs")
        await pilot.press("slash", *"local")
        await until(pilot, lambda: table_ids(app, "#runs") == [tuiscene.LOCAL_ID], "one run")
        await pilot.press("enter")  # keeps the filter, the keys back to the table
        await pilot.pause()
        assert table_ids(app, "#runs") == [tuiscene.LOCAL_ID]
        await pilot.press("escape")
        await until(pilot, lambda: len(table_ids(app, "#runs")) == 3, "every run again")


@pytest.mark.asyncio
async def test_slash_filters_the_hosts_and_esc_clears(tmp_path):
    app, _ = tuiscene.finished_run(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_scene(pilot, app, "hosts")
        every = table_ids(app, "#hosts")
        assert "local" in every and "mac-rental" in every
        await pilot.press("slash", *"rent")
        await until(pilot, lambda: table_ids(app, "#hosts") == ["mac-rental"], "one host")
        await pilot.press("escape")
        await until(pilot, lambda: table_ids(app, "#hosts") == every, "every host again")
        assert isinstance(app.screen, HostsScreen)


@pytest.mark.asyncio
async def test_slash_filters_the_log_lines_and_esc_clears(tmp_path):
    app, _ = tuiscene.finished_run(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await open_scene(pilot, app, "run")
        log = app.screen.query_one("#log", LogView)
        await pilot.press("slash", *"step 0100")
        await until(pilot, lambda: len(log.lines) == 2, "the two step-100 lines")
        assert all("step 0100" in line for line in log.lines)
        await pilot.press("escape")
        await until(pilot, lambda: len(log.lines) == 241, "every line again")
        assert isinstance(app.screen, RunScreen)  # esc cleared the filter, did not leave


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "where, typed",
    [("runs", "/labmc"), ("runs", "/wipe cw"), ("hosts", "/tcd"), ("run", "/wpdt")],
)
async def test_a_destructive_letter_typed_into_a_filter_does_nothing(tmp_path, where, typed):
    """``/labmc`` on the runs screen once ran ``c`` (cleanup): in a filter it is text."""
    app, _ = tuiscene.finished_run(tmp_path)
    ran: list[str] = []
    real_run_action = app.run_action

    async def recording(action, default_namespace=None):
        ran.append(str(action))
        return await real_run_action(action, default_namespace)

    app.run_action = recording  # type: ignore[method-assign]
    async with app.run_test(size=(120, 40)) as pilot:
        await open_scene(pilot, app, where)
        home = app.screen
        ran.clear()
        await pilot.press(*["slash" if c == "/" else "space" if c == " " else c for c in typed])
        await pilot.pause(0.2)
        assert app.screen is home
        assert home.query_one(FilterBar).value == typed[1:]
        assert not any(a.split(".")[-1] in _NOT_RUN | {"wipe", "app.wipe"} for a in ran), ran
        assert not [w for w in app.workers if w.group in ("cleanup", "phase")]


@pytest.mark.asyncio
async def test_wipe_and_attach_are_offered_only_where_they_apply(tmp_path):
    app, _ = tuiscene.finished_run(tmp_path)
    async with app.run_test(size=(200, 40)) as pilot:
        await open_scene(pilot, app, "runs")
        bar = app.screen.query_one(KeyBar)

        def footer() -> str:
            return str(bar.render())

        # the running run, followed by nobody here: attach yes, wipe no (its job runs)
        assert cursor_id(app, "#runs") == tuiscene.LIVE_ID
        await until(pilot, lambda: "t Attach" in footer(), "attach offered")
        assert "w Wipe" not in footer()
        # the local run, wiped already: no wipe, no attach; w does nothing
        await pilot.press("G")
        await until(pilot, lambda: "t Attach" not in footer(), "attach gone")
        assert "w Wipe" not in footer() and "p Pull" in footer()
        await pilot.press("w")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        # the finished run not wiped yet: wipe offered, it asks in words
        await pilot.press("k")
        await until(pilot, lambda: "w Wipe" in footer(), "wipe offered")
        await pilot.press("w")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert "Wipe the data of " + tuiscene.DONE_ID in app.screen.question
        await pilot.press("n")
        await pilot.pause()
        # attached here: no attach on its run screen
        live = app.driver.lives[tuiscene.LIVE_ID] = RunLive(tuiscene.LIVE_ID, host="mac-rental")
        live.active = True
        app.driver.attached = lambda run_id: run_id == tuiscene.LIVE_ID  # type: ignore
        app.open_run(tuiscene.LIVE_ID)
        await until(pilot, lambda: isinstance(app.screen, RunScreen), "the live run")
        await pilot.pause()
        footer_now = str(app.screen.query_one(KeyBar).render())
        assert "t Attach" not in footer_now and "w Wipe" not in footer_now, footer_now


@pytest.mark.asyncio
async def test_quitting_mid_run_asks_then_exits_130_with_the_attach_command(tmp_path):
    app, _ = tuiscene.finished_run(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_scene(pilot, app, "runs")
        live = app.driver.lives[tuiscene.LIVE_ID] = RunLive(tuiscene.LIVE_ID, host="mac-rental")
        live.active = True  # a worker of this TUI follows it
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        assert app.screen.question == "Quit while 1 run is live?"
        assert f"remotemac attach {tuiscene.LIVE_ID}" in app.screen.details
        await pilot.press("n")  # stay here
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen) and app.is_running
        await pilot.press("ctrl+c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "asked again")
        await pilot.press("y")
        await until(pilot, lambda: not app.is_running, "the exit")
    assert app.return_code == 130
    said = " ".join(app.exit_lines)
    assert f"Resume with: remotemac attach {tuiscene.LIVE_ID}" in said


@pytest.mark.asyncio
async def test_quitting_with_nothing_live_leaves_at_once_with_0(tmp_path):
    app, _ = tuiscene.finished_run(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await open_scene(pilot, app, "runs")
        await pilot.press("q")
        await until(pilot, lambda: not app.is_running, "the exit")
    assert app.return_code == 0


def cleanup_record(n: int = 30) -> dict:
    """A dry run's record as the engine builds it (``build_record``) from a host's answer."""
    from remotemac.engine.cleanup import Knowledge, build_record

    items = [
        {
            "kind": "run",
            "path": f"~/remotemac/runs/tiny-mlp-2025123{i % 10}-0900{i:02d}-c3d4",
            "fate": "would remove",
            "bytes": (i + 1) * 7 << 20,
            "sources": ["journal"],
        }
        for i in range(n)
    ]
    items.append(
        {
            "kind": "venv",
            "path": "~/remotemac/venvs/torch-2.5",
            "fate": "would remove",
            "bytes": 1800 << 20,
            "sources": ["host"],
        }
    )
    items.append(
        {
            "kind": "dir",
            "path": "~/remotemac/tmp/held",
            "fate": "left alone",
            "bytes": 0,
            "why": "open by a running job",
            "sources": ["host"],
        }
    )
    answer = {"roots": [{"root": "~/remotemac", "items": items, "remaining": []}]}
    return build_record(
        host="mac-rental",
        name="mac-rental",
        fingerprint="SHA256:abc",
        started=tuiscene.NOW,
        dry_run=True,
        answer=answer,
        know=Knowledge(),
        extra_items=[],
    ).to_json()


@pytest.mark.asyncio
async def test_cleanup_dialog_lists_kind_path_size_total_and_keeps_its_buttons_on_screen(
    tmp_path,
):
    app, _ = tuiscene.finished_run(tmp_path)
    plan = CleanupPlan.from_record(cleanup_record())
    async with app.run_test(size=(80, 24)) as pilot:
        await open_scene(pilot, app, "runs")
        app.push_screen(CleanupScreen(plan))
        await until(pilot, lambda: isinstance(app.screen, CleanupScreen), "the dialog")
        await pilot.pause()
        screen = app.screen
        assert screen.question.startswith("Remove these 31 items (")
        dialog = screen.query_one("#dialog").region
        for button in ("#yes", "#no"):
            widget = screen.query_one(button)
            x, y = widget.region.offset
            shown = [screen.get_widget_at(x + 2, y + dy)[0] for dy in range(3)]
            assert shown == [widget] * 3, (button, widget.region, dialog)  # on screen, whole
        total = str(screen.query_one("#plan-total").render())
        assert total.startswith("total ") and "nothing is touched" in total
        assert dialog.contains_region(screen.query_one("#plan-total").region)
        assert app.focused is screen.query_one("#no")  # enter out of habit removes nothing
        await pilot.press("n")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
