"""remotemac's ``sitecustomize`` for a job: observe every Python process that imports torch.

The runner copies this file as ``sitecustomize.py`` into a directory of its own and
puts that directory first on the job's ``PYTHONPATH``, so every Python interpreter
the job starts — ``cd src && python train.py``, ``bash run.sh``, torchrun's workers,
a subprocess — runs it at start-up. It is inert unless the process imports torch:
it only adds a finder to ``sys.meta_path`` that answers for the name ``torch`` and
nothing else (one string comparison per import), and when torch has finished
importing it starts observer.py (loaded by path from the agent's directory) and
takes itself out of ``sys.meta_path``.

``remotemac preflight`` uses the same hook on the laptop to trace every Python process of
a command: REMOTEMAC_OBSERVE_MODULE=optrace starts optrace.py instead of observer.py,
and REMOTEMAC_OBSERVE_MARK leaves ``py-<pid>`` in the directory for every Python
process, torch or not (so "no Python started" and "no torch imported" can be told apart).

It then runs the ``sitecustomize`` it hides (the next one on ``sys.path``, e.g.
Debian's), so the job behaves as it would without remotemac.

The MPS fallback variable is set (or cleared, ``fallback: off``) here, before torch
can be imported: PyTorch reads it when it registers the MPS fallback.

Standard library only, Python 3.9; must never raise into the user's interpreter.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
#: what may be started in a process that imports torch (REMOTEMAC_OBSERVE_MODULE)
_MODULES = ("observer", "optrace")


def _start_observer(torch, env_before_torch):
    agent = os.environ.get("REMOTEMAC_OBSERVE_AGENT") or ""
    name = os.environ.get("REMOTEMAC_OBSERVE_MODULE") or "observer"
    try:
        if name not in _MODULES:
            raise ValueError("unknown REMOTEMAC_OBSERVE_MODULE %r" % name)
        spec = importlib.util.spec_from_file_location(
            "_remotemac_" + name, os.path.join(agent, name + ".py")
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["_remotemac_" + name] = module
        spec.loader.exec_module(module)
        module.start(torch, env_before_torch)
    except Exception as exc:  # noqa: BLE001 - the job must run even if observing fails
        sys.stderr.write(
            "remotemac: could not observe this process (%s: %s)\n" % (type(exc).__name__, exc)
        )


class _ObservingLoader:
    """Runs torch's own loader, then starts the observer; everything else is delegated."""

    def __init__(self, inner, spec):
        self._inner = inner
        self._spec = spec

    def create_module(self, spec):
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        # torch sees its real loader (importlib.resources and friends ask it)
        module.__loader__ = self._inner
        self._spec.loader = self._inner
        self._inner.exec_module(module)
        _start_observer(module, True)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _TorchFinder:
    """A meta-path finder that only ever answers for ``torch``, once."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        with_us = sys.meta_path
        if self in with_us:
            with_us.remove(self)
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            return None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ObservingLoader(spec.loader, spec)
        return spec

    def invalidate_caches(self):
        pass


def _fallback_variable():
    mode = os.environ.get("REMOTEMAC_OBSERVE_FALLBACK")
    if mode == "diagnostic":
        os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"
    elif mode == "off":  # a missing op must fail, not silently run on the CPU
        os.environ.pop("PYTORCH_ENABLE_MPS_FALLBACK", None)


def _chain():
    """Run the sitecustomize this one hides, as site.py would have."""
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _mark(obs_dir):
    """``py-<pid>`` holding the interpreter's path: this Python process started."""
    path = os.path.join(obs_dir, "py-%d" % os.getpid())
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(sys.executable or "")


def _install():
    obs_dir = os.environ.get("REMOTEMAC_OBSERVE_DIR")
    if not obs_dir:
        return
    if os.environ.get("REMOTEMAC_OBSERVE_MARK"):
        _mark(obs_dir)
    _fallback_variable()
    torch = sys.modules.get("torch")
    if torch is not None:  # a .pth file imported torch before us: observe, say so
        _start_observer(torch, False)
    else:
        sys.meta_path.insert(0, _TorchFinder())


try:
    _install()
except Exception as _exc:  # noqa: BLE001
    sys.stderr.write("remotemac: observer hook not installed (%s)\n" % _exc)
_chain()
