#!/usr/bin/env python3
"""Check that the agent (remotemac/agent) imports only the standard library and itself.

The agent is copied to a rented Mac and run by whatever Python 3.9 is there, with nothing
installed: an import of a third-party package or of the rest of remotemac would fail on
the host, not here, where everything is installed. This reads every import statement
(including those inside functions) with ``ast`` and allows:

- standard-library modules (``sys.stdlib_module_names``);
- the agent's own modules, relatively (``from . import safefs``): on the host the agent
  runs as one package (agent/shared.py); an import of one by name fails there, and is
  reported by :func:`absolute_sibling_imports`.

A lazy import of what the host provides at run time (the workload's torch, the agent
runtime's cryptography) carries ``# agent-imports: lazy`` on its line and is allowed.

It also checks the in-memory bootstrap's load order (engine/agentship.py's
IN_MEMORY_ORDER): each module after every sibling it imports when it loads, and each
entry's shipped prefix holding every sibling its modules import inside functions, so a
module that gains an import fails here and not on a host in the middle of a cleanup.

What import-linter can say is a contract in pyproject.toml ("the agent imports neither
the rest of remotemac nor the laptop's third-party packages", a forbid list); this script
keeps what it cannot: the allow list (standard library or the agent, nothing else, so a
package nobody thought to forbid fails too) and the bootstrap's order.

Exit 0 when clean, 1 with one line per violation otherwise.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# the audit's parser: it pauses the collector around ast.parse (CPython 3.11.7's spurious
# "AST constructor recursion depth mismatch" when finalizers run mid-parse)
from remotemac.checks.audit_rules.parsing import parse_source  # noqa: E402

AGENT = Path(__file__).resolve().parent.parent / "remotemac" / "agent"
WAIVER = "agent-imports: lazy"


def violations(agent_dir: Path = AGENT) -> list[str]:
    """Every import in ``agent_dir`` that is neither stdlib nor the agent's own."""
    own = {path.stem for path in agent_dir.glob("*.py")}
    allowed = set(sys.stdlib_module_names) | own | {"__future__"}
    found: list[str] = []
    for path in sorted(agent_dir.glob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(parse_source(source, filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: inside the agent package
                    continue
                names = [node.module or ""]
            else:
                continue
            if WAIVER in lines[node.lineno - 1]:
                continue
            for name in names:
                if name == "remotemac.agent" or name.startswith("remotemac.agent."):
                    continue
                if name.split(".")[0] not in allowed:
                    found.append(
                        f"{path.relative_to(agent_dir.parent.parent)}:{node.lineno}: {name}"
                    )
    return found


#: agent modules the host runs as plain scripts (``python3 -S pullops.py send``: a pull
#: channel's sender starts without the package boot, and a test replaces it by a hostile
#: script); they import ``protocol`` by name when run so, relatively when imported
SCRIPTS = {"pullops.py"}


def absolute_sibling_imports(agent_dir: Path = AGENT) -> list[str]:
    """Every import of an agent module by name (``import safefs``, ``remotemac.agent.X``).

    On the host the agent is the package ``rmagent`` (agent/shared.py): a sibling is
    reached relatively (``from . import safefs``), or the import fails there (a bare name
    is not on its ``sys.path``, ``remotemac`` is not installed) and not here.

    One exception, :data:`SCRIPTS`: a module the host runs as a plain script, whose
    directory is then its ``sys.path[0]``, so a bare sibling name is what works there.
    """
    own = {path.stem for path in agent_dir.glob("*.py")}
    found: list[str] = []
    for path in sorted(agent_dir.glob("*.py")):
        if path.name in SCRIPTS:
            continue
        tree = parse_source(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                bare = name.removeprefix("remotemac.agent.")
                if name == "remotemac.agent" or bare.split(".")[0] in own:
                    rel = path.relative_to(agent_dir.parent.parent)
                    found.append(
                        f"{rel}:{node.lineno}: {name}: import the agent's own modules relatively"
                    )
    return found


def _siblings(node: ast.Import | ast.ImportFrom, own: set[str]) -> set[str]:
    """The agent modules one import statement names (bare, ``remotemac.agent.X`` or relative)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif node.level or node.module == "remotemac.agent":  # from . / remotemac.agent import X
        names = [node.module or ""] if node.level and node.module else []
        names += [alias.name for alias in node.names]
    else:
        names = [node.module or ""]
    found = set()
    for name in names:
        name = name.removeprefix("remotemac.agent.")
        if name.split(".")[0] in own:
            found.add(name.split(".")[0])
    return found


def sibling_imports(agent_dir: Path = AGENT) -> dict[str, tuple[set[str], set[str]]]:
    """Per agent module: (siblings imported when it loads, siblings imported in a function)."""
    own = {path.stem for path in agent_dir.glob("*.py")}
    graph: dict[str, tuple[set[str], set[str]]] = {}
    for path in sorted(agent_dir.glob("*.py")):
        load: set[str] = set()
        late: set[str] = set()

        def visit(node: ast.AST, in_function: bool, load=load, late=late) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    (late if in_function else load).update(_siblings(child, own))
                nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, in_function or nested)

        visit(parse_source(path.read_text(), filename=str(path)), False)
        graph[path.stem] = (load - {path.stem}, late - load - {path.stem})
    return graph


def bootstrap_violations(
    order: tuple[str, ...], entries: tuple[str, ...], agent_dir: Path = AGENT
) -> list[str]:
    """Where the in-memory bootstrap's order would fail on a host (see the docstring)."""
    graph = sibling_imports(agent_dir)
    found: list[str] = []
    for i, name in enumerate(order):
        if name not in graph:
            found.append(f"IN_MEMORY_ORDER names {name}, which is not an agent module")
            continue
        for dep in sorted(graph[name][0] - set(order[:i])):
            found.append(
                f"IN_MEMORY_ORDER: {name} imports {dep} when it loads: put {dep} before {name}"
            )
    for entry in entries:
        if entry not in order:
            found.append(f"IN_MEMORY_ENTRIES names {entry}, which IN_MEMORY_ORDER lacks")
            continue
        shipped = order[: order.index(entry) + 1]
        for name in shipped:
            _, late = graph.get(name, (set(), set()))
            for dep in sorted(late - set(shipped)):  # load-time ones: checked above
                found.append(
                    f"IN_MEMORY_ORDER: a call into {entry} ships {shipped[0]}..{entry}, "
                    f"but {name} imports {dep}: put {dep} before {entry}"
                )
    return found


def main() -> int:
    from remotemac.engine.agentship import IN_MEMORY_ENTRIES, IN_MEMORY_ORDER

    found = violations()
    for line in found:
        print(f"{line}: the agent may import only the standard library and itself")
    found += absolute_sibling_imports()
    for line in absolute_sibling_imports():
        print(line)
    order = bootstrap_violations(IN_MEMORY_ORDER, IN_MEMORY_ENTRIES)
    for line in order:
        print(line)
    return 1 if found or order else 0


if __name__ == "__main__":
    sys.exit(main())
