"""``remotemac audit PATH``: the findings remotemac.checks.audit made, as text or JSON."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from remotemac.checks.audit import AuditReport, audit_project
from remotemac.checks.audit_rules import BLOCKER, NEEDS_REFACTOR, NOTE

_STYLE = {BLOCKER: "bold red", NEEDS_REFACTOR: "yellow", NOTE: "dim"}
_VERDICT_STYLE = {
    "keep-linux": "bold red",
    "dual-track": "bold magenta",
    "refactor-for-portability": "bold yellow",
    "portable": "bold green",
}


def _hang(text: str, width: int, indent: str = "  ") -> str:
    """Indented, continuation lines two more spaces, broken between words only."""
    return (
        "\n".join(
            textwrap.wrap(
                text,
                max(20, width - 1),
                initial_indent=indent,
                subsequent_indent=indent + "  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
        or indent + text
    )


def render(report: AuditReport, console: Any) -> None:
    """Findings one block each (where on its own line, so a path is never split), then the
    verdict once, its reasons and the timing; reads the same at 80 columns as at 200."""
    if report.findings:
        console.print(Text(f"CUDA audit of {report.path}", style="bold"))
        for f in report.findings:
            head = Text(f"{f.severity:<15}", style=_STYLE[f.severity])
            head.append(f.where())
            console.print(head)
            for label, value in (("match", f.text), ("why", f.why), ("fix", f.alternative)):
                console.print(Text(_hang(f"{label}: {value}", console.width)))
    else:
        console.print(
            Text(f"No CUDA ties found in the project's own code ({report.path}).", style="green")
        )
    apart = report.apart_counts()
    if apart:
        files = len({f.file for f in report.set_apart})
        console.print(
            Text(
                "Set apart, not in the verdict: "
                + ", ".join(f"{n} in {z}" for z, n in apart.items())
                + f" ({files} file(s); --json lists them, --exclude drops them).",
                style="dim",
            )
        )
    verdict = Text("verdict: ")
    verdict.append(report.verdict, style=_VERDICT_STYLE[report.verdict])
    console.print(verdict)
    for reason in report.reasons:
        console.print(Text(_hang(reason, console.width)))
    if report.unparsed:
        console.print(
            Text(
                f"  {len(report.unparsed)} file(s) did not parse and were "
                f"not checked: {', '.join(report.unparsed[:5])}",
                style="yellow",
            )
        )
    c = report.counts()
    console.print(
        Text(
            _hang(
                f"{c[BLOCKER]} blocker(s), {c[NEEDS_REFACTOR]} needing refactor, "
                f"{c[NOTE]} note(s) in {report.files_scanned} file(s) read "
                f"({report.files_seen} seen) in {report.elapsed_s:.2f}s;",  # one word: never split
                console.width,
                "",
            ),
            style="dim",
        )
    )


def main_audit(
    path: Path, as_json: bool, console: Any = None, exclude: tuple[str, ...] = ()
) -> int:
    """CLI entry for ``remotemac audit PATH [--json] [--exclude GLOB]…``: 0 whenever it ran.

    Findings do not fail the command (the verdict is the answer); a missing path
    raises BadInput (exit code 2).
    """
    report = audit_project(Path(path), exclude)
    if console is None:
        console = Console()
    if as_json:
        console.out(json.dumps(report.to_dict()), highlight=False)
    else:
        render(report, console)
    return 0
