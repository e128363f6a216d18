"""The modules a run's later phases import, imported while it waits for the network.

Why (issue 36): the phases import what they need when they start (the compare's
numpy, the record's renderers, the pull, the wipe): 0.2-0.5 s of CPU on the
critical path of a trivial run, paid between two round trips. From the moment the
run starts connecting, the laptop mostly waits (the key exchange, the host's Python
starts, the job): a daemon thread imports them then, each at most once (Python's
import lock makes a phase that needs a module first wait for it, never import it
twice). Nothing is imported that a run would not import anyway; a module that fails
to import here fails again, with its error, where it is needed.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading

#: in the order the phases need them
LATER: tuple[str, ...] = (
    "remotemac.engine.provision",
    "remotemac.engine.storage",
    "remotemac.engine.jobs",
    "remotemac.engine.drift",
    "remotemac.engine.pullstream",
    "remotemac.engine.pull",
    "remotemac.engine.wipe",
    "remotemac.acceptance.compare",
    "remotemac.engine.record",
    "remotemac.acceptance.decide",
    "remotemac.acceptance.record",
)


def warm_imports(names: tuple[str, ...] = LATER) -> threading.Thread:
    """Start importing ``names`` in a daemon thread (it never holds the process up)."""

    def run() -> None:
        for name in names:
            if name not in sys.modules:
                with contextlib.suppress(Exception):
                    importlib.import_module(name)

    thread = threading.Thread(target=run, name="remotemac-warm-imports", daemon=True)
    thread.start()
    return thread
