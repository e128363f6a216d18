"""No empty SSH_MSG_IGNORE before every packet when the cipher has no chained IV.

Why: asyncssh (2.x, ``SSHConnection.send_packet``) sends an empty ``SSH_MSG_IGNORE``
before every packet past key exchange once encryption is on. That is the
countermeasure RFC 4251 section 9.3.1 gives for SSH's CBC modes, where the IV of the
next packet is the last ciphertext block an observer already saw, so a chosen
plaintext can be tested against it; an unpredictable packet in between breaks the
chain. remotemac offers no CBC cipher (sshconnect.ENCRYPTION_ALGS: AES-GCM,
ChaCha20-Poly1305, AES-CTR): their per-packet nonce or counter is no ciphertext an
observer saw, which is why RFC 4344 replaced CBC with CTR, and OpenSSH sends no such
packets. For them the extra packet guards nothing; it doubles the packets of a push
(sshd takes 32 KiB of channel data per packet: 16,384 instead of 8,192 per 256 MiB),
each with its own padding from ``os.urandom``, AEAD seal, sequence number, socket
bytes, and sshd's own work to open and drop it. Measured: docs/figures.md ("Half the
SSH packets").

It plugs in per connection (an instance attribute wrapping the bound method), so
asyncssh's code is not touched: while a packet past key exchange is being sent with
a cipher named in NO_CHAINED_IV, the one ``SSH_MSG_IGNORE`` asyncssh inserts for it
is not sent. Any other IGNORE (none today) and every packet under any other cipher
(a CBC one a future list might add, or before encryption) go as before.
"""

from __future__ import annotations

from typing import Any

import asyncssh

#: the SSH message numbers (RFC 4250)
MSG_IGNORE = 2
MSG_KEX_LAST = 49

#: ciphers whose next packet's IV is not the last ciphertext block on the wire
NO_CHAINED_IV = frozenset(
    {
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
        "aes128-ctr",
        "aes192-ctr",
        "aes256-ctr",
    }
)


def drop_cbc_ignores(conn: asyncssh.SSHClientConnection) -> None:
    """Leave out asyncssh's per-packet IGNORE on ``conn`` while its cipher does not
    need it (checked at every packet: a re-key could in principle change it)."""
    original = conn.send_packet
    skipping = [False]

    def send_packet(pkttype: int, *args: bytes, **kwargs: Any) -> None:
        # (keywords passed through as given: a later asyncssh may add some)
        if pkttype == MSG_IGNORE and skipping[0]:
            skipping[0] = False  # the one asyncssh inserts before the packet being sent
            return
        if pkttype > MSG_KEX_LAST and conn.get_extra_info("send_cipher") in NO_CHAINED_IV:
            skipping[0] = True
            try:
                original(pkttype, *args, **kwargs)
            finally:
                skipping[0] = False
            return
        original(pkttype, *args, **kwargs)

    conn.send_packet = send_packet  # type: ignore[method-assign]
