"""The SSH connection's coalescing transport: one socket write per loop turn.

The unit tests drive CoalescingTransport over a recording stand-in for asyncio's TCP
transport; the last test pushes 8 MiB to a real OpenSSH sshd through SSHTransport and
counts the writes that reached the real socket transport.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from remotemac.transport import sshconnect
from remotemac.transport.coalesce import CoalescingTransport, DirectConnector, _Relay
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport


class _Socket(asyncio.Transport):
    """Records what would have gone to the socket, write by write."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.sent.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 22)}.get(name, default)


async def _turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_the_writes_of_one_turn_leave_as_one_send_in_order():
    sock = _Socket()
    t = CoalescingTransport(sock, asyncio.get_running_loop())
    for i in range(50):
        t.write(b"packet-%02d;" % i)
    t.write(b"")
    assert sock.sent == []  # nothing before the turn ends
    assert t.get_write_buffer_size() == 50 * 10
    await _turn()
    assert sock.sent == [b"".join(b"packet-%02d;" % i for i in range(50))]
    t.write(b"next turn")
    await _turn()
    assert sock.sent[1:] == [b"next turn"]
    assert t.get_extra_info("peername") == ("127.0.0.1", 22)


@pytest.mark.asyncio
async def test_close_sends_what_the_turn_wrote_before_closing():
    """asyncssh writes its disconnect message and closes in the same turn."""
    sock = _Socket()
    t = CoalescingTransport(sock, asyncio.get_running_loop())
    t.write(b"disconnect")
    t.close()
    assert sock.sent == [b"disconnect"] and sock.closed
    await _turn()
    assert sock.sent == [b"disconnect"]  # the scheduled flush finds nothing more


@pytest.mark.asyncio
async def test_abort_and_a_lost_socket_drop_what_was_pending():
    sock = _Socket()
    t = CoalescingTransport(sock, asyncio.get_running_loop())
    t.write(b"never sent")
    t.abort()
    await _turn()
    assert sock.sent == [] and sock.aborted

    seen: list[Any] = []

    class Session(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            seen.append(transport)

        def connection_lost(self, exc: Exception | None) -> None:
            seen.append(exc)

    sock2 = _Socket()
    relay = _Relay(Session())
    relay.connection_made(sock2)
    (wrapped,) = seen
    assert isinstance(wrapped, CoalescingTransport)
    wrapped.write(b"lost with the link")
    relay.connection_lost(ConnectionResetError())
    await _turn()
    assert sock2.sent == [] and isinstance(seen[-1], ConnectionResetError)


@pytest.mark.sshd
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_push_to_a_real_sshd_leaves_in_a_few_socket_writes(sshd, ssh_env, monkeypatch):
    """8 MiB through one exec channel is 256 SSH data packets (sshd takes 32 KiB per
    packet) and as many MSG_IGNOREs asyncssh puts before them: hundreds of socket
    writes without coalescing. Through the direct connector they leave a turn at a
    time, and every byte arrives."""
    connectors: list[DirectConnector] = []
    writes: list[int] = []

    class Counting(DirectConnector):
        async def create_connection(self, session_factory, remote_host, remote_port):  # type: ignore[no-untyped-def]
            transport, session = await super().create_connection(
                session_factory, remote_host, remote_port
            )
            inner = transport._inner
            real_write = inner.write

            def write(data: bytes) -> None:
                writes.append(len(data))
                real_write(data)

            inner.write = write  # type: ignore[method-assign]
            connectors.append(self)
            return transport, session

    monkeypatch.setattr(sshconnect, "DirectConnector", Counting)
    home, cfg, alias = ssh_env(sshd)
    payload = bytes(range(256)) * (32 << 10)  # 8 MiB
    async with SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)) as t:
        proc = await t.open_process(["sha256sum"])
        before = len(writes)
        for at in range(0, len(payload), 1 << 20):
            await proc.write(payload[at : at + (1 << 20)])
        await proc.write_eof()
        answer = await proc.readline()
        await proc.wait(timeout=10)
        sent = writes[before:]
    assert connectors, "the connection did not go through the direct connector"
    assert answer.split()[0].decode() == hashlib.sha256(payload).hexdigest()
    assert sum(sent) > len(payload)
    assert len(sent) <= 128, f"{len(sent)} socket writes for 512 packets"
