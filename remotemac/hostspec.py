"""``[user@]host[:port]`` host specs, checked without importing asyncssh.

Why a module of its own: the playbook checks ``host:`` at load time (``check``
must refuse ``mac:99999`` or ``[::1`` before anything is rented), and the SSH
transport parses the same spec when it connects; both use :func:`split_spec`.
"""

from __future__ import annotations

import re

_SPEC = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[^\]]+\]|[^:@\s\[\]]+)(?::(?P<port>\d+))?$")
MAX_SPEC = 255


def split_spec(spec: str) -> tuple[str | None, str, int | None]:
    """``(user, host, port)`` of a spec; ValueError with a one-line reason otherwise."""
    text = spec.strip()
    match = _SPEC.match(text) if len(text) <= MAX_SPEC else None
    if not match:
        raise ValueError(
            f"not a host: {text[:60]!r} (write local, an ssh alias or "
            "[user@]host[:port], IPv6 in brackets)"
        )
    port_text = match["port"]
    port = int(port_text) if port_text and len(port_text) <= 5 else (0 if port_text else None)
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"bad port in host {text[:60]!r} (ports are 1-65535)")
    return match["user"], match["host"].strip("[]"), port
