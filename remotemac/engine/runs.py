"""A run's journal row: created once by ``run`` (CLI, TUI, fleet), loaded by ``attach``.

One place so that every front end stores the same playbook, options and paths,
and ``attach`` rebuilds exactly the playbook the run started with.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from remotemac.errors import BadInput
from remotemac.journal import Journal, RunRow
from remotemac.playbook import Playbook


def register_run(
    journal: Journal,
    run_id: str,
    playbook: Playbook,
    out_dir: Path,
    *,
    source: Playbook | None = None,
    host: str | None = None,
    options: dict[str, Any] | None = None,
) -> None:
    """Record a new run; ``source`` is the playbook file's model when ``playbook`` is derived."""
    origin = source or playbook
    journal.create_run(
        run_id,
        name=playbook.name,
        host=host or playbook.host,
        playbook_path=str(origin.source) if origin.source else None,
        playbook=playbook.model_dump(mode="json"),
        out_dir=str(out_dir),
        options=dict(options or {}),
    )


LATEST = ("latest", "last")
_SHOW_CANDIDATES = 5


def resolve_run_id(journal: Journal, text: str) -> str:
    """The full run id the user means: the id itself, ``latest``, or any unique part of it.

    As with git's short hashes, ``7299`` (the random suffix), a unique prefix
    such as ``quickstart-2026113`` or any other unique piece works; the most
    specific kind of match wins (exact, suffix, prefix, anywhere), and an
    ambiguous part is an error that lists the candidates.
    """
    text = text.strip()
    if not text:
        raise BadInput("empty run id", hint="see: remotemac status")
    if journal.get_run(text) is not None:
        return text
    ids = [r.run_id for r in journal.list_runs(limit=1_000_000)]
    if text.lower() in LATEST:
        if not ids:
            raise BadInput(
                "no runs yet, so no latest run", hint="start one: remotemac run PLAYBOOK"
            )
        return ids[0]  # list_runs is newest first
    for matches in (
        [i for i in ids if i.endswith("-" + text)],
        [i for i in ids if i.startswith(text)],
        [i for i in ids if text in i],
    ):
        if len(matches) == 1:
            return matches[0]
        if matches:
            shown = ", ".join(matches[:_SHOW_CANDIDATES])
            more = (
                f" and {len(matches) - _SHOW_CANDIDATES} more"
                if len(matches) > _SHOW_CANDIDATES
                else ""
            )
            raise BadInput(
                f"run id {text!r} is ambiguous: {len(matches)} runs match ({shown}{more})",
                hint="give more of the id",
            )
    raise BadInput(f"unknown run id {text!r}", hint="see: remotemac status")


def load_run(journal: Journal, run_id: str) -> tuple[RunRow, Playbook]:
    """The journal row and the playbook the run started with (exit 2 if unknown).

    ``run_id`` may be any form :func:`resolve_run_id` takes; ``row.run_id`` is the full id.
    """
    row = journal.get_run(resolve_run_id(journal, run_id))
    if row is None:
        raise BadInput(f"unknown run id {run_id!r} (see: remotemac status)")
    pb = Playbook.model_validate(row.playbook)
    if row.playbook_path:
        pb._base_dir = Path(row.playbook_path).parent
        pb._source = Path(row.playbook_path)
    return row, pb


#: what a run writes at the top of its --out dir (docs/contract.md, "What lands locally")
RECORD_FILES = ("acceptance.json", "manifest.json", "ledger.jsonl")


def refuse_used_out_dir(out_dir: Path) -> None:
    """``--out`` must not be an earlier run's dir: its record and logs would be
    overwritten and its ledger mixed with the new run's (exit 2, nothing touched); and
    it must be a dir this user can make (else exit 2, not an internal error)."""
    found = [name for name in RECORD_FILES if (out_dir / name).exists()]
    logs = out_dir / "logs"
    if logs.is_dir() and any(logs.iterdir()):
        found.append("logs/")
    if found:
        raise BadInput(
            f"--out {out_dir} holds another run's record ({', '.join(found)}): "
            "this run would overwrite it",
            hint="give a new or empty dir, or leave --out out (default: ./runs/<run-id>)",
        )
    try:  # before the run is registered: a dir that cannot be made is bad input
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(
            f"--out {out_dir}: cannot create it ({exc.strerror or exc})",
            hint="give a directory you can write",
        ) from None


def remove_made_dirs(made: list[Path]) -> None:
    """Remove the directories a run made (deepest first), each only while empty: a run
    forgotten because its host was never reached leaves no ``./runs/<id>/``."""
    for path in made:
        with contextlib.suppress(OSError):
            path.rmdir()


def shown_state(journal: Journal, row: RunRow) -> str:
    """The run's state as the user should read it: a ``running`` run whose remotemac
    process died (SIGKILL, a closed terminal, a crash, a reboot) is ``interrupted``:
    the host runs on, nothing follows it here, ``remotemac attach`` goes on with it."""
    if row.state == "running" and journal.run_driver(row.run_id) is None:
        return "interrupted"
    return row.state


_DONE_WORD = {"pull": "pulled", "wipe": "wiped"}


def phase_already_done(journal: Journal, run_id: str, phase: str) -> str | None:
    """Why ``pull``/``wipe`` by hand must not run again on this run (None: go ahead).

    Running a finished phase again would overwrite the result the record was
    built from ("0 files verified" after a wipe); so a done phase is reported,
    not redone. A pull after the wipe is an error: the outputs are gone from the host.
    """
    phases = journal.phases(run_id)

    def done(name: str) -> bool:  # a wipe kept by ``wipe: manual`` is "done" but did nothing
        info = phases.get(name) or {}
        return info.get("state") == "done" and (info.get("result") or {}).get("done") is not False

    if phase == "pull" and done("wipe"):
        raise BadInput(
            f"run {run_id} was wiped: its outputs are gone from the host, nothing to pull",
            hint="what was pulled before the wipe is in its --out dir",
        )
    if not done(phase):
        return None
    info = phases[phase]
    summary = (info.get("result") or {}).get("summary")
    return (
        f"run {run_id} is already {_DONE_WORD.get(phase, phase + ' done')}"
        + (f" ({summary})" if summary else "")
        + "; nothing to do"
    )
