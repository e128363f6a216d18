"""The RAM stores (``/dev/shm/remotemac-<run id>``) of the runs a test made: find, remove.

Why: /dev/shm is machine-global and survives the test. A run left unwiped on purpose
(``wipe: manual``, a lost host, a job kept running after Ctrl-C) keeps its decrypted
dataset there, and after a few sessions the machine held 1.3 GB of them. A host's
teardown (the lab's ``HostDirs.remove``, the local host's ``make_playbook`` and
``make_preinstalled_playbook``) removes the stores of the runs under its own root or
in its journal; the session guard in tests/conftest.py looks for any that still
escaped.

Which runs are a test's own is read from what the test made, never from a listing of
/dev/shm (other sessions share it): the run dirs under a host root (``runs/<id>``)
and the runs in a laptop journal (``journal.sqlite3``), both under a directory only
this test (or this session) owns.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
from pathlib import Path

SHM = Path("/dev/shm")
#: ``journal.new_run_id``: ``<name>-<UTC date>-<UTC time>-<4 hex>``, unique per run
GENERATED_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*-\d{8}-\d{6}-[0-9a-f]{4}$")
#: what a walk never enters: a workload environment or a copied project is large and
#: holds no run
_SKIP = {"site-packages", "envs", "runtime", ".git", "node_modules", "__pycache__", "lib"}


def run_ids_under(top: Path, depth: int = 5) -> set[str]:
    """The run ids of the run dirs (``…/runs/<id>``) and journals under ``top``."""
    ids: set[str] = set()
    top_depth = str(top).rstrip("/").count("/")
    for dirpath, dirnames, filenames in os.walk(top):
        here = dirpath.rstrip("/").count("/") - top_depth
        if os.path.basename(dirpath) == "runs":
            ids.update(dirnames)
        if "journal.sqlite3" in filenames:
            ids.update(_journal_ids(Path(dirpath) / "journal.sqlite3"))
        dirnames[:] = [] if here >= depth else [d for d in dirnames if d not in _SKIP]
    return ids


def _journal_ids(path: Path) -> set[str]:
    """The run ids a journal knows (read-only; an unreadable journal knows none)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return set()
    try:
        return {row[0] for row in db.execute("select run_id from runs") if row[0]}
    except sqlite3.Error:
        return set()
    finally:
        db.close()


def stores_of(ids: set[str], owners: set[int]) -> list[Path]:
    """The RAM stores of ``ids`` that are there and belong to one of ``owners``."""
    found = []
    for run_id in sorted(ids):
        if "/" in run_id or run_id in ("", ".", ".."):
            continue
        path = SHM / f"remotemac-{run_id}"
        with contextlib.suppress(OSError):
            if path.lstat().st_uid in owners:
                found.append(path)
    return found


def remove_stores(ids: set[str], owners: set[int]) -> list[str]:
    """Remove the RAM stores of ``ids`` owned by ``owners``; the names removed."""
    removed = []
    for path in stores_of(ids, owners):
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    return removed


def remove_escaped(base: Path, owners: set[int]) -> list[str]:
    """The session guard's sweep: remove and name the RAM stores of the runs under
    ``base`` (a session's temp dir) whose ids are :data:`GENERATED_ID`'s shape (an id
    no other session makes; a fixed test id such as ``r1`` may be another's)."""
    ids = {i for i in run_ids_under(base, depth=6) if GENERATED_ID.match(i)}
    return remove_stores(ids, owners)
