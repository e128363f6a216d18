"""Channel data through transport/fastdata.py's short path, against a real OpenSSH sshd.

Each test moves random bytes through an exec channel of the project's own connection
(SSHTransport) and checks them by SHA-256 at the other end, while it counts what went
through asyncssh's own packet code: the short path must carry the data (a path that
quietly fell back would pass a test that only compares bytes), re-keys in the middle
of a transfer (ours and sshd's) must hand over and back without a lost or reordered
byte, a flipped byte on the wire must end the link and never reach the reader, and a
cipher the path does not know goes asyncssh's way whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncssh
import asyncssh.connection
import asyncssh.packet
import pytest

from remotemac.errors import RemotemacError
from remotemac.transport import fastdata, sshconnect
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport

MSG_CHANNEL_WINDOW_ADJUST = 93
MSG_CHANNEL_DATA = 94
MSG_KEXINIT = 20
MiB = 1 << 20


class AsyncsshCounts:
    """Packets that went through asyncssh's own send_packet, and its own reader (which
    logs every packet it opens; the short path logs only when asyncssh's packet log is
    on, and it is off here), by type."""

    def __init__(self, monkeypatch: Any) -> None:
        self.sent: dict[int, int] = {}
        self.received: dict[int, int] = {}
        send = asyncssh.connection.SSHConnection.send_packet
        log = asyncssh.packet.SSHPacketLogger.log_received_packet

        def counting_send(conn: Any, pkttype: int, *args: bytes, handler: Any = None) -> None:
            self.sent[pkttype] = self.sent.get(pkttype, 0) + 1
            send(conn, pkttype, *args, handler=handler)

        def counting_log(handler: Any, pkttype: int, *args: Any, **kwargs: Any) -> None:
            self.received[pkttype] = self.received.get(pkttype, 0) + 1
            log(handler, pkttype, *args, **kwargs)

        monkeypatch.setattr(asyncssh.connection.SSHConnection, "send_packet", counting_send)
        monkeypatch.setattr(asyncssh.packet.SSHPacketLogger, "log_received_packet", counting_log)


def rekey_every(monkeypatch: Any, size: int) -> None:
    """Our side starts a re-key after every ``size`` bytes sent (asyncssh's rekey_bytes)."""
    real = sshconnect._connect_kwargs

    def with_rekey(*args: Any) -> tuple[dict, float]:
        kwargs, timeout = real(*args)
        kwargs["rekey_bytes"] = size
        return kwargs, timeout

    monkeypatch.setattr(sshconnect, "_connect_kwargs", with_rekey)


class BufferCounts:
    """Data packets sealed straight from a channel's buffer (fastdata's flush), and
    those that reached the connection's send_packet instead (asyncssh's flush: one
    that found a re-key due, those written while it ran)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.buffer = self.other = 0
        install = sshconnect.send_data_directly

        def counting(conn: Any) -> bool:
            if not install(conn):
                return False
            sealer, send = fastdata._SENDERS[conn], conn.send_packet

            def from_buffer(parts: Any, size: int, handler: Any) -> bool:
                sent = sealer(parts, size, handler)
                self.buffer += sent
                return sent

            def other(pkttype: int, *args: Any, **kwargs: Any) -> None:
                self.other += pkttype == MSG_CHANNEL_DATA
                send(pkttype, *args, **kwargs)

            fastdata._SENDERS[conn] = from_buffer
            conn.send_packet = other
            return True

        monkeypatch.setattr(sshconnect, "send_data_directly", counting)


async def push(alias: str, home: Path, cfg: Path, payload: bytes) -> tuple[str, str]:
    """(the host's sha256sum of what arrived, the cipher) for ``payload`` pushed in MiBs."""
    async with SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)) as t:
        proc = await t.open_process(["sha256sum"])
        for at in range(0, len(payload), MiB):
            await proc.write(payload[at : at + MiB])
        await proc.write_eof()
        answer = await proc.readline()
        await proc.wait(timeout=20)
        return answer.split()[0].decode(), t._conn.get_extra_info("send_cipher")  # type: ignore[union-attr]


async def pull(alias: str, home: Path, cfg: Path, path: Path, size: int) -> tuple[bytes, Any]:
    """(the bytes of ``cat path`` on the host, read in MiBs; the connection)."""
    async with SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)) as t:
        proc = await t.open_process(["cat", str(path)], window=16 * MiB)
        got = bytearray()
        while len(got) < size:
            got += await proc.readexactly(min(MiB, size - len(got)))
        assert await proc.wait(timeout=20) == 0
        return bytes(got), t._conn


def host_file(sshd: Any, name: str, data: bytes) -> Path:
    path = sshd.home / name
    path.write_bytes(data)
    os.chmod(path, 0o644)
    return path


@pytest.mark.sshd
@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_push_goes_the_short_way_across_our_rekeys(sshd, ssh_env, monkeypatch):
    """24 MiB pushed with a re-key started every 4 MiB: every byte arrives in order
    (the host's SHA-256), asyncssh's own send_packet carried next to none of the 768
    or more data packets, and it did start the re-keys (the short path hands the
    packet that is due for one to asyncssh, which re-keys first); most packets were
    sealed straight from the channel's buffer, and sshd's window credits came through
    the short reader."""
    rekey_every(monkeypatch, 4 * MiB)
    counts, sealed = AsyncsshCounts(monkeypatch), BufferCounts(monkeypatch)
    home, cfg, alias = ssh_env(sshd)
    payload = os.urandom(24 * MiB)
    digest, cipher = await push(alias, home, cfg, payload)
    assert cipher == "aes128-gcm@openssh.com"
    assert digest == hashlib.sha256(payload).hexdigest()
    assert counts.sent.get(MSG_KEXINIT, 0) >= 5, counts.sent
    # a re-key's own few go asyncssh's way: the packet that finds it due, and those
    # written while it runs (asyncssh holds them back until the new keys)
    assert counts.sent.get(MSG_CHANNEL_DATA, 0) < 24 * MiB // (32 << 10) // 8, counts.sent
    # most straight from the channel's buffer; sshd's window credits (about one per
    # data packet) opened by the short reader, not asyncssh's
    assert sealed.buffer >= 0.85 * (sealed.buffer + sealed.other), vars(sealed)
    assert counts.received.get(MSG_CHANNEL_WINDOW_ADJUST, 0) < 24 * MiB // (32 << 10) // 8, (
        counts.received
    )


@pytest.mark.sshd
@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_pull_goes_the_short_way_across_the_hosts_rekeys(
    sshd_factory, ssh_env, monkeypatch
):
    """32 MiB read from ``cat`` while sshd re-keys every 4 MiB (``RekeyLimit``): the
    bytes are the file's, the receive key changed under the transfer, and asyncssh's
    own packet reader opened only the key exchanges' packets (at most the
    first data packet, which arrives before the login's end hands over)."""
    server = sshd_factory(extra_config=["RekeyLimit 4M"])
    counts = AsyncsshCounts(monkeypatch)
    home, cfg, alias = ssh_env(server)
    data = os.urandom(32 * MiB)
    path = host_file(server, "pull.bin", data)
    keys: list[bytes] = []
    real = sshconnect.receive_data_directly

    def note_key(conn: Any) -> bool:
        keys.append(conn._recv_encryption._cipher._key)
        return real(conn)

    monkeypatch.setattr(sshconnect, "receive_data_directly", note_key)
    got, conn = await pull(alias, home, cfg, path, len(data))
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    assert conn._recv_encryption._cipher._key != keys[0]  # sshd re-keyed mid-pull
    assert counts.received.get(MSG_KEXINIT, 0) >= 4, counts.received
    assert counts.received.get(MSG_CHANNEL_DATA, 0) <= 2, counts.received


@pytest.mark.sshd
@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_unknown_ciphers_go_asyncsshs_way_whole(sshd_factory, ssh_env, monkeypatch):
    """Under ChaCha20-Poly1305 (a cipher the short path does not take) a push and a
    pull both go through asyncssh's own code, and every byte arrives."""
    server = sshd_factory(extra_config=["Ciphers chacha20-poly1305@openssh.com"])
    counts = AsyncsshCounts(monkeypatch)
    home, cfg, alias = ssh_env(server)
    payload = os.urandom(4 * MiB)
    digest, cipher = await push(alias, home, cfg, payload)
    assert cipher == "chacha20-poly1305@openssh.com"
    assert digest == hashlib.sha256(payload).hexdigest()
    assert counts.sent[MSG_CHANNEL_DATA] >= 4 * MiB // (32 << 10)
    path = host_file(server, "pull.bin", payload)
    before = counts.received.get(MSG_CHANNEL_DATA, 0)
    got, _ = await pull(alias, home, cfg, path, len(payload))
    assert got == payload
    assert counts.received[MSG_CHANNEL_DATA] - before >= 4 * MiB // (256 << 10)


class FlippingRelay:
    """A TCP relay to sshd that flips one bit of the byte at ``at`` of what sshd sends
    (counted from the first byte): an attacker on the path, or a bad NIC."""

    def __init__(self, sshd: Any, at: int) -> None:
        self.sshd, self.at = sshd, at
        self.port = 0
        self.flipped = False

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[FlippingRelay]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(self.sshd.host, self.sshd.port)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, flip: bool) -> None:
            seen = 0
            with contextlib.suppress(ConnectionError):
                while chunk := await r.read(65536):
                    if flip and seen <= self.at < seen + len(chunk):
                        i = self.at - seen
                        chunk = chunk[:i] + bytes([chunk[i] ^ 0x01]) + chunk[i + 1 :]
                        self.flipped = True
                    seen += len(chunk)
                    w.write(chunk)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_w, False), pipe(up_r, writer, True))


@pytest.mark.sshd
@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_a_flipped_byte_ends_the_link_and_never_reaches_the_reader(
    sshd, ssh_env, monkeypatch
):
    """One bit flipped 6 MiB into what sshd sends during a 16 MiB pull: the packet
    fails its GCM tag, the link ends with an error, and what the reader got before is
    exactly the start of the file (the flipped packet's bytes never delivered); the
    short path carried the data up to it."""
    counts = AsyncsshCounts(monkeypatch)
    data = os.urandom(16 * MiB)
    path = host_file(sshd, "pull.bin", data)
    relay = FlippingRelay(sshd, at=6 * MiB)
    async with relay.running():
        home, cfg, alias = ssh_env(sshd, relay)  # type: ignore[arg-type]
        got = bytearray()
        with pytest.raises((RemotemacError, asyncssh.Error, ConnectionError, EOFError)):
            async with SSHTransport(
                alias, home_dir=home, options=SSHOptions(ssh_config=cfg, reconnect_deadline=0)
            ) as t:
                proc = await t.open_process(["cat", str(path)], window=16 * MiB)
                while len(got) < len(data):
                    got += await proc.readexactly(min(MiB, len(data) - len(got)))
    assert relay.flipped
    assert len(got) < 6 * MiB
    assert bytes(got) == data[: len(got)]
    assert counts.received.get(MSG_CHANNEL_DATA, 0) <= 2, counts.received
