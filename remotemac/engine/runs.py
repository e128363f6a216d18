"""A run's journal row: created once by ``run`` (CLI, TUI, fleet), loaded by ``attach``.

One place so that every front end stores the same playbook, options and paths,
and ``attach`` rebuilds exactly the playbook the run started with.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from pathlib import Path

from remotemac.agent.protocol import JsonObject
from remotemac.engine.phaseresults import PhaseRow, WipeResult, from_journal
from remotemac.errors import BadInput
from remotemac.journal import Journal, RunRow
from remotemac.phases import Phase
from remotemac.playbook import Playbook


def register_run(
    journal: Journal,
    run_id: str,
    playbook: Playbook,
    out_dir: Path,
    *,
    source: Playbook | None = None,
    host: str | None = None,
    options: JsonObject | None = None,
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


#: the file a run creates, exclusively, in its --out dir before it is registered
OUT_CLAIM = ".remotemac-run"
_USED_HINT = "give a new or empty dir, or leave --out out (default: ./runs/<run-id>)"


def refuse_used_out_dir(out_dir: Path, run_id: str | None = None) -> None:
    """``--out`` must not be an earlier run's dir: its record and logs would be
    overwritten and its ledger mixed with the new run's (exit 2, nothing touched); and
    it must be a dir this user can make (else exit 2, not an internal error).

    With ``run_id`` the dir is claimed for that run by an exclusive create of
    ``.remotemac-run`` (holding the id) *before* it is looked at: of two runs started at
    once with one ``--out`` exactly one gets it, the other is refused up front (a
    look-then-write let both in, into one mixed dir). The claim stays: the dir is that
    run's for good, as its record and logs would make it anyway.
    """
    try:  # before the run is registered: a dir that cannot be made is bad input
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(
            f"--out {out_dir}: cannot create it ({exc.strerror or exc})",
            hint="give a directory you can write",
        ) from None
    claimed = False
    if run_id is not None:
        claimed = _claim(out_dir, run_id)
    found = [name for name in RECORD_FILES if (out_dir / name).exists()]
    logs = out_dir / "logs"
    if logs.is_dir() and any(logs.iterdir()):
        found.append("logs/")
    if found:
        if claimed:
            (out_dir / OUT_CLAIM).unlink(missing_ok=True)
        raise BadInput(
            f"--out {out_dir} holds another run's record ({', '.join(found)}): "
            "this run would overwrite it",
            hint=_USED_HINT,
        )


def _claim(out_dir: Path, run_id: str) -> bool:
    """Create ``out_dir/.remotemac-run`` for ``run_id`` (O_EXCL); BadInput if it is taken."""
    path = out_dir / OUT_CLAIM
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    except FileExistsError:
        try:
            owner = path.read_text(encoding="utf-8", errors="replace").strip()[:200]
        except OSError:
            owner = ""
        raise BadInput(
            f"--out {out_dir} is taken by run {owner or '(unknown)'}: two runs never "
            "share an output dir",
            hint=_USED_HINT,
        ) from None
    except OSError as exc:
        raise BadInput(
            f"--out {out_dir}: cannot write in it ({exc.strerror or exc})",
            hint="give a directory you can write",
        ) from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(run_id + "\n")
    return True


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def remove_made_dirs(made: list[Path]) -> None:
    """Remove the directories a run made (deepest first), each only while empty: a run
    forgotten because its host was never reached leaves no ``./runs/<id>/``."""
    for path in made:
        with contextlib.suppress(OSError):
            (path / OUT_CLAIM).unlink(missing_ok=True)  # this run's own --out claim
            path.rmdir()


def shown_state(journal: Journal, row: RunRow) -> str:
    """The run's state as the user should read it: a ``running`` run whose remotemac
    process died (SIGKILL, a closed terminal, a crash, a reboot) is ``interrupted``:
    the host runs on, nothing follows it here, ``remotemac attach`` goes on with it."""
    if row.state == "running" and journal.run_driver(row.run_id) is None:
        return "interrupted"
    return row.state


#: a run in any other state may still have a job or data on its host (running,
#: detached, interrupted: ``attach`` goes on with it)
FORGETTABLE = ("finished", "failed", "lost")


def forgettable_runs(journal: Journal, texts: list[str], before: str | None) -> list[str]:
    """The run ids ``remotemac forget`` drops: each RUN given (any unique part, or
    latest) and, with ``before`` (``YYYY-MM-DD``, UTC), every finished run started
    before that day. A run that may still be in progress (followed here, detached,
    interrupted) is refused: forgetting it would lose the way to attach, pull and wipe it."""
    import calendar

    if not texts and before is None:
        raise BadInput("forget what?", hint="give run ids, or --before YYYY-MM-DD")
    ids = [resolve_run_id(journal, text) for text in texts]
    cutoff = None
    if before is not None:
        try:
            cutoff = calendar.timegm(time.strptime(before, "%Y-%m-%d"))
        except ValueError:
            raise BadInput(
                f"--before {before!r}: not a day", hint="e.g. --before 2026-11-01"
            ) from None
    for row in journal.list_runs(limit=1_000_000):
        old = cutoff is not None and row.created_at < cutoff and row.run_id not in ids
        if old and shown_state(journal, row) in FORGETTABLE:
            ids.append(row.run_id)
    for run_id in ids:
        found = journal.get_run(run_id)
        state = shown_state(journal, found) if found else "finished"
        if state not in FORGETTABLE:
            raise BadInput(
                f"run {run_id} is {state}: forgetting it would lose the way to attach, "
                "pull and wipe it; nothing was forgotten",
                hint=f"remotemac attach {run_id[-4:]} or wipe it first",
            )
    return ids


_DONE_WORD = {"pull": "pulled", "wipe": "wiped"}


def outputs_kept_by_wipe(phases: Mapping[str, JsonObject]) -> bool:
    """Whether the run's wipe ran but kept its outputs on the host, not yet verified here
    (a wipe after a failed or refused pull, or one by hand before the pull).
    Whether the pull has been done since is for the caller to look at.

    Such outputs are for ``pull``/``attach`` to get (the one rule of docs/contract.md,
    "What survives a failure"): they are not "gone", and once they are verified on the
    laptop the wipe runs again to remove them."""
    wipe = PhaseRow.of(phases.get(Phase.WIPE))
    result = WipeResult.from_json(wipe.result or {})
    return wipe.done and result.done is not False and result.outputs_wiped is False


def phase_already_done(journal: Journal, run_id: str, phase: str) -> str | None:
    """Why ``pull``/``wipe`` by hand must not run again on this run (None: go ahead).

    Running a finished phase again would overwrite the result the record was
    built from ("0 files verified" after a wipe); so a done phase is reported,
    not redone. A pull after the wipe is an error: the outputs are gone from the host.
    """
    phases = journal.phases(run_id)

    def done(name: str) -> bool:  # a wipe kept by ``wipe: manual`` is "done" but did nothing
        row = PhaseRow.of(phases.get(name))
        kept = name == Phase.WIPE and WipeResult.from_json(row.result or {}).done is False
        return row.done and not kept

    if phase == "pull" and done("wipe") and not outputs_kept_by_wipe(phases):
        raise BadInput(
            f"run {run_id} was wiped: its outputs are gone from the host, nothing to pull",
            hint="what was pulled before the wipe is in its --out dir",
        )
    if not done(phase):
        return None
    if phase == "wipe" and outputs_kept_by_wipe(phases) and done("pull"):
        return None  # the outputs it kept are verified here now: they go too
    summary = from_journal(phase, PhaseRow.of(phases[phase]).result or {}).line
    return (
        f"run {run_id} is already {_DONE_WORD.get(phase, phase + ' done')}"
        + (f" ({summary})" if summary else "")
        + "; nothing to do"
    )
