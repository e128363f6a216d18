"""How to reach a host over SSH: one frozen object from the CLI/playbook to the connection.

Why one object: the options used to travel through three carriers (the engine's
options, the transport's keyword arguments, the connector's options) and were
unpacked twice, so a knob added in one place silently missed the others. Now the
CLI builds an :class:`SSHOptions`, the engine applies the playbook's reconnect
deadline with :meth:`SSHOptions.for_playbook`, and the transport hands the same
object to every hop of the connection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PassphrasePrompt = Callable[[Path], "str | None"]
"""Asked for a key's passphrase; ``None`` when there is nobody to ask."""

#: used when neither the caller nor ssh_config says (ServerAliveInterval, …)
DEFAULT_KEEPALIVE_INTERVAL_S = 10.0
DEFAULT_KEEPALIVE_COUNT_MAX = 3
DEFAULT_CONNECT_TIMEOUT_S = 15.0
#: how long an operation keeps reconnecting before the run stops (issue 16)
DEFAULT_RECONNECT_DEADLINE_S = 600.0


@dataclass(frozen=True)
class SSHOptions:
    """Knobs of one SSH transport, shared by every hop (ProxyJump) of its connection.

    ``None`` for a keepalive or timeout knob means "what ssh_config says for the
    host, else our default", so a user's ``ServerAliveInterval`` is honoured unless
    the caller overrides it on purpose.
    """

    ssh_config: Path | None = None
    identity: Path | None = None
    keepalive_interval: float | None = None
    keepalive_count_max: int | None = None
    connect_timeout: float | None = None
    #: ``None``: the playbook's ``connection.reconnect_deadline`` (default 10 minutes)
    reconnect_deadline: float | None = None
    #: exec channels at once (OpenSSH's MaxSessions is 10; one more is the SFTP session)
    max_channels: int = 8
    passphrase_prompt: PassphrasePrompt | None = None

    def for_playbook(self, deadline: float) -> SSHOptions:
        """These options with the playbook's reconnect deadline unless one was given here."""
        if self.reconnect_deadline is not None:
            return self
        return dataclasses.replace(self, reconnect_deadline=deadline)

    @property
    def deadline_s(self) -> float:
        """The reconnect deadline in effect (seconds)."""
        if self.reconnect_deadline is not None:
            return self.reconnect_deadline
        return DEFAULT_RECONNECT_DEADLINE_S
