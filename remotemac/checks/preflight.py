"""``remotemac preflight``: trace the workload on the local CPU, predict MPS coverage.

The cheapest Mac rental is the one you learn you do not need. The workload runs
for a bounded time in a subprocess under ``remotemac/agent/optrace.py`` (the same
tracer that can run on the Mac), and every (operator overload, dtypes) it used is
checked against the installed torch's own native_functions.yaml
(``mps_coverage``). The result is a prediction for that torch version, not proof:
some ops take a different path on MPS.

Exit codes follow SPEC: 0 every traced op is predicted to run on MPS, 1 some op
is predicted to fall back or fail (not accepted), 2 bad input.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from remotemac.errors import EXIT_ACCEPTED, EXIT_REJECTED, BadInput, RemotemacError
from remotemac.placeholders import PlaceholderError, expand

DEFAULT_SECONDS = 60.0
# Time for interpreter start, torch import and writing the trace, beyond --seconds.
STARTUP_GRACE_S = 120.0
BLOCKING = ("fail", "fallback", "unknown")
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_FLAGS = {"-u", "-B", "-O", "-OO", "-s", "-S", "-E", "-I", "-q", "-b", "-bb", "-d", "-v"}
_FLAGS_WITH_ARG = {"-W", "-X"}
LEGEND = (
    "fail: NotImplementedError or TypeError on MPS (ops without a kernel run on the CPU "
    "when PYTORCH_ENABLE_MPS_FALLBACK=1); fallback: MPS always runs it on the CPU; "
    "unknown: not predictable; caveat: fails for some arguments"
)


@dataclass
class Finding:
    """One op predicted not to run cleanly on MPS."""

    op: str
    dtypes: list[str]
    count: int
    verdict: str  # fail | fallback | unknown | caveat
    reason: str


@dataclass
class TracedOp:
    """Every traced overload with the support the yaml predicts (for --json readers)."""

    op: str
    dtypes: list[str]
    count: int
    support: str  # mps | composite | mapped | agnostic | fallback | missing | unknown
    via: str | None = None


@dataclass
class Float64Site:
    site: str
    dtype: str
    ops: list[str]
    count: int


@dataclass
class PreflightReport:
    torch_version: str | None
    traced_torch_version: str | None
    seconds_limit: float
    elapsed_s: float
    stopped: str  # completed | time_limit | error
    workload_error: str | None
    total_ops: int
    covered_ops: int
    clean_ops: int
    findings: list[Finding] = field(default_factory=list)
    float64_sites: list[Float64Site] = field(default_factory=list)
    output_tail: list[str] = field(default_factory=list)
    ops: list[TracedOp] = field(default_factory=list)
    #: custom ops that take and return no tensor (``torchvision::_cuda_version`` at import):
    #: version and build queries, not work a backend runs, so not coverage findings
    queries: list[TracedOp] = field(default_factory=list)
    interpreter: str | None = None
    kind: str = "prediction"

    @property
    def coverage_pct(self) -> float | None:
        """None when nothing was traced: "100% of 0" would read as a pass."""
        if not self.total_ops:
            return None
        return round(100.0 * self.covered_ops / self.total_ops, 1)

    @property
    def error(self) -> str | None:
        """The failed preflight's one line: the workload died before any torch operator
        (an import error, a missing file), so there is no prediction at all."""
        if self.stopped != "error" or self.total_ops:
            return None
        line = (
            "preflight: the workload failed before any torch operator ran: "
            f"{self.workload_error or 'no error line'}"
        )
        if self.workload_error and "ModuleNotFoundError" in self.workload_error:
            line += (
                f" (traced under {self.interpreter or 'unknown'}; name the project's venv in "
                "workload.command or environment.python)"
            )
        return line

    @property
    def exit_code(self) -> int:
        """1 when any op is predicted to fail or fall back, or the workload failed."""
        if self.workload_error or any(f.verdict in BLOCKING for f in self.findings):
            return EXIT_REJECTED
        return EXIT_ACCEPTED

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["coverage_pct"] = self.coverage_pct
        data["error"] = self.error
        data["exit_code"] = self.exit_code
        return data


def python_target(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Split ``[VAR=x] python [opts] script.py args`` into (tracer target, env).

    The target is what follows ``--`` on the tracer's command line: ``script.py
    args`` or ``-m module args``. Anything that is not a Python command is BadInput.
    """
    env: dict[str, str] = {}
    rest = list(argv)
    if rest and rest[0] == "env":
        rest.pop(0)
    while rest and _ENV_ASSIGN.match(rest[0]):
        key, _, value = rest.pop(0).partition("=")
        env[key] = value
    if not rest or not _PYTHON.match(os.path.basename(rest[0])):
        first = rest[0] if rest else ""
        raise BadInput(
            f"preflight: can only trace Python commands, workload.command starts with {first!r}",
            hint="write it as `python script.py …` or `python -m module …`",
        )
    rest.pop(0)
    while rest:
        arg = rest[0]
        if arg in _FLAGS:
            rest.pop(0)
        elif arg in _FLAGS_WITH_ARG:
            del rest[:2]
        elif arg[:2] in _FLAGS_WITH_ARG:
            rest.pop(0)
        elif arg == "-m" and len(rest) >= 2:
            return rest, env
        elif arg.startswith("-m") and len(arg) > 2:
            return ["-m", arg[2:]] + rest[1:], env
        elif arg.startswith("-"):
            raise BadInput(
                f"preflight: cannot trace `python {arg} …` in workload.command",
                hint="preflight runs `python script.py …` or `python -m module …`",
            )
        else:
            return rest, env
    raise BadInput("preflight: workload.command runs python without a script or -m module")


def _python_word(argv: list[str]) -> str:
    """The interpreter word of ``[env] [VAR=x] python …`` (python_target checked the shape)."""
    rest = argv[1:] if argv and argv[0] == "env" else argv
    return next((a for a in rest if not _ENV_ASSIGN.match(a)), "python")


def _local_path(word: str, project: Path) -> Path:
    path = Path(os.path.expanduser(word))
    return path if path.is_absolute() else project / path


def interpreter_for(argv: list[str], project: Path, environment_python: str | None) -> str:
    """The project's own interpreter, as the run would start it.

    A path in the command (``.venv/bin/python train.py``, relative to the project) is
    that interpreter, and must exist. A bare ``python`` is ``environment.python`` when
    that names an interpreter on this machine (a venv, conda env or pyenv version:
    ``.venv/bin/python``, ``~/miniconda3/envs/x/bin/python``), else remotemac's own.
    """
    word = _python_word(argv)
    if "/" in word or word.startswith("~"):
        path = _local_path(word, project)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BadInput(
                f"preflight: the command's interpreter {word} does not exist (looked for {path})",
                hint="create the project's venv here, or write the command with `python`",
            )
        return str(path)
    if environment_python and ("/" in environment_python or environment_python[:1] == "~"):
        path = _local_path(environment_python, project)
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return sys.executable


def _venv_env(interpreter: str, env: dict[str, str]) -> None:
    """What an activated venv sets (and the run sets for its venv): VIRTUAL_ENV, PATH."""
    bin_dir = os.path.dirname(interpreter)
    if interpreter != sys.executable and os.path.isfile(
        os.path.join(os.path.dirname(bin_dir), "pyvenv.cfg")
    ):
        env["VIRTUAL_ENV"] = os.path.dirname(bin_dir)
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")


def substitute(
    command: str, values: dict[str, str], matrix: dict[str, object] | None = None
) -> str:
    """Fill the placeholders as ``run`` does (remotemac/placeholders.py), shell-quoted."""
    try:
        return expand(command, values, matrix)
    except PlaceholderError as exc:
        raise BadInput(f"preflight: workload.command: {exc}") from None


def run_preflight(
    command: str,
    cwd: Path,
    data_dir: Path | None,
    seconds: float,
    env: dict[str, str],
    environment_python: str | None = None,
    matrix: dict[str, object] | None = None,
) -> PreflightReport:
    """Trace ``command`` on the local CPU for ``seconds`` and predict MPS coverage,
    under the project's own interpreter (see interpreter_for)."""
    from remotemac.checks import mps_coverage

    if seconds <= 0:
        raise BadInput(f"preflight: --seconds must be positive, got {seconds}")
    cwd = Path(cwd)
    if not cwd.is_dir():
        raise BadInput(f"preflight: project directory {cwd} does not exist")
    table = mps_coverage.load_table()
    with tempfile.TemporaryDirectory(prefix="remotemac-preflight-") as tmp:
        out_dir = Path(tmp) / "output"
        data = Path(data_dir) if data_dir is not None else Path(tmp) / "data"
        out_dir.mkdir()
        if data_dir is None:
            data.mkdir()  # no data in the playbook: an empty directory keeps {data_dir} valid
        values = {"device": "cpu", "data_dir": str(data), "output_dir": str(out_dir)}
        try:
            argv = shlex.split(substitute(command, values, matrix))
        except ValueError as exc:
            raise BadInput(f"preflight: workload.command does not parse: {exc}") from None
        target, cmd_env = python_target(argv)
        interpreter = interpreter_for(argv, cwd, environment_python)
        trace_path = Path(tmp) / "trace.json"
        full_env = dict(os.environ)
        full_env.update(env)
        full_env.update(cmd_env)
        full_env.update(
            REMOTEMAC_DEVICE="cpu",
            REMOTEMAC_DATA=str(data),
            REMOTEMAC_OUTPUT=str(out_dir),
            CUDA_VISIBLE_DEVICES="",  # the trace must be the CPU's choices, even on a GPU box
        )
        _venv_env(interpreter, full_env)
        tail = _run_tracer(interpreter, target, trace_path, cwd, seconds, full_env)
        try:
            trace = json.loads(trace_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            last = tail[-1] if tail else "no output"
            raise RemotemacError(f"preflight: the tracer wrote no trace ({last})") from None
    report = predict(trace, table, mps_coverage.torch_version())
    report.interpreter = interpreter
    if report.stopped == "error":
        report.output_tail = tail
    return report


def tracer_file() -> Path:
    """optrace.py's file on this machine, found by its module name (not imported: it
    is run by path under the project's interpreter); the checks never import the engine."""
    import importlib.util

    spec = importlib.util.find_spec("remotemac.agent.optrace")
    if spec is None or not spec.origin:
        raise RemotemacError("preflight: the tracer remotemac.agent.optrace is missing")
    return Path(spec.origin)


def _run_tracer(
    interpreter: str,
    target: list[str],
    trace_path: Path,
    cwd: Path,
    seconds: float,
    env: dict[str, str],
) -> list[str]:
    """Run the tracer subprocess under ``interpreter``; return the last lines it printed.

    optrace.py is standard library only (Python 3.9+), the file the agent ships to the
    Mac, so any project interpreter runs it by path; its own frames are skipped by file.
    """
    tracer = tracer_file()
    cmd = [interpreter, str(tracer), "--seconds", str(seconds), "--out", str(trace_path)]
    cmd += ["--", *target]
    try:
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=seconds + STARTUP_GRACE_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RemotemacError(
            f"preflight: the workload did not stop {seconds + STARTUP_GRACE_S:.0f}s after start",
            hint="it may block outside Python; try a smaller --seconds or check the command",
        ) from None
    text = proc.stdout.decode("utf-8", errors="replace")
    return list(deque(text.splitlines(), maxlen=20))


def predict(trace: dict[str, Any], table: Any, torch_version: str | None) -> PreflightReport:
    """Turn a tracer JSON into the report (pure: no process, no torch)."""
    from remotemac.checks.mps_coverage import ALWAYS_FALLBACK, FALLBACK_CHILDREN

    functions_seen = {f["name"].rpartition("::")[2] for f in trace.get("functions", [])}
    by_op: dict[str, list[dict[str, Any]]] = {}
    for rec in trace.get("ops", []):
        by_op.setdefault(rec["op"], []).append(rec)

    findings: list[Finding] = []
    traced: list[TracedOp] = []
    queries: list[TracedOp] = []
    covered = 0
    for op, recs in sorted(by_op.items()):
        dtypes = sorted({d for r in recs for d in r.get("dtypes", []) + r.get("out_dtypes", [])})
        count = sum(r.get("count", 0) for r in recs)
        if not dtypes and not op.startswith("aten::"):
            queries.append(TracedOp(op, [], count, "query"))
            continue
        support = table.support(op)
        traced.append(TracedOp(op, dtypes, count, support.kind, support.via))
        if support.covered:
            covered += 1
        else:
            findings.append(_support_finding(op, dtypes, count, support, functions_seen))
        findings += _dtype_findings(op, recs)

    flagged = {f.op.rpartition("::")[2] for f in findings}
    for fn in sorted(functions_seen & ALWAYS_FALLBACK):
        if not any(FALLBACK_CHILDREN.get(child) == fn for child in flagged):
            findings.append(
                Finding(
                    f"aten::{fn}",
                    [],
                    _fn_count(trace, fn),
                    "fallback",
                    "always-fallback list: runs on the CPU",
                )
            )
    return PreflightReport(
        torch_version=torch_version,
        traced_torch_version=trace.get("torch_version"),
        seconds_limit=float(trace.get("seconds_limit", 0.0)),
        elapsed_s=float(trace.get("elapsed_s", 0.0)),
        stopped=trace.get("stopped", "error"),
        workload_error=trace.get("error"),
        total_ops=len(traced),
        covered_ops=covered,
        clean_ops=len(traced)
        - len({f.op for f in findings if f.verdict in BLOCKING} & {t.op for t in traced}),
        findings=findings,
        float64_sites=_float64_sites(trace),
        ops=traced,
        queries=queries,
    )


def _support_finding(
    op: str, dtypes: list[str], count: int, support: Any, functions_seen: set[str]
) -> Finding:
    """Why an op the MPS table does not cover is flagged (fallback, no kernel, unknown)."""
    from remotemac.checks.mps_coverage import FALLBACK_CHILDREN

    name = op.rpartition("::")[2]
    if name in FALLBACK_CHILDREN and FALLBACK_CHILDREN[name] in functions_seen:
        parent = FALLBACK_CHILDREN[name]
        return Finding(
            op, dtypes, count, "fallback", f"always-fallback list: {parent} runs on the CPU"
        )
    if support.kind == "fallback":
        return Finding(op, dtypes, count, "fallback", "always-fallback list: runs on the CPU")
    if support.kind == "missing":
        where = f" (nor for its MPS counterpart {support.via})" if support.via else ""
        return Finding(op, dtypes, count, "fail", f"no MPS kernel{where}")
    return Finding(op, dtypes, count, "unknown", "not in native_functions.yaml: cannot predict")


def _dtype_findings(op: str, recs: list[dict[str, Any]]) -> list[Finding]:
    """The op's dtype problems on MPS, one finding per (verdict, reason)."""
    from remotemac.checks.mps_coverage import dtype_issues

    issues: dict[tuple[str, str], tuple[set[str], int]] = {}
    for rec in recs:
        rec_dtypes = rec.get("dtypes", []) + rec.get("out_dtypes", [])
        for issue in dtype_issues(op, rec_dtypes):
            seen, n = issues.get((issue.verdict, issue.reason), (set(), 0))
            issues[(issue.verdict, issue.reason)] = (seen | set(rec_dtypes), n + rec["count"])
    return [
        Finding(op, sorted(seen), n, verdict, reason)
        for (verdict, reason), (seen, n) in issues.items()
    ]


def _fn_count(trace: dict[str, Any], name: str) -> int:
    return sum(f["count"] for f in trace.get("functions", []) if f["name"] == name)


def _float64_sites(trace: dict[str, Any]) -> list[Float64Site]:
    """Group creation records by site: the dispatch op and the user's call together."""
    sites: dict[tuple[str, str], Float64Site] = {}
    for rec in trace.get("float64_sites", []):
        key = (rec["site"], rec["dtype"])
        site = sites.setdefault(key, Float64Site(rec["site"], rec["dtype"], [], 0))
        if rec["op"] not in site.ops:
            site.ops.append(rec["op"])
        if rec["op"].startswith("aten::"):
            site.count += rec["count"]  # the torch.* twin of the same call is not a new tensor
    for site in sites.values():
        site.count = site.count or 1
    return sorted(sites.values(), key=lambda s: _site_order(s.site))


def _site_order(site: str) -> tuple[str, int]:
    path, _, line = site.rpartition(":")
    return (path, int(line)) if line.isdigit() else (site, 0)
