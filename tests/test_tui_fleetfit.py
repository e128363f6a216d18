"""The fleet table fitted to the terminal as the runs table is (issue 30).

At 80 columns a fleet of long host names and long matrix variants pushed the
verdict past the screen's edge: the table kept every column at its full width.
The fleet table now drops columns by priority (reason, cost, duration, variant)
and never cuts a host or a verdict; what it hides is said under the title.
"""

from __future__ import annotations

import pytest

from remotemac.tui.screens.fleet import FleetScreen
from tests import tuiscene
from tests.test_tui import screen_text, wait_for

pytestmark = pytest.mark.timeout(120)

FLEET = "sweep-20251229-100000-9f9f"
HOSTS = (
    ("mac-m2-ultra-rental-eu-west-01.example.net", "accepted"),
    ("mac-m4-pro-rental-us-east-02.example.net", "rejected"),
    ("mac-m1-max-rental-ap-south-03.example.net", "accepted"),
)
VARIANT = {"batch": 64, "dtype": "float16", "lr": 0.001, "model": "resnet50"}


def long_fleet() -> tuiscene.FakeJournal:
    rows = [
        tuiscene.row(
            f"{FLEET}-{i:02d}",
            host,
            "finished",
            verdict,
            86400 - 60 * i,
            name="sweep",
            options={"fleet": FLEET, "variant": {**VARIANT, "seed": i}},
        )
        for i, (host, verdict) in enumerate(HOSTS)
    ]
    return tuiscene.FakeJournal(rows, {})


def screen_lines(app) -> list[str]:
    return screen_text(app).splitlines()


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
async def test_fleet_table_keeps_hosts_and_verdicts_whole(tmp_path, size):
    app = tuiscene.app(tmp_path, long_fleet())
    async with app.run_test(size=size) as pilot:
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, FleetScreen), 10, "the fleet")
        await wait_for(pilot, lambda: HOSTS[0][0] in screen_text(app), 10, "the fleet's rows")
        await pilot.pause()
        lines = screen_lines(app)
        for host, verdict in HOSTS:
            row = [line for line in lines if host in line]
            assert row, (host, "\n".join(lines))
            assert verdict in row[0], (host, verdict, row[0])  # whole, on the host's row
        if size[0] >= 120:  # comfortable: the variant has room
            assert "model=resnet50" in screen_text(app)
        else:
            assert "hidden at this width" in screen_text(app)
