"""asyncssh's empty SSH_MSG_IGNORE before every packet: left out under ciphers with no
chained IV, kept under CBC (transport/ignorepackets.py).

Both tests push 8 MiB through an exec channel of a real OpenSSH sshd (the project's
connection path, SSHTransport) and count the packets that reach asyncssh's own
``send_packet`` by type; the second one makes sshd and the laptop agree on
aes128-cbc, the one case where the IGNORE packet is a countermeasure. Channel data
under AES-GCM normally goes by transport/fastdata.py's short path, which never sends
an IGNORE; here it is switched off so that every packet takes asyncssh's path, the
one this module's rule is for (its own tests: test_fastdata_sshd.py).
"""

from __future__ import annotations

import collections
import hashlib
from typing import Any

import asyncssh
import asyncssh.connection
import pytest

from remotemac.transport import sshconnect
from remotemac.transport.ignorepackets import MSG_IGNORE, NO_CHAINED_IV, drop_cbc_ignores
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport

MSG_CHANNEL_DATA = 94
PAYLOAD = bytes(range(256)) * (32 << 10)  # 8 MiB


async def _push(
    alias: str, home: Any, cfg: Any, monkeypatch: Any
) -> tuple[collections.Counter, str]:
    """(packets sent by type during the push, the cipher) of 8 MiB into sha256sum."""
    counts: collections.Counter = collections.Counter()
    real = asyncssh.connection.SSHConnection.send_packet

    def counting(self: Any, pkttype: int, *args: bytes, handler: Any = None) -> None:
        counts[pkttype] += 1
        real(self, pkttype, *args, handler=handler)

    monkeypatch.setattr(asyncssh.connection.SSHConnection, "send_packet", counting)
    monkeypatch.setattr(sshconnect, "send_data_directly", lambda conn: False)
    async with SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)) as t:
        proc = await t.open_process(["sha256sum"])
        counts.clear()
        for at in range(0, len(PAYLOAD), 1 << 20):
            await proc.write(PAYLOAD[at : at + (1 << 20)])
        await proc.write_eof()
        answer = await proc.readline()
        await proc.wait(timeout=10)
        sent = collections.Counter(counts)
        cipher = t._conn.get_extra_info("send_cipher")  # type: ignore[union-attr]
    assert answer.split()[0].decode() == hashlib.sha256(PAYLOAD).hexdigest()
    return sent, cipher


@pytest.mark.sshd
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_push_under_aes_gcm_sends_no_ignore_packets(sshd, ssh_env, monkeypatch):
    """sshd takes 32 KiB of channel data per packet: 8 MiB is at least 256 data
    packets, and not one IGNORE goes with them (asyncssh alone sends as many)."""
    home, cfg, alias = ssh_env(sshd)
    sent, cipher = await _push(alias, home, cfg, monkeypatch)
    assert cipher == "aes128-gcm@openssh.com" and cipher in NO_CHAINED_IV
    assert sent[MSG_CHANNEL_DATA] >= len(PAYLOAD) // (32 << 10)
    assert sent[MSG_IGNORE] == 0, sent


@pytest.mark.sshd
@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_push_under_cbc_keeps_the_ignore_before_every_packet(
    sshd_factory, ssh_env, monkeypatch
):
    """With a CBC cipher (not one remotemac offers; here forced on both ends) every
    packet past key exchange still has its IGNORE before it, and every byte arrives."""
    server = sshd_factory(extra_config=["Ciphers aes128-cbc"])
    monkeypatch.setattr(sshconnect, "ENCRYPTION_ALGS", ["aes128-cbc"])
    home, cfg, alias = ssh_env(server)
    sent, cipher = await _push(alias, home, cfg, monkeypatch)
    assert cipher == "aes128-cbc" and cipher not in NO_CHAINED_IV
    assert sent[MSG_CHANNEL_DATA] >= len(PAYLOAD) // (32 << 10)
    others = sum(n for kind, n in sent.items() if kind != MSG_IGNORE)
    assert sent[MSG_IGNORE] == others, sent


def test_only_the_inserted_ignore_is_left_out():
    """The rule itself, on a stand-in for the connection that inserts its IGNORE as
    asyncssh 2.x does: a packet past key exchange goes alone under GCM; an IGNORE sent
    on its own and key-exchange packets go as they are; under CBC nothing changes."""

    class Conn:
        def __init__(self, cipher: str) -> None:
            self.cipher, self.wire = cipher, []

        def get_extra_info(self, name: str) -> str:
            assert name == "send_cipher"
            return self.cipher

        def send_packet(self, pkttype: int, *args: bytes, handler: Any = None) -> None:
            if pkttype > 49:
                self.send_packet(MSG_IGNORE, b"\0\0\0\0")
            self.wire.append(pkttype)

    gcm = Conn("aes256-gcm@openssh.com")
    drop_cbc_ignores(gcm)  # type: ignore[arg-type]
    for kind in (MSG_CHANNEL_DATA, 20, MSG_IGNORE, MSG_CHANNEL_DATA):
        gcm.send_packet(kind, b"x")
    assert gcm.wire == [MSG_CHANNEL_DATA, 20, MSG_IGNORE, MSG_CHANNEL_DATA]
    cbc = Conn("aes128-cbc")
    drop_cbc_ignores(cbc)  # type: ignore[arg-type]
    cbc.send_packet(MSG_CHANNEL_DATA, b"x")
    assert cbc.wire == [MSG_IGNORE, MSG_CHANNEL_DATA]
