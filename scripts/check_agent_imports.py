#!/usr/bin/env python3
"""Check that the agent (remotemac/agent) imports only the standard library and itself.

The agent is copied to a rented Mac and run by whatever Python 3.9 is there, with nothing
installed: an import of a third-party package or of the rest of remotemac would fail on
the host, not here, where everything is installed. This reads every import statement
(including those inside functions) with ``ast`` and allows:

- standard-library modules (``sys.stdlib_module_names``);
- the agent's own modules, by bare name (``import safefs``: the agent runs from its own
  directory) or as ``remotemac.agent.X`` / relative imports.

A lazy import of what the host provides at run time (the workload's torch, the agent
runtime's cryptography) carries ``# agent-imports: lazy`` on its line and is allowed.

Exit 0 when clean, 1 with one line per violation (file:line: module) otherwise.
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


def main() -> int:
    found = violations()
    for line in found:
        print(f"{line}: the agent may import only the standard library and itself")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
