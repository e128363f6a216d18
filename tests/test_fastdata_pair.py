"""transport/fastdata.py's short paths against an asyncssh server in the same process.

Why a second kind of peer: OpenSSH's sshd does not check the packet sequence numbers
under AES-GCM (the nonce is the cipher's own counter), so the real-sshd tests
(test_fastdata_sshd.py) cannot see a short path that loses count of them; here the
server is asyncssh, whose numbers and nonces are read at the end on both sides. The
client's reads are also cut into pieces of 1 byte to 40 KiB (a packet's length split,
its first block split, many packets in one read), so every hand-over between the short
path and asyncssh's own reader runs, and both ends re-key (the server every 768 KiB). A unit test
of the state kept: the promises (bytes checked end to end over a real sshd, a flipped
byte) are test_fastdata_sshd.py's.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import asyncssh
import pytest

from remotemac.transport import fastdata
from remotemac.transport.fastdata import (
    flush_channel_directly,
    receive_data_directly,
    send_data_directly,
)
from remotemac.transport.ignorepackets import drop_cbc_ignores

GCM = ["aes128-gcm@openssh.com"]
MSG_CHANNEL_DATA = 94
PIECES = [1, 3, 4, 15, 16, 17, 100, 4096, 33000, 40000]


class Server(asyncssh.SSHServer):
    conns: list[Any] = []

    def connection_made(self, conn: Any) -> None:
        Server.conns.append(conn)
        drop_cbc_ignores(conn)

    def begin_auth(self, username: str) -> bool:
        return False  # (no auth: this is about the packets after it)

    def connection_requested(self, *args: Any) -> bool:
        return True  # the jump host's forwarding


async def echo(process: Any) -> None:
    """Echo stdin to stdout, with a byte on stderr now and then (extended data, which
    goes asyncssh's way, between the data packets)."""
    count = 0
    while chunk := await process.stdin.read(65536):
        process.stdout.write(chunk)
        count += 1
        if count % 7 == 0:
            process.stderr.write(b"e")
        await process.stdout.drain()
    process.exit(0)


def cut_reads(conn: Any, seed: int) -> None:
    """Hand each read to the connection in pieces of PIECES' sizes."""
    inner, rnd = conn.data_received, random.Random(seed)

    def in_pieces(data: bytes, datatype: Any = None) -> None:
        at = 0
        while at < len(data):
            step = rnd.choice(PIECES)
            inner(data[at : at + step])
            at += step

    conn.data_received = in_pieces


async def echoed(conn: Any, payload: bytes) -> bytes:
    """``payload`` through the server's echo, the channel flushed by the short path
    (as SSHTransport.open_process does)."""
    proc = await conn.create_process("echo", encoding=None)
    assert flush_channel_directly(conn, proc.channel)
    got = bytearray()

    async def read() -> None:
        while len(got) < len(payload) and (data := await proc.stdout.read(1 << 20)):
            got.extend(data)

    reader = asyncio.ensure_future(read())
    for at in range(0, len(payload), 100_000):
        proc.stdin.write(payload[at : at + 100_000])
        await proc.stdin.drain()
    proc.stdin.write_eof()
    await reader
    await proc.wait()
    return bytes(got)


def counters(sender: Any, receiver: Any) -> tuple:
    return (
        sender._send_seq,
        sender._send_encryption._cipher._iv,
        receiver._recv_seq,
        receiver._recv_encryption._cipher._iv,
    )


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_numbers_and_nonces_agree_after_reads_cut_anywhere_and_rekeys(monkeypatch):
    """3 MiB echoed while the server re-keys every 768 KiB, the client every MiB, and the client's reads
    come in pieces: the bytes come back, and both directions end with the same
    sequence number and GCM nonce on both sides, and the short path sealed the data
    straight from the channel's buffer."""
    Server.conns = []
    key = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.listen(
        "127.0.0.1", 0, server_host_keys=[key], server_factory=Server,
        process_factory=echo, encryption_algs=GCM, rekey_bytes=768 << 10,
        allow_pty=False, encoding=None,
    )  # fmt: skip
    port = server.sockets[0].getsockname()[1]
    took = {"short": 0, "asyncssh": 0}
    clients: list[Any] = []
    theirs = asyncssh.connection.SSHConnection.send_packet

    def long_way(self: Any, pkttype: int, *args: Any, **kwargs: Any) -> None:
        took["asyncssh"] += self in clients and pkttype == MSG_CHANNEL_DATA
        theirs(self, pkttype, *args, **kwargs)

    # (patched before the connection binds it: asyncssh's own send, the client's only)
    monkeypatch.setattr(asyncssh.connection.SSHConnection, "send_packet", long_way)
    conn = await asyncssh.connect(
        "127.0.0.1", port, known_hosts=None, username="u", client_keys=None,
        encryption_algs=GCM, rekey_bytes=1 << 20,
    )  # fmt: skip
    clients.append(conn)
    try:
        drop_cbc_ignores(conn)
        assert send_data_directly(conn) and receive_data_directly(conn)
        direct = fastdata._SENDERS[conn]

        def short(parts: Any, size: int, handler: Any) -> bool:
            done = direct(parts, size, handler)
            took["short"] += done
            return done

        fastdata._SENDERS[conn] = short
        cut_reads(conn, seed=1)
        payload = os.urandom(3 << 20)
        assert await echoed(conn, payload) == payload
        await asyncio.sleep(0.2)  # (the last window adjusts)
        peer = Server.conns[0]
        up, down = counters(conn, peer), counters(peer, conn)
        assert up[:2] == up[2:], up
        assert down[:2] == down[2:], down
        # both ways took part between the re-keys (asyncssh sends what is written while
        # a key exchange runs, here a large share; the real-sshd push checks the share
        # sealed from the buffer): the counters above are the short path's as well
        assert took["short"] >= 30 and took["asyncssh"] >= 1, took
    finally:
        conn.close()
        server.close()


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_behind_a_jump_host_a_packet_is_one_write_of_the_outer_channel():
    """Through a jump connection (the inner connection's transport is a channel of
    the outer one) each packet goes as one write: two would make the outer link carry
    an extra 4-byte data packet per inner packet."""
    Server.conns = []
    key = asyncssh.generate_private_key("ssh-ed25519")
    server = await asyncssh.listen(
        "127.0.0.1", 0, server_host_keys=[key], server_factory=Server,
        process_factory=echo, encryption_algs=GCM, allow_pty=False, encoding=None,
    )  # fmt: skip
    port = server.sockets[0].getsockname()[1]
    jump = await asyncssh.connect(
        "127.0.0.1", port, known_hosts=None, username="u", client_keys=None, encryption_algs=GCM
    )
    sizes: list[int] = []
    outer = jump.send_packet

    def note(pkttype: int, *args: bytes, **kwargs: Any) -> None:
        if pkttype == MSG_CHANNEL_DATA:
            sizes.append(len(b"".join(args)) - 8)  # (the channel number and the length)
        outer(pkttype, *args, **kwargs)

    jump.send_packet = note  # type: ignore[method-assign]
    inner = await asyncssh.connect(
        "127.0.0.1", port, tunnel=jump, known_hosts=None, username="u", client_keys=None,
        encryption_algs=GCM,
    )  # fmt: skip
    try:
        assert send_data_directly(inner) and receive_data_directly(inner)
        sizes.clear()
        payload = os.urandom(1 << 20)
        assert await echoed(inner, payload) == payload
        assert len(sizes) >= (1 << 20) // (32 << 10)
        assert 4 not in sizes, sizes[:20]
    finally:
        inner.close()
        jump.close()
        server.close()
