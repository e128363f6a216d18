"""Fixed TUI scenes with real content (a finished run's log, a fleet, a cleanup plan).

Shared by the snapshot tests, the real-tmux test and ``scripts/bench_tui.py``:
a fake journal with fixed run ids and times, a fixed "now", a finished run whose
out dir holds real log files and an acceptance record.

``python -m tests.tuiscene SCENE OUT_DIR`` runs the app in the current terminal on
that scene (the tmux test and the idle bench start it inside tmux).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from remotemac.journal import RunRow
from remotemac.settings import LocalSettings
from remotemac.tui.app import RemotemacApp

NOW = 1_790_000_000.0
PB = {"cost": {"hourly_rate": 1.1, "currency": "USD"}}
LIVE_ID = "tiny-mlp-20260101-120000-a1b2"
DONE_ID = "tiny-mlp-20251231-090000-c3d4"
LOCAL_ID = "lines-20251230-080000-e5f6"


def row(
    run_id: str,
    host: str,
    state: str,
    verdict: str | None,
    age: float,
    out_dir: str = "/nonexistent",
    **extra,
) -> RunRow:
    created = NOW - age
    fields = dict(
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
    fields.update(extra)
    return RunRow(**fields)


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


def journal(out_dir: str = "/nonexistent", done_dir: str = "/nonexistent") -> FakeJournal:
    rows = [
        row(LIVE_ID, "mac-rental", "running", None, 2 * 3600 + 300, out_dir),
        row(DONE_ID, "mac-rental", "finished", "rejected", 86400 * 1.2, done_dir),
        row(LOCAL_ID, "local", "finished", "accepted", 86400 * 2.5),
    ]
    done = {"state": "done", "result": {}}
    phases = {
        rows[0].run_id: {
            "provision": done,
            "sync": done,
            "launch:reference": done,
            "follow:reference": {"state": "started", "result": {}},
        },
        rows[1].run_id: {
            "provision": done,
            "sync": done,
            "launch:reference": done,
            "follow:reference": done,
            "pull": done,
            "compare": done,
            "record": done,
        },
        rows[2].run_id: {"wipe": done},
    }
    return FakeJournal(rows, phases)


def fleet_journal() -> FakeJournal:
    fleet = "sweep-20251229-100000-9f9f"
    rows = []
    for i, (host, verdict, bs) in enumerate(
        (("mac-a", "accepted", 1), ("mac-b", "rejected", 2), ("mac-c", "accepted", 4))
    ):
        rows.append(
            row(
                f"{fleet}-{i:02d}",
                host,
                "finished",
                verdict,
                86400 * 3 - 60 * i,
                name="sweep",
                options={"fleet": fleet, "variant": {"bs": bs}},
            )
        )
    return FakeJournal(rows, {})


def acceptance(out_dir: Path) -> None:
    """A rejected run's record: one fallback op, memory stable, results within tolerance."""
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


def finished_logs(out_dir: Path, lines: int = 120) -> None:
    """A finished run's two logs as the engine leaves them in ``<out>/logs``."""
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cpu, mps = [], []
    for i in range(1, lines + 1):
        cpu.append(
            f"epoch {i // 20} step {i:04d} loss {1 / i:.4f} lr 1.0e-03 "
            f"throughput {1200 + i % 7 * 11:.1f} samples/s"
        )
        mps.append(
            f"epoch {i // 20} step {i:04d} loss {1 / i + 1e-6:.4f} lr 1.0e-03 "
            f"throughput {2100 + i % 5 * 13:.1f} samples/s"
        )
    mps.insert(
        3,
        "UserWarning: The operator 'aten::_linalg_svd' is not currently supported on the "
        "MPS backend and will fall back to run on the CPU.",
    )
    (logs / "cpu.log").write_text("\n".join(cpu) + "\n")
    (logs / "mps.log").write_text("\n".join(mps) + "\n")


def finished_run(tmp: Path) -> tuple[RemotemacApp, str]:
    """The app and the id of a finished, rejected run whose log and record are on disk."""
    out = tmp / "done"
    acceptance(out)
    finished_logs(out)
    return app(tmp, journal(done_dir=str(out))), DONE_ID


def app(tmp: Path, jr: FakeJournal, **kwargs) -> RemotemacApp:
    return RemotemacApp(
        LocalSettings.from_options(str(tmp / "home")),
        ["examples/tiny-mlp.yaml"],
        journal=jr,
        now=lambda: NOW,
        out_root=tmp / "runs",
        reattach=False,
        blink=False,
        live_poll_s=0,
        **kwargs,
    )


def stream(the_app: RemotemacApp, total: int, burst: int = 250, every_s: float = 0.025) -> None:
    """The live run's screen while ``total`` lines stream in (as the engine's sink adds
    them), then the run ends, as a re-attached run that finishes: the screen the issue
    saw cut lines on."""
    from remotemac.events import LogLine, PhaseStarted
    from remotemac.tui.messages import RunEnded
    from remotemac.tui.model import RunLive

    live = RunLive(LIVE_ID, host="mac-rental", name="tiny-mlp")
    live.active = True
    the_app.driver.lives[LIVE_ID] = live
    live.apply(PhaseStarted(LIVE_ID, phase="follow:target", ts=NOW - 60))
    sent = 0

    def more() -> None:
        nonlocal sent
        for _ in range(min(burst, total - sent)):
            sent += 1
            device = "mps" if sent % 2 else "cpu"
            live.apply(
                LogLine(
                    LIVE_ID,
                    device=device,
                    line=f"step {sent:06d} loss 0.{sent:05d} lr 1e-4 throughput 1234.5 samples/s",
                    ts=NOW - 60 + sent / 1000,
                )
            )
        if sent >= total:
            timer.stop()
            live.active = False
            live.verdict = "accepted"
            the_app.post_message(RunEnded(LIVE_ID, 0, None))

    the_app.call_later(lambda: the_app.open_run(LIVE_ID))
    timer = the_app.set_interval(every_s, more)


def main(argv: list[str]) -> int:
    """Run a scene in this terminal: ``finished`` opens the finished run's screen,
    ``stream N`` streams N lines into the live run's screen, then ends the run."""
    scene, tmp = argv[0], Path(argv[1])
    tmp.mkdir(parents=True, exist_ok=True)
    the_app, run_id = finished_run(tmp)
    if scene == "finished":
        the_app.call_later(lambda: the_app.open_run(run_id))
    elif scene == "stream":
        the_app.call_later(lambda: stream(the_app, int(argv[2])))
    the_app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
