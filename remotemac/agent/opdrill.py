"""The op-level drill-down: one module call, run alone under an operator trace.

The divergence trace (modtrace.py) names the first module call whose output differs
(or the first that made a NaN); which aten op inside it did is the next question. This
is a second, short pass of the job, on each side: the job's own code runs up to that
call (the same step counting and module paths as the trace: the call is named by step,
path and call index) and there, instead of going on, the module is run once, alone,
under a ``TorchDispatchMode`` that summarises every aten op's output and first input
(modtrace.summarise: shape, dtype, sums, abs-max, a strided sample, NaN/Inf counts).
Then the process ends (``os._exit``): the rest of the job would only cost time.

Both sides run the call with the *reference's* input and weights, so whatever differs
is the target's own arithmetic: the reference saves the call's tensors (the positional
and keyword arguments' tensors, in order, and the module's parameters and buffers) as a
dict of plain tensors with ``torch.save``; the target loads that file with
``weights_only=True`` (nothing is unpickled) and puts each tensor on its own argument's
device. The module runs through ``torch.func.functional_call`` with those weights, in
the grad mode the real call had.

Turned on by ``REMOTEMAC_DRILL`` (a JSON object: ``step``, ``path``, ``call``, ``out``:
the op trace to write, ``save``: where the reference saves the input, ``input``: the
file the target loads); when it is absent this file is not read.

Standard library only, Python 3.9; torch is the workload's own, handed in.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import time
from typing import Any

DRILL_SCHEMA = "remotemac.drill/1"
#: a module call of more ops than this is cut (the rows say so: ``truncated``)
MAX_OPS = 20_000
#: what the drill pass's process exits with once the op trace is written
DRILL_EXIT = 0


def _modtrace() -> Any:
    """modtrace.py, loaded by path under the observer's private name (shared with it)."""
    key = "_remotemac_modtrace"
    if key in sys.modules:
        return sys.modules[key]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "modtrace.py")
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


def _map_tensors(obj: Any, torch: Any, fn: Any, depth: int = 0) -> Any:
    """``obj`` with each tensor replaced by ``fn(tensor)`` (tuples, lists, dicts)."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if depth < 4 and isinstance(obj, (list, tuple)):
        items = [_map_tensors(x, torch, fn, depth + 1) for x in obj]
        return type(obj)(items) if isinstance(obj, list) else tuple(items)
    if depth < 4 and isinstance(obj, dict):
        return {k: _map_tensors(v, torch, fn, depth + 1) for k, v in obj.items()}
    return obj


def _tensors(obj: Any, torch: Any) -> list[Any]:
    found: list[Any] = []
    _map_tensors(obj, torch, lambda t: found.append(t) or t)
    return found


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _bad(tensors: list[Any], torch: Any) -> int:
    """NaNs and Infs over the floating tensors of an op's inputs."""
    total = 0
    for t in tensors:
        if t.is_floating_point() and t.numel():
            total += int((~torch.isfinite(t)).sum().item())
    return total


def _op_recorder(torch: Any, summarise: Any, stack: list[str], rows: list[Any]) -> Any:
    """A TorchDispatchMode that appends one row per aten op (made here: the class is
    the workload's torch's)."""
    from torch.utils._python_dispatch import (  # agent-imports: lazy (workload's torch)
        TorchDispatchMode,
    )

    class OpRecorder(TorchDispatchMode):  # type: ignore[misc, valid-type]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            # the inputs are summarised before the op runs: an in-place op (``fill_``,
            # ``add_``) changes its own input, and a NaN it writes is its own
            before = None
            if len(rows) < MAX_OPS:
                with contextlib.suppress(Exception):
                    inputs = _tensors((args, kwargs or {}), torch)
                    first = summarise(inputs[0], torch) if inputs else None
                    before = (first, _bad(inputs, torch))
            out = func(*args, **(kwargs or {}))
            if before is not None:
                with contextlib.suppress(Exception):  # the op ran: a summary bug is no error
                    schema = getattr(func, "_schema", None)
                    outputs = _tensors(out, torch)
                    rows.append(
                        {
                            "i": len(rows),
                            "op": schema.name if schema is not None else str(func),
                            "module": stack[-1] if stack else None,
                            "out": summarise(outputs[0], torch) if outputs else None,
                            "in": before[0],
                            "in_bad": before[1],
                        }
                    )
            return out

    return OpRecorder()


def start(torch: Any, spec: dict[str, Any], device: str) -> Any:
    """Hooks that find the named call and drill there; the caller stops it at exit."""
    base = _modtrace().ModuleTrace

    class Drill(base):  # type: ignore[misc, valid-type]
        """The trace's step counting and module paths, without its rows: at the named
        call, the drill."""

        def __init__(self) -> None:
            super().__init__(torch, str(spec["out"]), int(spec["step"]) + 1, device)
            self.at_path = str(spec["path"])
            self.at_call = int(spec.get("call") or 0)
            self.at_step = int(spec["step"])
            self.hooked: Any = None
            self.seen = 0
            self.written = False

        def _top_level(self, module: Any) -> None:
            super()._top_level(module)
            if self.done or module is not self.root:
                return
            self.seen = 0
            if self.hooked is None:
                target = dict(module.named_modules()).get(self.at_path)
                if target is not None:
                    self.hooked = target.register_forward_pre_hook(self._at, with_kwargs=True)

        def _record(self, module: Any, args: Any, output: Any) -> None:
            return None  # no trace rows in a drill pass

        def _flush(self) -> None:
            return None

        def _at(self, module: Any, args: Any, kwargs: Any) -> None:
            if self.done or self.step != self.at_step:
                return None
            seen, self.seen = self.seen, self.seen + 1
            if seen != self.at_call:
                return None
            names = dict(self.names)
            self.stop(write=False)  # the trace's hooks off: they would see the drill's calls
            header, rows = self._drill(module, args, kwargs, names)
            self._write(header, rows)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(DRILL_EXIT)

        def _drill(
            self, module: Any, args: Any, kwargs: Any, names: dict[int, str]
        ) -> tuple[dict[str, Any], list[Any]]:
            header: dict[str, Any] = {
                "schema": DRILL_SCHEMA,
                "device": device,
                "torch": getattr(torch, "__version__", None),
                "step": self.at_step,
                "path": self.at_path,
                "call": self.at_call,
                "cls": type(module).__name__,
                "reached": True,
                "input": "reference" if spec.get("input") else "own",
                "error": None,
                "started_at": time.time(),
            }
            rows: list[Any] = []
            try:
                run_args, run_kwargs, state = self._inputs(module, args, kwargs, header)
            except Exception as exc:  # noqa: BLE001 - said in the op trace, not raised
                header["error"] = "input: %s: %s" % (type(exc).__name__, exc)
                return header, rows
            stack: list[str] = []
            hooks = torch.nn.modules.module

            def push(m: Any, a: Any) -> None:
                stack.append(names.get(id(m), "?" + type(m).__name__))

            def pop(m: Any, a: Any, o: Any) -> None:
                if stack:
                    stack.pop()

            handles = [
                hooks.register_module_forward_pre_hook(push),
                hooks.register_module_forward_hook(pop),
            ]
            summarise = _modtrace().summarise
            try:
                with _op_recorder(torch, summarise, stack, rows):
                    torch.func.functional_call(module, state, tuple(run_args), run_kwargs)
            except Exception as exc:  # noqa: BLE001 - the ops up to it are the answer
                header["error"] = "run: %s: %s" % (type(exc).__name__, exc)
            finally:
                for handle in handles:
                    handle.remove()
            header["ops"] = len(rows)
            header["truncated"] = len(rows) >= MAX_OPS
            return header, rows

        def _inputs(
            self, module: Any, args: Any, kwargs: Any, header: dict[str, Any]
        ) -> tuple[Any, Any, Any]:
            """The call's arguments and the module's weights: the side's own (detached;
            the reference saves them) or the reference's, loaded without unpickling.
            The header's ``input_sha256`` is the file's as saved, or as loaded: the
            laptop checks the target ran on the reference's very bytes (the file may
            have crossed from another host)."""
            own = dict(module.named_parameters())
            own.update(dict(module.named_buffers()))
            arg_tensors = _tensors((args, kwargs), torch)
            saved = spec.get("input")
            if not saved:
                if spec.get("save"):
                    blob = {
                        "arg.%d" % i: t.detach().cpu().clone() for i, t in enumerate(arg_tensors)
                    }
                    blob.update({"state." + k: v.detach().cpu().clone() for k, v in own.items()})
                    os.makedirs(os.path.dirname(str(spec["save"])) or ".", exist_ok=True)
                    torch.save(blob, str(spec["save"]))
                    header["input_sha256"] = _sha256(str(spec["save"]))
                detach = lambda t: t.detach()  # noqa: E731
                state = {k: v.detach() for k, v in own.items()}
                return (
                    _map_tensors(args, torch, detach),
                    _map_tensors(kwargs, torch, detach),
                    state,
                )
            with open(str(saved), "rb") as fh:
                # hashed in chunks, then loaded through the same open file: the bytes
                # hashed are the bytes loaded, without a second copy of a large input
                digest = hashlib.sha256()
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
                header["input_sha256"] = digest.hexdigest()
                fh.seek(0)
                blob = torch.load(fh, map_location="cpu", weights_only=True)
            count = len([k for k in blob if k.startswith("arg.")])
            if count != len(arg_tensors):
                raise ValueError(
                    "%d tensors in the reference's call, %d here" % (count, len(arg_tensors))
                )
            index = iter(range(count))

            def theirs(t: Any) -> Any:
                ref = blob["arg.%d" % next(index)]
                if list(ref.shape) != list(t.shape):
                    raise ValueError(
                        "shape %s on the reference, %s here" % (list(ref.shape), list(t.shape))
                    )
                return ref.to(t.device)

            run_args = _map_tensors(args, torch, theirs)
            run_kwargs = _map_tensors(kwargs, torch, theirs)
            state = {
                k: blob["state." + k].to(v.device) for k, v in own.items() if "state." + k in blob
            }
            return run_args, run_kwargs, state

        def _write(self, header: dict[str, Any], rows: list[Any]) -> None:
            """The op trace. Every Python process of the job runs a Drill (the spec is
            inherited), so the one that reached the call replaces the file whole, and
            one that did not only creates it where none is: a worker or a later
            ``python eval.py`` ending without the call never hides the real trace."""
            if self.written:
                return
            self.written = True
            path = str(spec["out"])
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            reached = header.get("reached", True) is not False
            tmp = "%s.%d.tmp" % (path, os.getpid())
            flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if reached else os.O_EXCL)
            try:
                fd = os.open(tmp if reached else path, flags, 0o600)
            except FileExistsError:
                return  # a trace is there already: never replaced by "not reached"
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(header) + "\n")
                for row in rows:
                    fh.write(json.dumps(row, allow_nan=False) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            if reached:
                os.replace(tmp, path)

        def stop(self, write: bool = True) -> None:
            """At exit without reaching the call: an op trace that says so."""
            if self.hooked is not None:
                with contextlib.suppress(Exception):
                    self.hooked.remove()
                self.hooked = None
            super().stop(write=False)
            if write and not self.written:
                with contextlib.suppress(Exception):
                    self._write(
                        {
                            "schema": DRILL_SCHEMA,
                            "device": device,
                            "step": self.at_step,
                            "path": self.at_path,
                            "call": self.at_call,
                            "reached": False,
                            "error": "the job never made that call",
                        },
                        [],
                    )

    drill = Drill()
    drill.install()
    return drill
