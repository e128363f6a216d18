"""Open a Transport for a host spec: ``local``, an ssh_config alias or [user@]host[:port]."""

from __future__ import annotations

from pathlib import Path

from remotemac.transport.base import Transport
from remotemac.transport.options import SSHOptions

__all__ = ["SSHOptions", "open_transport"]


def open_transport(
    host: str, home: Path, options: SSHOptions | None = None, emit=None, run_id: str = ""
) -> Transport:
    """Build (not connect) the transport; ssh is imported only when needed."""
    if host == "local":
        from remotemac.transport.local import LocalTransport

        return LocalTransport()
    from remotemac.transport.ssh import SSHTransport

    emit_fn = emit if emit is not None else (lambda _e: None)
    return SSHTransport(host, home_dir=home, options=options, emit=emit_fn, run_id=run_id)
