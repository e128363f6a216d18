"""The divergence trace: a summary of every module call's output for the first N steps.

Loaded by observer.py only when the playbook asks for it (``workload.trace: {steps: N}``,
the job's ``REMOTEMAC_TRACE_STEPS``); when tracing is off this file is not even read,
so no hook is registered and nothing is imported.

Why module-level and not operator-level: after a few optimizer steps every weight of
the two sides differs, so a results diff names where a difference *ended up*. The
first module whose output differs while its input did not is where it *started*; the
laptop (acceptance/divergence.py) finds it by comparing the two sides' traces.

What is recorded, through torch's global module hooks (``register_module_forward_pre_hook``
and ``register_module_forward_hook``), for each module call in completion order (a
child's record comes before its parent's): the module's path from the root model
(``transformer.h.1.mlp``; the root model itself is ``""``; a module called several times in a step is keyed by its call
index), its class, the file:line of its ``forward`` (``src``) and the file:line that
built it (``built``: while the trace is on, ``nn.Module.__init__`` is wrapped and notes,
in a weak map beside the module, never on it, the first caller outside torch that is not
the module's own ``__init__``; the observer loads before the model is built; the
original ``__init__`` is put back when the trace stops), and a summary of its first tensor
output and first tensor input: shape, dtype, device, sum and abs-max over the finite
values, NaN and Inf counts and a fixed strided sample of ``SAMPLE`` values.

A *step* is one top-level forward of the root model: the module of the first
top-level call this process makes to a module that holds parameters (so a torchvision
transform, an ``nn.Module`` without weights run on the batch first, is not taken for
the model). Other top-level calls (a loss module called after the model) belong to the
step in progress, under ``<ClassName>``; before the first step they are not recorded. The trace stops when
the root model is called for the (N+1)-th time (the hooks are removed: from there on
it costs nothing), or at exit.

The backward of each traced step is recorded too, as rows with ``"pass": "backward"``
keyed like the forward's (path, call index): for each module call whose output needs
a gradient, a hook on its output tensor notes the gradient that comes into its
backward (``in``) and a hook on its first input tensor the gradient it hands on
(``out``); the row is written when its call's backward is complete, in the order the
gradients are made (``i``). Tensor hooks, not module backward hooks (see
``_watch_backward``); a backward that runs after the next step's forward (gradient
accumulation over several forwards) is recorded only while the trace is on.

Only the first process of the job that runs a forward writes the trace (the file is
created exclusively); a second Python process of the same job and a forked child
(a DataLoader worker running a transform) are not traced.

Standard library only, Python 3.9; torch is the workload's own, handed in.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for the annotations only: this file also runs on its own
    from .protocol import JsonObject

TRACE_SCHEMA = "remotemac.trace/1"
#: values sampled from each tensor, at a fixed stride over its flattened elements
SAMPLE = 16
#: the last outputs kept with their summary: a module's input is most often one of them
RECENT = 8
#: a runaway trace (a model of thousands of modules, many steps) stops here
MAX_RECORDS = 200_000


def _first_tensor(obj: Any, torch: Any, depth: int = 0) -> Any:
    """The first tensor in a module's args or output (tuples, lists, dicts, nested)."""
    if isinstance(obj, torch.Tensor):
        return obj
    if depth < 3 and isinstance(obj, (list, tuple)):
        for item in obj:
            found = _first_tensor(item, torch, depth + 1)
            if found is not None:
                return found
    if depth < 3 and isinstance(obj, dict):
        for item in obj.values():
            found = _first_tensor(item, torch, depth + 1)
            if found is not None:
                return found
    return None


def summarise(t: Any, torch: Any) -> JsonObject | None:
    """Shape, dtype, device and the numbers the laptop compares, in one device sync."""
    if t is None:
        return None
    out: JsonObject = {
        "shape": list(t.shape),
        "dtype": str(t.dtype).replace("torch.", ""),
        "device": str(t.device),
    }
    n = t.numel()
    if n == 0 or t.is_complex():
        return out
    with torch.no_grad():
        x = t.detach().reshape(-1)
        if not x.is_floating_point():
            x = x.to(torch.float32)
        nan = torch.isnan(x).sum()
        inf = torch.isinf(x).sum()
        finite = torch.nan_to_num(x.float(), nan=0.0, posinf=0.0, neginf=0.0)
        stride = max(1, n // SAMPLE)
        idx = torch.arange(0, min(n, stride * SAMPLE), stride, device=x.device)
        sample = x.float().index_select(0, idx)
        head = torch.stack(
            [finite.sum(), finite.abs().max(), nan.to(torch.float32), inf.to(torch.float32)]
        )
        values = torch.cat([head, sample]).cpu().tolist()
    out.update(
        {
            "sum": values[0],
            "absmax": values[1],
            "nan": int(values[2]),
            "inf": int(values[3]),
            "stride": stride,
            "sample": [_json_float(v) for v in values[4:]],
        }
    )
    return out


def _json_float(v: float) -> Any:
    """NaN and Inf as strings: the trace is strict JSON."""
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf" if v > 0 else "-inf"
    return v


def _source(module: Any) -> str | None:
    """file:line of the module class's ``forward`` (where the layer's code is)."""
    code = getattr(getattr(type(module), "forward", None), "__code__", None)
    if code is None:
        return None
    return "%s:%d" % (os.path.basename(code.co_filename), code.co_firstlineno)


def _builder(module: Any, skip: str) -> str | None:
    """file:line of the first caller outside torch (``skip``, its package directory)
    whose ``self`` is not ``module``: the line that built it."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(skip) and frame.f_locals.get("self") is not module:
            return "%s:%d" % (os.path.basename(code.co_filename), frame.f_lineno)
        frame = frame.f_back
    return None


def _has_parameters(module: Any) -> bool:
    """Whether a module holds weights: the model does, a torchvision transform does not."""
    try:
        next(module.parameters())
    except (StopIteration, AttributeError, TypeError):
        return False
    return True


class ModuleTrace:
    """Global forward hooks that summarise each module call for the first ``steps`` steps."""

    def __init__(self, torch: Any, path: str, steps: int, device: str) -> None:
        self.torch = torch
        self.path = path
        self.steps = steps
        self.device = device
        self.root: Any = None
        self.step = -1
        self.depth = 0
        self.names: dict[int, str] = {}
        self.calls: dict[str, int] = {}
        self.order = 0
        self.lines: list[str] = []
        self.records = 0
        self.handles: list[Any] = []
        self.fh: Any = None
        self.done = False
        self.sources: dict[type, str | None] = {}
        #: module -> the file:line that built it (weak: the trace keeps no module alive)
        self.built: Any = weakref.WeakKeyDictionary()
        #: (torch's ``nn.Module.__init__``, the wrapper put in its place)
        self.init: tuple[Any, Any] | None = None
        self.pid = os.getpid()
        #: (tensor, its version counter, summary) of the last RECENT outputs
        self.recent: list[tuple[Any, int, JsonObject | None]] = []
        #: backward calls recorded so far in each step (their order, as the hooks fire)
        self.border: dict[int, int] = {}
        #: (gradient, summary) of the last RECENT gradients: hooks on one tensor share it
        self.recent_grads: list[tuple[Any, JsonObject | None]] = []

    def install(self) -> None:
        hooks = self.torch.nn.modules.module
        self.handles.append(hooks.register_module_forward_pre_hook(self._pre))
        try:
            self.handles.append(hooks.register_module_forward_hook(self._post, always_call=True))
        except TypeError:  # torch < 2.1: no always_call
            self.handles.append(hooks.register_module_forward_hook(self._post))
        self._wrap_init()

    def _wrap_init(self) -> None:
        """Wrap ``nn.Module.__init__`` to note where each module is built."""
        module_cls = self.torch.nn.Module
        original = module_cls.__init__
        skip = os.path.dirname(os.path.abspath(self.torch.__file__)) + os.sep
        built = self.built

        def __init__(module: Any, *args: Any, **kwargs: Any) -> None:
            original(module, *args, **kwargs)
            if not self.done:
                with contextlib.suppress(Exception):  # never break the model's build
                    if module not in built:
                        built[module] = _builder(module, skip)

        __init__.__doc__ = original.__doc__
        __init__.__qualname__ = getattr(original, "__qualname__", "Module.__init__")
        module_cls.__init__ = __init__
        self.init = (original, __init__)

    def _unwrap_init(self) -> None:
        """Put torch's ``__init__`` back, unless someone wrapped ours since."""
        if self.init is None:
            return
        original, wrapper = self.init
        module_cls = self.torch.nn.Module
        if module_cls.__dict__.get("__init__") is wrapper:
            module_cls.__init__ = original
        self.init = None

    def _names_for(self, top: Any, prefix: str) -> dict[int, str]:
        names = {}
        for name, module in top.named_modules():
            full = (prefix + "." + name if prefix and name else prefix) or name
            names.setdefault(id(module), full)
        return names

    def _pre(self, module: Any, args: Any) -> None:
        if self.done:
            return
        if self.depth == 0:
            with contextlib.suppress(Exception):
                self._top_level(module)
        self.depth += 1

    def _top_level(self, module: Any) -> None:
        if os.getpid() != self.pid:  # a forked child (a DataLoader worker): not traced
            self.stop(write=False)
            return
        if self.root is None and _has_parameters(module):
            self.root = module
        if module is self.root:
            self._flush()
            self.step += 1
            if self.step >= self.steps:
                self.stop()
                return
            self.calls = {}
            self.order = 0
            self.recent = []
            self.recent_grads = []
            self.names = self._names_for(module, "")
        elif self.step >= 0:
            self.names.update(self._names_for(module, "<%s>" % type(module).__name__))

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self.done or self.depth == 0:
            return
        self.depth -= 1
        if self.step < 0:
            return
        with contextlib.suppress(Exception):  # a tracer bug must never break the workload
            self._record(module, args, output)

    def _record(self, module: Any, args: Any, output: Any) -> None:
        torch = self.torch
        path = self.names.get(id(module))
        if path is None:  # made on the fly, outside the model's tree
            path = "?" + type(module).__name__
        call = self.calls.get(path, 0)
        self.calls[path] = call + 1
        kind = type(module)
        if kind not in self.sources:
            self.sources[kind] = _source(module)
        row = {
            "step": self.step,
            "i": self.order,
            "path": path,
            "call": call,
            "cls": kind.__name__,
            "src": self.sources[kind],
            "built": self._built(module),
            "out": self._summary(_first_tensor(output, torch), True),
            "in": self._summary(_first_tensor(args, torch), False),
        }
        self.order += 1
        self._write(row)
        if torch.is_grad_enabled():
            self._watch_backward(row, output, args)

    def _write(self, row: JsonObject) -> None:
        self.lines.append(json.dumps(row, allow_nan=False))
        self.records += 1
        if self.records >= MAX_RECORDS:
            self.stop()

    def _watch_backward(self, row: JsonObject, output: Any, args: Any) -> None:
        """Tensor hooks that record this call's backward: the gradient of its output
        (what comes into its backward) and of its first input (what leaves it).

        Hooks on the tensors, not ``register_module_full_backward_hook``: those wrap
        every module's inputs and outputs in an autograd Function, and an in-place op
        on such a view (``nn.ReLU(inplace=True)``, ``out += identity``) then raises in
        the user's code. A tensor hook only observes. Its limit: an input several
        modules read gets one gradient, their sum; the row is written when it is
        complete (the hook fires once the tensor's gradient is whole)."""
        torch = self.torch
        out_t = _first_tensor(output, torch)
        if out_t is None or not out_t.requires_grad:
            return
        in_t = _first_tensor(args, torch)
        if in_t is not None and not (in_t.requires_grad and in_t.is_floating_point()):
            in_t = None
        back = {k: row[k] for k in ("step", "path", "call", "cls", "src", "built")}
        back["pass"] = "backward"
        back["out"] = None
        back["in"] = None

        def grad_out(grad: Any) -> None:
            if self.done:
                return
            with contextlib.suppress(Exception):
                back["in"] = self._grad_summary(grad)
                if in_t is None:  # nothing to hand a gradient to: the call ends here
                    self._write_backward(back)

        def grad_in(grad: Any) -> None:
            if self.done:
                return
            with contextlib.suppress(Exception):
                back["out"] = self._grad_summary(grad)
                self._write_backward(back)

        out_t.register_hook(grad_out)
        if in_t is not None:
            in_t.register_hook(grad_in)

    def _write_backward(self, back: JsonObject) -> None:
        step = int(back["step"])
        order = self.border.get(step, 0)
        self.border[step] = order + 1
        back["i"] = order
        self._write(back)

    def _grad_summary(self, grad: Any) -> JsonObject | None:
        """``summarise`` once per gradient: the hooks of one tensor get the same one."""
        if grad is None:
            return None
        for seen, summary in self.recent_grads:
            if seen is grad:
                return summary
        summary = summarise(grad, self.torch)
        self.recent_grads.append((grad, summary))
        del self.recent_grads[:-RECENT]
        return summary

    def _built(self, module: Any) -> str | None:
        try:
            return self.built.get(module)
        except TypeError:  # a module class that defines __eq__ without __hash__
            return None

    def _summary(self, t: Any, keep: bool) -> JsonObject | None:
        """``summarise``, reusing the summary of a recent output when ``t`` is that same
        unchanged tensor (a block's input is the previous block's output)."""
        if t is None:
            return None
        version = getattr(t, "_version", None)
        for seen, seen_version, summary in self.recent:
            if seen is t and seen_version == version:
                return summary
        summary = summarise(t, self.torch)
        if keep:
            self.recent.append((t, version, summary))
            del self.recent[:-RECENT]
        return summary

    def _open(self) -> bool:
        if self.fh is not None:
            return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError:  # another process of the job is the one traced
            self.stop(write=False)
            return False
        self.fh = os.fdopen(fd, "w")
        header = {
            "schema": TRACE_SCHEMA,
            "pid": os.getpid(),
            "device": self.device,
            "steps": self.steps,
            "sample": SAMPLE,
            "torch": getattr(self.torch, "__version__", None),
            "started_at": time.time(),
        }
        self.fh.write(json.dumps(header) + "\n")
        return True

    def _flush(self) -> None:
        if not self.lines or not self._open():
            return
        self.fh.write("\n".join(self.lines) + "\n")
        self.fh.flush()
        self.lines = []

    def stop(self, write: bool = True) -> None:
        """Remove the hooks and write what is left (also the observer's atexit)."""
        if self.done:
            return
        self.done = True
        for handle in self.handles:
            with contextlib.suppress(Exception):
                handle.remove()
        self.handles = []
        with contextlib.suppress(Exception):
            self._unwrap_init()
        self.recent = []
        self.recent_grads = []
        if write:
            with contextlib.suppress(Exception):
                self._flush()
        if self.fh is not None:
            with contextlib.suppress(Exception):
                self.fh.close()
            self.fh = None


def start(torch: Any, path: str, steps: int, device: str) -> ModuleTrace:
    """Register the hooks; the caller stops the trace at exit."""
    trace = ModuleTrace(torch, path, steps, device)
    trace.install()
    return trace
