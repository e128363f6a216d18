"""``run --dry-run`` on a terminal: the plan remotemac.engine.plan computed, as rich text."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from remotemac.units import format_size


def print_plan(plan: dict[str, Any]) -> None:
    c = Console()
    c.print(f"[bold]Plan for {plan['playbook']}[/] on [bold]{plan['host']}[/] (dry run: nothing is touched)")
    c.print("phases: " + " → ".join(plan["phases"]))
    for key, value in plan["remote_paths"].items():
        c.print(f"  {key:8} {value}")
    c.print(f"project: {plan['project']['files']} files, {format_size(plan['project']['bytes'])}")
    data = plan["data"]
    if data["files"]:
        table = Table("dataset file", "size", "why", title=f"dataset slice ({'encrypted' if data['encrypted'] else 'plain'})")
        for f in data["files"]:
            table.add_row(f["path"], format_size(f["size"]), f["reason"])
        c.print(table)
    for role, cmd in plan["commands"].items():
        auto = " (auto: the first of these the host's torch offers)" if "|" in cmd["device"] else ""
        c.print(f"{role}: device {cmd['device']}{auto}, logs/{cmd['label']}.log; on {cmd['host']} "
                f"in tmux {cmd['session']}: [dim]{cmd['command']}[/]", soft_wrap=True)
    c.print(f"bytes to send: {format_size(plan['bytes_to_send'])}")
