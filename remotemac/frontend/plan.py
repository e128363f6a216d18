"""``run --dry-run`` on a terminal: the plan remotemac.engine.plan computed, as rich text.

Host- and playbook-supplied text is shown escaped (:func:`remotemac.render.shown`): a
command or a path cannot drive the terminal or break the markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from remotemac.units import format_size

#: the human plan shows this much of a command; ``--json`` has all of it (rich wraps a
#: 300 KB line for minutes)
SHOWN_COMMAND = 400


def _short(text: str) -> str:
    from remotemac.render import shown

    if len(text) <= SHOWN_COMMAND:
        return shown(text)
    return shown(text[:SHOWN_COMMAND]) + f"… ({len(text)} characters; --json shows all)"


def command_lines(command: str, width: int) -> list[str]:
    """``$ command`` in lines of at most ``width`` (a word longer than that stays whole)."""
    import textwrap

    return textwrap.wrap(
        "$ " + command,
        max(40, width - 1),
        initial_indent="  ",
        subsequent_indent="      ",
        break_long_words=False,
        break_on_hyphens=False,
    )


def print_plan(plan: dict[str, Any], console: Any = None) -> None:
    from remotemac.render import shown

    c = console or Console()
    c.print(
        f"[bold]Plan for {shown(plan['playbook'])}[/] on [bold]{shown(plan['host'])}[/] "
        "(dry run: nothing is touched)"
    )
    c.print("phases: " + " → ".join(shown(p) for p in plan["phases"]))
    for key, value in plan["remote_paths"].items():
        c.print(f"  {key:8} {shown(value)}")
    if plan.get("python"):
        py = plan["python"]
        c.print(f"python: {shown(py['request'])} ({py['kind']}: {shown(py['note'])})")
        for line in py["pins"]:
            c.print(f"  {shown(line)}")
    project = plan["project"]
    c.print(f"project: {project['files']} files, {format_size(project['bytes'])}")
    for group in project.get("left_out", []):
        examples = ", ".join(shown(e) for e in group["examples"])
        more = " …" if group["files"] > len(group["examples"]) else ""
        c.print(
            f"  left out of the project upload: {group['files']} files {shown(group['why'])}"
            f" [dim]({examples}{more})[/]"
        )
    data = plan["data"]
    if data["files"]:
        table = Table(
            "dataset file",
            "size",
            "why",
            title=f"dataset slice ({'encrypted' if data['encrypted'] else 'plain'})",
        )
        for f in data["files"]:
            table.add_row(shown(f["path"]), format_size(f["size"]), shown(f["reason"]))
        c.print(table)
    print_left_out(c, data.get("skipped") or [])
    for role, cmd in plan["commands"].items():
        auto = " (auto: the first the host's torch offers)" if "|" in cmd["device"] else ""
        c.print(f"{role}: device {cmd['device']}{auto}, logs/{cmd['label']}.log", soft_wrap=True)
        c.print(f"  on {shown(cmd['host'])} in tmux {shown(cmd['session'])}", soft_wrap=True)
        # the command wrapped between words at the terminal's width, continuation
        # lines indented: a path or a --flag=value is never split (--json: one line)
        for line in command_lines(_short(cmd["command"]), c.width):
            c.print(Text(line, style="dim"), soft_wrap=True)
    c.print(f"bytes to send: {format_size(plan['bytes_to_send'])}")
    cost = plan.get("cost")
    if cost and cost["hourly_rate"] > 0:
        jobs = f"{cost['jobs']} job{'s' if cost['jobs'] != 1 else ''}"
        c.print(
            f"cost: at most {cost['max_amount']:.2f} {shown(cost['currency'])} "
            f"({jobs} up to workload.timeout, {cost['max_hours']:g} h × "
            f"{cost['hourly_rate']:g}/h)"
        )


#: the human plan names this many left-out dataset files per reason; ``--json`` has all
SHOWN_LEFT_OUT = 5


def print_left_out(c: Any, skipped: list[dict[str, str]]) -> None:
    """The dataset files the slice leaves out, by reason (over max_bytes, a FIFO, a link
    out of the data dir, not sampled, no include matched), so the user sees before
    renting what the job will not have."""
    from remotemac.render import shown

    if not skipped:
        return
    by_reason: dict[str, list[str]] = {}
    for item in skipped:
        reason = str(item.get("reason", "")).removeprefix("skipped: ")
        by_reason.setdefault(reason, []).append(str(item["path"]))
    c.print(f"left out of the dataset slice: {len(skipped)} file{'s' if len(skipped) != 1 else ''}")
    for reason, paths in by_reason.items():
        names = ", ".join(shown(p) for p in paths[:SHOWN_LEFT_OUT])
        more = f" … and {len(paths) - SHOWN_LEFT_OUT} more" if len(paths) > SHOWN_LEFT_OUT else ""
        count = f"{len(paths)} file{'s' if len(paths) != 1 else ''}"
        c.print(f"  {shown(reason)}: {count} ({names}{more})", soft_wrap=True)


def print_fleet_plan(fleet: dict[str, Any]) -> None:
    from remotemac.render import shown

    c = Console()
    c.print(
        f"[bold]Fleet plan for {shown(fleet['playbook'])}[/]: {len(fleet['runs'])} runs "
        "(dry run: nothing is touched)"
    )
    for i, run in enumerate(fleet["runs"]):
        label = shown(run["host"]) + (f" \\[{shown(run['variant'])}]" if run["variant"] else "")
        c.rule(f"run {i}: {label}")
        print_plan(run["plan"], c)
