"""How every process of the agent starts on the host: one boot, the agent as a package.

Why one boot: the agent's modules import each other relatively (``from . import
safefs``), so they must load as one package, never as loose scripts whose imports
depend on the directory they happen to run from. :data:`BOOT` (``python3 -c``) makes
the agent directory named in ``argv[1]`` the package :data:`PACKAGE`, imports the module
that path names and calls its ``main(args)``. The laptop starts the resident agent, the
one-shot ``hostagent`` and the sync receiver with it (engine/agentship.py); the agent
starts the job's runner and the dead-man with it (:func:`agent_argv`). An imported
module loads from the bytecode its first start cached beside it (``__pycache__``),
where a script is compiled on every start.

``-c`` puts the current directory first on ``sys.path``: the boot takes it off
before it imports anything (a job's directory may hold a ``types.py``).
The path stays in argv (``<agent dir>/runner.py …``): wipe and cleanup recognise the
agent's own processes by it. One line, no newline: ``ps`` output is read line by line.

Modules that run inside the workload's interpreter (harness, optrace, ckptconvert,
jobsite, observer) are not started this way: they load what they need by path under
private names, so a user module of the same name is neither shadowed nor used.
Standard library only, Python 3.9.
"""

from __future__ import annotations

from typing import List

#: the agent's package name on the host (``remotemac.agent`` on the laptop)
PACKAGE = "rmagent"

BOOT = (
    "import sys;sys.path[:1]=[p for p in sys.path[:1] if p];import importlib,types;"
    "d,_,f=sys.argv[1].rpartition('/');p=types.ModuleType('rmagent');p.__path__=[d];"
    "sys.modules['rmagent']=p;"
    "sys.exit(importlib.import_module('rmagent.'+f[:-3]).main(sys.argv[2:]))"
)


def agent_argv(
    python: str, agent_dir: str, module: str, *args: str, site: bool = False
) -> List[str]:
    """The argv that runs ``module.main(args)`` of the agent in ``agent_dir`` under ``python``.

    ``site``: keep site-packages (the runner: the job's environment is its own);
    without it ``-S``: stdlib only, and a host Python with a large site costs
    0.2-0.4 s per start.
    """
    return (
        [python]
        + ([] if site else ["-S"])
        + ["-c", BOOT, "%s/%s.py" % (agent_dir, module)]
        + list(args)
    )
