"""The host side of a split push (agent/dataops.py ``S`` and ``J`` frames), in process.

One large file arrives as pieces (chunk ranges) over several streams, each stream's
receiver writing its range into one ciphertext and one plaintext part in RAM; a ``J``
frame checks the whole and puts it in place. The pieces are sealed as the laptop seals
them (streamcrypt.seal_chunks); the agent runtime's activation and the RAM store are
faked as in tests/test_dataops_behind.py, the encryption, hashing and files are real.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from pathlib import Path

import pytest

from remotemac.agent import datafiles, datarecords, receiver, streamcrypt
from tests import test_dataops_behind as behind
from tests.test_dataops_behind import _hello, _leftovers, _run
from tests.test_sync_resync import _dead_pid

dataops = behind.dataops  # the fixture: the receiver module, runtime and RAM store faked

REL = "big/train.bin"
CS = streamcrypt.DEFAULT_CHUNK
#: 13 chunks, the last one short; pieces as a laptop with three streams cuts them
SIZE = 12 * CS + 12_345
PIECES = [(0, 5), (5, 4), (9, 4)]


class _File:
    """One large file of the laptop's slice and the frames it sends of it."""

    def __init__(self, root: Path, key: bytes, size: int = SIZE) -> None:
        self.root, self.key = root, key
        self.data = os.urandom(size)
        (root / REL).parent.mkdir(parents=True, exist_ok=True)
        (root / REL).write_bytes(self.data)
        self.header = streamcrypt.new_header(key, REL, CS)
        self.sha256 = hashlib.sha256(self.data).hexdigest()

    def entry(self, **changed) -> dict:
        st = (self.root / REL).stat()
        entry = {"path": REL, "size": len(self.data), "sha256": None, "mtime_ns": st.st_mtime_ns}
        return dict(entry, **changed)

    def hello(self, *entries: dict, **extra) -> dict:
        return dict(_hello(self.root, self.key, list(entries) or [self.entry()]), **extra)

    def piece(
        self, first: int, count: int, *, header: bytes | None = None, rel: str = REL, pad=b""
    ) -> bytes:
        """``S 0 length`` + its description + the sealed chunks (``pad`` appended)."""
        from remotemac.agent.dataops import FRAME, META_LEN

        header = header or self.header
        src = io.BytesIO(self.data[first * CS :])
        body = b"".join(
            streamcrypt.seal_chunks(self.key, rel, header, src, len(self.data), first, count)
        )
        body += pad
        desc = json.dumps({"header": header.hex(), "first": first, "count": count}).encode()
        return FRAME.pack(b"S", 0, len(body)) + META_LEN.pack(len(desc)) + desc + body

    def assemble(self, sha256: str | None = None, header: bytes | None = None) -> bytes:
        from remotemac.agent.dataops import FRAME

        req = {"sha256": sha256 or self.sha256, "header": (header or self.header).hex()}
        body = json.dumps(req).encode()
        return FRAME.pack(b"J", 0, len(body)) + body

    def plain_sha(self, first: int, count: int) -> str:
        return hashlib.sha256(self.data[first * CS : (first + count) * CS]).hexdigest()


def _line(obj: dict) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def _end(big: _File | None = None) -> bytes:
    """The E frame: the hello's entries, with the file's hash the laptop learnt."""
    from remotemac.agent.dataops import FRAME

    changed = [[0, len(big.data), big.sha256]] if big is not None else []
    final = json.dumps({"changed": changed}).encode()
    return FRAME.pack(b"E", 0, len(final)) + final


def _split_files(tmp_path: Path) -> list[str]:
    """What is left of any split: its files under .remotemac-partial and its RAM part."""
    partial = tmp_path / "run" / "data" / ".remotemac-partial"
    kept = [p.name for p in partial.iterdir()] if partial.exists() else []
    ram = tmp_path / "ram"
    return sorted(kept + [p.name for p in ram.rglob("*.split-*")])


def _assert_whole(dataops, tmp_path: Path, big: _File) -> None:
    """Stored encrypted as one remotemac-enc/v1 file, decrypted in RAM, recorded."""
    src = tmp_path / "run" / "data"
    out = tmp_path / "decrypted"
    streamcrypt.decrypt_file(big.key, REL, str(src / (REL + ".rmenc")), str(out))
    assert out.read_bytes() == big.data
    assert (tmp_path / "ram" / REL).read_bytes() == big.data
    rec = datarecords.load_records(str(src))[REL]
    assert rec["sha256"] == big.sha256 and rec["size"] == len(big.data)
    assert rec["enc_size"] == streamcrypt.ciphertext_size(len(big.data), CS)
    assert rec["plain_mtime_ns"] == (tmp_path / "ram" / REL).stat().st_mtime_ns
    assert _split_files(tmp_path) == [] and _leftovers(tmp_path / "ram", src) == []


class _Channel:
    """One receiver session on a thread, fed through pipes: the laptop's end of one
    SSH channel (several of them share the host's src, as the streams of one sync)."""

    def __init__(self, dataops, hello: dict) -> None:
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        self._to = os.fdopen(stdin_w, "wb")
        self._from = os.fdopen(stdout_r, "rb")
        stdin, stdout = os.fdopen(stdin_r, "rb"), os.fdopen(stdout_w, "wb")
        self.code: int | None = None

        def run() -> None:
            try:
                self.code = dataops.serve(stdin, stdout)
            finally:
                stdout.close()
                stdin.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        self.send(_line(hello))

    def send(self, data: bytes) -> None:
        self._to.write(data)
        self._to.flush()

    def line(self) -> dict:
        raw = self._from.readline()
        assert raw, "the receiver ended"
        return json.loads(raw)

    def until_result(self) -> list[dict]:
        lines = [self.line()]
        while "result" not in lines[-1] and lines[-1].get("ok") is not False:
            lines.append(self.line())
        return lines

    def close(self) -> int | None:
        self._to.close()
        self._thread.join(30)
        self._from.close()
        return self.code


@pytest.mark.timeout(60)
def test_pieces_out_of_order_over_two_streams_assemble_into_one_verified_file(dataops, tmp_path):
    """Piece 2 on a worker stream, piece 0 on the main one, piece 1 on the worker: each
    is answered at once, and the J frame on the main stream puts one ciphertext in the
    usual format and the plaintext in RAM in place, recorded and acknowledged."""
    from remotemac.agent.dataops import FRAME

    big = _File(tmp_path / "data", os.urandom(32))
    main = _Channel(dataops, big.hello())
    worker = None
    try:
        assert main.line() == {"ok": True, "todo": [[0, None]], "partial": []}
        worker = _Channel(dataops, big.hello(worker=True))
        assert worker.line()["ok"] is True
        worker.send(big.piece(*PIECES[2]))
        assert worker.line() == {"piece": [0, PIECES[2][0]]}
        main.send(big.piece(*PIECES[0]))
        assert main.line() == {"piece": [0, PIECES[0][0]]}
        worker.send(big.piece(*PIECES[1]))
        assert worker.line() == {"piece": [0, PIECES[1][0]]}
        assert not (tmp_path / "ram" / REL).exists()  # nothing in place before J
        worker.send(FRAME.pack(b"D", 0, 0))
        assert worker.line() == {"ok": True, "result": {"received": 0}}
        main.send(big.assemble() + _end(big))
        lines = main.until_result()
    finally:
        main.close()
        if worker is not None:
            worker.close()
    assert lines[-1]["ok"] is True, lines
    assert [i for line in lines if "acks" in line for i in line["acks"]] == [0]
    result = lines[-1]["result"]
    assert result["received"] == 1 and result["mismatches"] == []
    assert main.code == 0 and worker.code == 0
    _assert_whole(dataops, tmp_path, big)


def test_a_cut_inside_a_piece_keeps_the_whole_pieces_for_the_next_session(dataops, tmp_path):
    """The link drops inside piece 1: the next start answer lists the split with piece
    0 and the chunks of piece 1 that came whole (each with its plaintext hash as the
    laptop checks it), and the missing pieces + J complete the file."""
    big = _File(tmp_path / "data", os.urandom(32))
    second = big.piece(*PIECES[1])
    cut = _line(big.hello()) + big.piece(*PIECES[0]) + second[: len(second) // 2]
    code, lines = _run(dataops, cut)
    assert code == 3 and lines[1:] == [{"piece": [0, 0]}]
    assert (tmp_path / "ram" / REL).exists() is False
    resumed = _line(big.hello()) + second + big.piece(*PIECES[2]) + big.assemble() + _end(big)
    code, lines = _run(dataops, resumed)
    first, n = PIECES[0]
    held = lines[0]["partial"][0][1]["pieces"]
    whole = held[1][1]  # of piece 1, the chunks that came before the cut
    assert 1 <= whole < PIECES[1][1]
    assert lines[0]["partial"] == [
        [
            0,
            {
                "split": True,
                "header": big.header.hex(),
                "pieces": [
                    [first, n, big.plain_sha(first, n)],
                    [PIECES[1][0], whole, big.plain_sha(PIECES[1][0], whole)],
                ],
                "size": len(big.data),
                "mtime_ns": big.entry()["mtime_ns"],
            },
        ]
    ]
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    _assert_whole(dataops, tmp_path, big)


def _hostile(big: _File, case: str) -> bytes:
    """The frames of one hostile (or broken) laptop after its hello."""
    p0, p1, p2 = PIECES
    if case == "piece beyond the file":
        return big.piece(12, 1).replace(b'"first": 12, "count": 1', b'"first": 12, "count": 2')
    if case == "length not the exact span":
        return big.piece(*p0, pad=bytes(16))
    if case == "header under another path":
        other = streamcrypt.new_header(big.key, "other.bin", CS)
        return big.piece(*p0, header=other, rel="other.bin")
    if case == "header under another key":
        stranger = _File(big.root / "elsewhere", os.urandom(32))
        stranger.data = big.data
        return stranger.piece(*p0)
    if case == "J with a gap":
        return big.piece(*p0) + big.piece(*p2) + big.assemble() + _end()
    if case == "J with overlapping pieces":
        return big.piece(0, 6) + big.piece(*p1) + big.piece(*p2) + big.assemble() + _end()
    if case == "J whose sha256 differs":
        pieces = b"".join(big.piece(*p) for p in PIECES)
        return pieces + big.assemble(sha256="0" * 64) + _end()
    if case == "J for a split never started":
        return big.assemble() + _end()
    if case == "piece in a public session":
        return big.piece(*p0)
    raise AssertionError(case)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("piece beyond the file", "piece 12+2 is not within its 13 chunks"),
        ("length not the exact span", "of 1310816 bytes, not 1310800"),
        ("header under another path", "header authentication failed"),
        ("header under another key", "header authentication failed"),
        ("J with a gap", "do not cover its 13 chunks exactly once"),
        ("J with overlapping pieces", "do not cover its 13 chunks exactly once"),
        ("J whose sha256 differs", "differs from the laptop's"),
        ("J for a split never started", "no piece of it under this header"),
        ("piece in a public session", "not encrypted"),
    ],
)
def test_hostile_split_frames_are_one_integrity_line_and_record_nothing(
    dataops, tmp_path, case, why
):
    """A piece outside the file or of the wrong length, a header that does not
    authenticate for this path and key, a J whose pieces do not tile the file or whose
    plaintext hashes otherwise, a J of nothing: one integrity line, nothing recorded or
    in place, and a failed J leaves none of that split's files."""
    big = _File(tmp_path / "data", os.urandom(32))
    hello = big.hello()
    if case == "piece in a public session":
        hello = dict(hello, encrypted=False)
        del hello["key_hex"]
    code, lines = _run(dataops, _line(hello) + _hostile(big, case))
    assert code == 1
    failures = [line for line in lines if line.get("ok") is False]
    assert failures == [lines[-1]] and lines[-1]["code"] == "integrity", lines
    assert why in lines[-1]["error"]
    assert not any("acks" in line for line in lines)
    src = tmp_path / "run" / "data"
    assert datarecords.load_records(str(src)) == {}
    assert not (src / (REL + ".rmenc")).exists() and not (tmp_path / "ram" / REL).exists()
    if case.startswith("J"):
        assert _split_files(tmp_path) == []


@pytest.mark.parametrize("change", ["size", "mtime", "gone", "verified", "RAM lost"])
def test_a_stale_split_is_dropped_at_the_start(dataops, tmp_path, change):
    """The laptop's file changed (size, mtime) or left the slice since the cut, a later
    session sent it whole, or the host lost its RAM (a reboot): the start answer does
    not list the split, and its files, RAM part included, go."""
    big = _File(tmp_path / "data", os.urandom(32))
    code, lines = _run(dataops, _line(big.hello()) + big.piece(*PIECES[0]))
    assert code == 3 and lines[1:] == [{"piece": [0, 0]}]
    kept = _split_files(tmp_path)
    assert len(kept) == 4 and any(".split-" in name for name in kept)
    entry = big.entry()
    if change == "size":
        entry["size"] += 1
    elif change == "mtime":
        entry["mtime_ns"] += 1
    elif change == "gone":
        entry = dict(entry, path="other.bin", size=5)
    elif change == "verified":  # sent whole by a session cut after it was acknowledged
        from remotemac.agent.dataops import FRAME

        sealed = io.BytesIO()
        streamcrypt.encrypt_stream(big.key, REL, io.BytesIO(big.data), sealed, CS)
        whole = FRAME.pack(b"F", 0, len(sealed.getvalue())) + sealed.getvalue()
        code, lines = _run(dataops, _line(big.hello()) + whole + bytes.fromhex(big.sha256))
        assert code == 3 and lines[-1] == {"acks": [0]}
        assert len(_split_files(tmp_path)) == 4
    else:
        for name in kept:
            if ".split-" in name:
                (tmp_path / "ram" / "big" / name).unlink()
    code, lines = _run(dataops, _line(big.hello(entry)))
    assert code == 3 and lines[0]["partial"] == []
    assert _split_files(tmp_path) == []


def test_finish_removes_a_cut_sessions_split_but_not_one_this_session_still_writes(
    dataops, tmp_path
):
    """After a cut session (its marker left, its process gone): finish removes its split
    that this session did not resume and a RAM part left with no notes, and keeps the
    split this session wrote a piece of and did not assemble (the next start lists it)."""
    big = _File(tmp_path / "data", os.urandom(32))
    code, _ = _run(dataops, _line(big.hello()) + big.piece(*PIECES[0]))
    assert code == 3
    src = tmp_path / "run" / "data"
    dead = _dead_pid()
    (src / f"{datarecords.WRITING}{os.getpid()}").rename(src / f"{datarecords.WRITING}{dead}")
    orphan = tmp_path / "ram" / "big" / ".train.bin.split-0123456789abcdef"
    orphan.write_bytes(b"a piece of a split whose notes were lost")
    old_sid = hashlib.sha256(big.header).hexdigest()[:16]
    big.header = streamcrypt.new_header(big.key, REL, CS)  # the laptop starts afresh
    code, lines = _run(dataops, _line(big.hello()) + big.piece(*PIECES[1]) + _end())
    assert code == 0 and lines[-1]["result"]["mismatches"][0]["path"] == REL
    left = _split_files(tmp_path)
    assert not orphan.exists() and not any(old_sid in name for name in left)
    new_sid = hashlib.sha256(big.header).hexdigest()[:16]
    assert len(left) == 4 and all(new_sid in name for name in left)
    code, lines = _run(dataops, _line(big.hello()))
    assert [info["header"] for _, info in lines[0]["partial"]] == [big.header.hex()]


def test_a_whole_file_send_of_the_path_drops_its_split(dataops, tmp_path, monkeypatch):
    """The laptop sends the file whole (one stream) after a cut split: the receiver
    forgets the split as it claims its own cut-transfer file, RAM part included."""
    from remotemac.agent.dataops import FRAME

    big = _File(tmp_path / "data", os.urandom(32))
    code, _ = _run(dataops, _line(big.hello()) + big.piece(*PIECES[0]))
    assert code == 3 and len(_split_files(tmp_path)) == 4
    monkeypatch.setattr(receiver, "RESUMABLE", 1 << 20)  # this file streams, resumable
    sealed = io.BytesIO()
    streamcrypt.encrypt_stream(big.key, REL, io.BytesIO(big.data), sealed, CS)
    whole = FRAME.pack(b"F", 0, len(sealed.getvalue())) + sealed.getvalue()
    code, lines = _run(dataops, _line(big.hello()) + whole[: len(whole) // 2])
    assert code == 3 and lines[0]["partial"][0][1]["split"] is True
    left = _split_files(tmp_path)
    assert not any("-s" in name or ".split-" in name for name in left), left


def _split_paths(tmp_path: Path, big: _File) -> tuple[Path, Path]:
    """(ciphertext under .remotemac-partial, plaintext part in RAM) of the split."""
    sid = hashlib.sha256(big.header).hexdigest()[:16]
    name = hashlib.sha256(REL.encode()).hexdigest()[:32]
    base = tmp_path / "run" / "data" / ".remotemac-partial" / f"{name}-s{sid}"
    return base.with_name(
        base.name + ".rmenc"
    ), tmp_path / "ram" / "big" / f".train.bin.split-{sid}"


@pytest.mark.parametrize("which", ["ciphertext", "plaintext part"])
def test_a_hard_link_at_a_kept_splits_file_is_never_written_through(dataops, tmp_path, which):
    """A cut split keeps its files under names the start answer gives away (the sid);
    someone on the host replaces one with a hard link to a file outside remote_root (a
    regular file, so it passes for the part). The next piece would be written into that
    file: ciphertext, or the dataset's plaintext on a disk. Before: written through."""
    big = _File(tmp_path / "data", os.urandom(32))
    code, _ = _run(dataops, _line(big.hello()) + big.piece(*PIECES[0]))
    assert code == 3
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * 200_000)
    target = _split_paths(tmp_path, big)[0 if which == "ciphertext" else 1]
    target.unlink()
    os.link(victim, target)
    code, lines = _run(dataops, _line(big.hello()) + big.piece(*PIECES[1]))
    assert victim.read_bytes() == b"precious" * 200_000
    assert lines[-1].get("ok") is False and lines[-1]["code"] == "unsafe-path", lines


def test_a_symlink_swapped_in_for_a_splits_ciphertext_is_not_followed_by_assemble(
    dataops, tmp_path
):
    """Between the pieces and the J frame the split's ciphertext becomes a symlink to a
    larger file outside remote_root: assembling truncated that file to the ciphertext's
    size and put the link in place as the stored file. Before: truncated."""
    big = _File(tmp_path / "data", os.urandom(32))
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious" * 1_000_000)
    main = _Channel(dataops, big.hello())
    try:
        assert main.line()["ok"] is True
        for first, count in PIECES:
            main.send(big.piece(first, count))
            assert main.line() == {"piece": [0, first]}
        cipher = _split_paths(tmp_path, big)[0]
        cipher.unlink()
        cipher.symlink_to(victim)
        main.send(big.assemble() + _end(big))
        lines = main.until_result()
    finally:
        main.close()
    assert victim.read_bytes() == b"precious" * 1_000_000
    assert lines[-1]["ok"] is False, lines
    assert not (tmp_path / "run" / "data" / (REL + ".rmenc")).is_symlink()


def _straggler(dataops, big: _File) -> _Channel:
    """A cut session's receiver that has not noticed the cut yet (sshd learns of a
    dropped link only when its keepalive gives up): piece 0 in, piece 1 half read."""
    stale = _Channel(dataops, big.hello())
    assert stale.line()["ok"] is True
    stale.send(big.piece(*PIECES[0]))
    assert stale.line() == {"piece": [0, 0]}
    second = big.piece(*PIECES[1])
    stale.send(second[: len(second) // 2])
    return stale


@pytest.mark.timeout(60)
def test_a_straggler_noting_its_cut_piece_late_does_not_undo_the_whole_one(dataops, tmp_path):
    """The next session continues the split and stores piece 1 whole; then the old
    receiver reads its end of file and notes the chunks of piece 1 it had. That shorter
    note replaced the whole one, and the J frame failed as an integrity error (the
    pieces no longer covered the file) and dropped every piece. Before: it did."""
    big = _File(tmp_path / "data", os.urandom(32))
    stale = _straggler(dataops, big)
    main = _Channel(dataops, big.hello())
    try:
        assert main.line()["partial"][0][1]["pieces"] == [[0, 5, big.plain_sha(0, 5)]]
        for first, count in PIECES[1:]:
            main.send(big.piece(first, count))
            assert main.line() == {"piece": [0, first]}
        assert stale.close() == 3  # the cut reaches it: it notes what it had of piece 1
        main.send(big.assemble() + _end(big))
        lines = main.until_result()
    finally:
        main.close()
        stale.close()
    assert lines[-1]["ok"] is True, lines
    _assert_whole(dataops, tmp_path, big)


@pytest.mark.timeout(60)
def test_a_straggler_noting_its_cut_piece_after_the_assemble_leaves_nothing(dataops, tmp_path):
    """The same old receiver reads its end of file once the split was assembled: it
    wrote the split's notes (and lock) anew, for a split whose ciphertext and RAM part
    are in place: debris under .remotemac-partial. Before: left."""
    big = _File(tmp_path / "data", os.urandom(32))
    stale = _straggler(dataops, big)
    main = _Channel(dataops, big.hello())
    try:
        assert main.line()["ok"] is True
        for first, count in PIECES[1:]:
            main.send(big.piece(first, count))
            assert main.line() == {"piece": [0, first]}
        main.send(big.assemble() + _end(big))
        lines = main.until_result()
        assert stale.close() == 3
    finally:
        main.close()
        stale.close()
    assert lines[-1]["ok"] is True, lines
    _assert_whole(dataops, tmp_path, big)


def _run_within(dataops, stream: bytes, seconds: float = 20.0) -> tuple[int, list[dict]]:
    """_run on a thread: a receiver that blocks (an open() of a FIFO) fails the test
    instead of hanging it."""
    got: list[tuple[int, list[dict]]] = []
    worker = threading.Thread(target=lambda: got.append(_run(dataops, stream)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert got, f"the receiver still had not answered after {seconds} s"
    return got[0]


@pytest.mark.parametrize("which", ["notes", "ciphertext"])
def test_a_fifo_planted_at_a_kept_splits_file_does_not_hang_the_next_start(
    dataops, tmp_path, which
):
    """Someone on the host replaces a cut split's notes (``.json``) or ciphertext with a
    FIFO. The next session's start must answer (an open() of a FIFO for reading waits
    for a writer forever: the sync would hang with it) and list no piece of the split;
    the J frame's open of the split's files must refuse a FIFO, not wait on it. Before:
    the start hung on the notes, and the J frame's open on a FIFO."""
    big = _File(tmp_path / "data", os.urandom(32))
    code, _ = _run(dataops, _line(big.hello()) + big.piece(*PIECES[0]))
    assert code == 3
    cipher = _split_paths(tmp_path, big)[0]
    fifo = cipher.with_suffix(".json") if which == "notes" else cipher
    fifo.unlink()
    os.mkfifo(fifo)
    code, lines = _run_within(dataops, _line(big.hello()))
    assert lines[0]["partial"] == [], lines
    if which == "notes":
        assert fifo.is_fifo()  # not a note of remotemac's: left where it is
    else:
        os.mkfifo(fifo)  # (the start dropped the split, FIFO and all) the J frame's open
        refused: list[BaseException] = []

        def open_it() -> None:
            try:
                datafiles.own_file(str(fifo), os.O_RDONLY)
            except BaseException as exc:  # noqa: BLE001 - the test looks at it
                refused.append(exc)

        worker = threading.Thread(target=open_it, daemon=True)
        worker.start()
        worker.join(10)
        assert refused and isinstance(refused[0], datarecords.DataError), refused
        assert refused[0].code == "unsafe-path"


def _hint(big: _File, header: bytes | None = None) -> bytes:
    """An ``H`` frame: hash what tiles so far (the laptop sends it as pieces land)."""
    from remotemac.agent.dataops import FRAME

    body = json.dumps({"header": (header or big.header).hex()}).encode()
    return FRAME.pack(b"H", 0, len(body)) + body


def _hashed(monkeypatch) -> list[tuple[int, int]]:
    """The plaintext ranges the receiver hashes for a split (hash_ahead, then the join)."""
    from remotemac.agent import datasplit

    ranges: list[tuple[int, int]] = []
    extend = datasplit.Prefix.extend

    def spy(self, part: str, end: int) -> None:
        if end > self.at:
            ranges.append((self.at, end))
        extend(self, part, end)

    monkeypatch.setattr(datasplit.Prefix, "extend", spy)
    return ranges


def test_hints_hash_the_pieces_that_tile_and_the_join_only_the_rest(dataops, tmp_path, monkeypatch):
    """Pieces 0 and 2 are in: a hint hashes piece 0 only (piece 2 does not tile from the
    start, and is never hashed before piece 1); piece 1 and a hint: up to the end; the
    join hashes nothing more, and the file is verified, in place and recorded as before."""
    ranges = _hashed(monkeypatch)
    big = _File(tmp_path / "data", os.urandom(32))
    (p0, n0), (p1, n1), (p2, n2) = PIECES
    stream = (
        _line(big.hello())
        + big.piece(p0, n0)
        + big.piece(p2, n2)
        + _hint(big)
        + big.piece(p1, n1)
        + _hint(big)
        + _hint(big)  # (nothing new: nothing hashed)
        + big.assemble()
        + _end(big)
    )
    code, lines = _run(dataops, stream)
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    # (the hints run on the write-behind thread: piece 1 may be noted before the first
    # one runs, and then it hashes the whole file at once)
    assert ranges in ([(0, n0 * CS), (n0 * CS, SIZE)], [(0, SIZE)]), ranges
    _assert_whole(dataops, tmp_path, big)


@pytest.mark.parametrize("other", ["another key", "another split of the file"])
def test_a_hint_that_is_not_the_splits_is_ignored(dataops, tmp_path, monkeypatch, other):
    """A hint under a header that does not authenticate, or one of a split that has no
    piece here: no error, nothing hashed for it; the join completes from what the
    split's own hints hashed."""
    ranges = _hashed(monkeypatch)
    big = _File(tmp_path / "data", os.urandom(32))
    key = os.urandom(32) if other == "another key" else big.key
    stranger = streamcrypt.new_header(key, REL, CS)
    stream = (
        _line(big.hello())
        + b"".join(big.piece(*p) for p in PIECES)
        + _hint(big)
        + _hint(big, header=stranger)
        + big.assemble()
        + _end(big)
    )
    code, lines = _run(dataops, stream)
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    assert ranges == [(0, SIZE)]
    _assert_whole(dataops, tmp_path, big)


def test_a_join_after_hints_still_refuses_a_hash_that_differs(dataops, tmp_path, monkeypatch):
    """The whole file hashed ahead, then a join whose SHA-256 is not the plaintext's: one
    integrity line, nothing recorded or in place, none of the split's files left."""
    ranges = _hashed(monkeypatch)
    big = _File(tmp_path / "data", os.urandom(32))
    pieces = b"".join(big.piece(*p) for p in PIECES)
    stream = _line(big.hello()) + pieces + _hint(big) + big.assemble(sha256="0" * 64) + _end()
    code, lines = _run(dataops, stream)
    assert ranges == [(0, SIZE)]
    assert code == 1 and lines[-1]["code"] == "integrity", lines
    assert "differs from the laptop's" in lines[-1]["error"]
    src = tmp_path / "run" / "data"
    assert datarecords.load_records(str(src)) == {}
    assert not (tmp_path / "ram" / REL).exists() and _split_files(tmp_path) == []


def _other_bytes(big: _File, first: int, count: int) -> bytes:
    """Piece ``first``+``count`` sealed under the split's own header and nonces but over
    other plaintext: what a laptop that resealed a chunk index with new bytes sends."""
    kept = big.data
    big.data = kept[: first * CS] + os.urandom(count * CS) + kept[(first + count) * CS :]
    try:
        return big.piece(first, count)
    finally:
        big.data = kept


def test_a_piece_written_again_after_a_hint_makes_the_join_hash_the_whole_file(
    dataops, tmp_path, monkeypatch
):
    """Piece 0 is hashed ahead, then written again over other plaintext (its chunks
    authenticate: same key, header and nonces). The join must not trust what it hashed
    before: it hashes the whole file, finds it differs from the laptop's SHA-256 and
    keeps nothing. Before: it hashed only the pieces after the hint and accepted a file
    whose first 5 chunks in RAM had never been checked."""
    ranges = _hashed(monkeypatch)
    big = _File(tmp_path / "data", os.urandom(32))
    (p0, n0), (p1, n1), (p2, n2) = PIECES
    stream = (
        _line(big.hello())
        + big.piece(p0, n0)
        + _hint(big)
        + _other_bytes(big, p0, n0)
        + big.piece(p1, n1)
        + big.piece(p2, n2)
        + _hint(big)  # marked rewritten: no hashing ahead
        + big.assemble()
        + _end(big)
    )
    code, lines = _run(dataops, stream)
    assert ranges[-1] == (0, SIZE), ranges  # the join hashed it all
    assert code == 1 and lines[-1]["code"] == "integrity", lines
    assert "differs from the laptop's" in lines[-1]["error"]
    assert datarecords.load_records(str(tmp_path / "run" / "data")) == {}
    assert not (tmp_path / "ram" / REL).exists() and _split_files(tmp_path) == []


def test_a_piece_sent_again_with_the_same_bytes_is_verified_by_a_whole_hash(
    dataops, tmp_path, monkeypatch
):
    """A resend of a noted piece with the same bytes (as after a cut): the file is
    verified, in place and recorded as usual, by a hash of the whole file at the join."""
    ranges = _hashed(monkeypatch)
    big = _File(tmp_path / "data", os.urandom(32))
    (p0, n0), (p1, n1), (p2, n2) = PIECES
    stream = (
        _line(big.hello())
        + big.piece(p0, n0)
        + _hint(big)
        + big.piece(p0, n0)
        + big.piece(p1, n1)
        + big.piece(p2, n2)
        + _hint(big)
        + big.assemble()
        + _end(big)
    )
    code, lines = _run(dataops, stream)
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    assert ranges[-1] == (0, SIZE), ranges
    _assert_whole(dataops, tmp_path, big)
