"""``remotemac preflight PLAYBOOK``: the CPU trace's MPS prediction, as tables or JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from remotemac.checks.preflight import DEFAULT_SECONDS, LEGEND, PreflightReport, run_preflight
from remotemac.errors import RemotemacError
from remotemac.playbook import load_playbook


def render(report: PreflightReport, console: Any = None) -> None:
    """Print the report as rich tables."""
    console = console or Console()
    version = report.torch_version or "unknown"
    console.print(
        f"[bold]MPS coverage prediction[/bold] for torch {version} "
        f"(a prediction from a CPU trace of {report.elapsed_s:.1f}s, "
        f"stopped: {report.stopped.replace('_', ' ')})"
    )
    if report.interpreter and report.interpreter != sys.executable:
        console.print(f"traced under {report.interpreter}", markup=False, highlight=False)
    if report.processes > 1:  # run.sh's python, DataLoader workers, torchrun's ranks
        console.print(f"operators merged from {report.processes} Python processes")
    others = [e for e in report.executables if e != report.interpreter]
    if others:  # the command named another interpreter than the one preflight chose
        console.print(f"traced Python: {', '.join(report.executables)}", markup=False)
    if report.traced_torch_version and report.traced_torch_version != report.torch_version:
        console.print(f"[yellow]the workload ran torch {report.traced_torch_version}[/yellow]")
    if report.total_ops:
        console.print(
            f"coverage: [bold]{report.coverage_pct:.1f}%[/bold] "
            f"({report.covered_ops} of {report.total_ops} traced operators have an MPS kernel "
            "or are composite)"
        )
    else:  # "100% of 0" would read as a pass
        console.print("coverage: [bold]n/a[/bold] (no torch operator was traced)")
    console.print(
        f"{report.clean_ops} of {report.total_ops} predicted to run on MPS as traced "
        "(kernel and dtypes)"
    )
    if report.queries:  # version/build queries at import: no tensor, nothing for MPS to run
        names = ", ".join(q.op for q in report.queries[:3]) + (
            ", …" if len(report.queries) > 3 else ""
        )
        console.print(
            f"not counted: {len(report.queries)} custom op call(s) without tensors ({names})",
            markup=False,
            highlight=False,
        )
    if report.findings:
        table = Table(title="predicted to fall back or fail on MPS")
        for col in ("operator", "dtypes", "calls", "verdict", "reason"):
            table.add_column(col, overflow="fold")
        for f in report.findings:
            table.add_row(f.op, ", ".join(f.dtypes), str(f.count), f.verdict, f.reason)
        console.print(table)
        console.print(LEGEND, highlight=False)
    if report.float64_sites:
        table = Table(title="float64/complex128 tensors created (MPS rejects them)")
        for col in ("where", "dtype", "made by", "tensors"):
            table.add_column(col)
        for s in report.float64_sites:
            table.add_row(s.site, s.dtype, ", ".join(s.ops), str(s.count))
        console.print(table)
    if report.workload_error:
        console.print(f"[red]the workload failed on the CPU:[/red] {report.workload_error}")
        for line in report.output_tail[-10:]:
            console.print(f"  {line}", markup=False, highlight=False)
    if report.exit_code == 0:
        verdict = "every traced operator is predicted to run on MPS"
    elif report.findings:
        verdict = "some operators are predicted to fall back or fail on MPS"
    else:  # nothing predicted to fail: the trace is cut short by the workload's own error
        verdict = (
            f"incomplete: the workload failed on the CPU after {report.total_ops} traced "
            "operator(s); fix the error above and run preflight again"
        )
    console.print(f"prediction: {verdict}")


def main_preflight(
    playbook_path: Path,
    seconds: float = DEFAULT_SECONDS,
    as_json: bool = False,
    console: Any = None,
) -> int:
    """CLI entry: load the playbook, trace, print; return the exit code."""
    try:
        pb = load_playbook(playbook_path)
        base = Path(pb.base_dir)
        data_dir = base / pb.data.path if pb.data is not None and pb.data.path else None
        report = run_preflight(
            pb.workload.command,
            cwd=(base / pb.project.path).resolve(),
            data_dir=data_dir.resolve() if data_dir is not None else None,
            seconds=seconds,
            env=dict(pb.workload.env),
            environment_python=pb.environment.python,
            # a sweep is traced at its first combination, as the first run of it would start
            matrix={k: v[0] for k, v in (pb.matrix or {}).items()},
        )
    except RemotemacError as err:
        if as_json:
            print(json.dumps({"error": err.line(), "exit_code": err.exit_code}))
        else:
            print(f"remotemac: error: {err.line()}", file=sys.stderr)  # as every error
        return err.exit_code
    if as_json:
        print(json.dumps(report.to_dict(), sort_keys=True))
    else:
        render(report, console)
        if report.error:  # a failed preflight ends as every failure does
            print(f"remotemac: error: {report.error}", file=sys.stderr)
    return report.exit_code
