"""The TUI's disconnect drill (``d``) over the real sshd: the cut is counted in the record.

Before: the drill looked for a ``drop_link`` method that exists nowhere, then aborted the
transport's private connection behind its back, so the record never said a drill happened.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remotemac.tui.screens.run import RunScreen
from remotemac.tui.widgets.connection_badge import ConnectionBadge
from tests.test_tui import (
    SIZE,
    expected_log,
    fast_workload,
    make_app,
    run_screen,
    view_lines,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)


@pytest.mark.asyncio
async def test_tui_drill_cuts_the_link_through_the_transport_and_the_record_counts_it(
    sshd, ssh_env, make_preinstalled_playbook, tmp_path
):
    home, cfg, alias = ssh_env(sshd)
    # remote_root in the sshd session's own HOME: the lab user cannot write the test's tmp
    pb = make_preinstalled_playbook(
        host=alias,
        # 3 s a side: the drill cuts 0.3 s into the target's run, the reconnect takes ~1 s
        workload=fast_workload(200, 3),
        remote_root="~/remotemac",
        environment={"python": "python3", "venv": False},
    )
    app = make_app(home, tmp_path, [pb], ssh_config=str(cfg))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("r")
        await pilot.pause()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, RunScreen), 10, "the run screen")
        screen = run_screen(app)
        badge = screen.query_one("#badge", ConnectionBadge)
        await wait_for(pilot, lambda: len(view_lines(app, "cpu-target")) > 20, 90, "target lines")
        await pilot.press("d")
        await wait_for(
            pilot,
            lambda: "disconnected" in badge.shown or "reconnecting" in badge.shown,
            10,
            "the badge to show the cut",
        )
        await wait_for(pilot, lambda: screen.acceptance is not None, 120, "the record")
        await pilot.pause(0.2)
        assert app.errors == []
        out = Path(screen.live.out_dir)
        record = json.loads((out / "acceptance.json").read_text())
        cont = record["continuity"]
        assert cont["disconnects"] >= 1 and cont["reconnects"] >= 1, cont
        drill = cont["drill"]
        assert drill["by"] == "tui" and drill["cuts"] == 1 and drill["dropped"] == 1, drill
        assert view_lines(app, "cpu-target") == expected_log(200)
        row = next(
            r for r in record["process_behaviour"] if "dropped SSH session" in r.get("question", "")
        )
        assert "from the TUI" in json.dumps(row)
