"""``remotemac doctor HOST``: the report remotemac.checks.doctor judged, as a table or JSON."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from remotemac.checks.doctor import FAIL, NOT_APPLICABLE, OK, WARN, DoctorReport
from remotemac.engine.session import doctor
from remotemac.transport.base import Transport

_STYLES = {OK: "green", WARN: "yellow", FAIL: "bold red", NOT_APPLICABLE: "dim"}


def render(report: DoctorReport, console: Any = None) -> None:
    """The human table."""
    console = console or Console()
    verdict = "[green]fit[/]" if report.fit else "[bold red]not fit[/]"
    table = Table(title=f"remotemac doctor {report.host}: {verdict}", title_justify="left")
    table.add_column("check")
    table.add_column("status")
    table.add_column("value", overflow="fold")
    table.add_column("why / fix", overflow="fold")
    from remotemac.render import shown

    for c in report.checks:  # values and notes quote the host: shown, never obeyed
        notes = shown(c.why) + (f"\nfix: {shown(c.fix)}" if c.fix else "")
        table.add_row(c.name, f"[{_STYLES[c.status]}]{c.status}[/]", shown(c.value), notes)
    console.print(table)


def emit(report: DoctorReport, as_json: bool, console: Any = None) -> int:
    """Print the report (table or one JSON object); exit 0 only if fit, else 1."""
    if as_json:
        text = json.dumps(report.to_dict(), sort_keys=True, default=str)
        if console is not None:
            console.out(text, highlight=False)
        else:
            sys.stdout.write(text + "\n")
    else:
        render(report, console)
    return 0 if report.fit else 1


def main_doctor(
    host: str,
    as_json: bool,
    transport: Transport,
    console: Any = None,
    *,
    remote_root: str = "~/remotemac",
    needs_disk_bytes: int | None = None,
    workload: Any = None,
) -> int:
    """``remotemac doctor HOST [--json]``: connects, gathers, judges, prints, closes."""

    async def _run() -> DoctorReport:
        async with transport:
            return await doctor(transport, host, remote_root, needs_disk_bytes, workload=workload)

    return emit(asyncio.run(_run()), as_json, console)
