"""Open a Transport for a host spec: ``local``, an ssh_config alias or [user@]host[:port]."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from remotemac.transport.base import Transport


@dataclass(frozen=True)
class SSHOptions:
    ssh_config: Path | None = None
    identity: Path | None = None
    keepalive_interval: float = 10.0
    keepalive_count_max: int = 3
    reconnect_deadline: float = 300.0


def open_transport(host: str, home: Path, options: SSHOptions | None = None,
                   emit=None, run_id: str = "") -> Transport:
    """Build (not connect) the transport; ssh is imported only when needed."""
    if host == "local":
        from remotemac.transport.local import LocalTransport

        return LocalTransport()
    from remotemac.transport.ssh import SSHTransport

    opts = options or SSHOptions()
    emit_fn = emit if emit is not None else (lambda _e: None)
    return SSHTransport(
        host, home_dir=home, ssh_config=opts.ssh_config, identity=opts.identity,
        keepalive_interval=opts.keepalive_interval, keepalive_count_max=opts.keepalive_count_max,
        reconnect_deadline=opts.reconnect_deadline, emit=emit_fn, run_id=run_id,
    )

