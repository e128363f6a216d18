"""The run's ledger shows how the host's RAM disk was made, even when the session that
made it was cut (issue 28).

Why: on a Mac the first sync session runs ``hdiutil attach`` and ``diskutil
erasevolume``; when the link is cut before its answer reaches the laptop, the next
session finds the volume mounted and reuses it, and no ledger showed the commands that
made it. The agent keeps them in ``<run_dir>/ramstore.json`` (agent/ramstore.py) and a
reusing session returns them marked ``earlier``; the laptop writes them into the ledger
once, as made by an earlier session, at the time they ran. The ledger, the journal and
the agent's record here are the real ones (files in tmp_path).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from remotemac.agent import ramstore
from remotemac.engine.ledger import Ledger
from remotemac.engine.sync import _record_ram
from remotemac.journal import Journal

RUN = "mac-20261202-133000-ab12"
MOUNT = f"/Volumes/remotemac-{RUN}"
ATTACH = ["hdiutil", "attach", "-nobrowse", "-nomount", "ram://131072"]
ERASE = ["diskutil", "erasevolume", "HFS+", f"remotemac-{RUN}", "/dev/disk4"]


def _ctx(tmp_path: Path) -> SimpleNamespace:
    warnings: list[object] = []
    return SimpleNamespace(
        run_id=RUN,
        ledger=Ledger(tmp_path / "out" / "ledger.jsonl"),
        journal=Journal(tmp_path / "journal.db"),
        emit=warnings.append,
        warnings=warnings,
    )


def _binding() -> SimpleNamespace:
    return SimpleNamespace(transport=SimpleNamespace(name="mac"))


def _made(run_dir: Path) -> list[dict[str, object]]:
    """The steps the maker session ran (as ramstore._step records them)."""
    steps: list[dict[str, object]] = [
        {"argv": ATTACH, "code": 0, "time": 1764682200.25, "stdout": "/dev/disk4 \n", "stderr": ""},
        {"argv": ERASE, "code": 0, "time": 1764682200.75, "stdout": "", "stderr": ""},
    ]
    ramstore._keep_record(str(run_dir), MOUNT, "/dev/disk4", steps)
    return steps


def _reused(run_dir: Path) -> dict[str, object]:
    """The ``ram`` answer of a later session that found the volume mounted."""
    device, steps = ramstore.made_earlier(str(run_dir), MOUNT)
    return ramstore._info(MOUNT, "ramdisk", device, None, steps, reused=True)


def _entries(ctx: SimpleNamespace) -> list[dict[str, object]]:
    path = ctx.ledger.path
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_cut_makers_ram_disk_steps_reach_the_ledger_once_marked_earlier(tmp_path: Path):
    """The maker session was cut (its answer never arrived); two later sessions of the
    run reuse the volume: the ledger shows hdiutil attach and diskutil erasevolume once,
    as made by an earlier session, at the times they ran on the host."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _made(run_dir)
    ctx = _ctx(tmp_path)
    for _ in range(2):  # the resuming sync, then a re-sync (attach) of the same run
        _record_ram(ctx, _binding(), {"ram": _reused(run_dir)})
    rows = [(e["command"], e["op"], e["time"], e["via"]) for e in _entries(ctx)]
    assert rows == [
        (" ".join(ATTACH), "ramstore:earlier-session", 1764682200.25, "agent"),
        (" ".join(ERASE), "ramstore:earlier-session", 1764682200.75, "agent"),
    ], rows
    assert [r["path"] for r in ctx.journal.inventory("mac")] == [MOUNT]


def test_the_makers_own_steps_are_not_written_again_when_a_later_session_reuses_it(
    tmp_path: Path,
):
    """The maker's answer arrived (its steps are in the ledger as ``ramstore``): a later
    session's reuse adds nothing."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    made = _made(run_dir)
    ctx = _ctx(tmp_path)
    _record_ram(
        ctx, _binding(), {"ram": ramstore._info(MOUNT, "ramdisk", "/dev/disk4", None, made)}
    )
    _record_ram(ctx, _binding(), {"ram": _reused(run_dir)})
    rows = [(e["command"], e["op"]) for e in _entries(ctx)]
    assert rows == [(" ".join(ATTACH), "ramstore"), (" ".join(ERASE), "ramstore")], rows


def test_a_reuse_without_the_makers_record_writes_no_step(tmp_path: Path):
    """An older agent's volume (no ramstore.json): nothing is invented."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ctx = _ctx(tmp_path)
    _record_ram(ctx, _binding(), {"ram": _reused(run_dir)})
    assert _entries(ctx) == []
