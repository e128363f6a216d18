"""``remotemac preflight``: trace the workload on the local CPU, predict MPS coverage.

The cheapest Mac rental is the one you learn you do not need. The workload's command
runs for a bounded time, whatever its shape (``python train.py``, ``bash run.sh``,
``sh -c "cd src && python train.py"``, ``torchrun …``), and every Python process it
starts that imports torch is traced by ``remotemac/agent/optrace.py``, loaded the way
the run loads its observer (the job's sitecustomize, agent/jobsite.py), so DataLoader
workers and torchrun's ranks count too. Every (operator overload, dtypes) the
processes used is checked against the installed torch's own native_functions.yaml
(``mps_coverage``). The result is a prediction for that torch version, not proof:
some ops take a different path on MPS.

Exit codes follow SPEC: 0 every traced op is predicted to run on MPS, 1 some op
is predicted to fall back or fail (not accepted), 2 bad input (and a command that
started no Python process that imported torch: nothing to predict).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from remotemac.errors import (
    EXIT_ACCEPTED,
    EXIT_BAD_INPUT,
    EXIT_REJECTED,
    BadInput,
    RemotemacError,
)
from remotemac.placeholders import PlaceholderError, expand

DEFAULT_SECONDS = 60.0
# Time for interpreter start, torch import and writing the trace, beyond --seconds.
STARTUP_GRACE_S = 120.0
# After the processes' shared deadline: time to stop on their own, then to write on SIGTERM.
KILL_GRACE_S = 3.0
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
    #: the command's Python processes that imported torch and were traced (merged)
    processes: int = 1
    #: the interpreters those processes ran (a run.sh may name another than ``interpreter``)
    executables: list[str] = field(default_factory=list)
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


def _python_word(argv: list[str]) -> tuple[int, str] | None:
    """(index, word) of the interpreter word of ``[env] [VAR=x] python …``, or None when
    the command starts with something else (``bash run.sh``, ``torchrun``)."""
    i = 1 if argv and argv[0] == "env" else 0
    while i < len(argv) and _ENV_ASSIGN.match(argv[i]):
        i += 1
    if i < len(argv) and _PYTHON.match(os.path.basename(argv[i])):
        return i, argv[i]
    return None


def _local_path(word: str, project: Path) -> Path:
    path = Path(os.path.expanduser(word))
    return path if path.is_absolute() else project / path


def interpreter_for(argv: list[str], project: Path, environment_python: str | None) -> str:
    """The project's own interpreter, as the run would start it.

    A path in the command (``.venv/bin/python train.py``, relative to the project) is
    that interpreter, and must exist. A bare ``python`` is ``environment.python`` when
    that names an interpreter on this machine (a venv, conda env or pyenv version:
    ``.venv/bin/python``, ``~/miniconda3/envs/x/bin/python``), else remotemac's own.
    A command that does not start with python (``bash run.sh``, ``torchrun …``) finds
    ``python`` and ``torchrun`` through PATH, whose first entry is that interpreter's
    directory (see _venv_env).
    """
    found = _python_word(argv)
    word = found[1] if found else "python"
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
    """What an activated venv sets (and the run sets for its venv): VIRTUAL_ENV, PATH.
    The interpreter's directory comes first on PATH in any case, so ``python`` and
    ``torchrun`` inside ``run.sh`` are the ones preflight names."""
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


def python_shims(bin_dir: Path, interpreter: str, argv: list[str]) -> None:
    """``python``, ``python3`` (and the command's own bare python word) in ``bin_dir``,
    each ``exec interpreter "$@"``: a bare python anywhere in the command is the
    project's interpreter, as ``.venv/bin`` first on the run's PATH makes it on the host.
    Scripts, not links: a link to a venv's python would lose its venv."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    found = _python_word(argv)
    names = {"python", "python3"} | ({found[1]} if found and "/" not in found[1] else set())
    for name in names:
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(interpreter)} "$@"\n', encoding="utf-8")
        shim.chmod(0o755)


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
    under the project's own interpreter (see interpreter_for).

    Every Python process the command starts is traced, as the run observes a job: the
    job's sitecustomize (agent/jobsite.py) starts optrace.py in each process that
    imports torch, and the processes' ops are merged (merge_traces)."""
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
        substituted = substitute(command, values, matrix)
        try:
            argv = shlex.split(substituted)
        except ValueError as exc:
            raise BadInput(f"preflight: workload.command does not parse: {exc}") from None
        if not argv:
            raise BadInput("preflight: workload.command is empty")
        interpreter = interpreter_for(argv, cwd, environment_python)
        trace_dir = Path(tmp) / "traces"
        trace_dir.mkdir()
        full_env = dict(os.environ)
        full_env.update(env)
        full_env.update(
            REMOTEMAC_DEVICE="cpu",
            REMOTEMAC_DATA=str(data),
            REMOTEMAC_OUTPUT=str(out_dir),
            CUDA_VISIBLE_DEVICES="",  # the trace must be the CPU's choices, even on a GPU box
        )
        _venv_env(interpreter, full_env)
        python_shims(Path(tmp) / "bin", interpreter, argv)
        full_env["PATH"] = str(Path(tmp) / "bin") + os.pathsep + full_env["PATH"]
        _tracer_env(full_env, trace_dir, Path(tmp) / "site", cwd, seconds)
        # as the run starts a job (agent/runner.py): whatever the command's shape
        cmd = ["/bin/sh", "-c", substituted]
        done = _run_command(cmd, cwd, full_env, seconds, trace_dir, Path(tmp) / "output.log")
        merged = merge_traces(trace_dir, done)
    if merged.get("processes", 0) == 0:
        hidden = re.search(r"\bpython[\d.]*\s+(-\w*[IES]\w*)\b", command)
        raise NoTrace(
            _no_trace_line(merged, done),
            hint=f"`python {hidden.group(1)}` skips the tracer's sitecustomize" if hidden else None,
        )
    if not merged["ops"] and merged["stopped"] != "error":  # torch imported, nothing run
        raise NoTrace(
            f"preflight: the command's {merged['processes']} Python process(es) imported torch "
            f"but ran no torch operator ({merged['stopped'].replace('_', ' ')}); nothing to predict"
        )
    report = predict(merged, table, mps_coverage.torch_version())
    report.interpreter = interpreter
    report.processes = int(merged["processes"])
    report.executables = list(merged.get("executables", []))
    if report.stopped == "error":
        report.output_tail = done.tail
    return report


class NoTrace(RemotemacError):
    """The command ran no Python process that imported torch: nothing to predict.
    Bad input for preflight (exit 2), said in one line, never "100 % of 0"."""

    exit_code = EXIT_BAD_INPUT


@dataclass
class CommandDone:
    """How the command ended: its exit status, whether preflight had to stop it."""

    returncode: int
    stopped_by_preflight: bool
    tail: list[str]


def _no_trace_line(merged: dict[str, Any], done: CommandDone) -> str:
    status = (
        "was stopped at the time limit"
        if done.stopped_by_preflight
        else f"exited with status {done.returncode}"
    )
    last = f": {done.tail[-1]}" if done.tail and done.returncode else ""
    pythons = int(merged.get("pythons", 0))
    if not pythons:
        return (
            f"preflight: the command started no Python process ({status}{last}); nothing to trace"
        )
    return (
        f"preflight: the command's {pythons} Python process(es) never imported torch "
        f"({status}{last}); nothing to trace"
    )


def agent_dir() -> Path:
    """The agent's directory on this machine, found by module name (not imported: its
    files run under the project's interpreter); the checks never import the engine."""
    import importlib.util

    spec = importlib.util.find_spec("remotemac.agent.optrace")
    if spec is None or not spec.origin:
        raise RemotemacError("preflight: the tracer remotemac.agent.optrace is missing")
    return Path(spec.origin).parent


def _tracer_env(
    env: dict[str, str], trace_dir: Path, site_dir: Path, project: Path, seconds: float
) -> None:
    """The run's sitecustomize (agent/jobsite.py), loading optrace.py instead of the
    observer: every Python process of the command that imports torch is traced, each
    process leaves a ``py-<pid>`` mark, torch or not."""
    from remotemac.agent.shared import install_jobsite

    install_jobsite(str(agent_dir()), str(site_dir), str(trace_dir), env, module="optrace")
    env["REMOTEMAC_OBSERVE_MARK"] = "1"
    env["REMOTEMAC_PREFLIGHT_SECONDS"] = repr(float(seconds))
    env["REMOTEMAC_PREFLIGHT_PROJECT"] = str(project)
    # the run's own observer settings must not leak in from a surrounding job
    for var in ("REMOTEMAC_OBSERVE_FALLBACK", "REMOTEMAC_TRACE_STEPS", "REMOTEMAC_TRACE_PATH"):
        env.pop(var, None)


def _read_deadline(trace_dir: Path) -> float | None:
    try:
        return float((trace_dir / "deadline").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _run_command(
    argv: list[str], cwd: Path, env: dict[str, str], seconds: float, trace_dir: Path, log: Path
) -> CommandDone:
    """Run the command in its own process group until it ends or its processes' shared
    deadline (set at the first torch op, see optrace.shared_deadline) is
    KILL_GRACE_S past; then SIGTERM the group (each traced process writes its trace
    and exits), SIGKILL what is left. Processes the command left behind are stopped
    the same way once it ends."""
    started = time.monotonic()
    limit = started + seconds + STARTUP_GRACE_S
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise BadInput(f"preflight: cannot start {argv[0]}: {exc.strerror}") from None
    stopped = False
    while True:
        try:
            code = proc.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            pass
        deadline = _read_deadline(trace_dir)
        if deadline is not None:
            limit = min(limit, time.monotonic() + deadline - time.time() + KILL_GRACE_S)
        if time.monotonic() >= limit:
            stopped = True
            _stop_group(proc.pid)
            code = proc.wait()
            break
    _stop_group(proc.pid)
    with open(log, "rb") as fh:
        text = fh.read()[-65536:].decode("utf-8", errors="replace")
    return CommandDone(code, stopped, list(deque(text.splitlines(), maxlen=20)))


def _stop_group(pgid: int) -> None:
    """SIGTERM the process group, give it a moment to write its traces, SIGKILL the rest."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)


_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b(: .*)?$")


def merge_traces(trace_dir: Path, done: CommandDone) -> dict[str, Any]:
    """One trace from every process's ``trace-<pid>.json``: ops, functions and float64
    sites summed; stopped at the time limit if any process was (or preflight stopped
    the command), an error if the command failed (the first process's exception, else
    the last exception line it printed, else its status)."""
    traces = []
    for path in sorted(trace_dir.glob("trace-*.json")):
        try:
            traces.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # a process killed while writing: its last full trace is gone too
    traces.sort(key=lambda t: float(t.get("started_at", 0.0)))
    pythons = len(list(trace_dir.glob("py-*")))
    merged: dict[str, Any] = {"processes": len(traces), "pythons": pythons}
    ops: dict[tuple[str, tuple[str, ...], tuple[str, ...]], int] = {}
    fns: dict[tuple[str, tuple[str, ...]], int] = {}
    sites: dict[tuple[str, str, str], int] = {}
    for t in traces:
        for r in t.get("ops", []):
            key = (r["op"], tuple(r.get("dtypes", [])), tuple(r.get("out_dtypes", [])))
            ops[key] = ops.get(key, 0) + int(r.get("count", 0))
        for r in t.get("functions", []):
            fkey = (r["name"], tuple(r.get("dtypes", [])))
            fns[fkey] = fns.get(fkey, 0) + int(r.get("count", 0))
        for r in t.get("float64_sites", []):
            skey = (r["site"], r["op"], r["dtype"])
            sites[skey] = sites.get(skey, 0) + int(r.get("count", 0))
    merged["ops"] = [
        {"op": o, "dtypes": list(i), "out_dtypes": list(x), "count": n}
        for (o, i, x), n in sorted(ops.items())
    ]
    merged["functions"] = [
        {"name": f, "dtypes": list(i), "count": n} for (f, i), n in sorted(fns.items())
    ]
    merged["float64_sites"] = [
        {"site": s, "op": o, "dtype": d, "count": n} for (s, o, d), n in sorted(sites.items())
    ]
    merged["executables"] = sorted({str(t["executable"]) for t in traces if t.get("executable")})
    if traces:
        merged["torch_version"] = traces[0].get("torch_version")
        merged["seconds_limit"] = traces[0].get("seconds_limit", 0.0)
        firsts = [float(t["first_op_at"]) for t in traces if t.get("first_op_at")]
        if firsts:  # from the first op (the deadline's start) to the last process's end
            merged["elapsed_s"] = round(
                max(float(t.get("ended_at", 0.0)) for t in traces) - min(firsts), 3
            )
    if done.stopped_by_preflight or any(t.get("stopped") == "time_limit" for t in traces):
        merged["stopped"], merged["error"] = "time_limit", None
    elif done.returncode != 0:
        errors = [t["error"] for t in traces if t.get("error")]
        printed = [line.strip() for line in done.tail if _EXC_LINE.match(line.strip())]
        merged["stopped"] = "error"
        merged["error"] = (errors or printed or [f"workload exited with status {done.returncode}"])[
            0
        ]
    else:
        merged["stopped"], merged["error"] = "completed", None
    return merged


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
    if op.startswith("c10d::"):  # DDP under torchrun: the process group runs these
        return Finding(
            op,
            dtypes,
            count,
            "unknown",
            "a torch.distributed collective: the process group's backend (gloo, nccl) runs "
            "it, not an MPS kernel; cannot predict",
        )
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
