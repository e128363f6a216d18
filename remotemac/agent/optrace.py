"""Trace which PyTorch operators (and dtypes) a workload uses, for a bounded time.

Runs a Python workload script (or ``-m module``) in this process via ``runpy``
under two recorders:

* a ``TorchDispatchMode`` below autograd, so composite ops arrive decomposed into
  the kernels a backend must actually provide (``aten::add.Tensor`` ...), the same
  names MPS's fallback messages use;
* a ``TorchFunctionMode`` one level up, which sees what the user called (for
  example ``scaled_dot_product_attention`` or ``linalg_svd``) before a CPU-only
  implementation was chosen.

It also notes where float64/complex128 tensors were created (file:line of the
first frame outside torch), since MPS rejects those outright.

After ``--seconds`` the workload is stopped (checked in the dispatch hook, with a
SIGALRM backstop for loops that do not touch torch) and the trace is written as
JSON. Shipped to the machine that runs the workload: standard library only, torch
imported lazily, Python 3.9 compatible.

Usage: ``python optrace.py --seconds N --out trace.json -- script.py args...``
or ``python optrace.py --seconds N --out trace.json -- -m package.module args...``
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import platform
import runpy
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the annotations only: this file also runs on its own
    from .protocol import JsonObject

TRACE_SCHEMA = 1
FLOAT64_DTYPES = ("float64", "complex128")
MAX_SITES = 200
_THIS_FILE = os.path.abspath(__file__)


class _TimeUp(BaseException):
    """Raised inside the workload when the time budget is spent.

    A BaseException so that the workload's own ``except Exception`` does not
    swallow it.
    """


def _dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _tensors(obj: Any, torch: Any, out: list[Any], depth: int = 0) -> list[Any]:
    """Collect the tensors in nested args (lists, tuples, dicts) without pytree."""
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif depth < 4 and isinstance(obj, (list, tuple)):
        for item in obj:
            _tensors(item, torch, out, depth + 1)
    elif depth < 4 and isinstance(obj, dict):
        for item in obj.values():
            _tensors(item, torch, out, depth + 1)
    return out


def _dtypes(obj: Any, torch: Any) -> tuple[str, ...]:
    return tuple(sorted({_dtype_name(t.dtype) for t in _tensors(obj, torch, [])}))


class Recorder:
    """Counts (op, input dtypes, output dtypes) and float64 creation sites.

    ``check_time`` runs after every dispatched op; past the deadline it calls
    ``on_time_up`` (raise _TimeUp by default: ``run`` catches it around the workload).
    """

    def __init__(self, seconds: float, project_dirs: tuple[str, ...]) -> None:
        self.deadline = time.monotonic() + seconds
        self.started = time.monotonic()
        self.project_dirs = tuple(os.path.abspath(d) for d in project_dirs)
        self.ops: dict[tuple[str, tuple[str, ...], tuple[str, ...]], int] = {}
        self.functions: dict[tuple[str, tuple[str, ...]], int] = {}
        self.sites: dict[tuple[str, str, str], int] = {}
        self.time_up = False
        self.skip_dirs: tuple[str, ...] = ()
        self.on_time_up: Any = None
        self.on_op: Any = None

    def check_time(self) -> None:
        if time.monotonic() >= self.deadline and not self.time_up:
            self.time_up = True
            if self.on_time_up is not None:
                self.on_time_up()
            raise _TimeUp()
        if self.on_op is not None:
            self.on_op()

    def reset(self) -> None:
        """Forget what was recorded (a forked child starts with its own counts)."""
        self.ops.clear()
        self.functions.clear()
        self.sites.clear()

    def records(self) -> JsonObject:
        """The trace's ops, functions and float64 sites as JSON lists (copies first: a
        process's deadline timer writes while its main thread may still be recording)."""
        ops, functions, sites = dict(self.ops), dict(self.functions), dict(self.sites)
        return {
            "ops": [
                {"op": op, "dtypes": list(ins), "out_dtypes": list(outs), "count": n}
                for (op, ins, outs), n in sorted(ops.items())
            ],
            "functions": [
                {"name": fn, "dtypes": list(ins), "count": n}
                for (fn, ins), n in sorted(functions.items())
            ],
            "float64_sites": [
                {"site": site, "op": op, "dtype": dt, "count": n}
                for (site, op, dt), n in sorted(sites.items())
            ],
        }

    def site(self) -> str:
        """file:line of the innermost frame outside torch and this tracer.

        Frames inside the project directory win over other third-party code, so a
        float64 made by a helper library still points at the user's call.
        """
        frame = sys._getframe(2)
        fallback = ""
        while frame is not None:
            raw = frame.f_code.co_filename
            name = os.path.abspath(raw)
            if raw.startswith("<") or name == _THIS_FILE or name.startswith(self.skip_dirs):
                frame = frame.f_back
                continue
            for root in self.project_dirs:
                if name.startswith(root + os.sep):
                    return f"{os.path.relpath(name, root)}:{frame.f_lineno}"
            fallback = fallback or f"{name}:{frame.f_lineno}"
            frame = frame.f_back
        return fallback or "unknown"

    def note_float64(self, op: str, ins: tuple[str, ...], outs: tuple[str, ...]) -> None:
        """Record a creation site when a float64/complex128 tensor appears from none."""
        made = [d for d in outs if d in FLOAT64_DTYPES and d not in ins]
        if not made:
            return
        key = (self.site(), op, made[0])
        if key in self.sites or len(self.sites) < MAX_SITES:
            self.sites[key] = self.sites.get(key, 0) + 1


def _make_modes(rec: Recorder, torch: Any) -> tuple[Any, Any]:
    """Build the dispatch-level and function-level modes bound to ``rec``."""
    from torch.overrides import TorchFunctionMode  # agent-imports: lazy (workload's torch)
    from torch.utils._python_dispatch import TorchDispatchMode  # agent-imports: lazy

    class OpRecorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            try:
                name = func.name()
                ins = _dtypes((args, kwargs), torch)
                outs = _dtypes(result, torch)
                key = (name, ins, outs)
                rec.ops[key] = rec.ops.get(key, 0) + 1
                rec.note_float64(name, ins, outs)
            except Exception:  # a recorder bug must never break the workload
                pass
            rec.check_time()  # after recording: the op that crossed the deadline counts
            return result

    class FnRecorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            try:
                if hasattr(func, "name") and hasattr(func, "overloadpacket"):
                    name = func.name()
                else:
                    name = getattr(func, "__name__", "") or repr(func)
                ins = _dtypes((args, kwargs), torch)
                outs = _dtypes(result, torch)
                key = (name, ins)
                rec.functions[key] = rec.functions.get(key, 0) + 1
                rec.note_float64("torch." + name, ins, outs)
            except Exception:
                pass
            return result

    return FnRecorder(), OpRecorder()


def _target(argv: list[str]) -> tuple[str, str, list[str]]:
    """(kind, name, argv) from ``script.py args`` or ``-m module args``."""
    if not argv:
        raise SystemExit("optrace: nothing to run (give a script or -m module after --)")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("optrace: -m needs a module name")
        return "module", argv[1], [argv[1]] + argv[2:]
    return "script", argv[0], argv


def run(seconds: float, out_path: str, argv: list[str], cwd: str | None = None) -> JsonObject:
    """Run the workload under the recorders and write the trace; return it."""
    kind, name, script_argv = _target(argv)
    cwd = os.path.abspath(cwd or os.getcwd())
    trace: JsonObject = {
        "schema": TRACE_SCHEMA,
        "python": platform.python_version(),
        "target": {"kind": kind, "name": name, "argv": script_argv[1:]},
        "seconds_limit": seconds,
    }
    try:
        import torch  # agent-imports: lazy (the traced script's torch)
    except ImportError as exc:
        trace.update(stopped="error", error=f"torch is not importable: {exc}", elapsed_s=0.0)
        _write(out_path, trace)
        return trace

    script_dir = os.path.dirname(os.path.abspath(name)) if kind == "script" else cwd
    rec = Recorder(seconds, (cwd, script_dir))
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    rec.skip_dirs = (torch_dir, os.path.abspath(runpy.__file__))
    fn_mode, op_mode = _make_modes(rec, torch)
    trace["torch_version"] = str(torch.__version__)

    old_argv = sys.argv
    sys.argv = script_argv
    # What ``python script.py`` / ``python -m mod`` would put first on sys.path.
    path0 = script_dir
    sys.path.insert(0, path0)
    stopped, error = "completed", None
    alarm = _arm_alarm(rec, seconds)
    try:
        with fn_mode, op_mode:
            if kind == "script":
                runpy.run_path(name, run_name="__main__")
            else:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
    except _TimeUp:
        stopped = "time_limit"
    except SystemExit as exc:
        if exc.code not in (None, 0):
            stopped, error = "error", f"workload exited with status {exc.code}"
    except BaseException as exc:  # noqa: BLE001 - report, whatever the workload raised
        if rec.time_up:  # _TimeUp wrapped by torch or the workload on its way out
            stopped = "time_limit"
        elif isinstance(exc, KeyboardInterrupt):
            raise
        else:
            stopped = "error"
            error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    finally:
        _disarm_alarm(alarm)
        sys.argv = old_argv
        if path0 in sys.path:
            sys.path.remove(path0)
    trace.update(stopped=stopped, error=error, elapsed_s=round(time.monotonic() - rec.started, 3))
    trace.update(rec.records())
    _write(out_path, trace)
    return trace


# ------------------------------------------------------------------ every process of a command
#
# ``remotemac preflight`` of a command that is not ``python script.py`` (``bash run.sh``,
# torchrun, ``sh -c``) traces it as the run observes a job: jobsite.py is the
# sitecustomize of every Python process the command starts and, when that process has
# imported torch, calls :func:`start` here (REMOTEMAC_OBSERVE_MODULE=optrace) instead of
# observer.py. Each process writes ``trace-<pid>.json`` in REMOTEMAC_OBSERVE_DIR (every
# second while it runs ops, at its deadline and at exit); the laptop merges them.

#: seconds between rewrites of a running process's trace (a SIGKILL leaves the last one)
WRITE_EVERY_S = 1.0
#: after the deadline, a process that ran no op since ends by its timer
WATCH_GRACE_S = 0.5
_ACTIVE: list[Any] = []  # keeps the process's tracer alive (multiprocessing holds it weakly)


def shared_deadline(out_dir: str, seconds: float) -> float:
    """The wall-clock deadline of every process of the command: set by the first one
    that imports torch (``out_dir/deadline``), so a worker started later stops with it."""
    path = os.path.join(out_dir, "deadline")
    tmp = "%s.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(repr(time.time() + seconds))
    try:
        os.link(tmp, path)  # atomic: the first one wins, the others read it
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    with open(path, encoding="utf-8") as fh:
        return float(fh.read())


class ProcessTrace:
    """The trace of one Python process of a command, from its torch import to its end."""

    def __init__(self, torch: Any, out_dir: str, seconds: float) -> None:
        self.out_dir = out_dir
        self.seconds = seconds
        argv0 = (getattr(sys, "argv", None) or [""])[0] or ""
        project = os.environ.get("REMOTEMAC_PREFLIGHT_PROJECT") or os.getcwd()
        dirs = [project, os.getcwd()]
        if os.path.isfile(argv0):
            dirs.append(os.path.dirname(os.path.abspath(argv0)))
        # no deadline until the first op (see tick): the first op under a dispatch mode
        # imports much of torch (seconds on a loaded machine), which is not the workload
        self.rec = Recorder(float("inf"), tuple(dirs))
        torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
        self.rec.skip_dirs = (torch_dir, os.path.abspath(runpy.__file__))
        self.rec.on_time_up = self.time_up
        self.rec.on_op = self.tick
        self.torch_version = str(getattr(torch, "__version__", ""))
        self.modes = _make_modes(self.rec, torch)
        self.started_at = time.time()
        self.first_op_at: Any = None
        self.written = time.monotonic()
        self.done = False

    def start(self) -> None:
        """Enter the recorders for the rest of the process and arrange the writes."""
        for mode in self.modes:
            mode.__enter__()
        atexit.register(self.finish)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.forked)
        try:  # a multiprocessing child ends with os._exit: no atexit, but its finalizers
            import multiprocessing.util as mputil

            mputil.register_after_fork(self, ProcessTrace._mp_child)
        except Exception:  # noqa: BLE001
            pass
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, self._terminated)
        _ACTIVE.append(self)
        self.write("running")

    def _arm(self) -> None:
        """At the first op: the command's shared deadline, and a timer for it."""
        self.first_op_at = time.time()
        wall = shared_deadline(self.out_dir, self.seconds)
        self.rec.deadline = time.monotonic() + (wall - time.time())
        self._watch()

    def _watch(self) -> None:
        """A timer for the deadline: a process blocked outside torch (a DataLoader worker
        waiting for indices, a torch-free loop) writes its trace and ends too; a busy
        one ends in check_time first."""
        delay = max(self.rec.deadline - time.monotonic(), 0.0) + WATCH_GRACE_S
        timer = threading.Timer(delay, self.time_up)
        timer.daemon = True
        timer.start()

    def trace(self, stopped: str, error: Any = None) -> JsonObject:
        argv = list(getattr(sys, "argv", None) or [])
        trace: JsonObject = {
            "schema": TRACE_SCHEMA,
            "python": platform.python_version(),
            "executable": sys.executable,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "argv": [a[:200] for a in argv[:12]],
            "torch_version": self.torch_version,
            "seconds_limit": self.seconds,
            "started_at": self.started_at,
            "first_op_at": self.first_op_at,
            "ended_at": time.time(),
            "stopped": stopped,
            "error": error,
        }
        trace.update(self.rec.records())
        return trace

    def write(self, stopped: str, error: Any = None) -> None:
        self.written = time.monotonic()
        try:
            path = os.path.join(self.out_dir, "trace-%d.json" % os.getpid())
            _write(path, self.trace(stopped, error))
        except Exception:  # noqa: BLE001 - tracing must never break the workload
            pass

    def tick(self) -> None:
        if self.first_op_at is None:
            self._arm()
        if time.monotonic() - self.written >= WRITE_EVERY_S:
            self.write("running")

    def _stop(self, stopped: str) -> None:
        """Write the final trace and end the process now (the preflight is over for it)."""
        self.done = True
        self.write(stopped)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)

    def time_up(self) -> None:
        self._stop("time_limit")

    def _terminated(self, signum: int, frame: Any) -> None:
        self._stop("terminated")

    def forked(self) -> None:
        """A forked child (a DataLoader worker) records its own ops from here on."""
        self.rec.reset()
        self.started_at = time.time()
        if self.first_op_at is not None:
            self.first_op_at = self.started_at
        self.written = time.monotonic()
        if self.first_op_at is not None:  # threads do not survive a fork: a new timer
            with contextlib.suppress(Exception):
                self._watch()

    def _mp_child(self) -> None:
        import multiprocessing.util as mputil

        mputil.Finalize(self, self.finish, exitpriority=100)

    def finish(self) -> None:
        """At exit: the exception that ended the process, if any, and the last trace."""
        if self.done:
            return
        self.done = True
        exc = getattr(sys, "last_value", None)
        error = None
        if isinstance(exc, BaseException) and not isinstance(exc, SystemExit):
            error = "%s: %s" % (type(exc).__name__, (str(exc).strip().splitlines() or [""])[0])
        self.write("exited", error)


def start(torch: Any, env_before_torch: bool = True) -> ProcessTrace | None:
    """Trace this process (jobsite.py calls it once torch is imported)."""
    out_dir = os.environ.get("REMOTEMAC_OBSERVE_DIR")
    if not out_dir:
        return None
    proc = ProcessTrace(torch, out_dir, float(os.environ.get("REMOTEMAC_PREFLIGHT_SECONDS") or 60))
    proc.start()
    return proc


def _arm_alarm(rec: Recorder, seconds: float) -> Any:
    """SIGALRM backstop one second after the deadline, for torch-free loops.

    Returns what is needed to put back any handler and timer that were there
    before (when the tracer runs inside another program, such as a test runner).
    """
    if (
        not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        return None

    def _ring(signum: int, frame: Any) -> None:
        if not rec.time_up:
            rec.time_up = True
            raise _TimeUp()

    previous = signal.signal(signal.SIGALRM, _ring)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds + 1.0)
    return previous, old_delay, old_interval, time.monotonic()


def _disarm_alarm(armed: Any) -> None:
    if armed is None:
        return
    previous, old_delay, old_interval, armed_at = armed
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    if old_delay > 0:  # someone else's timer was pending: let it ring when it would have
        remaining = max(old_delay - (time.monotonic() - armed_at), 0.001)
        signal.setitimer(signal.ITIMER_REAL, remaining, old_interval)


def _write(path: str, trace: JsonObject) -> None:
    """Write atomically so a reader never sees half a trace."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(trace, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(_THIS_FILE):
        sys.path.pop(0)  # run as a file: the agent dir must not shadow workload imports
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(prog="optrace", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)
    out = os.path.abspath(opts.out)
    trace = run(opts.seconds, out, rest)
    return 0 if trace.get("stopped") != "error" else 1


if __name__ == "__main__":
    sys.exit(main())
