"""remotemac-enc/v1: round trips, exact sizes, and every attack the issue lists must fail."""

from __future__ import annotations

import io
import os
import random

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from remotemac.agent import streamcrypt as sc
from remotemac.agent.streamcrypt import DecryptError

CS = sc.MIN_CHUNK  # 64 KiB keeps the tests fast while exercising several chunks
SEALED = CS + sc.TAG_LEN
KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


def enc(plain: bytes, path: str = "train/a.npy", key: bytes = KEY, cs: int = CS) -> bytes:
    out = io.BytesIO()
    written = sc.encrypt_stream(key, path, io.BytesIO(plain), out, cs)
    assert written == len(out.getvalue())
    return out.getvalue()


def dec(blob: bytes, path: str = "train/a.npy", key: bytes = KEY) -> bytes:
    out = io.BytesIO()
    count = sc.decrypt_stream(key, path, io.BytesIO(blob), out)
    assert count == len(out.getvalue())
    return out.getvalue()


def chunks(blob: bytes) -> list[bytes]:
    body = blob[sc.HEADER_LEN :]
    return [body[i : i + SEALED] for i in range(0, len(body), SEALED)]


PLAIN3 = random.Random(1).randbytes(2 * CS + 1000)  # three chunks, short last one


@pytest.mark.parametrize("size", [0, 1, CS - 1, CS, CS + 1, 2 * CS, 3 * CS + 17])
def test_round_trip_and_exact_size(size: int) -> None:
    plain = random.Random(size).randbytes(size)
    blob = enc(plain)
    assert len(blob) == sc.ciphertext_size(size, CS)
    assert dec(blob) == plain


def test_default_chunk_round_trip_and_size() -> None:
    plain = os.urandom(sc.DEFAULT_CHUNK * 2 + 5)
    blob = enc(plain, cs=sc.DEFAULT_CHUNK)
    assert len(blob) == sc.ciphertext_size(len(plain))
    assert dec(blob) == plain


def test_empty_file_is_one_empty_final_chunk() -> None:
    blob = enc(b"")
    assert len(blob) == sc.HEADER_LEN + sc.TAG_LEN
    assert dec(blob) == b""
    with pytest.raises(DecryptError, match="no chunk after the header"):
        dec(blob[: sc.HEADER_LEN])


def test_exact_multiple_ends_with_full_final_chunk() -> None:
    """No empty trailer: the second full chunk itself carries the last-chunk flag."""
    plain = os.urandom(2 * CS)
    blob = enc(plain)
    parts = chunks(blob)
    assert [len(p) for p in parts] == [SEALED, SEALED]
    salt = blob[len(sc.MAGIC) + 4 : len(sc.MAGIC) + 4 + sc.SALT_LEN]
    payload_key, _ = sc._derive(KEY, salt, "train/a.npy")
    aead = AESGCM(payload_key)
    assert aead.decrypt(bytes(11) + b"\x00", parts[0], None) == plain[:CS]
    assert aead.decrypt((1).to_bytes(11, "big") + b"\x01", parts[1], None) == plain[CS:]
    # Sealing a non-final chunk as the end of the stream is refused:
    with pytest.raises(DecryptError, match="final chunk 0"):
        dec(blob[: sc.HEADER_LEN + SEALED])


def test_hkdf_matches_rfc5869_implementation() -> None:
    salt = os.urandom(32)
    ours = sc._derive(KEY, salt, "dir/ü.bin")
    ref = HKDF(
        algorithm=hashes.SHA256(),
        length=64,
        salt=salt,
        info=b"remotemac file v1\x00dir/\xc3\xbc.bin",
    ).derive(KEY)
    assert ours[0] + ours[1] == ref


def test_each_encryption_uses_a_fresh_salt() -> None:
    assert enc(b"same bytes") != enc(b"same bytes")


def test_truncation_drop_last_chunk() -> None:
    blob = enc(PLAIN3)
    with pytest.raises(DecryptError, match="final chunk 1"):
        dec(blob[: sc.HEADER_LEN + 2 * SEALED])


@pytest.mark.parametrize("cut", [1, 16, 17, 1000 + 16, 1000 + 17 + SEALED // 2])
def test_truncation_mid_chunk(cut: int) -> None:
    blob = enc(PLAIN3)
    with pytest.raises(DecryptError):
        dec(blob[:-cut])


def test_truncated_header() -> None:
    blob = enc(PLAIN3)
    with pytest.raises(DecryptError, match="truncated header"):
        dec(blob[: sc.HEADER_LEN - 1])


def test_appended_bytes_fail() -> None:
    blob = enc(PLAIN3)
    with pytest.raises(DecryptError):
        dec(blob + b"\x00")
    with pytest.raises(DecryptError):
        dec(blob + chunks(blob)[-1])


def test_reordered_chunks_fail() -> None:
    blob = enc(PLAIN3)
    c = chunks(blob)
    with pytest.raises(DecryptError, match="chunk 0"):
        dec(blob[: sc.HEADER_LEN] + c[1] + c[0] + c[2])


@pytest.mark.parametrize("other_path", ["train/b.npy", "train/a.npy"])
def test_chunk_swap_between_files_with_same_key(other_path: str) -> None:
    """Same data key, different file (or the same path encrypted again): other salt, other key."""
    a = enc(PLAIN3)
    b = enc(PLAIN3, path=other_path)
    ca, cb = chunks(a), chunks(b)
    with pytest.raises(DecryptError, match="chunk 1"):
        dec(a[: sc.HEADER_LEN] + ca[0] + cb[1] + ca[2])
    with pytest.raises(DecryptError):
        dec(a[: sc.HEADER_LEN] + b[sc.HEADER_LEN :])


def test_whole_file_swapped_for_another_path_fails() -> None:
    b = enc(PLAIN3, path="train/b.npy")
    with pytest.raises(DecryptError, match="header authentication failed"):
        dec(b, path="train/a.npy")


@pytest.mark.parametrize(
    "field,offset",
    [
        ("magic", 0),
        ("magic", len(sc.MAGIC) - 1),
        ("chunk_size", len(sc.MAGIC) + 1),
        ("chunk_size", len(sc.MAGIC) + 3),
        ("salt", len(sc.MAGIC) + 4),
        ("salt", len(sc.MAGIC) + 4 + sc.SALT_LEN - 1),
        ("mac", sc.HEADER_LEN - sc.MAC_LEN),
        ("mac", sc.HEADER_LEN - 1),
    ],
)
def test_header_edits_fail(field: str, offset: int) -> None:
    blob = bytearray(enc(PLAIN3))
    blob[offset] ^= 0x01
    out = io.BytesIO()
    with pytest.raises(DecryptError, match="magic" if field == "magic" else "header"):
        sc.decrypt_stream(KEY, "train/a.npy", io.BytesIO(bytes(blob)), out)
    assert out.getvalue() == b""  # nothing released before the header verified


def test_chunk_size_header_rewritten_to_other_valid_size_fails() -> None:
    blob = bytearray(enc(PLAIN3))
    blob[len(sc.MAGIC) : len(sc.MAGIC) + 4] = (2 * CS).to_bytes(4, "big")
    with pytest.raises(DecryptError, match="header authentication failed"):
        dec(bytes(blob))


def test_bit_flips_anywhere_fail() -> None:
    """Every header byte, both ends of every chunk and its tag, and 150 seeded positions."""
    blob = enc(PLAIN3)
    positions = set(range(sc.HEADER_LEN))
    for i in range(3):
        start = sc.HEADER_LEN + i * SEALED
        end = min(start + SEALED, len(blob))
        positions |= {start, start + 1, end - 17, end - 16, end - 1}
    rng = random.Random(5)
    positions |= {rng.randrange(len(blob)) for _ in range(150)}
    for pos in sorted(positions):
        flipped = bytearray(blob)
        flipped[pos] ^= 1 << rng.randrange(8)
        with pytest.raises(DecryptError):
            dec(bytes(flipped))


def test_wrong_key_fails_before_any_output() -> None:
    out = io.BytesIO()
    with pytest.raises(DecryptError, match="wrong key"):
        sc.decrypt_stream(OTHER_KEY, "train/a.npy", io.BytesIO(enc(PLAIN3)), out)
    assert out.getvalue() == b""


def test_renamed_path_fails() -> None:
    with pytest.raises(DecryptError, match="renamed"):
        dec(enc(PLAIN3), path="train/c.npy")


def test_error_messages_are_one_line() -> None:
    with pytest.raises(DecryptError) as info:
        dec(enc(PLAIN3)[:-1])
    assert "\n" not in str(info.value) and "train/a.npy" in str(info.value)


def test_iter_encrypt_yields_header_then_chunks() -> None:
    pieces = list(sc.iter_encrypt(KEY, "x", io.BytesIO(PLAIN3), CS))
    assert [len(p) for p in pieces] == [sc.HEADER_LEN, SEALED, SEALED, 1000 + sc.TAG_LEN]
    assert dec(b"".join(pieces), path="x") == PLAIN3


class Trickle:
    """A pipe-like reader that returns at most 777 bytes per read."""

    def __init__(self, data: bytes) -> None:
        self._buf = io.BytesIO(data)

    def read(self, size: int) -> bytes:
        return self._buf.read(min(size, 777))


def test_short_reads_from_pipes_are_handled() -> None:
    blob = b"".join(sc.iter_encrypt(KEY, "x", Trickle(PLAIN3), CS))
    out = io.BytesIO()
    sc.decrypt_stream(KEY, "x", Trickle(blob), out)
    assert out.getvalue() == PLAIN3


def test_limit_frames_files_inside_one_stream() -> None:
    a_plain, b_plain = PLAIN3, b"second file"
    a, b = enc(a_plain, "a"), enc(b_plain, "b")
    stream = io.BytesIO(a + b)
    out_a, out_b = io.BytesIO(), io.BytesIO()
    sc.decrypt_stream(KEY, "a", stream, out_a, limit=sc.ciphertext_size(len(a_plain), CS))
    sc.decrypt_stream(KEY, "b", stream, out_b, limit=sc.ciphertext_size(len(b_plain), CS))
    assert (out_a.getvalue(), out_b.getvalue()) == (a_plain, b_plain)
    with pytest.raises(DecryptError, match="shorter than its frame"):
        sc.decrypt_stream(KEY, "b", io.BytesIO(b), io.BytesIO(), limit=len(b) + 10)


def test_decrypt_file_leaves_nothing_on_failure(tmp_path) -> None:
    src, blob_path, dst = tmp_path / "p.bin", tmp_path / "p.enc", tmp_path / "out" / "p.bin"
    dst.parent.mkdir()
    src.write_bytes(PLAIN3)
    with open(src, "rb") as plain, open(blob_path, "wb") as out:
        size = sc.encrypt_stream(KEY, "p.bin", plain, out, CS)
    assert size == blob_path.stat().st_size == sc.ciphertext_size(len(PLAIN3), CS)
    blob = blob_path.read_bytes()
    blob_path.write_bytes(blob[:-1])  # the last chunk is damaged: the first two verify
    with pytest.raises(DecryptError):
        sc.decrypt_file(KEY, "p.bin", str(blob_path), str(dst))
    assert list(dst.parent.iterdir()) == []
    blob_path.write_bytes(blob)
    assert sc.decrypt_file(KEY, "p.bin", str(blob_path), str(dst)) == len(PLAIN3)
    assert dst.read_bytes() == PLAIN3
    assert [p.name for p in dst.parent.iterdir()] == ["p.bin"]


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        enc(b"x", cs=CS - 1)
    with pytest.raises(ValueError, match="chunk_size"):
        sc.ciphertext_size(10, sc.MAX_CHUNK + 1)
    with pytest.raises(ValueError, match="32 bytes"):
        enc(b"x", key=b"short")


@pytest.mark.parametrize("size", [0, 1, 64 << 10, (64 << 10) * 5 + 17, (64 << 10) * 6])
def test_pieces_sealed_apart_are_the_bytes_of_one_stream(size):
    """A file sent as pieces over several channels: each piece sealed on its own, put
    together in chunk order, decrypts as one stream and equals that stream's bytes."""
    from remotemac.agent.streamcrypt import (
        chunk_count,
        chunk_opener,
        iter_encrypt,
        new_header,
        seal_chunks,
        sealed_span,
    )

    key, data, cs = os.urandom(32), os.urandom(size), 64 << 10
    header = new_header(key, "big/train.bin", cs)
    total = chunk_count(size, cs)
    cuts = sorted({0, total // 3, total - 1 if total > 1 else 0, total} - {0}) or [total]
    pieces, first = [], 0
    for end in cuts:
        if end <= first:
            continue
        src = io.BytesIO(data)
        src.seek(first * cs)
        sealed = b"".join(seal_chunks(key, "big/train.bin", header, src, size, first, end - first))
        assert len(sealed) == sealed_span(size, cs, first, end - first)
        pieces.append(sealed)
        first = end
    assert first == total
    whole = header + b"".join(pieces)
    stream = b"".join(iter_encrypt(key, "big/train.bin", io.BytesIO(data), cs, resume=(header, 0)))
    assert whole == header + stream
    out = io.BytesIO()
    sc.decrypt_stream(key, "big/train.bin", io.BytesIO(whole), out)
    assert out.getvalue() == data
    opener, chunk = chunk_opener(key, "big/train.bin", header)
    assert chunk == cs
    last_plain = size - (total - 1) * cs
    assert (
        opener(total - 1, True, whole[len(whole) - last_plain - 16 :]) == data[(total - 1) * cs :]
    )


def test_a_piece_outside_its_file_or_under_another_path_is_refused():
    from remotemac.agent.streamcrypt import chunk_opener, new_header, seal_chunks, sealed_span

    key, cs = os.urandom(32), 64 << 10
    header = new_header(key, "a.bin", cs)
    with pytest.raises(ValueError):
        sealed_span(3 * cs, cs, 2, 2)
    with pytest.raises(ValueError):
        list(seal_chunks(key, "a.bin", header, io.BytesIO(b"x" * cs), 3 * cs, 0, 2))
    with pytest.raises(DecryptError):
        chunk_opener(key, "b.bin", header)  # the path is bound into the header MAC
