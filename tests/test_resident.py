"""The resident agent's server and its exactly-once answer store, in this process.

The server (agent/resident.py) is driven through real pipes and real threads;
only the operation is a test one, so its side effects can be counted.
"""

from __future__ import annotations

import io
import json
import os
import struct
import threading
import time
from pathlib import Path

import pytest

from remotemac.agent import hostagent, resident
from tests.harness import hostbuilt

AGENT = Path(__file__).resolve().parent.parent / "remotemac" / "agent"


def frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def frames(data: bytes) -> list[dict]:
    out, pos = [], 0
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        out.append(json.loads(data[pos + 4 : pos + 4 + size]))
        pos += 4 + size
    return out


@pytest.fixture
def counting_op(monkeypatch, tmp_path: Path):
    """A non-idempotent op: appends one line to a file per run (and can be held mid-way)."""
    ledger = tmp_path / "side-effects.txt"
    gate = threading.Event()
    gate.set()
    started = threading.Event()

    def op_append(req: dict) -> dict:
        started.set()
        gate.wait(10)
        with open(ledger, "a") as fh:
            fh.write(req["line"] + "\n")
        return {"count": len(ledger.read_text().splitlines())}

    monkeypatch.setitem(hostagent.OPS, "append", op_append)
    return ledger, gate, started


def serve(requests: list[dict]) -> list[dict]:
    out = io.BytesIO()
    server = resident.Server(io.BytesIO(b"".join(frame(r) for r in requests)), out)
    server.serve()
    return frames(out.getvalue())


def test_answers_carry_ids_and_several_run_at_once(counting_op, tmp_path: Path):
    """Three calls in flight; each answer names its id; the hello comes first."""
    ledger, _, _ = counting_op
    answers = serve(
        [{"id": f"c{i}", "op": "append", "req": {"line": str(i)}} for i in range(3)]
        + [{"id": "p", "op": "ping", "req": {}}]
    )
    assert answers[0]["hello"] == 1 and answers[0]["pid"] == os.getpid()
    by_id = {a["id"]: a for a in answers[1:]}
    assert set(by_id) == {"c0", "c1", "c2", "p"}
    assert all(a["answer"]["ok"] for a in by_id.values())
    assert by_id["p"]["answer"]["result"]["python"]
    assert all(isinstance(a["cpu_s"], float) for a in by_id.values())
    assert sorted(ledger.read_text().split()) == ["0", "1", "2"]


def test_unknown_op_and_bad_id_are_answers_not_crashes(tmp_path: Path):
    answers = serve(
        [
            {"id": "x", "op": "nope", "req": {}},
            {"id": "../evil", "op": "ping", "req": {}, "store": str(tmp_path)},
        ]
    )
    by_id = {a["id"]: a["answer"] for a in answers[1:]}
    assert by_id["x"]["code"] == "usage"
    assert by_id["../evil"]["code"] == "usage"
    assert not list(tmp_path.iterdir())


def test_a_retried_id_is_answered_from_the_record_not_run_again(counting_op, tmp_path: Path):
    """Same id twice (the retry after a cut): the side effect happens once."""
    ledger, _, _ = counting_op
    store = str(tmp_path / "calls")
    req = {"id": "run1-7", "op": "append", "req": {"line": "once"}, "store": store}
    first = serve([req])[1]["answer"]
    again = serve([req])[1]["answer"]
    assert ledger.read_text().splitlines() == ["once"]
    assert first == {"ok": True, "result": {"count": 1}}
    assert again == {"ok": True, "result": {"count": 1}, "replayed": True}
    assert (tmp_path / "calls" / "run1-7.json").is_file()


def test_a_retry_while_the_first_attempt_still_runs_waits_for_it(counting_op, tmp_path: Path):
    """The old agent process is still running the call when the new one gets the retry."""
    ledger, gate, started = counting_op
    gate.clear()
    store = str(tmp_path / "calls")
    req = {"id": "run1-9", "op": "append", "req": {"line": "once"}, "store": store}
    results: dict[str, dict] = {}
    old = threading.Thread(target=lambda: results.__setitem__("old", serve([req])[1]))
    old.start()
    assert started.wait(10)
    new = threading.Thread(target=lambda: results.__setitem__("new", serve([req])[1]))
    new.start()
    time.sleep(0.3)
    assert "new" not in results  # waiting on the id's lock, not running the op again
    gate.set()
    old.join(10)
    new.join(10)
    assert ledger.read_text().splitlines() == ["once"]
    assert results["new"]["answer"]["replayed"] is True
    assert results["new"]["answer"]["result"] == results["old"]["answer"]["result"]


def test_the_store_is_pruned_to_its_bound(tmp_path: Path):
    store = tmp_path / "calls"
    store.mkdir()
    for i in range(20):
        path = store / f"id-{i}.json"
        path.write_text("{}")
        os.utime(path, (1000 + i, 1000 + i))
    assert resident.prune_store(str(store), keep=5, max_age_s=1e12) == 15
    assert sorted(p.name for p in store.iterdir()) == [f"id-{i}.json" for i in range(15, 20)]


def test_end_of_input_finishes_calls_in_flight(counting_op, tmp_path: Path):
    """The laptop hung up mid-call: the call still completes and its answer is recorded."""
    ledger, gate, started = counting_op
    gate.clear()
    store = tmp_path / "calls"

    class Gone(io.BytesIO):
        def write(self, data: bytes) -> int:
            if b'"answer"' in data:
                raise BrokenPipeError("the channel is gone")
            return super().write(data)

    server = resident.Server(
        io.BytesIO(frame({"id": "c1", "op": "append", "req": {"line": "x"}, "store": str(store)})),
        Gone(),
    )
    runner = threading.Thread(target=server.serve)
    runner.start()
    assert started.wait(10)
    gate.set()
    runner.join(10)
    assert not runner.is_alive()
    assert ledger.read_text() == "x\n"
    assert json.loads((store / "c1.json").read_text())["answer"]["result"] == {"count": 1}


def test_freeze_env_is_cached_per_environment_and_redone_when_it_changes(
    monkeypatch, tmp_path: Path
):
    """The package probe runs once per environment key; a package added to a directory
    on the interpreter's path (its mtime changes) makes it run again."""
    from remotemac.agent import envfreeze

    site = tmp_path / "site"
    site.mkdir()
    # The probe imports torch (1.5 s each time); caching is what is under test, not torch.
    (site / "torch.py").write_text("raise ImportError('stub: this test needs no torch')\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    probes: list[str] = []
    real = envfreeze._probe
    monkeypatch.setattr(envfreeze, "_probe", lambda p, r: probes.append(p) or real(p, r))
    cache = str(tmp_path / "envs" / "key.freeze.json")
    req = {"python": hostbuilt.host_python(), "cache": cache}  # the host's own Python
    first = envfreeze.op_freeze_env(dict(req))
    second = envfreeze.op_freeze_env(dict(req))
    assert (first["freeze_cached"], second["freeze_cached"]) == (False, True)
    assert len(probes) == 1
    assert {k: v for k, v in first.items() if k != "freeze_cached"} == {
        k: v for k, v in second.items() if k != "freeze_cached"
    }
    assert "_paths" not in first
    time.sleep(0.01)
    (site / "newpkg-1.0.dist-info").mkdir()  # "pip install newpkg"
    third = envfreeze.op_freeze_env(dict(req))
    assert third["freeze_cached"] is False and len(probes) == 2


def test_reconnect_counts_the_deadline_down():
    """Every ``reconnecting`` event says how long is left before the run gives up."""
    import asyncio

    from remotemac.errors import TransientHostError
    from remotemac.transport.reconnect import reconnect

    events: list = []

    async def never() -> None:
        raise ConnectionRefusedError("host down")

    async def go() -> None:
        with pytest.raises(TransientHostError, match="gave up"):
            await reconnect(
                never,
                host="mac",
                deadline=0.6,
                emit=events.append,
                initial_wait=0.05,
                max_wait=0.15,  # at least 4 waits fit in the deadline
                total_deadline=600,
            )

    asyncio.run(go())
    left = [e.deadline_left_s for e in events if e.state == "reconnecting"]
    assert len(left) >= 3 and left == sorted(left, reverse=True) and left[0] <= 0.6
    assert all(e.deadline_s == 600 for e in events if e.state == "reconnecting")
    assert events[-1].state == "lost"


def test_reconnect_deadline_precedence_flag_then_playbook_then_ten_minutes():
    from remotemac.engine.hosts import SSHOptions
    from remotemac.playbook import parse_playbook

    text = "name: p\nworkload: {command: python3 a.py}\n"
    default = parse_playbook(text).connection.reconnect_deadline
    set_in_playbook = parse_playbook(text + "connection: {reconnect_deadline: 25m}\n")
    assert default == 600.0
    assert set_in_playbook.connection.reconnect_deadline == 1500.0
    assert SSHOptions().for_playbook(1500.0).deadline_s == 1500.0
    assert SSHOptions(reconnect_deadline=30.0).for_playbook(1500.0).deadline_s == 30.0
    assert SSHOptions().deadline_s == 600.0
    with pytest.raises(Exception, match="reconnect_deadline"):
        parse_playbook(text + "connection: {reconnect_deadline: soon}\n")
