"""Small parts of the pull: the hashing sink and how many files it keeps open at once."""

from __future__ import annotations

import hashlib
import resource

import pytest

from remotemac.engine import pull
from remotemac.engine.pull import FILES_IN_FLIGHT, HashingSink, files_in_flight


def test_sink_hashes_what_is_written_and_rehashes_a_prefix_it_is_sent_back_to(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"stale prefix")
    with open(path, "r+b") as fh:
        sink = HashingSink(fh, 5)  # resume after the first 5 bytes: hashed once, from disk
        sink.seek(5)
        sink.truncate()
        sink.write(b" fresh")
        assert sink.hexdigest() == hashlib.sha256(b"stale fresh").hexdigest()
        sink.seek(0)  # the transport starts over: the hash does too
        sink.truncate()
        sink.write(b"new")
        assert sink.hexdigest() == hashlib.sha256(b"new").hexdigest()
    assert path.read_bytes() == b"new"


def test_files_in_flight_fit_a_small_open_files_limit(monkeypatch):
    """Simulation: a macOS terminal's 256 open files that cannot be raised."""

    def refuse(*_a):
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "getrlimit", lambda _r: (256, 256))
    monkeypatch.setattr(resource, "setrlimit", refuse)
    assert files_in_flight() == (256 - 64) // 4 < FILES_IN_FLIGHT
    monkeypatch.setattr(resource, "getrlimit", lambda _r: (1024, resource.RLIM_INFINITY))
    raised = []
    monkeypatch.setattr(resource, "setrlimit", lambda _r, limits: raised.append(limits))
    assert files_in_flight() == pull.FILES_IN_FLIGHT and raised == [(8192, resource.RLIM_INFINITY)]


def test_the_host_sender_opens_only_regular_files_below_its_dir_without_links(tmp_path):
    """agent/pullops.py's own checks (the host's side of a streamed pull): a link, a
    FIFO, a linked or missing parent, a climbing name are refused, never opened."""
    import os

    from remotemac.agent.pullops import Skip, open_below

    out, outside = tmp_path / "out", tmp_path / "outside"
    (out / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    (out / "sub" / "ok.bin").write_bytes(b"fine")
    os.symlink(outside / "secret", out / "link")
    os.symlink(outside, out / "linkdir")
    os.mkfifo(out / "pipe")
    (out / "plain").write_bytes(b"x")
    base = os.open(out, os.O_RDONLY)
    try:
        fd = open_below(base, b"sub/ok.bin")
        assert os.read(fd, 10) == b"fine"
        os.close(fd)
        refused = {
            b"link": "link",
            b"linkdir/secret": "parent linkdir is a link",
            b"pipe": "fifo",
            b"plain/x": "parent plain is a regular file",
            b"gone": "gone",
            b"sub/../link": "plain relative",
            b"/etc/passwd": "plain relative",
            b"sub": "dir",
        }
        for name, why in refused.items():
            with pytest.raises(Skip, match=why):
                open_below(base, name)
    finally:
        os.close(base)


def test_streams_split_by_bytes_and_one_local_file_stays_on_one_stream(tmp_path):
    from remotemac.engine.pullstream import (
        BASE_WINDOW,
        MAX_WINDOW,
        StreamFile,
        choose_window,
        split_streams,
    )

    def f(i: int, size: int, key: str) -> StreamFile:
        return StreamFile(i, b"n", "r", tmp_path / str(i), size, key=key)

    files = [f(i, 100 << 20, f"k{i}") for i in range(4)] + [f(4, 1, "k0")]
    groups = split_streams(files, 2)
    assert [[x.index for x in g] for g in groups] == [[0, 1, 4], [2, 3]]
    assert len(split_streams([f(0, 1 << 30, "a")], 2)) == 1  # one file: one stream
    assert len(split_streams([f(i, 1 << 20, str(i)) for i in range(9)], 2)) == 1  # 9 MiB
    assert choose_window(0.0005) == BASE_WINDOW  # loopback: the small window
    assert 16 << 20 < choose_window(0.08) <= MAX_WINDOW  # 80 ms: one channel fills 100 MB/s
    assert choose_window(0.08, 2) < choose_window(0.08)


def test_the_shared_budget_refuses_the_side_that_goes_past_it_in_the_runs_order():
    """Sides pulled at once share ``outputs.max_bytes`` as one after the other did: each
    waits until every side has listed, then may take what the sides before it left."""
    import asyncio

    async def main() -> list[int | None]:
        budget = pull.SharedBudget(100, ["cpu", "mps"])
        # the second side lists first: it still waits for the first side's total
        second = asyncio.ensure_future(budget.left_for("mps", 70))
        await asyncio.sleep(0)
        assert not second.done()
        first = await budget.left_for("cpu", 60)
        return [first, await second]

    assert asyncio.run(main()) == [100, 40]  # 60 fits in 100; 70 is past the 40 left


def test_a_side_that_failed_before_listing_never_holds_the_others():
    import asyncio

    async def main() -> int | None:
        budget = pull.SharedBudget(100, ["cpu", "mps"])
        budget.note("cpu", 0)  # pull_side's finally, after a failure
        return await budget.left_for("mps", 50)

    assert asyncio.run(main()) == 100


def test_without_a_limit_no_side_waits():
    import asyncio

    budget = pull.SharedBudget(None, ["cpu", "mps"])
    assert asyncio.run(budget.left_for("mps", 10**12)) is None
