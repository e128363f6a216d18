"""The laptop-side settings every command shares: ``--home``, ``--ssh-config``, ``-i``,
``-v`` and ``--reconnect-deadline``.

One frozen, typed object built by the CLI (or a test, or a bench) and read by the front
ends (TUI, fleet). The engine never takes it whole: it takes the journal, the home
directory and the :class:`SSHOptions` this object makes, so a front end that is not
the CLI can call the engine without imitating the CLI's settings.

No click, rich or textual here, and nothing heavy at import time (the CLI's start-up
stays fast): the journal and the SSH options are imported when first asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from remotemac.journal import Journal
    from remotemac.transport.options import SSHOptions


@dataclass(frozen=True)
class LocalSettings:
    """What the global options say; ``home`` is resolved (and created) only when used,
    so a command that never needs it (``check``, ``--help``) never fails on it."""

    #: ``--home`` as given; None: REMOTEMAC_HOME, else the platform's user state dir
    home_option: Path | None = None
    ssh_config: Path | None = None
    identity: Path | None = None
    verbose: bool = False
    #: ``--reconnect-deadline`` of run/attach (seconds); None: the playbook's
    reconnect_deadline: float | None = None

    @property
    def home(self) -> Path:
        """remotemac's state directory (journal, known_hosts, data keys), created if absent."""
        from remotemac.home import resolve_home

        return resolve_home(self.home_option)

    def journal(self) -> Journal:
        """The journal in ``home`` (each call opens it); a write that waits for another
        process's lock says so on stderr, naming the journal and the holder."""
        from remotemac.journal import Journal

        return Journal(self.home / "journal.sqlite3", on_wait=_say_on_stderr)

    def ssh_options(self) -> SSHOptions:
        """The SSH options of these settings (the playbook may add its reconnect deadline)."""
        from remotemac.transport.options import SSHOptions

        return SSHOptions(
            ssh_config=self.ssh_config,
            identity=self.identity,
            reconnect_deadline=self.reconnect_deadline,
        )

    @classmethod
    def from_options(
        cls,
        home: str | None = None,
        ssh_config: str | None = None,
        identity: str | None = None,
        verbose: bool = False,
    ) -> LocalSettings:
        """From the command line's strings (``None``: not given)."""
        return cls(
            home_option=Path(home) if home else None,
            ssh_config=Path(ssh_config) if ssh_config else None,
            identity=Path(identity) if identity else None,
            verbose=verbose,
        )


def _say_on_stderr(line: str) -> None:
    """A wait the user should know about, as one ``remotemac:`` line (never stdout:
    ``--json`` readers parse it)."""
    import sys

    print(f"remotemac: {line}", file=sys.stderr, flush=True)
