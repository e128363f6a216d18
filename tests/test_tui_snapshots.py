"""pytest-textual-snapshot pictures of each TUI screen and dialog at 80x24, 120x40, 200x60.

Deterministic on purpose: a fake journal with fixed run ids and times, a fixed
"now", a fixed terminal size, no clock in the header, no cursor blink, live state
built from hand-made events with fixed timestamps. Update with ``--snapshot-update``.

Each picture is also read as text before it is taken: every run id and verdict the
screen shows must be whole there (issue 30: at 80 columns the verdict was cut to
``accept``), and no line may end in a cut (``…``) id.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from remotemac.checks.doctor import Check, DoctorReport
from remotemac.events import (
    ConnectionState,
    LogLine,
    Metric,
    PhaseFinished,
    PhaseProgress,
    PhaseStarted,
    RunFinished,
)
from remotemac.journal import RunRow
from remotemac.settings import LocalSettings
from remotemac.tui.app import RemotemacApp
from remotemac.tui.model import RunLive
from remotemac.tui.screens.run import RunScreen
from remotemac.tui.widgets.log_view import LogView

pytestmark = pytest.mark.slow

NOW = 1_790_000_000.0
SIZES = [(80, 24), (120, 40), (200, 60)]
SIZE_IDS = ["80x24", "120x40", "200x60"]
PB = {"cost": {"hourly_rate": 1.1, "currency": "USD"}}


def _row(
    run_id: str,
    host: str,
    state: str,
    verdict: str | None,
    age: float,
    out_dir: str = "/nonexistent",
) -> RunRow:
    created = NOW - age
    return RunRow(
        run_id=run_id,
        name=run_id.rsplit("-", 3)[0],
        host=host,
        playbook_path=None,
        playbook=PB,
        out_dir=out_dir,
        options={},
        state=state,
        verdict=verdict,
        exit_code=None,
        created_at=created,
        updated_at=created,
        finished_at=None if state == "running" else created + 1800,
    )


class FakeJournal:
    """The reads the TUI makes, over fixed rows."""

    def __init__(self, rows: list[RunRow], phases: dict[str, dict]) -> None:
        self.rows = rows
        self._phases = phases

    def list_runs(self, limit: int = 200) -> list[RunRow]:
        return self.rows

    def get_run(self, run_id: str) -> RunRow | None:
        return next((r for r in self.rows if r.run_id == run_id), None)

    def phases(self, run_id: str) -> dict:
        return self._phases.get(run_id, {})

    def log_offset(self, run_id: str, device: str) -> tuple[int, int]:
        return (0, 0)


def _journal(out_dir: str = "/nonexistent") -> FakeJournal:
    rows = [
        _row(
            "tiny-mlp-20260101-120000-a1b2", "mac-rental", "running", None, 2 * 3600 + 300, out_dir
        ),
        _row("tiny-mlp-20251231-090000-c3d4", "mac-rental", "finished", "rejected", 86400 * 1.2),
        _row("lines-20251230-080000-e5f6", "local", "finished", "accepted", 86400 * 2.5),
    ]
    done = {"state": "done", "result": {}}
    phases = {
        rows[0].run_id: {
            "provision": done,
            "sync": done,
            "launch:reference": done,
            "follow:reference": {"state": "started", "result": {}},
        },
        rows[1].run_id: {"wipe": done},
        rows[2].run_id: {"wipe": done},
    }
    return FakeJournal(rows, phases)


def _app(tmp_path: Path, journal: FakeJournal) -> RemotemacApp:
    settings = LocalSettings.from_options(str(tmp_path / "home"))
    return RemotemacApp(
        settings,
        ["examples/tiny-mlp.yaml"],
        journal=journal,
        now=lambda: NOW,
        out_root=tmp_path / "runs",
        reattach=False,
        blink=False,
        live_poll_s=0,
    )


async def _run_screen_settled(pilot, app: RemotemacApp, timeout: float = 10.0) -> None:
    """Until the run screen is mounted, its loads are done and its log has taken every
    line of the store (what a fixed 0.3 s pause used to wait for, in less time)."""
    deadline = time.monotonic() + timeout

    async def until(ready) -> None:
        while not ready():
            assert time.monotonic() < deadline, "the run screen did not settle"
            await pilot.pause(0.02)

    await until(lambda: isinstance(app.screen, RunScreen) and bool(app.screen.query("#log")))
    await app.workers.wait_for_complete()
    screen = app.screen
    log = screen.query_one("#log", LogView)
    status = screen.query_one("#log-status")
    total = screen.live.lines.total  # a flush has run once the status counts the lines
    await until(lambda: log.seen == total and f"{total:,} lines" in str(status.render()))
    await pilot.pause()


def _live(run_id: str, out_dir: Path) -> RunLive:
    live = RunLive(run_id, host="mac-rental", name="tiny-mlp")
    live.out_dir = str(out_dir)
    t = NOW - 600
    events = [
        ConnectionState(run_id, host="mac-rental", state="connected", ts=t),
        PhaseStarted(run_id, phase="provision", ts=t),
        PhaseFinished(run_id, phase="provision", detail="target=mps", ts=t + 5),
        PhaseStarted(run_id, phase="sync", ts=t + 5),
        PhaseProgress(run_id, phase="sync", done=0, total=300 << 20, ts=t + 5),
        PhaseProgress(run_id, phase="sync", done=120 << 20, total=300 << 20, ts=t + 15),
        PhaseStarted(run_id, phase="launch:reference", ts=t + 20),
        PhaseFinished(run_id, phase="launch:reference", ts=t + 21),
        PhaseStarted(run_id, phase="follow:reference", ts=t + 21),
        PhaseProgress(run_id, phase="follow:cpu", done=0, unit="lines", ts=t + 21),
        PhaseProgress(run_id, phase="follow:cpu", done=1200, unit="lines", ts=t + 31),
        ConnectionState(
            run_id, host="mac-rental", state="disconnected", detail="keepalive timeout", ts=t + 32
        ),
        ConnectionState(
            run_id, host="mac-rental", state="reconnecting", attempt=3, next_in_s=4.0, ts=t + 40
        ),
    ]
    for i, mem in enumerate((310, 320, 330, 360, 380, 400, 410, 415)):
        events.append(
            Metric(run_id, device="cpu", name="peak_rss_bytes", value=mem * 2**20, ts=t + 22 + i)
        )
    for i in range(1, 61):
        events.append(
            LogLine(
                run_id,
                device="cpu",
                line=f"epoch {i // 10} step {i:04d} loss {1 / i:.4f}",
                ts=t + 30,
            )
        )
    events.append(
        LogLine(
            run_id,
            device="mps",
            line="UserWarning: The operator "
            "'aten::_linalg_svd' is not currently supported on the MPS backend "
            "and will fall back to run on the CPU.",
            ts=t + 31,
        )
    )
    events.append(
        RunFinished(run_id, verdict="rejected", exit_code=1, out_dir=str(out_dir), ts=t + 50)
    )
    for event in events:
        live.apply(event)
    return live


def _acceptance(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "acceptance.json").write_text(
        json.dumps(
            {
                "verdict": "rejected",
                "stopping_conditions": [
                    {"code": "fallback-op", "detail": "aten::_linalg_svd ran on the CPU"}
                ],
                "observations": {
                    "tensors_on_device": True,
                    "operators": {
                        "fallback_ops": [{"op": "aten::_linalg_svd"}],
                        "unsupported_ops": [],
                        "dtype_errors": [],
                    },
                    "memory": {"peak_bytes": 415 * 2**20, "stable": True, "slope_bytes_per_s": 0.0},
                    "results": {"within_tolerance": True, "files": []},
                },
            }
        )
    )
    (out_dir / "acceptance.md").write_text("# Acceptance: tiny-mlp\n\n**rejected**\n")


sized = pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
IDS = [r.run_id for r in _journal().rows]


def screen_text(app: RemotemacApp) -> str:
    import html
    import re

    svg = app.export_screenshot()
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


def _whole(app: RemotemacApp, *words: str) -> None:
    text = screen_text(app)
    for word in words:
        assert word in text, (word, text[:3000])


async def _runs_settled(pilot, app: RemotemacApp) -> None:
    from textual.widgets import DataTable

    deadline = time.monotonic() + 10
    while not (app.screen.query("#runs") and app.screen.query_one("#runs", DataTable).row_count):
        assert time.monotonic() < deadline, "the runs table did not fill"
        await pilot.pause(0.02)
    await pilot.pause()


@sized
def test_runs_screen(snap_compare, tmp_path, size):
    app = _app(tmp_path, _journal())

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        _whole(app, *IDS, "rejected", "accepted")

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_run_screen_live_reconnecting(snap_compare, tmp_path, size):
    out = tmp_path / "out"
    _acceptance(out)
    journal = _journal(str(out))
    app = _app(tmp_path, journal)
    run_id = journal.rows[0].run_id

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        app.driver.lives[run_id] = _live(run_id, out)
        app.open_run(run_id)
        await _run_screen_settled(pilot, app)
        _whole(app, run_id)

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_finished_run_from_the_journal(snap_compare, tmp_path, size):
    """A finished run opened from the journal: its log files, the record's verdict."""
    from tests import tuiscene

    app, run_id = tuiscene.finished_run(tmp_path)

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        app.open_run(run_id)
        await _run_screen_settled(pilot, app)
        _whole(app, run_id, "REJECTED", "samples/s")

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_finished_run_side_panel_opened(snap_compare, tmp_path, size):
    """``i`` on a narrow terminal: the phases, link, memory and verdict beside the log."""
    from tests import tuiscene

    app, run_id = tuiscene.finished_run(tmp_path)

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        app.open_run(run_id)
        await _run_screen_settled(pilot, app)
        await pilot.press("i")
        await pilot.pause()
        _whole(app, "REJECTED")

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_log_filtered(snap_compare, tmp_path, size):
    """``/`` on the run screen: only the lines holding the words, the status says so."""
    from tests import tuiscene

    app, run_id = tuiscene.finished_run(tmp_path)

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        app.open_run(run_id)
        await _run_screen_settled(pilot, app)
        await pilot.press("slash", *"UserWarning")
        await pilot.pause(0.2)
        _whole(app, "filter: 'UserWarning'")

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_hosts_screen(snap_compare, tmp_path, size):
    app = _app(tmp_path, _journal())
    report = DoctorReport(
        "mac-rental",
        [
            Check("macos", "ok", "15.3.1", "MPS needs macOS 14+"),
            Check("arch", "ok", "arm64"),
            Check(
                "vm",
                "warn",
                "virtual machine",
                "MPS in a VM is slower than on bare metal",
                "rent a bare-metal Mac",
            ),
            Check("python", "ok", "3.12.8"),
            Check(
                "tmux",
                "fail",
                "missing",
                "jobs survive disconnects only inside tmux",
                "brew install tmux, or let remotemac bring its own",
            ),
            Check("disk", "ok", "212.0 GiB free of 500.0 GiB at /Users/me"),
            Check("mps", "ok", "available"),
        ],
    )

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        await pilot.press("h", "down")
        await pilot.pause()
        app.screen.set_report("mac-rental", report)
        await pilot.pause()
        _whole(app, "not fit", "virtual machine")

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_wipe_confirm_dialog(snap_compare, tmp_path, size):
    """Wipe of the finished run not wiped yet (the wiped one offers no wipe)."""
    from tests import tuiscene

    app = _app(tmp_path, tuiscene.journal())

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        await pilot.press("down", "w")
        await pilot.pause()
        _whole(app, "Wipe", "No", IDS[1])

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_trust_key_confirm_dialog(snap_compare, tmp_path, size):
    """``t`` on the hosts screen for a host with no pinned key: the key in words, whole."""
    from remotemac.tui.screens.hosts import trust_question

    app = _app(tmp_path, _journal())
    fp = "SHA256:nThbg6kXUpJWGl7E1IGOCspRomTxdCARLviKw6E5SY8"

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        await pilot.press("h", "down")
        await pilot.pause()
        app.push_screen(trust_question("mac-rental", "ssh-ed25519", fp))
        await pilot.pause(0.2)
        _whole(app, "Trust mac-rental's host key?", f"ssh-ed25519 {fp}", "Trust", "No")

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_cleanup_dialog_with_a_plan(snap_compare, tmp_path, size):
    """The dry run's plan: kind, path, size of each item, what stays and why, the total."""
    from remotemac.tui.fit import CleanupPlan
    from remotemac.tui.screens.dialogs import CleanupScreen
    from tests.test_tui_keys import cleanup_record

    app = _app(tmp_path, _journal())

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        app.push_screen(CleanupScreen(CleanupPlan.from_record(cleanup_record(12))))
        await pilot.pause(0.2)
        _whole(app, "Clean up", "No", "total ", "Remove these 13 items")

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_quit_mid_run_dialog(snap_compare, tmp_path, size):
    app = _app(tmp_path, _journal())
    run_id = IDS[0]

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        live = app.driver.lives[run_id] = RunLive(run_id, host="mac-rental")
        live.active = True
        await pilot.press("q")
        await pilot.pause(0.2)
        _whole(app, "Keep running", "Stay here", f"remotemac attach {run_id}")

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_playbook_picker(snap_compare, tmp_path, size):
    app = _app(tmp_path, _journal())

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        await pilot.press("r")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_help_screen(snap_compare, tmp_path, size):
    """``?`` on the runs screen: every key, and where the palette is."""
    app = _app(tmp_path, _journal())

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_acceptance_markdown(snap_compare, tmp_path, size):
    out = tmp_path / "out"
    _acceptance(out)
    app = _app(tmp_path, _journal(str(out)))

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        app.open_markdown(out / "acceptance.md")
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=before)


@sized
def test_fleet_screen_from_journal(snap_compare, tmp_path, size):
    """Fleet runs found in the journal (no fleet.json anywhere near the cwd)."""
    from tests import tuiscene

    app = _app(tmp_path, tuiscene.fleet_journal())

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        await pilot.press("f")
        await pilot.pause(0.2)
        _whole(app, "mac-a", "mac-b", "mac-c", "accepted", "rejected")

    assert snap_compare(app, terminal_size=size, run_before=before)


def _two_devices(run_id: str, t: float) -> RunLive:
    live = RunLive(run_id, host="mac-rental", name="tiny-mlp")
    live.active = True
    live.apply(ConnectionState(run_id, host="mac-rental", state="connected", ts=t))
    live.apply(PhaseStarted(run_id, phase="follow:target", ts=t))
    for i in range(12):
        live.apply(
            LogLine(run_id, device="cpu", line=f"epoch {i} loss {1 / (i + 1):.4f}", ts=t + 2 * i)
        )
        live.apply(
            LogLine(
                run_id,
                device="cpu-target",
                line=f"epoch {i} loss {1 / (i + 1) + 1e-6:.4f}",
                ts=t + 2 * i + 1,
            )
        )
    return live


@sized
def test_live_run_two_devices(snap_compare, tmp_path, size):
    """Two devices: each line with its time, the device column aligned, elapsed time."""
    journal = _journal(str(tmp_path / "out"))
    app = _app(tmp_path, journal)
    run_id = journal.rows[0].run_id

    async def before(pilot) -> None:
        await _runs_settled(pilot, app)
        app.driver.lives[run_id] = _two_devices(run_id, NOW - 95)
        app.open_run(run_id)
        await _run_screen_settled(pilot, app)
        await pilot.press("l")  # one device's lines only
        await pilot.pause()
        _whole(app, "device: cpu", "elapsed 1m35s")

    assert snap_compare(app, terminal_size=size, run_before=before)


@pytest.fixture(autouse=True)
def _fixed_home(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTEMAC_HOME", str(tmp_path / "home"))
