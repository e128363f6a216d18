"""Terminal front ends of the CLI: every rich table, coloured line and click prompt.

The engine and the checks return data and emit events; the modules here render them.
Only this package, remotemac.cli, remotemac.render and remotemac.tui import rich, click
or textual (checked by import-linter: see ``[tool.importlinter]`` in pyproject.toml).
"""
