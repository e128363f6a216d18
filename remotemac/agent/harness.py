"""In-agent MPS validation harness: run a Python workload in-process and observe it.

Runs on the rented Mac (Python 3.9, standard library; torch imported lazily, never at
module import) as a plain script::

    python3 harness.py --device mps --obs obs.json --metrics metrics.jsonl \
        [--fallback diagnostic|off] [--interval 1.0] -- train.py ARG...
    python3 harness.py ... -- -m package.module ARG...

Running the workload in this process (runpy, ``__main__`` semantics) is what lets it
see what the user's code never reports: every MPS fallback warning, the exact
exception class and text of a failure, the Metal allocator's figures and whether any
tensor landed on the device. It writes ``obs.json`` (atomically, also provisionally
while running so a SIGKILL leaves evidence) and one JSON line per tick to
``metrics.jsonl``. Messages are matched on their stable prefixes only (the source
file in PyTorch is named next to each pattern); wording after them changes between
releases.

Known blind spots: warnings raised in other processes (DataLoader workers) and a
workload that ends with ``os._exit`` (only the provisional record remains).

A job run by remotemac is observed through observer.py instead (started by the job's
sitecustomize, jobsite.py, in every process that imports torch, whatever the
command's shape); it reuses this module's classifier, warning counter and device
watch. Run as a script, this module still observes one workload in-process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import runpy
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # for the annotations only: on the host this file runs on its own
    from .protocol import JsonObject

try:  # imported as remotemac.agent.harness (tests, the laptop)
    from . import memsample
except ImportError:  # run as a script on the host: load the sibling file by path, so a
    # user module that happens to be called "memsample" is neither shadowed nor used.
    _spec = importlib.util.spec_from_file_location(
        "_remotemac_memsample",
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "memsample.py"),
    )
    assert _spec is not None and _spec.loader is not None
    memsample = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(memsample)  # type: ignore[union-attr]

FALLBACK_ENV = "PYTORCH_ENABLE_MPS_FALLBACK"
OBS_SCHEMA = "remotemac.harness.obs/1"
EXIT_USAGE = 2

# Stable prefixes. Fallback warning and NotImplementedError: aten/src/ATen/mps/MPSFallback.mm
# ("current" without "ly" is the 2022 wording); float64: aten/src/ATen/mps/EmptyTensor.cpp and
# native/mps/OperationUtils.mm; OOM: MPSAllocator.mm; macOS too old: MPSDevice.mm.
FALLBACK_RE = re.compile(
    r"The operator '(aten::[^']+)' is not currently supported on the MPS backend"
)
UNSUPPORTED_RE = re.compile(
    r"The operator '(aten::[^']+)' is not current(?:ly)? implemented for the MPS device"
)
DTYPE_RES: tuple[re.Pattern[str], ...] = (
    re.compile(r"Cannot convert a MPS Tensor to (\w+) dtype"),
    re.compile(r"Cannot convert a (\w+) Tensor to MPS"),
    re.compile(r"Trying to convert (\w+) to the MPS backend"),
    re.compile(r"MPS Autocast only supports dtypes"),
    re.compile(r"(Complex) types are unsupported on MPS"),
    re.compile(r"(BFloat16) is not supported on MPS"),
    re.compile(r"MPS device does not support \S+ for non-float inputs"),
)
OOM_RE = re.compile(r"(?:MPS backend|CUDA) out of memory")
MACOS_TOO_OLD_RE = re.compile(r"The MPS backend is supported on MacOS \S+")
# Filter for warnings.filters: "always", so that a repeated fallback reaches our hook
# even though Python's registry would show it once per source line.
FALLBACK_FILTER = r"The operator 'aten::"


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of a message, cut to ``limit`` characters."""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def _exception_chain(exc: BaseException) -> list[BaseException]:
    """The exception and its causes/contexts: a wrapper must not hide an MPS error."""
    chain: list[BaseException] = []
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    return chain


@dataclass(frozen=True)
class Failure:
    """What the exception that ended a workload says: the ops MPS lacks, dtype errors,
    an out-of-memory, and the stopping conditions the record lists (each one
    ``{code, detail[, op]}`` as the record carries it)."""

    unsupported_ops: List[Dict[str, str]] = field(default_factory=list)
    dtype_errors: List[Dict[str, Optional[str]]] = field(default_factory=list)
    oom: bool = False
    stopping_conditions: List[Dict[str, str]] = field(default_factory=list)

    def to_json(self) -> JsonObject:
        return {
            "unsupported_ops": self.unsupported_ops,
            "dtype_errors": self.dtype_errors,
            "oom": self.oom,
            "stopping_conditions": self.stopping_conditions,
        }


def classify(exc: BaseException) -> Failure:
    """Map a workload failure to operator findings and stopping conditions; a failure
    that matches nothing known becomes ``workload-failed``."""
    unsupported: list[dict[str, str]] = []
    dtype_errors: list[dict[str, str | None]] = []
    conditions: list[dict[str, str]] = []
    oom = False
    for link in _exception_chain(exc):
        text = str(link) if link.args else ""
        for m in UNSUPPORTED_RE.finditer(text):
            if all(u["op"] != m.group(1) for u in unsupported):
                unsupported.append({"op": m.group(1), "message": first_line(text[m.start() :])})
                conditions.append(
                    {
                        "code": "unsupported-op",
                        "op": m.group(1),
                        "detail": f"{m.group(1)} is not implemented for MPS ({type(link).__name__})",
                    }
                )
        for rx in DTYPE_RES:
            m = rx.search(text)
            if m and not dtype_errors:
                dtype = m.group(1) if m.groups() else None
                dtype_errors.append({"dtype": dtype, "message": first_line(text[m.start() :])})
                conditions.append({"code": "dtype-error", "detail": first_line(text[m.start() :])})
        m = OOM_RE.search(text)
        if m and not oom:
            oom = True
            conditions.append({"code": "out-of-memory", "detail": first_line(text[m.start() :])})
        m = MACOS_TOO_OLD_RE.search(text)
        if m and not any(c["code"] == "mps-unavailable" for c in conditions):
            conditions.append({"code": "mps-unavailable", "detail": first_line(text[m.start() :])})
    if not conditions:
        conditions.append(
            {
                "code": "workload-failed",
                "detail": "{}: {}".format(
                    type(exc).__name__, first_line(str(exc)) or "(no message)"
                ),
            }
        )
    return Failure(unsupported, dtype_errors, oom, conditions)


class FallbackCounter:
    """Counts every MPS CPU-fallback warning and prints each op's first one, as torch would.

    Hooks ``warnings._showwarnmsg``: both Python's ``warn`` and the C-level
    ``PyErr_WarnEx`` torch uses end there, and it still runs when the user replaces
    ``warnings.showwarning`` (``logging.captureWarnings``) or records warnings with
    ``catch_warnings(record=True)``. (A ``showwarning`` wrapper would be bypassed
    by ``logging.captureWarnings``, which replaces it.) ``_showwarnmsg`` is private
    but has existed unchanged since Python 3.6.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.order: list[str] = []
        self._lock = threading.Lock()
        self._orig_showwarnmsg: Callable[..., Any] | None = None

    def note(self, message: str) -> bool | None:
        """Count a fallback message; True if first for its op, False if repeat, None if other."""
        m = FALLBACK_RE.search(message)
        if m is None:
            return None
        op = m.group(1)
        with self._lock:
            first = op not in self.counts
            if first:
                self.order.append(op)
            self.counts[op] = self.counts.get(op, 0) + 1
        return first

    def fallback_counts(self) -> List[Tuple[str, int]]:
        """(op, times it fell back) in the order the ops first fell back."""
        with self._lock:
            return [(op, self.counts[op]) for op in self.order]

    def ensure_filter(self) -> None:
        """Put our "always" filter first again if the workload pushed its own in front."""
        head = warnings.filters[0] if warnings.filters else None
        if not head or head[0] != "always" or getattr(head[1], "pattern", None) != FALLBACK_FILTER:
            warnings.filterwarnings("always", message=FALLBACK_FILTER, category=UserWarning)

    def install(self) -> None:
        self.ensure_filter()
        orig = warnings._showwarnmsg  # type: ignore[attr-defined]
        self._orig_showwarnmsg = orig

        def _showwarnmsg(msg: Any) -> None:
            if self.note(str(getattr(msg, "message", ""))) is False:
                return  # counted; the first one was already printed
            orig(msg)

        warnings._showwarnmsg = _showwarnmsg  # type: ignore[attr-defined]

    def uninstall(self) -> None:
        if self._orig_showwarnmsg is not None:
            warnings._showwarnmsg = self._orig_showwarnmsg  # type: ignore[attr-defined]
            self._orig_showwarnmsg = None


class DeviceWatch:
    """Did any tensor, and any model's parameters, land on the target device type?

    A TorchFunctionMode sees every torch call on the main thread: factories with
    ``device=``, ``.to``, ``.cuda`` and every op. A tensor result on the device answers
    "tensors"; an ``nn.Parameter`` argument on the device (a forward pass, an optimizer
    step) answers "model". Once both are known the mode only passes calls through.
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self.tensor_seen = False
        self.on_device = False
        self.first_on_device: str | None = None
        self.model_seen = False
        self.model_on_device = False
        self.mode: Any = None

    def enter(self, torch: Any) -> None:
        watch = self
        tensor_type = torch.Tensor
        param_type = torch.nn.Parameter
        resolve = getattr(torch.overrides, "resolve_name", None)

        class _Mode(torch.overrides.TorchFunctionMode):  # type: ignore[misc, name-defined]
            def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                result = func(*args, **(kwargs or {}))
                if not (watch.on_device and watch.model_on_device):
                    if not watch.model_on_device:
                        watch.look_params(args, param_type)
                    if not watch.on_device and watch.look_result(result, tensor_type):
                        name = resolve(func) if resolve is not None else None
                        watch.first_on_device = name or getattr(func, "__name__", str(func))
                return result

        self.mode = _Mode()
        self.mode.__enter__()

    def _on(self, tensor: Any) -> bool:
        try:
            return bool(tensor.device.type == self.device_type)
        except Exception:  # noqa: BLE001 - exotic subclasses without a device
            return False

    def look_result(self, result: Any, tensor_type: type) -> bool:
        """Note a call's result; True the first time a tensor is on the device."""
        items = result if isinstance(result, (tuple, list)) else (result,)
        for item in items:
            if isinstance(item, tensor_type):
                self.tensor_seen = True
                if self._on(item):
                    self.on_device = True
                    return True
        return False

    def look_params(self, args: Sequence[Any], param_type: type) -> None:
        """Note parameters passed to a call (one level into lists: ``_foreach`` ops)."""
        for arg in args:
            group = arg if isinstance(arg, (tuple, list)) else (arg,)
            for item in group:
                if isinstance(item, param_type):
                    self.model_seen = True
                    if self._on(item):
                        self.model_on_device = True
                        return

    def exit(self) -> None:
        if self.mode is not None:
            with contextlib.suppress(Exception):  # the workload left its own modes pushed
                self.mode.__exit__(None, None, None)
            self.mode = None

    def tensors_on_device(self) -> bool | None:
        if self.on_device:
            return True
        return False if self.tensor_seen else None

    def model_state(self) -> bool | None:
        if self.model_on_device:
            return True
        return False if self.model_seen else None


def write_json_atomic(path: str, data: JsonObject, fsync: bool = True) -> None:
    """Write via a temp file and rename: a reader never sees half a record."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    os.replace(tmp, path)


class Harness:
    """One workload run: environment, hooks, sampler, classification and the record."""

    def __init__(
        self,
        device: str,
        obs_path: str,
        metrics_path: str,
        fallback: str = "diagnostic",
        interval: float = 1.0,
    ) -> None:
        self.device = device
        self.device_type = device.split(":", 1)[0]
        # Absolute: the workload may chdir before the record is written.
        self.obs_path = os.path.abspath(obs_path)
        self.metrics_path = os.path.abspath(metrics_path)
        self.fallback = fallback
        self.interval = interval
        self.pid = os.getpid()
        self.started_at = time.time()
        self.torch: Any = None
        self.torch_error: str | None = None
        self.mps_state: dict[str, bool | None] = {"is_built": None, "is_available": None}
        self.counter = FallbackCounter()
        self.watch = DeviceWatch(self.device_type)
        self.failure: Failure | None = None
        self.conditions: list[dict[str, str]] = []
        self.exit_code: int | None = None
        self.finished = False
        self.sampler: Any = None
        self._obs_lock = threading.Lock()
        self.pytorch_env: dict[str, str] = {}
        self.env_before_torch: bool | None = None
        self._closing = False

    # --- setup -------------------------------------------------------------------
    def prepare_environment(self) -> None:
        """Set or clear the fallback variable; must run before anything imports torch."""
        # False only if something (a sitecustomize, a .pth file) imported torch before us:
        # then torch never saw the variable, and the record must say so.
        self.env_before_torch = "torch" not in sys.modules
        if self.fallback == "diagnostic":
            os.environ[FALLBACK_ENV] = "1"
        else:  # "off": a missing op must fail, not silently run on the CPU
            os.environ.pop(FALLBACK_ENV, None)
        self.pytorch_env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("PYTORCH_")}

    def import_torch(self) -> None:
        """Import torch if installed; note build/availability and turn on warn-always."""
        try:
            if importlib.util.find_spec("torch") is None:
                self.torch_error = "torch is not installed"
                return
            import torch  # noqa: PLC0415  # agent-imports: lazy, after prepare_environment
        except Exception as exc:  # noqa: BLE001 - a broken install is a finding, not a crash
            self.torch_error = f"{type(exc).__name__}: {first_line(str(exc))}"
            return
        self.torch = torch
        # Fallback warnings are TORCH_WARN_ONCE: without this only the first op shows.
        torch.set_warn_always(True)
        with contextlib.suppress(Exception):
            self.mps_state = {
                "is_built": bool(torch.backends.mps.is_built()),
                "is_available": bool(torch.backends.mps.is_available()),
            }
        if self.device_type == "mps" and not self.mps_state.get("is_available"):
            self.conditions.append(
                {
                    "code": "mps-unavailable",
                    "detail": "torch.backends.mps.is_available() is False (is_built {}, torch {})".format(
                        self.mps_state.get("is_built"), getattr(torch, "__version__", "?")
                    ),
                }
            )

    # --- the record ----------------------------------------------------------------
    def observation(self) -> JsonObject:
        failure = self.failure or Failure()
        fallback_ops = [{"op": op, "count": n} for op, n in self.counter.fallback_counts()]
        conditions = list(self.conditions)
        if self.device_type == "mps" and self.torch is None:
            conditions.append(
                {
                    "code": "mps-unavailable",
                    "detail": f"torch is not importable ({self.torch_error})",
                }
            )
        conditions += [
            {
                "code": "fallback-op",
                "op": f["op"],
                "detail": f"{f['op']} fell back to the CPU {f['count']} time(s)",
            }
            for f in fallback_ops
        ]
        for cond in failure.stopping_conditions:
            if cond not in conditions:
                conditions.append(cond)
        peak = self.sampler.peak_rss if self.sampler is not None else 0
        with contextlib.suppress(Exception):
            peak = max(peak, memsample.peak_rss_self())
        return {
            "schema": OBS_SCHEMA,
            "device": self.device,
            "fallback": self.fallback,
            "finished": self.finished,
            "started_at": self.started_at,
            "finished_at": time.time() if self.finished else None,
            "exit_code": self.exit_code,
            "tensors_on_device": self.watch.tensors_on_device(),
            "first_on_device": self.watch.first_on_device,
            "model_on_device": self.watch.model_state(),
            "operators": {
                "fallback_ops": fallback_ops,
                "unsupported_ops": failure.unsupported_ops,
                "dtype_errors": failure.dtype_errors,
            },
            "oom": bool(failure.oom),
            "stopping_conditions": conditions,
            "torch_version": getattr(self.torch, "__version__", None),
            "torch_error": self.torch_error,
            "mps": dict(self.mps_state),
            "pytorch_env": self.pytorch_env,
            "fallback_env_before_torch": self.env_before_torch,
            "peak_rss_bytes": peak,
            # the process tree's own memory at its highest (memsample.Sampler: PSS or
            # phys_footprint, forked workers' shared pages once); None when not read
            "peak_own_bytes": (self.sampler.peak_own or None) if self.sampler else None,
            "samples": self.sampler.count if self.sampler is not None else 0,
        }

    def write_obs(self, fsync: bool = True) -> None:
        if os.getpid() != self.pid:  # a forked DataLoader worker must not overwrite it
            return
        with self._obs_lock:
            write_json_atomic(self.obs_path, self.observation(), fsync=fsync)

    def _tick(self, elapsed: float) -> None:
        """Sampler callback: filter upkeep and a provisional record."""
        self.counter.ensure_filter()
        if not self.finished:
            self.write_obs(fsync=False)

    # --- running -------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.pid:  # forked child: behave as if we were never there
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self._closing:  # already writing the record: let it finish, then exit
            return
        raise _Terminated(signum)

    def run(self, target: Sequence[str]) -> int:
        """Run ``script.py args`` or ``-m module args``; return the process exit code."""
        self.prepare_environment()
        self.import_torch()
        self.counter.install()
        self.sampler = memsample.Sampler(
            self.metrics_path, self.interval, mps=self.device_type == "mps", extra=self._tick
        )
        self.sampler.start()
        if self.torch is not None:
            with contextlib.suppress(Exception):  # very old torch: no TorchFunctionMode
                self.watch.enter(self.torch)
        code = 0
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        try:
            _run_target(target)
        except _Terminated as exc:
            code = 128 + exc.signum
            self.conditions.append(
                {"code": "workload-failed", "detail": f"terminated by signal {exc.signum}"}
            )
        except SystemExit as exc:
            code = _system_exit_code(exc)
            if code != 0:
                self.conditions.append(
                    {"code": "workload-failed", "detail": f"the workload exited with code {code}"}
                )
        except KeyboardInterrupt as exc:
            _print_workload_traceback(exc)
            code = 130
            self.conditions.append({"code": "workload-failed", "detail": "interrupted (SIGINT)"})
        except BaseException as exc:  # noqa: BLE001 - classify everything the workload raised
            _print_workload_traceback(exc)
            self.failure = classify(exc)
            code = 1
        finally:
            self._closing = True
            self.watch.exit()
            self.counter.uninstall()
            self.sampler.stop()
            self.exit_code = code
            self.finished = True
            self.write_obs()
        return code


class _Terminated(BaseException):
    """Raised in the main thread by the SIGTERM/SIGHUP handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _system_exit_code(exc: SystemExit) -> int:
    """What the interpreter would exit with for this SystemExit."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _print_workload_traceback(exc: BaseException) -> None:
    """Print the traceback as ``python script.py`` would: without harness/runpy frames."""
    tb = exc.__traceback__
    skip = {os.path.abspath(__file__), os.path.abspath(runpy.__file__ or ""), "<frozen runpy>"}
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if name not in skip and os.path.abspath(name) not in skip:
            break
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
    sys.stderr.flush()


def _run_target(target: Sequence[str]) -> None:
    """runpy with the interpreter's own ``sys.argv``/``sys.path[0]`` conventions."""
    if target[0] == "-m":
        module, args = target[1], list(target[2:])
        sys.argv = [module] + args  # run_module replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script, args = target[0], list(target[1:])
    sys.argv = [script] + args
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


@dataclass(frozen=True)
class Options:
    """The harness's command line before ``--``."""

    device: str
    obs: str
    metrics: str
    fallback: str = "diagnostic"
    interval: float = 1.0


def parse_args(argv: Sequence[str]) -> tuple[Options, list[str]]:
    """Split ``OPTIONS -- TARGET``; raises ValueError with a one-line usage message."""
    argv = list(argv)
    if "--" not in argv:
        raise ValueError("missing '--' before the workload (script.py ARGS or -m MODULE ARGS)")
    cut = argv.index("--")
    opts_list, target = argv[:cut], argv[cut + 1 :]
    if not target or (target[0] == "-m" and len(target) < 2):
        raise ValueError("no workload after '--'")
    opts: Dict[str, str] = {"fallback": "diagnostic", "interval": "1.0"}  # as given
    names = {
        "--device": "device",
        "--obs": "obs",
        "--metrics": "metrics",
        "--fallback": "fallback",
        "--interval": "interval",
    }
    i = 0
    while i < len(opts_list):
        key, sep, value = opts_list[i].partition("=")
        if key not in names:
            raise ValueError(f"unknown option {opts_list[i]!r}")
        if not sep:
            i += 1
            if i >= len(opts_list):
                raise ValueError(f"{key} needs a value")
            value = opts_list[i]
        opts[names[key]] = value
        i += 1
    for required in ("device", "obs", "metrics"):
        if required not in opts:
            raise ValueError(f"--{required} is required")
    if opts["fallback"] not in ("diagnostic", "off"):
        raise ValueError("--fallback must be diagnostic or off, not {!r}".format(opts["fallback"]))
    try:
        interval = float(opts["interval"])
    except ValueError:
        raise ValueError("--interval must be a number of seconds") from None
    if interval <= 0:
        raise ValueError("--interval must be positive")
    return Options(opts["device"], opts["obs"], opts["metrics"], opts["fallback"], interval), target


def main(argv: Sequence[str] | None = None) -> int:
    try:
        opts, target = parse_args(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"remotemac harness: {exc}", file=sys.stderr)
        return EXIT_USAGE
    harness = Harness(
        opts.device, opts.obs, opts.metrics, fallback=opts.fallback, interval=opts.interval
    )
    code = harness.run(target)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
