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
    """Counts (op, input dtypes, output dtypes) and float64 creation sites."""

    def __init__(self, seconds: float, project_dirs: tuple[str, ...]) -> None:
        self.deadline = time.monotonic() + seconds
        self.started = time.monotonic()
        self.project_dirs = tuple(os.path.abspath(d) for d in project_dirs)
        self.ops: dict[tuple[str, tuple[str, ...], tuple[str, ...]], int] = {}
        self.functions: dict[tuple[str, tuple[str, ...]], int] = {}
        self.sites: dict[tuple[str, str, str], int] = {}
        self.time_up = False
        self.skip_dirs: tuple[str, ...] = ()

    def check_time(self) -> None:
        if time.monotonic() >= self.deadline and not self.time_up:
            self.time_up = True
            raise _TimeUp()

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
    trace.update(
        stopped=stopped,
        error=error,
        elapsed_s=round(time.monotonic() - rec.started, 3),
        ops=[
            {"op": op, "dtypes": list(ins), "out_dtypes": list(outs), "count": n}
            for (op, ins, outs), n in sorted(rec.ops.items())
        ],
        functions=[
            {"name": fn, "dtypes": list(ins), "count": n}
            for (fn, ins), n in sorted(rec.functions.items())
        ],
        float64_sites=[
            {"site": site, "op": op, "dtype": dt, "count": n}
            for (site, op, dt), n in sorted(rec.sites.items())
        ],
    )
    _write(out_path, trace)
    return trace


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
