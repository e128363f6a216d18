"""Channel data sealed or opened in one step under AES-GCM: fewer copies per SSH packet.

Why: a push is tens of thousands of SSH packets (sshd takes at most 32 KiB of channel
data per packet: 32,768 per GiB), and on the laptop each went through asyncssh's
general ``send_packet``: the payload joined, padded by two concatenations, sealed by a
new ``AESGCM`` object (its key schedule set up again for every packet), the sealed
bytes split from their tag and joined again with the length and then with the tag:
six copies of the payload past the channel's own, with their Python around them. On
loopback that path was the laptop's largest cost above OpenSSH's C client (1.4–1.55 s
per GiB against its 0.9 s, docs/figures.md "The floor for one large file"). Here a
``SSH_MSG_CHANNEL_DATA`` packet is built with one join and sealed with one call of an
``AESGCM`` kept per key, and the length and the sealed bytes go to the transport as
they are: the bytes on the wire are the same as asyncssh's (RFC 5647 as OpenSSH does
it: the length in clear as associated data, a fresh random padding of 4–19 bytes).

It plugs in per connection like :mod:`ignorepackets` (asyncssh's code is untouched)
and takes a packet only when asyncssh itself would send it straight away with nothing
else to do: key exchange and authentication complete, no re-key due, no compression,
an ``aes*-gcm@openssh.com`` cipher object of the shape this module knows. Anything
else (a re-key starting, which asyncssh's own call sends first, another cipher, an
asyncssh whose internals differ) goes through asyncssh's path as before, so the
sequence numbers, the invocation counter and the re-key byte count stay asyncssh's.

Receiving is the same in reverse. asyncssh appends every read to a ``bytes`` buffer,
slices the header and then the rest off it (copying what follows each time), joins
the parts again to open them, slices the payload out and then the string out of that:
a pull on loopback cost the laptop 1.5x OpenSSH's client. Here whole packets are
opened straight from one ``bytearray`` (the GCM tag checked by the same call that
decrypts: a packet that fails it is never handed on; asyncssh's path is given it to
fail it) and a channel data packet goes to its channel as the payload asyncssh's own
reader would make of it. Every other packet (key exchange, window adjusts, replies)
and everything after it in that read goes to asyncssh as it came; the short path
takes over again at the next read where asyncssh stands at a packet's start or
inside one whose first block it holds as it came (GCM sends the length in clear).
Measured: ``scripts/bench_packets.py``, docs/figures.md "The SSH packet path".
"""

from __future__ import annotations

import functools
import inspect
import os
import time
import weakref
from typing import Any

import asyncssh

from remotemac.transport.coalesce import CoalescingTransport

MSG_CHANNEL_WINDOW_ADJUST = 93
MSG_CHANNEL_DATA = 94
MSG_CHANNEL_EXTENDED_DATA = 95
#: what the short receive path opens and hands to the channel: its data (and stderr),
#: and the window credits a push gets back (7,748 packets from sshd per 256 MiB pushed
#: into ``cat``, about one per data packet; through asyncssh's reader they cost more of
#: the laptop's CPU than sealing the data: scripts/bench_packets.py)
CHANNEL_TRAFFIC = frozenset(
    {MSG_CHANNEL_WINDOW_ADJUST, MSG_CHANNEL_DATA, MSG_CHANNEL_EXTENDED_DATA}
)
#: GCM in SSH (RFC 5647 section 7.2): the padded part is a multiple of 16 bytes
GCM_BLOCK = 16
GCM_TAG = 16
GCM_NONCE = 12
#: a channel data packet's first two bytes by its padding's length
_PREFIX = [bytes((pad, MSG_CHANNEL_DATA)) for pad in range(GCM_BLOCK + 4)]
#: each connection's short send (send_data_directly), for its channels' flush
_SENDERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: what asyncssh's channel must have for flush_channel_directly
_CHANNEL_NEEDS = (
    "_flush_send_buf",
    "_send_buf",
    "_send_buf_len",
    "_send_window",
    "_send_pktsize",
    "_send_chan",
)
#: what asyncssh's connection must have for this path to stand in for its own
_NEEDS = (
    "_send_encryption",
    "_send_seq",
    "_rekey_bytes",
    "_rekey_bytes_sent",
    "_rekey_seconds",
    "_rekey_time",
    "_kex_complete",
    "_auth_complete",
    "_compressor",
    "_transport",
)

#: and for receiving
_RECV_NEEDS = (
    "_recv_encryption",
    "_recv_seq",
    "_recv_handler",
    "_recv_pkthdr",
    "_recv_packet",
    "_packet",
    "_inpbuf",
    "_decompressor",
    "_max_recv_pktlen",
    "_channels",
    "_finish_recv_packet",
    "create_task",
    "_kex_complete",
    "_auth_complete",
    "_transport",
    "_reset_keepalive_timer",
    "_send_disconnect",
    "_force_close",
    "internal_error",
)


def _packet_shape_known() -> bool:
    """asyncssh's packet reader keeps its place in ``_idx`` and its end in ``_len``."""
    packet = asyncssh.packet.SSHPacket(b"\x00\x00\x00\x01x")
    if not (hasattr(packet, "_idx") and hasattr(packet, "_len")):
        return False
    packet._len = 4
    return packet.get_uint32() == 1 and not packet


def _gcm_cipher(conn: Any, which: str = "_send_encryption") -> Any:
    """asyncssh's GCM cipher object for one direction, or None when its shape is not known."""
    encryption = getattr(conn, which)
    cipher = getattr(encryption, "_cipher", None)
    if type(encryption).__name__ != "GCMEncryption" or cipher is None:
        return None
    if not all(hasattr(cipher, a) for a in ("_key", "_iv", "_update_iv")):
        return None
    if not isinstance(cipher._iv, bytes) or len(cipher._iv) != GCM_NONCE:
        return None
    return cipher


_SHAPE_OK: list[bool] = []


def _gcm_shape_known() -> bool:
    """Once per process: asyncssh's GCM packets are what this module makes of the same
    key, nonce and packet (its ``encrypt_packet`` against ours), its nonce counts up
    as RFC 5647 says, and its header step hands back the block as it came (which
    ``adopt`` relies on). Any difference and both short paths stay off."""
    if not _SHAPE_OK:
        _SHAPE_OK.append(_check_gcm_shape())
    return _SHAPE_OK[0]


def _check_gcm_shape() -> bool:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        key, nonce = bytes(range(16)), bytes(range(100, 112))
        enc = asyncssh.encryption.get_encryption(b"aes128-gcm@openssh.com", key, nonce)
        cipher = enc._cipher  # type: ignore[attr-defined]
        plain = bytes((4, MSG_CHANNEL_DATA)) + bytes(range(10)) + b"\0" * 4
        length = len(plain).to_bytes(4, "big")
        theirs, tag = enc.encrypt_packet(0, length, plain)
        ours = length + AESGCM(key).encrypt(nonce, plain, length)
        block = ours[:GCM_BLOCK]
        return (
            theirs + tag == ours
            and cipher._iv == nonce[:4] + (int.from_bytes(nonce[4:], "big") + 1).to_bytes(8, "big")
            and enc.decrypt_header(0, block, 4) == (block, block[:4])
        )
    except Exception:  # an asyncssh shaped otherwise: its own path it is
        return False


def send_data_directly(conn: asyncssh.SSHClientConnection) -> bool:
    """Send ``conn``'s channel data packets through the short path while it applies;
    False (nothing changed) when this asyncssh does not have the internals it relies on."""
    if not all(hasattr(conn, a) for a in _NEEDS) or not _gcm_shape_known():
        return False
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:  # pragma: no cover - asyncssh requires cryptography
        return False
    original = conn.send_packet
    sealer: list[Any] = [None, None]  # (key, AESGCM for it): set up again only on a re-key
    checked: list[Any] = [None, None]  # (asyncssh's encryption object, its GCM cipher)

    def direct(parts: tuple[Any, ...], size: int, handler: Any) -> bool:
        """Seal and send one channel data packet whose payload after the type is
        ``parts`` (``size`` bytes with the type); False when asyncssh must send it."""
        c: Any = conn
        if not (c._kex_complete and c._auth_complete) or c._compressor is not None:
            return False
        if c._rekey_bytes_sent >= c._rekey_bytes or (
            c._rekey_seconds and time.monotonic() >= c._rekey_time
        ):
            return False  # asyncssh's own call starts the re-key first
        encryption, transport = c._send_encryption, c._transport
        if checked[0] is not encryption:  # (a new one at each re-key)
            checked[0], checked[1] = encryption, _gcm_cipher(c)
        cipher = checked[1]
        if cipher is None or transport is None:
            return False
        key = cipher._key
        if sealer[0] is not key:
            sealer[0], sealer[1] = key, AESGCM(key)
        pad = -(1 + size) % GCM_BLOCK
        if pad < 4:
            pad += GCM_BLOCK
        length = (1 + size + pad).to_bytes(4, "big")
        plain = b"".join((_PREFIX[pad], *parts, os.urandom(pad)))
        sealed = sealer[1].encrypt(cipher._iv, plain, length)
        cipher._update_iv()
        try:
            if isinstance(transport, CoalescingTransport):
                transport.write(length)  # (joined with the turn's other writes anyway)
                transport.write(sealed)
            else:  # a jump host's channel: every write would be a packet of its own
                transport.write(length + sealed)
        except ConnectionError:  # as asyncssh's _send: the loss is reported by the transport
            pass
        seq = c._send_seq
        c._send_seq = (seq + 1) & 0xFFFFFFFF
        c._rekey_bytes_sent += 1 + size + pad
        logger = handler or c  # as asyncssh's: the channel logs its own packets
        if getattr(logger.logger, "_debug_level", 3) >= 3:  # asyncssh's packet log is on
            logger.log_sent_packet(MSG_CHANNEL_DATA, seq, plain[1 : 1 + size])
        return True

    def send_packet(pkttype: int, *args: bytes, **kwargs: Any) -> None:
        # (asyncssh's channels pass only ``handler``; anything more goes the long way)
        if (
            pkttype == MSG_CHANNEL_DATA
            and kwargs.keys() <= {"handler"}
            and direct(args, 1 + sum(map(len, args)), kwargs.get("handler"))
        ):
            return
        original(pkttype, *args, **kwargs)

    conn.send_packet = send_packet  # type: ignore[method-assign]
    _SENDERS[conn] = direct
    return True


def flush_channel_directly(conn: asyncssh.SSHClientConnection, channel: Any) -> bool:
    """Send ``channel``'s buffered data in packets sealed straight from its buffer.

    Why: asyncssh's channel slices each packet's data out of its buffer, copies it
    into a length-prefixed string and that behind the channel number, before the
    connection's send (above) joins it once more: three copies and five Python calls
    per 32 KiB that this path does without. What it leaves to asyncssh's own flush:
    everything it does not take (extended data, a closed channel, a packet the
    connection's short path refuses, such as the one that finds a re-key due) and the
    end of each flush (flow control's pause and resume, a pending EOF or close). False
    (nothing changed) when ``conn`` has no short send path or the channel lacks what
    this relies on."""
    direct = _SENDERS.get(conn)
    if direct is None or not all(hasattr(channel, a) for a in _CHANNEL_NEEDS):
        return False
    original = channel._flush_send_buf

    def flush() -> None:
        ch: Any = channel
        pending = ch._send_buf
        while pending and ch._send_window and ch._send_chan is not None:
            buf, datatype = pending[0]
            if datatype is not None:
                break
            n = min(ch._send_window, ch._send_pktsize, len(buf))
            head = ch._send_chan.to_bytes(4, "big") + n.to_bytes(4, "big")
            with memoryview(buf) as view, view[:n] as part:
                # (released on the way out even when the send raises: a traceback
                # holding the slice would lock the buffer against the del below)
                sent = _SENDERS[conn]((head, part), 9 + n, ch)
            if not sent:
                break
            if n == len(buf):
                del pending[0]
            else:
                del buf[:n]
            ch._send_buf_len -= n
            ch._send_window -= n
        original()  # the rest its own way, and flow control and a pending EOF or close

    channel._flush_send_buf = flush
    return True


def receive_data_directly(conn: asyncssh.SSHClientConnection) -> bool:
    """Open and hand on ``conn``'s incoming channel data packets through the short path
    while it applies; False (nothing changed) when this asyncssh lacks what it uses."""
    if not all(hasattr(conn, a) for a in _RECV_NEEDS) or not _packet_shape_known():
        return False
    if not _gcm_shape_known():
        return False
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    original = conn.data_received
    held = bytearray()  # the bytes past the last whole packet, while the path applies
    opener: list[Any] = [None, None]

    def ours(c: Any) -> Any:
        """The GCM cipher when asyncssh can hand its place over: between packets, or
        inside one whose first block it holds as it came (GCM leaves the length in
        clear, so that block is the wire's bytes); else None."""
        if c._decompressor is not None or not (c._kex_complete and c._auth_complete):
            return None
        if c._transport is None:
            return None
        if c._recv_handler != c._recv_pkthdr and c._recv_handler != c._recv_packet:
            return None  # (a packet being processed by a task: asyncssh holds the rest)
        return _gcm_cipher(c, "_recv_encryption")

    def adopt(c: Any) -> None:
        """Take what asyncssh holds of the packet it is reading, and its place."""
        if c._recv_handler == c._recv_packet:
            held[:0] = c._packet + c._inpbuf
        elif c._inpbuf:
            held[:0] = c._inpbuf
        c._packet, c._inpbuf, c._recv_handler = b"", b"", c._recv_pkthdr

    def take(c: Any, cipher: Any, view: memoryview, pos: int, end: int) -> bool:
        """Open the packet in ``view[pos:end]`` and give its data to its channel; False
        (nothing done) when it is anything else, for asyncssh's path to take."""
        key = cipher._key
        if opener[0] is not key:
            opener[0], opener[1] = key, AESGCM(key)
        try:
            plain = opener[1].decrypt(cipher._iv, view[pos + 4 : end], view[pos : pos + 4])
        except InvalidTag:
            return False  # asyncssh opens it again and says so (MACError)
        pad = plain[0]
        # (RFC 4253 section 6: 4 bytes of padding at least; GCM pads to 16 bytes; the
        # type, the channel and the data's length or the window's credit are 9 bytes)
        if pad < 4 or len(plain) % GCM_BLOCK or len(plain) < pad + 10:
            return False
        pkttype = plain[1]
        channel = c._channels.get(int.from_bytes(plain[2:6], "big"))
        if pkttype not in CHANNEL_TRAFFIC or channel is None:
            return False
        cipher._update_iv()
        seq = c._recv_seq
        packet = asyncssh.packet.SSHPacket(plain)
        packet._idx, packet._len = 6, len(plain) - pad  # past the type and the channel
        if getattr(channel.logger, "_debug_level", 3) >= 3:  # asyncssh's packet log is on
            channel.log_received_packet(pkttype, seq, plain[1 : len(plain) - pad])
        try:
            result = channel.process_packet(pkttype, seq, packet)
        except asyncssh.packet.PacketDecodeError as exc:
            raise asyncssh.ProtocolError(str(exc)) from None
        if inspect.isawaitable(result):  # as asyncssh's reader: the rest waits for it
            c._recv_handler = lambda: False
            task = c.create_task(result)
            task.add_done_callback(
                functools.partial(c._finish_recv_packet, pkttype, seq, is_async=True)
            )
        else:
            c._finish_recv_packet(pkttype, seq)
        return True

    def data_received(data: bytes, datatype: Any = None) -> None:
        c: Any = conn
        cipher = ours(c)
        if cipher is None:
            if held:  # (asyncssh gets what was held first)
                data, held[:] = bytes(held) + data, b""
            original(data)
            return
        pos, whole = 0, True
        try:
            adopt(c)
            held.extend(data)
            c._reset_keepalive_timer()
            with memoryview(held) as view:
                while len(held) - pos >= 4:
                    size = int.from_bytes(view[pos : pos + 4], "big")
                    end = pos + 4 + size + GCM_TAG
                    if size > c._max_recv_pktlen:
                        break  # asyncssh refuses it (max packet size exceeded)
                    if end > len(held):
                        whole = False
                        break
                    if not take(c, cipher, view, pos, end):
                        # anything else goes asyncssh's way alone, as it came: a key
                        # exchange, a window adjust, a reply (or a packet that fails)
                        original(bytes(view[pos:end]))
                    pos = end
                    cipher = ours(c)
                    if cipher is None:
                        break
                else:
                    whole = False
        except asyncssh.DisconnectError as exc:  # as asyncssh's _recv_data
            held[:] = b""
            c._send_disconnect(exc.code, exc.reason, exc.lang)
            c._force_close(exc)
            return
        except Exception:
            held[:] = b""
            c.internal_error()
            return
        del held[:pos]
        if c._transport is None:  # closed (a packet failed, or the session ended it)
            held[:] = b""
            return
        if held and not whole and cipher is not None:
            return  # the beginning of a packet: kept for the bytes still to come
        rest, held[:] = bytes(held), b""
        if rest:
            original(rest)

    conn.data_received = data_received  # type: ignore[method-assign]
    return True
