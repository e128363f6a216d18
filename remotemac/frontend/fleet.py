"""The fleet's terminal front end: live lines per run, the summary table, ``run`` for many.

The engine (remotemac.engine.fleet) plans, runs and records a fleet and emits events;
this module turns those into lines on a terminal (rich) and is what the CLI calls.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from remotemac.engine.session import (
    FLEET_FOLLOW_POLL_S,
    FleetResult,
    FleetRun,
    RunOptions,
    fleet_hosts,
    plan_runs,
    run_fleet,
    variant_label,
)
from remotemac.errors import EXIT_INTERRUPTED
from remotemac.events import ConnectionState, Event, LogLine, PhaseFinished, RunFinished, Warning
from remotemac.journal import new_run_id
from remotemac.playbook import Playbook
from remotemac.settings import LocalSettings


def summary_table(result: FleetResult):
    from remotemac.render import shown

    colours = {"accepted": "green", "rejected": "red", "lost": "magenta", "unreachable": "magenta"}
    table = Table(
        "host",
        "variant",
        "verdict",
        "duration",
        "cost",
        "reason",
        title=f"fleet {result.fleet_id}: exit {result.exit_code}",
    )
    for r in result.runs:
        colour = colours.get(r.verdict, "yellow")
        cost = f"{r.cost:.2f} {r.currency}" if r.cost is not None else "-"
        duration = f"{r.duration_s:.1f}s" if r.duration_s is not None else "-"
        table.add_row(
            shown(r.host),
            shown(variant_label(r.variant) or "-"),
            f"[{colour}]{shown(r.verdict)}[/]",
            duration,
            cost,
            shown(r.reason or ""),
        )
    return table


class FleetRenderer:
    """Many runs at once: one line per finished phase, prefixed with the run's host/variant."""

    def __init__(self, runs: list[FleetRun], verbose: bool = False) -> None:
        self.console = Console(highlight=False)
        self.verbose = verbose
        self.runs = runs

    def __call__(self, event: Event) -> None:
        from remotemac.render import shown
        from remotemac.termsafe import escape_controls

        # host and job text is shown escaped (controls, rich markup), as in RichRenderer
        name = shown(self._name(event.run_id))
        if isinstance(event, PhaseFinished):
            mark = "[dim]↷" if event.skipped else ("[green]✓" if event.ok else "[red]✗")
            self.console.print(
                f"{mark} {name} {shown(event.phase)}[/] [dim]{shown(event.detail)}[/]"
            )
        elif isinstance(event, ConnectionState) and event.state != "connected":
            self.console.print(f"[yellow]⚡ {name}: {shown(event.state)}[/] {shown(event.detail)}")
        elif isinstance(event, Warning):
            self.console.print(f"[yellow]warning:[/] {name}: {shown(event.message)}")
        elif isinstance(event, RunFinished):
            self.console.print(f"[bold]{name}: {shown(event.verdict)}[/] (exit {event.exit_code})")
        elif isinstance(event, LogLine) and self.verbose:
            self.console.print(f"[dim]{name} {shown(event.device)} │[/] ", end="")
            self.console.out(escape_controls(event.line), highlight=False)

    def _name(self, run_id: str) -> str:
        for r in self.runs:
            if r.run_id == run_id:
                return r.label
        return run_id

    def close(self) -> None:
        return None


def main_fleet(
    settings: LocalSettings,
    playbook: Playbook,
    *,
    hosts: list[str] | None,
    inventory_path: str | None,
    forks: int,
    out: str | None,
    as_json: bool,
    keep_data: bool,
) -> int:
    """``remotemac run`` for more than one (host, variant): run, print the summary, exit code."""
    from remotemac.engine.session import load_inventory

    inventory = load_inventory(inventory_path) if inventory_path else None
    targets = fleet_hosts(playbook, hosts, inventory)
    fleet_id = new_run_id(playbook.name)
    out_root = (Path(out) if out else Path.cwd() / "runs" / fleet_id).resolve()
    runs = plan_runs(playbook, targets, inventory, out_root)
    for r in runs:
        r.run_id = f"{fleet_id}-{r.index:02d}"
    if as_json:
        from remotemac.render import JsonRenderer

        sink: Any = JsonRenderer()
    else:
        sink = FleetRenderer(runs, settings.verbose)
        sink.console.print(
            f"fleet {fleet_id}: {len(runs)} runs on {len(set(targets))} hosts "
            f"(forks {forks}) → {out_root}"
        )
    options = RunOptions(keep_data=keep_data, follow_poll_s=FLEET_FOLLOW_POLL_S)
    try:
        result = asyncio.run(
            run_fleet(
                playbook,
                runs,
                journal=settings.journal(),
                home=settings.home,
                out_root=out_root,
                options=options,
                ssh=settings.ssh_options(),
                forks=forks,
                sink=sink,
                fleet_id=fleet_id,
            )
        )
    except KeyboardInterrupt:
        print(
            "\nremotemac: stopped locally; the jobs keep running on their hosts. Resume one "
            "with: remotemac attach <run-id> (see: remotemac status)",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    if as_json:
        print(
            json.dumps(
                {
                    "event": "fleet_finished",
                    "fleet_id": result.fleet_id,
                    "exit_code": result.exit_code,
                    "summary": str(result.summary_path),
                }
            ),
            flush=True,
        )
    else:
        sink.console.print(summary_table(result))
        sink.console.print(f"summary: {result.summary_path}")
    return result.exit_code
