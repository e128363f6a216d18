"""The host receiver (agent/dataops.py) with its write-behind thread, in process.

The laptop's own framing (engine/sync.py ``read_pieces``) produces the stream; the agent
runtime's activation and the RAM store are faked (a unit test: the real sshd path is
tests/test_sync_sshd.py), the encryption, hashing and files are real.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from remotemac.agent import datarecords, receiver

AGENT = Path(__file__).resolve().parent.parent / "remotemac" / "agent"


@pytest.fixture
def dataops(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(AGENT))  # the agent imports its siblings by bare name
    from remotemac.agent import dataops, ramstore

    ram = tmp_path / "ram"

    def fake_store(run_dir, size, run_id):
        ram.mkdir(exist_ok=True)
        return {"path": str(ram), "kind": "shm", "device": None, "warning": None, "steps": []}

    monkeypatch.setattr(receiver, "use_runtime", lambda path: None)
    monkeypatch.setattr(ramstore, "create_ram_store", fake_store)
    return dataops


def _slice(root: Path, sizes: dict[str, int]) -> list[str]:
    for rel, size in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return sorted(sizes)


def _hello(root: Path, key: bytes, entries: list[dict]) -> dict:
    """The laptop's hello for a slice under ``root`` (the run dir beside it)."""
    return {
        "run_dir": str(root.parent / "run"),
        "run_id": "t",
        "src": str(root.parent / "run" / "data"),
        "encrypted": True,
        "key_hex": key.hex(),
        "runtime_dir": "faked",
        "entries": entries,
    }


def _stream(
    root: Path,
    paths: list[str],
    key: bytes,
    tamper: int | None = None,
    zero_claim: int | None = None,
) -> bytes:
    """hello + the laptop's frames for every file (+ the E frame); ``tamper``: the
    index of a file one byte of one of whose sealed chunks is flipped on the way: a
    small file's only chunk; for a streamed file the last chunk the reader yields with
    plaintext in it, a few before its final one (its earlier chunks are then written
    before it fails; a bad final chunk: tests/test_streamcrypt.py). ``zero_claim``:
    the index of a file whose SHA-256 sent after its ciphertext is zeroed (a laptop
    whose claim and sealed bytes came from different reads); the E frame keeps the
    digest the laptop's reader took, as the laptop's final frame does."""
    from remotemac.engine.syncpieces import FileDone, pack_frame, read_pieces
    from remotemac.engine.syncplan import Job, stat_all

    files = stat_all(root, paths, None)
    hello = _hello(
        root,
        key,
        [{"path": f.path, "size": f.size, "sha256": None, "mtime_ns": f.mtime_ns} for f in files],
    )
    out = [json.dumps(hello).encode() + b"\n"]
    work = collections.deque(Job(i, None, None) for i in range(len(files)))
    current = last = -1
    for item in read_pieces(root, files, work, key):
        if isinstance(item, FileDone):
            files[item.index] = item.local
            continue
        data = item[0]
        if isinstance(data, list):  # a small file whole: frame, header, chunk, SHA-256
            index = int.from_bytes(data[0][1:5], "big")
            if index == tamper:
                sealed = data[-2]
                sealed = sealed[:-20] + bytes([sealed[-20] ^ 1]) + sealed[-19:]
                data = [*data[:-2], sealed, data[-1]]
            if index == zero_claim:
                data = [*data[:-1], bytes(32)]
            out += data
            continue
        if len(data) == 13 and item[1] == 0:  # a frame (a header is 84 bytes, a chunk
            current = int.from_bytes(data[1:5], "big")  # covers plaintext)
        elif current == zero_claim and len(data) == 32 and item[1] == 0:  # the claim
            data = bytes(32)
        if current == tamper and item[1] > 0:
            last = len(out)  # (a sealed chunk: it covers plaintext)
        out.append(data)
    if last >= 0:
        out[last] = out[last][:-20] + bytes([out[last][-20] ^ 1]) + out[last][-19:]
    final = json.dumps({"changed": [[i, f.size, f.sha256] for i, f in enumerate(files)]}).encode()
    out.append(pack_frame("E", 0, len(final)) + final)
    return b"".join(out)


def _run(dataops, stream: bytes) -> tuple[int, list[dict]]:
    out = io.BytesIO()
    code = dataops.serve(io.BytesIO(stream), out)
    return code, [json.loads(x) for x in out.getvalue().splitlines()]


def _stored(src: Path, rec: dict) -> bytes:
    """A record's stored ciphertext: its span of a pack, or its own ``.rmenc``."""
    path, off, length = datarecords.stored_span(str(src), rec, True)
    with open(path, "rb") as fh:
        fh.seek(off)
        return fh.read(-1 if length is None else length)


def _leftovers(*dirs: Path) -> list[str]:
    return sorted(str(p) for d in dirs for p in d.rglob("*") if ".part" in p.name)


def test_small_and_large_files_arrive_verified_with_acks_in_few_lines(
    dataops, tmp_path, monkeypatch
):
    """Small files take the in-memory path, a large one streams; every one is stored
    encrypted, decrypted into the RAM store, verified, recorded and acknowledged, and
    the acknowledgements come batched (one line per file before the write-behind)."""
    root = tmp_path / "data"
    sizes = {f"d{i % 4}/s{i:03d}.bin": 1000 + 3000 * i for i in range(80)}
    sizes["big/train.bin"] = datarecords.RESUMABLE + 300_000
    paths = _slice(root, sizes)
    key = os.urandom(32)
    # acks wait for a quiet second (default 20 ms): the test does not hang on timing
    behind = dataops.WriteBehind
    monkeypatch.setattr(dataops, "WriteBehind", lambda *a, **k: behind(*a, **k, idle_after=1.0))
    code, lines = _run(dataops, _stream(root, paths, key))
    assert code == 0, lines[-1]
    result = lines[-1]["result"]
    assert result["mismatches"] == [] and result["received"] == len(paths)
    acked = [i for line in lines if "acks" in line for i in line["acks"]]
    assert sorted(acked) == list(range(len(paths)))
    assert len([line for line in lines if "acks" in line]) <= 3
    ram, src = tmp_path / "ram", tmp_path / "run" / "data"
    records = datarecords.load_records(str(src))
    for rel in paths:
        assert (ram / rel).read_bytes() == (root / rel).read_bytes()
        stored = _stored(src, records[rel])
        assert (
            stored.startswith(b"remotemac-enc/v1") and (root / rel).read_bytes()[:64] not in stored
        )
    # the small files' ciphertext rests in a pack per group, the large file's on its own
    packs = list((src / datarecords.PACKS).iterdir())
    assert 1 <= len(packs) <= len(paths) // 4 and not list(src.rglob("s*.bin.rmenc"))
    assert {records[p].get("pack") is None for p in paths} == {False, True}
    assert {r["sha256"] for r in records.values()} == {
        hashlib.sha256((root / p).read_bytes()).hexdigest() for p in paths
    }
    assert _leftovers(ram, src) == []


@pytest.mark.parametrize("big", [False, True], ids=["small", "streamed"])
def test_a_whole_file_whose_ciphertext_was_altered_on_the_way_is_an_integrity_error(
    dataops, tmp_path, big
):
    """A file received whole is checked by its authenticated decryption, not by a second
    hash on the host (docs/contract.md, "Promises"): one flipped ciphertext byte ends the
    session with one integrity line, the file is neither recorded nor left in RAM (nor
    its part file), and no file after it is recorded as verified. The files before it
    (small ones still queued for the write-behind thread) are kept."""
    root = tmp_path / "data"
    sizes = {f"f{i:02d}.bin": 5000 + i for i in range(12)}
    if big:
        sizes["f05.bin"] = datarecords.RESUMABLE + 300_000
    paths = _slice(root, sizes)
    code, lines = _run(dataops, _stream(root, paths, os.urandom(32), tamper=5))
    assert code == 1
    assert lines[-1]["code"] == "integrity" and paths[5] in lines[-1]["error"]
    assert "failed decryption" in lines[-1]["error"]
    records = datarecords.load_records(str(tmp_path / "run" / "data"))
    assert paths[5] not in records
    assert not any(p > paths[5] for p in records)
    assert sorted(records) == paths[:5]
    assert not (tmp_path / "ram" / paths[5]).exists()
    assert _leftovers(tmp_path / "ram", tmp_path / "run" / "data") == []


def test_a_cut_inside_a_file_keeps_every_file_read_whole(dataops, tmp_path):
    """The link drops in the middle of a file: the files before it (still queued on
    the write-behind thread) are stored and recorded before the receiver exits, and
    nothing of the cut one is left behind."""
    root = tmp_path / "data"
    paths = _slice(root, {f"f{i:02d}.bin": 40_000 for i in range(20)})
    stream = _stream(root, paths, os.urandom(32))
    code, lines = _run(dataops, stream[: len(stream) // 2])
    assert code == 3
    records = datarecords.load_records(str(tmp_path / "run" / "data"))
    assert 5 <= len(records) < len(paths)
    acked = [i for line in lines if "acks" in line for i in line["acks"]]
    assert sorted(acked) == list(range(len(records)))
    assert _leftovers(tmp_path / "ram", tmp_path / "run" / "data") == []


def test_the_runtime_is_activated_once_per_session_not_once_per_file(
    dataops, tmp_path, monkeypatch
):
    """Activating the agent runtime resolves its path and reads its marker: done before
    every file, it cost a re-sync of 76 changed files ~17 ms on the reading thread."""
    root = tmp_path / "data"
    paths = _slice(root, {f"d/s{i:02d}.bin": 2000 + 100 * i for i in range(20)})
    calls: list[str | None] = []
    monkeypatch.setattr(receiver, "use_runtime", calls.append)
    code, lines = _run(dataops, _stream(root, paths, os.urandom(32)))
    assert code == 0, lines[-1]
    assert lines[-1]["result"]["received"] == len(paths)
    assert calls == ["faked"]


def _resync_stream(root: Path, paths: list[str], key: bytes) -> bytes:
    """hello listing every file as the laptop's hash cache knows it + the E frame: a
    re-sync where nothing changed on the laptop."""
    from remotemac.engine.syncpieces import pack_frame

    entries = []
    for rel in paths:
        st = (root / rel).stat()
        sha = hashlib.sha256((root / rel).read_bytes()).hexdigest()
        entries.append({"path": rel, "size": st.st_size, "sha256": sha, "mtime_ns": st.st_mtime_ns})
    hello = _hello(root, key, entries)
    final = json.dumps({"changed": []}).encode()
    return json.dumps(hello).encode() + b"\n" + pack_frame("E", 0, len(final)) + final


def test_a_resync_looks_at_the_ram_copies_on_a_thread_and_redecrypts_what_changed(
    dataops, tmp_path, monkeypatch
):
    """The look at every RAM copy runs beside the frames (it took 60 ms for 7,681 files
    that the first frame waited for), and finish still catches a RAM copy lost or
    touched since it was verified: it decrypts the stored copy again."""
    import threading

    root = tmp_path / "data"
    paths = _slice(root, {f"d{i % 3}/s{i:02d}.bin": 3000 + 500 * i for i in range(12)})
    key = os.urandom(32)
    code, lines = _run(dataops, _stream(root, paths, key))
    assert code == 0 and lines[-1]["result"]["mismatches"] == []
    ram = tmp_path / "ram"
    (ram / paths[0]).unlink()  # lost (a reboot)
    os.utime(ram / paths[1], ns=(1, 1))  # touched by the workload
    looked_on: list[str] = []
    check = dataops.Receiver.check_ram

    def spy(self):
        looked_on.append(threading.current_thread().name)
        check(self)

    monkeypatch.setattr(dataops.Receiver, "check_ram", spy)
    code, lines = _run(dataops, _resync_stream(root, paths, key))
    assert code == 0, lines[-1]
    result = lines[-1]["result"]
    assert result["mismatches"] == [] and result["received"] == 0
    assert result["redecrypted"] == 2
    assert looked_on == ["check-ram"]
    for rel in paths:
        assert (ram / rel).read_bytes() == (root / rel).read_bytes()


def test_a_hard_link_planted_at_a_part_name_is_never_written_through(dataops, tmp_path):
    """A file arrives under ``.<name>.part-<pid>`` (plaintext, in RAM), a name anyone on
    the host can guess (pids are few). A hard link planted there to a file outside
    remote_root had the file's plaintext (on a disk) written into it, then was renamed
    into place. Before: written through (O_TRUNC on the existing name)."""
    root = tmp_path / "data"
    paths = _slice(root, {"d/f.bin": 5000})
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    part = tmp_path / "ram" / "d" / f".f.bin.part-{os.getpid()}"
    part.parent.mkdir(parents=True)
    os.link(victim, part)
    code, lines = _run(dataops, _stream(root, paths, os.urandom(32)))
    assert victim.read_bytes() == b"precious"
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    assert (tmp_path / "ram" / "d" / "f.bin").read_bytes() == (root / "d" / "f.bin").read_bytes()


def test_a_wanted_file_named_like_a_part_file_keeps_its_plaintext(dataops, tmp_path):
    """After a cut session finish walks the RAM store and the stored copies for debris:
    it removed any name holding ``.part-<digits>`` of a dead pid, so the decrypted copy
    of a slice file named ``weights.part-<n>`` (or ``.cache.part-<n>``) went, and the
    job found it missing. Now only a name the slice does not want, in the exact form
    the receiver writes there (``.<name>.part-<pid>`` in RAM), is debris."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = proc.pid
    root = tmp_path / "data"
    paths = _slice(root, {f"d/weights.part-{dead}": 5000, f".cache.part-{dead}": 300})
    key = os.urandom(32)
    code, lines = _run(dataops, _stream(root, paths, key))
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    ram, src = tmp_path / "ram", tmp_path / "run" / "data"
    (src / (datarecords.WRITING + str(dead))).touch()  # a session cut, since dead
    debris = ram / "d" / f".f.bin.part-{dead}"
    debris.write_bytes(b"half")
    code, lines = _run(dataops, _resync_stream(root, paths, key))
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    for rel in paths:
        assert (ram / rel).read_bytes() == (root / rel).read_bytes()
    assert not debris.exists()  # real debris of the dead session still goes
    assert not (src / (datarecords.WRITING + str(dead))).exists()


def test_a_link_planted_at_the_packs_folder_is_refused(dataops, tmp_path):
    """Small files' ciphertext goes into packs under ``<src>/.remotemac-packs/`` (a name
    anyone can read in the code): a symlink planted there to a folder outside
    remote_root is refused, and nothing is written through it."""
    root = tmp_path / "data"
    paths = _slice(root, {"d/f.bin": 5000})
    outside = tmp_path / "outside"
    outside.mkdir()
    src = tmp_path / "run" / "data"
    src.mkdir(parents=True)
    (src / datarecords.PACKS).symlink_to(outside)
    code, lines = _run(dataops, _stream(root, paths, os.urandom(32)))
    assert list(outside.iterdir()) == []
    assert code != 0 and lines[-1]["code"] == "unsafe-path", lines


def test_a_link_swapped_in_for_the_packs_folder_deletes_nothing_it_leads_to(dataops, tmp_path):
    """The job (same user as the agent) moves the packs away and puts a link to a
    folder of the user's in their place. The next re-sync, with nothing to send, goes
    straight to the final check, which drops packs no record names: it listed and
    unlinked through the link, and the user's files went. Now the folder is opened
    without following a link: nothing there is touched, and the check says why."""
    root = tmp_path / "data"
    paths = _slice(root, {"d/a.bin": 5000, "d/b.bin": 7000})
    key = os.urandom(32)
    code, lines = _run(dataops, _stream(root, paths, key))
    assert code == 0, lines
    packs = tmp_path / "run" / "data" / datarecords.PACKS
    outside = tmp_path / "users-files"
    packs.rename(outside)
    (outside / "thesis.tex").write_text("precious")
    packs.symlink_to(outside)
    code, lines = _run(dataops, _resync_stream(root, paths, key))
    assert (outside / "thesis.tex").read_text() == "precious"
    assert len(list(outside.iterdir())) == 2  # the pack and thesis.tex: nothing removed
    assert packs.is_symlink()


def test_only_packs_are_removed_from_the_packs_folder(dataops, tmp_path):
    """Names that are not a pack's (a pid too large for kill(), a digit that is not
    ASCII, a folder, a link) crashed the final check or could be removed as packs; now
    they are left where they are, and a dead writer's unnamed pack still goes."""
    root = tmp_path / "data"
    paths = _slice(root, {"d/a.bin": 5000})
    key = os.urandom(32)
    assert _run(dataops, _stream(root, paths, key))[0] == 0
    packs = tmp_path / "run" / "data" / datarecords.PACKS
    strangers = ["99999999999999999999-x", "\u00b2-x", "notes.txt"]
    for name in strangers:
        (packs / name).write_text("not a pack")
    (packs / "1-aaaaaaaaaaaa-1").mkdir()
    (packs / "2-aaaaaaaaaaaa-1").symlink_to(tmp_path / "data" / "d" / "a.bin")
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)  # a writer that is gone
    (packs / f"{dead}-abcdefabcdef-1").write_bytes(b"an unrecorded group")
    code, lines = _run(dataops, _resync_stream(root, paths, key))
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    left = sorted(p.name for p in packs.iterdir())
    assert f"{dead}-abcdefabcdef-1" not in left
    assert set(strangers) | {"1-aaaaaaaaaaaa-1", "2-aaaaaaaaaaaa-1"} <= set(left)
    assert (tmp_path / "data" / "d" / "a.bin").exists()


def test_a_group_recorded_by_a_writer_that_ends_during_the_final_check_keeps_its_pack(
    dataops, tmp_path, monkeypatch
):
    """Another receiver (a cut session's straggler) records a group and ends after the
    final check read the record but before it dropped unnamed packs: its pack was
    removed while the record on disk named it. Now the writers are judged gone first
    and the record read again before anything is removed."""
    import shutil

    root = tmp_path / "data"
    paths = _slice(root, {f"d/f{i}.bin": 40_000 for i in range(8)})
    key = os.urandom(32)
    assert _run(dataops, _stream(root, paths, key))[0] == 0
    src = tmp_path / "run" / "data"
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    drop = dataops.Receiver.drop_dead_packs

    def straggler_records_then_ends(self, live):
        recs = datarecords.load_records(str(src))
        old = next(iter(recs.values()))["pack"]
        new = f"{gone}-abcdefabcdef-1"
        shutil.copy(src / datarecords.PACKS / old, src / datarecords.PACKS / new)
        with open(src / datarecords.RECORD, "a") as fh:
            for rec in recs.values():
                if rec["pack"] == old:
                    fh.write(json.dumps(dict(rec, pack=new), sort_keys=True) + "\n")
        return drop(self, live)

    monkeypatch.setattr(dataops.Receiver, "drop_dead_packs", straggler_records_then_ends)
    code, lines = _run(dataops, _resync_stream(root, paths, key))
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    recs = datarecords.load_records(str(src))
    assert [p for p, r in recs.items() if not (src / datarecords.PACKS / r["pack"]).exists()] == []


@pytest.mark.parametrize(
    "rel", [".remotemac-packs/big.bin", ".verified.jsonl", ".REMOTEMAC-partial/x", ".remotemac-x"]
)
def test_a_slice_path_under_a_name_the_host_keeps_is_refused_on_both_ends(dataops, tmp_path, rel):
    """A dataset folder named ``.remotemac-packs`` put a large file's ciphertext among
    the packs, where the final check removed it as an unnamed pack (counted present,
    never held); ``.verified.jsonl`` would be the record itself. The laptop refuses
    such a path before it sends anything, in one line; the host refuses a hello that
    names one (an older laptop), and stores nothing."""
    from remotemac.engine.syncplan import stat_all
    from remotemac.errors import BadInput

    root = tmp_path / "data"
    _slice(root, {rel: 3000})
    with pytest.raises(BadInput, match="kept for remotemac's own files"):
        stat_all(root, [rel], None)
    entry = {"path": rel, "size": 3000, "sha256": None, "mtime_ns": 1}
    code, lines = _run(dataops, json.dumps(_hello(root, os.urandom(32), [entry])).encode() + b"\n")
    assert code != 0 and lines[-1]["code"] == "unsafe-path", lines
    assert rel in lines[-1]["error"]
    assert not (tmp_path / "run" / "data").exists() or not any(
        p.is_file() for p in (tmp_path / "run" / "data").rglob("*")
    )


def _with_pending(stream: bytes, pending: list[int]) -> bytes:
    """``stream`` with its end frame naming ``pending`` (files sent, not yet acked)."""
    from remotemac.engine.syncpieces import pack_frame

    at = stream.rindex(b'{"changed"')
    final = json.loads(stream[at:])
    body = json.dumps(dict(final, pending=pending)).encode()
    return stream[: at - 13] + pack_frame("E", 0, len(body)) + body


def test_a_finish_that_waited_for_pending_files_does_not_rewrite_the_record(dataops, tmp_path):
    """A file left the slice, so the record would be compacted. A finish that waited
    for pending files' lines (as a cut attempt's receiver can, on the next attempt's
    lines, while that attempt goes on appending) leaves the record as it is; the next
    finish without pending files compacts it."""
    root = tmp_path / "data"
    paths = _slice(root, {"a.bin": 5000, "b.bin": 6000})
    key = os.urandom(32)
    assert _run(dataops, _stream(root, paths, key))[0] == 0
    record = tmp_path / "run" / "data" / datarecords.RECORD
    (root / "b.bin").unlink()
    (root / "a.bin").write_bytes(os.urandom(5000))  # sent again: its line is pending
    code, lines = _run(dataops, _with_pending(_stream(root, ["a.bin"], key), [0]))
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    assert '"b.bin"' in record.read_text()  # not rewritten
    code, lines = _run(dataops, _resync_stream(root, ["a.bin"], key))
    assert code == 0 and lines[-1]["result"]["mismatches"] == [], lines
    assert '"b.bin"' not in record.read_text()  # compacted


class _AckWatch(io.BytesIO):
    """The receiver's stdout: at every acks line, which acked files the record on disk
    did not hold yet (it must hold every one: the laptop trusts an ack)."""

    def __init__(self, src: Path, paths: list[str]) -> None:
        super().__init__()
        self.src, self.paths = src, paths
        self.unrecorded: list[str] = []
        self.ack_lines = 0

    def write(self, data) -> int:  # type: ignore[override]
        for line in bytes(data).splitlines():
            msg = json.loads(line)
            if "acks" in msg:
                self.ack_lines += 1
                held = datarecords.load_records(str(self.src))
                self.unrecorded += [self.paths[i] for i in msg["acks"] if self.paths[i] not in held]
        return super().write(data)


def test_an_ack_never_leaves_before_its_record_line_is_written(dataops, tmp_path, monkeypatch):
    """Record lines are kept and written in blocks (one locked write, not three
    syscalls per file): the block goes to disk before the acks of its files, so a
    cut or a SIGKILL can lose only lines of files the laptop was never told of.
    Several ack lines (a short idle step), each checked against the record on disk."""
    root = tmp_path / "data"
    paths = _slice(root, {f"d{i % 3}/s{i:03d}.bin": 20_000 + 37 * i for i in range(120)})
    behind = dataops.WriteBehind
    monkeypatch.setattr(dataops, "WriteBehind", lambda *a, **k: behind(*a, **k, idle_after=0.0))
    monkeypatch.setattr(receiver, "SMALL_BATCH_BYTES", 100_000)  # several groups
    out = _AckWatch(tmp_path / "run" / "data", paths)
    code = dataops.serve(io.BytesIO(_stream(root, paths, os.urandom(32))), out)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert code == 0, lines[-1]
    assert out.ack_lines >= 2 and out.unrecorded == []
    acked = [i for line in lines if "acks" in line for i in line["acks"]]
    assert sorted(acked) == list(range(len(paths)))
    record = (tmp_path / "run" / "data" / datarecords.RECORD).read_text().splitlines()
    assert len(record) == len(paths)  # one line each, none torn or doubled


def test_a_record_write_that_fails_sends_no_ack_for_its_files(dataops, tmp_path, monkeypatch):
    """The disk fills while a block of record lines is written: a short write, then
    ENOSPC (simulated: ``os.write`` fails for the record's fd only). The acks of that
    block's files, and of every later one, are never sent (they once went out on the
    next idle step, the block already dropped), and the torn tail is cut off, so no
    acknowledged file's line is lost to a line run into it."""
    root = tmp_path / "data"
    paths = _slice(root, {f"d{i % 3}/s{i:03d}.bin": 20_000 + 37 * i for i in range(120)})
    behind = dataops.WriteBehind
    monkeypatch.setattr(dataops, "WriteBehind", lambda *a, **k: behind(*a, **k, idle_after=0.0))
    monkeypatch.setattr(receiver, "SMALL_BATCH_BYTES", 100_000)  # several groups
    real_write, blocks = os.write, []

    def write(fd: int, data) -> int:
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(datarecords.RECORD):
            return real_write(fd, data)
        blocks.append(len(data))
        if len(blocks) == 2:
            return real_write(fd, bytes(data[: len(data) // 2]))  # the disk took half
        if len(blocks) >= 3:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(datarecords.os, "write", write)
    out = _AckWatch(tmp_path / "run" / "data", paths)
    code = dataops.serve(io.BytesIO(_stream(root, paths, os.urandom(32))), out)
    monkeypatch.setattr(datarecords.os, "write", real_write)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert code != 0 and len(blocks) >= 3, lines[-1]
    assert out.unrecorded == [], "an ack left for a file whose record line was lost"
    acked = {i for line in lines if "acks" in line for i in line["acks"]}
    assert 0 < len(acked) < len(paths)
    record = (tmp_path / "run" / "data" / datarecords.RECORD).read_text()
    assert record.endswith("\n") and all(json.loads(x) for x in record.splitlines())


def test_small_files_reach_the_write_behind_thread_in_groups(dataops, tmp_path, monkeypatch):
    """A task per small file woke the write-behind thread once per file (9,000 context
    switches for 1,916 files); they go in groups of ~SMALL_BATCH_BYTES, in order, and
    a large file or the end hands over the group before it. Before: 61 tasks here."""
    root = tmp_path / "data"
    sizes = {f"d/s{i:02d}.bin": 30_000 for i in range(60)}
    sizes["big/train.bin"] = datarecords.RESUMABLE + 1000
    paths = _slice(root, sizes)
    tasks: list[int] = []
    submit = dataops.WriteBehind.submit

    def count(self, task, nbytes=0):
        if not isinstance(task, functools.partial):  # (a streamed file's blocks are partials)
            tasks.append(nbytes)
        return submit(self, task, nbytes)

    monkeypatch.setattr(dataops.WriteBehind, "submit", count)
    code, lines = _run(dataops, _stream(root, paths, os.urandom(32)))
    assert code == 0, lines[-1]
    assert lines[-1]["result"]["mismatches"] == []
    assert lines[-1]["result"]["received"] == len(paths)
    # 60 files of ~60 KB each queued (ciphertext + plaintext): ~4 groups of 1 MiB, the
    # big file's own store, and nothing per file
    assert 3 <= len(tasks) <= 8, tasks
    for rel in paths:
        assert (tmp_path / "ram" / rel).read_bytes() == (root / rel).read_bytes()
