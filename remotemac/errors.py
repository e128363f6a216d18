"""Errors that map to the exit codes of docs/contract.md.

Every error the user can cause or meet carries the exit code it ends the process
with and a one-line message (what, where, what to do). The CLI prints that line;
a traceback only appears with ``-v``.
"""

from __future__ import annotations

EXIT_ACCEPTED = 0
EXIT_REJECTED = 1
EXIT_BAD_INPUT = 2
EXIT_HOST = 3
EXIT_JOB_LOST = 4
EXIT_INTEGRITY = 5
EXIT_HOST_ENV = 6
EXIT_INTERRUPTED = 130


class RemotemacError(Exception):
    """Base error: ``str(err)`` is the one line shown to the user."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class BadInput(RemotemacError):
    """Usage, playbook or unknown run id."""

    exit_code = EXIT_BAD_INPUT


class Declined(RemotemacError):
    """The user answered no to a question (wipe, cleanup): nothing was done, which is
    what they asked for, so it is said on stdout and the exit code is 0."""

    exit_code = 0


class HostError(RemotemacError):
    """Unreachable host, auth failure, unknown or changed host key."""

    exit_code = EXIT_HOST


class HostKeyError(HostError):
    """The host key is unknown or changed: never retried."""


class AuthError(HostError):
    """Authentication failed: never retried."""


class TransientHostError(HostError):
    """A link problem that a reconnect may cure."""


class HostEnvironmentError(RemotemacError):
    """The host is reachable but lacks something remotemac needs and could not bring or
    build there (a Python module, pip, a wheel for its platform), or installing it failed.

    Not exit 3: the link and the login are fine, and retrying will not help until
    the host's environment (or the laptop's access to wheels) changes. The message
    names the phase and carries pip's last lines.
    """

    exit_code = EXIT_HOST_ENV


class HostDiskFull(HostEnvironmentError):
    """The host's disk refused a write for want of space (ENOSPC, or an SFTP failure on
    a file system with no room left). Not exit 3: the link is fine and a retry only
    helps once space is freed, which the user does (docs/contract.md, exit 6)."""


class JobLost(RemotemacError):
    """The job on the host disappeared (reboot, killed tmux server)."""

    exit_code = EXIT_JOB_LOST


class IntegrityError(RemotemacError):
    """Checksum or decryption failure."""

    exit_code = EXIT_INTEGRITY


class UnsafePath(IntegrityError):
    """The host sent back a name that would escape the output directory."""


class JournalUnusable(BadInput):
    """The journal in ``--home`` cannot be read or written: it is damaged (not a
    database, truncated, malformed) or another process holds its write lock past the
    wait. Exit 2, like other input the user must fix: the line names the file and
    what to do (move it aside; wait for, or stop, the named process)."""
