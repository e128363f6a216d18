"""The in-process observer of one Python process of a job, started when it imports torch.

The job's ``sitecustomize`` (jobsite.py) loads this file by path the moment a process
imports torch, whatever started that process: ``cd src && python train.py``,
``bash run.sh``, a torchrun worker, a subprocess. It observes what only the process
itself can see, with the harness's tools (harness.py): every MPS fallback warning,
the exception that ended it, whether tensors and the model landed on the device, and
the Metal allocator's figures. It writes ``<obs dir>/<pid>.json`` when torch is
imported, every ``interval`` seconds while the process runs (a SIGKILL leaves the
last one) and at exit; obsmerge.py merges the processes' records into the job's.

The exception that ends a process is read in an atexit handler from
``sys.last_value`` (the interpreter sets it before printing the traceback), so a
workload that installs its own ``sys.excepthook`` does not hide it.

Blind spots: a process started with ``python -I``, ``-E`` or ``-S`` (no sitecustomize) or
that ends with ``os._exit`` (only the provisional record remains), and forked
children such as DataLoader workers (not recorded; their memory still counts in the
job's process tree).

Standard library only, Python 3.9; never imports torch itself.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import json
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the annotations only: this file also runs on its own
    from .protocol import JsonObject

PROCESS_SCHEMA = "remotemac.observer.process/1"


def _sibling(name: str) -> Any:
    """Load an agent module by path under a private name: a user module called
    ``harness`` or ``memsample`` is neither shadowed nor used."""
    key = "_remotemac_" + name
    if key in sys.modules:
        return sys.modules[key]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + ".py")
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


harness = _sibling("harness")
memsample = harness.memsample


class ProcessObserver(harness.Harness):  # type: ignore[misc, name-defined]
    """The harness's observation of one process, without running the workload itself."""

    def __init__(
        self, obs_dir: str, device: str, fallback: str, interval: float, env_before_torch: bool
    ) -> None:
        pid = os.getpid()
        super().__init__(
            device,
            os.path.join(obs_dir, "%d.json" % pid),
            os.devnull,
            fallback=fallback,
            interval=interval,
        )
        self.env_before_torch = env_before_torch
        self.pytorch_env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("PYTORCH_")}
        self._stop = threading.Event()
        self.mps_now: dict[str, int] = {}
        self.mps_peak_driver = 0
        #: optimizer steps taken: the memory trend's warm-up can end after the first few
        self.steps = 0
        #: the divergence trace (modtrace.py), only when the job asked for one
        self.trace: Any = None

    def start(self) -> None:
        """Hook warnings, watch the device, start the ticker, record at exit."""
        self.import_torch()  # already in sys.modules: notes MPS state, warn-always
        self.counter.install()
        if self.torch is not None:
            with contextlib.suppress(Exception):  # very old torch: no TorchFunctionMode
                self.watch.enter(self.torch)
            with contextlib.suppress(Exception):  # torch < 2.0: no global step hooks
                from torch.optim.optimizer import (  # agent-imports: lazy (workload's torch)
                    register_optimizer_step_post_hook,
                )

                register_optimizer_step_post_hook(self._count_step)
            self._start_trace()
        atexit.register(self.finish)
        self.write_obs(fsync=False)
        threading.Thread(target=self._run, name="remotemac-observer", daemon=True).start()

    def _start_trace(self) -> None:
        """The divergence trace, off unless REMOTEMAC_TRACE_STEPS is set: when off,
        modtrace.py is not loaded and no hook is registered. REMOTEMAC_DRILL makes the
        process a drill pass instead (opdrill.py: one module call under an op trace)."""
        drill = os.environ.get("REMOTEMAC_DRILL")
        if drill:
            try:
                spec = json.loads(drill)
                self.trace = _sibling("opdrill").start(self.torch, spec, self.device)
            except Exception as exc:  # noqa: BLE001 - the job must run even if this fails
                sys.stderr.write("remotemac: could not drill in this process (%s)\n" % exc)
            return
        steps = os.environ.get("REMOTEMAC_TRACE_STEPS")
        path = os.environ.get("REMOTEMAC_TRACE_PATH")
        if not steps or not path:
            return
        try:
            self.trace = _sibling("modtrace").start(self.torch, path, int(steps), self.device)
        except Exception as exc:  # noqa: BLE001 - the job must run even if tracing fails
            sys.stderr.write("remotemac: could not trace this process (%s)\n" % exc)

    def _count_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # observing must never hurt the workload
                self.counter.ensure_filter()
                self.write_obs(fsync=False)

    def finish(self) -> None:
        """atexit: classify the exception that ended the process and write the record."""
        self._stop.set()
        if self.trace is not None:
            with contextlib.suppress(Exception):
                self.trace.stop()
        exc = getattr(sys, "last_value", None)
        if isinstance(exc, BaseException) and not isinstance(exc, (SystemExit,)):
            self.failure = harness.classify(exc)
        self.finished = True
        self.counter.uninstall()
        with contextlib.suppress(Exception):
            self.write_obs()

    def observation(self) -> JsonObject:
        obs = super().observation()
        if self.device_type == "mps":
            self.mps_now = memsample.mps_memory()
            self.mps_peak_driver = max(
                self.mps_peak_driver, self.mps_now.get("mps_driver_allocated_bytes", 0)
            )
        argv = list(getattr(sys, "argv", []) or [])
        obs.update(
            {
                "schema": PROCESS_SCHEMA,
                "pid": self.pid,
                "ppid": os.getppid(),
                "argv0": argv[0] if argv else None,
                "argv": [a[:200] for a in argv[:12]],
                "executable": sys.executable,
                "updated_at": time.time(),
                "mps_memory": dict(self.mps_now),
                "mps_peak_driver_bytes": self.mps_peak_driver or None,
                "optimizer_steps": self.steps,
            }
        )
        # the process's own exit code is the job's business (the runner knows it)
        obs.pop("exit_code", None)
        obs.pop("samples", None)
        return obs


def start(torch: Any, env_before_torch: bool = True) -> ProcessObserver | None:
    """Observe this process, configured by the job's REMOTEMAC_OBSERVE_* variables."""
    obs_dir = os.environ.get("REMOTEMAC_OBSERVE_DIR")
    if not obs_dir:
        return None
    observer = ProcessObserver(
        obs_dir,
        os.environ.get("REMOTEMAC_OBSERVE_DEVICE") or "cpu",
        os.environ.get("REMOTEMAC_OBSERVE_FALLBACK") or "diagnostic",
        float(os.environ.get("REMOTEMAC_OBSERVE_INTERVAL") or 1.0),
        env_before_torch,
    )
    observer.torch = torch
    observer.start()
    return observer
