"""Small parts of the pull: the hashing sink and how many files it keeps open at once."""

from __future__ import annotations

import hashlib
import resource

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
