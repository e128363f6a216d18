"""The ``remotemac`` command line: one click group, its commands in modules by kind.

``remotemac.cli:entry`` is the console script; importing this package registers every
command on :data:`main` (core: the group and what commands share; running: run, attach,
pull, wipe; reading: status, logs, forget; hostcmds: check, schema, doctor, trust,
audit, preflight, cleanup, tui). Only click and the error classes load at start-up.
"""

from __future__ import annotations

from remotemac.cli import hostcmds, reading, running
from remotemac.cli.core import deadline_option, entry, main
from remotemac.cli.running import interrupted_lines

__all__ = [
    "deadline_option",
    "entry",
    "hostcmds",
    "interrupted_lines",
    "main",
    "reading",
    "running",
]
