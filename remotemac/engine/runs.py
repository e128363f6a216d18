"""A run's journal row: created once by ``run`` (CLI, TUI, fleet), loaded by ``attach``.

One place so that every front end stores the same playbook, options and paths,
and ``attach`` rebuilds exactly the playbook the run started with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from remotemac.errors import BadInput
from remotemac.journal import Journal, RunRow
from remotemac.playbook import Playbook


def register_run(journal: Journal, run_id: str, playbook: Playbook, out_dir: Path, *,
                 source: Playbook | None = None, host: str | None = None,
                 options: dict[str, Any] | None = None) -> None:
    """Record a new run; ``source`` is the playbook file's model when ``playbook`` is derived."""
    origin = source or playbook
    journal.create_run(run_id, name=playbook.name, host=host or playbook.host,
                       playbook_path=str(origin.source) if origin.source else None,
                       playbook=playbook.model_dump(mode="json"), out_dir=str(out_dir),
                       options=dict(options or {}))


def load_run(journal: Journal, run_id: str) -> tuple[RunRow, Playbook]:
    """The journal row and the playbook the run started with (exit 2 if unknown)."""
    row = journal.get_run(run_id)
    if row is None:
        raise BadInput(f"unknown run id {run_id!r} (see: remotemac status)")
    pb = Playbook.model_validate(row.playbook)
    if row.playbook_path:
        pb._base_dir = Path(row.playbook_path).parent
        pb._source = Path(row.playbook_path)
    return row, pb
