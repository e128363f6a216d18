"""The laptop–host protocol (agent/protocol.py): one declaration both sides read.

Each message survives a round trip through JSON unchanged (with keys this side does not
name kept), the enums are their wire strings, and a resident agent speaking another
protocol version is refused at its hello with one clear error, not misread.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from remotemac.agent import protocol
from remotemac.agent.protocol import (
    FINAL_STATES,
    FRAME,
    Answer,
    BringAnswer,
    FindPythonAnswer,
    FindPythonRequest,
    Hello,
    JobState,
    JobStatus,
    LaunchAnswer,
    LaunchRequest,
    Op,
    PrepareRunAnswer,
    ProtocolError,
    PullFrame,
    RuntimeEnsureAnswer,
    RuntimeStatus,
    StatusRequest,
    SyncFrame,
    is_final,
)
from remotemac.agent.shared import agent_argv

AGENT = Path(__file__).resolve().parent.parent / "remotemac" / "agent"

SAMPLES = [
    Hello(pid=41, cpu_s=0.25, python="3.9.6", protocol=protocol.PROTOCOL_VERSION),
    LaunchRequest(
        run_dir="/r/runs/x",
        device="mps",
        session="rm-x-mps",
        command="python3 train.py",
        env={"HF_HOME": "/r/runs/x/cache/hf"},
        timeout=60.0,
        next={"device": "cpu"},
        relaunch={"reason": "lost", "marker": "==="},
        extra={"skip_access_check": True},
    ),
    LaunchAnswer(session="rm-x-mps", mode="tmux", status={"state": "running"}),
    LaunchAnswer(session="rm-x-mps", already_done=True, status={"state": "finished"}),
    StatusRequest(run_dir="/r/runs/x", device="cpu", session="rm-x-cpu"),
    JobStatus(
        state="lost",
        status={"state": "running", "runner_pid": 7},
        now=1.5,
        tmux_alive=False,
        log_size=120,
        runner_alive=False,
        stale_after_s=15.0,
        lost_reason="runner gone",
    ),
    FindPythonRequest(root="/r", spec=">=3.10"),
    FindPythonAnswer(
        spec=">=3.10",
        python="/usr/bin/python3.11",
        version="3.11.7",
        pythons=[{"path": "/usr/bin/python3.11", "version": "3.11.7", "brought": False}],
        platform={"os": "darwin", "arch": "arm64", "libc": None},
    ),
    RuntimeStatus(key="cp39-arm64", dir="/r/rt", tags={"platforms": ["macosx_11_0_arm64"]}),
    PrepareRunAnswer(run_dir="/r/runs/x", paths={"logs": "/r/runs/x/logs"}),
    BringAnswer(dir="/r/runtime/py", exe="/r/runtime/py/bin/python3", version="3.12.1", bytes=9),
    BringAnswer(failed="cannot download it: offline"),
    RuntimeEnsureAnswer(failed="pip failed", tail=["x"], tags={"platforms": []}),
    RuntimeEnsureAnswer(dir="/r/rt", reused=True, method="online", installed=["cffi"]),
    Answer(ok=False, error="disk full", code="no-space", tail=["a", "b"]),
]


@pytest.mark.parametrize("message", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_survives_a_json_round_trip(message):
    wire = json.loads(json.dumps(message.to_json()))
    assert type(message).from_json(wire) == message
    assert type(message).from_json(wire).to_json() == wire


def test_keys_this_side_does_not_name_are_kept():
    answer = {"session": "s", "mode": "daemon", "tmux_hint": "brew install tmux", "new": 1}
    parsed = LaunchAnswer.from_json(answer)
    assert parsed.tmux_hint == "brew install tmux" and parsed.extra == {"new": 1}
    assert parsed.to_json() == answer


def test_a_message_that_is_not_an_object_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="JobStatus"):
        JobStatus.from_json(["state", "running"])


def test_the_agent_answers_read_through_the_messages():
    """What the agent's own ops answer reads into the message without loss."""
    from remotemac.agent import hostagent

    ping = hostagent.op_ping({})
    assert ping["protocol"] == protocol.PROTOCOL_VERSION
    status = hostagent.op_status({"run_dir": "/nonexistent", "device": "cpu"})
    parsed = JobStatus.from_json(status)
    assert parsed.state == JobState.ABSENT and not parsed.final and parsed.file == {}
    assert parsed.to_json() == status


def test_enum_members_are_their_wire_strings():
    assert json.dumps({"op": Op.LAUNCH, "state": JobState.STORAGE_LIMIT}) == (
        '{"op": "launch", "state": "storage-limit"}'
    )
    assert f"{Op.FIND_PYTHON}" == "find_python" and "%s" % Op.STATUS == "status"  # noqa: UP031
    assert {Op.LAUNCH: 1}.get("launch") == 1 and Op("launch") is Op.LAUNCH
    assert Op.CLEANUP_HOST.function == "op_cleanup_host"


def test_the_handler_table_serves_every_op_but_the_in_memory_and_inline_ones():
    from remotemac.agent import hostagent

    served = set(hostagent.OPS)
    assert served == {op.value for op in Op} - {Op.CLAIM_ROOT, Op.FACTS, Op.USAGE}
    # Op by name: hostagent may have loaded the agent's protocol as a sibling module
    # (another class object than remotemac.agent.protocol.Op, the same values)
    assert all(type(key).__name__ == "Op" for key in hostagent.OPS)


def test_final_states_are_the_ends_a_runner_writes():
    assert FINAL_STATES == ("finished", "failed", "timeout", "stopped", "storage-limit")
    assert is_final("finished") and is_final(JobState.STORAGE_LIMIT)
    assert not is_final("running") and not is_final("lost") and not is_final(None)


def test_frame_kinds_are_named_per_stream():
    """``D`` is "done" on a sync stream and "data" on a pull stream: two names."""
    assert SyncFrame.DONE == PullFrame.DATA == b"D"
    assert FRAME.pack(PullFrame.END, 0, 0) == b"Z" + bytes(12)
    assert FRAME.unpack(FRAME.pack(SyncFrame.FILE, 7, 1 << 40)) == (b"F", 7, 1 << 40)
    assert protocol.pack_frame(b"J", 1, 2) == FRAME.pack(b"J", 1, 2)


def test_check_protocol_names_both_versions():
    assert protocol.check_protocol(protocol.PROTOCOL_VERSION) is None
    why = protocol.check_protocol(protocol.PROTOCOL_VERSION + 1)
    assert why and str(protocol.PROTOCOL_VERSION + 1) in why
    assert "(none)" in (protocol.check_protocol(None) or "")


def test_an_agent_speaking_another_protocol_is_refused_at_its_hello(tmp_path: Path):
    """A resident agent whose hello carries another version: the call fails at once
    with one HostError naming both versions (exit 3), and is not retried."""
    from remotemac.engine.resident import ProtocolMismatch, ResidentAgent
    from remotemac.errors import HostError
    from remotemac.transport.local import LocalTransport

    agent = tmp_path / "agent"
    shutil.copytree(AGENT, agent, ignore=shutil.ignore_patterns("__pycache__"))
    source = (agent / "protocol.py").read_text()
    old = f"PROTOCOL_VERSION = {protocol.PROTOCOL_VERSION}\n"
    assert old in source
    (agent / "protocol.py").write_text(source.replace(old, "PROTOCOL_VERSION = 999\n"))

    async def go() -> None:
        session = ResidentAgent(
            LocalTransport(),
            agent_argv(sys.executable, str(agent), "resident"),
            reconnect_deadline=30,
        )
        try:
            with pytest.raises(ProtocolMismatch, match="999") as caught:
                await asyncio.wait_for(session.call(Op.PING, {}, store=None, timeout=30), 60)
        finally:
            await session.close()
            await asyncio.sleep(0.5)  # the refused process's close runs in the background
        assert isinstance(caught.value, HostError) and caught.value.exit_code == 3
        assert f"speaks {protocol.PROTOCOL_VERSION}" in str(caught.value)

    asyncio.run(go())


def test_an_agent_speaking_this_protocol_is_served(tmp_path: Path):
    from remotemac.engine.resident import ResidentAgent
    from remotemac.transport.local import LocalTransport

    async def go() -> dict:
        session = ResidentAgent(
            LocalTransport(),
            agent_argv(sys.executable, str(AGENT), "resident"),
            reconnect_deadline=30,
        )
        try:
            return await session.call(Op.PING, {}, store=None, timeout=30)
        finally:
            await session.close()

    frame = asyncio.run(go())
    assert frame["answer"]["ok"] and frame["answer"]["result"]["protocol"] == 1


def test_status_carries_the_logs_next_bytes_and_waits_on_the_host_for_them(tmp_path):
    """``status`` with ``log_from`` answers the log's bytes after that offset (read after
    the status); with ``wait_s`` it holds the answer until the log grows (issue 36: one
    round trip a poll); ``log_only`` leaves the status out while the job runs."""
    import base64
    import threading

    from remotemac.agent import hostagent

    (tmp_path / "logs").mkdir()
    (tmp_path / "status").mkdir()
    log = tmp_path / "logs" / "cpu.log"
    log.write_bytes(b"one\n")
    running = {"state": "running", "device": "cpu", "beat": 9e9, "heartbeat_at": 9e9}
    (tmp_path / "status" / "cpu.json").write_text(json.dumps(running))
    req = {"run_dir": str(tmp_path), "device": "cpu", "session": "s", "log_from": 0}
    answer = JobStatus.from_json(hostagent.op_status_with_log(req))
    assert answer.log_bytes() == b"one\n" and answer.log_size == 4
    assert answer.state == JobState.RUNNING
    # nothing new after byte 4: held until the job writes its next line
    later = threading.Timer(0.3, lambda: log.write_bytes(b"one\ntwo\n"))
    later.start()
    waited = hostagent.op_status_with_log(dict(req, log_from=4, wait_s=5, log_only=True))
    later.join()
    assert base64.b64decode(waited["log_b64"]) == b"two\n"
    assert "state" not in waited and "status" not in waited  # log_only, job running
    # a job that is over: the whole status even with log_only
    over = dict(running, state="finished", exit_code=0)
    (tmp_path / "status" / "cpu.json").write_text(json.dumps(over))
    done = JobStatus.from_json(
        hostagent.op_status_with_log(dict(req, log_from=8, wait_s=5, log_only=True))
    )
    assert done.final and done.log_bytes() == b"" and done.log_size == 8
    # a FIFO in the log's place is never opened (it would hang the agent's thread)
    log.unlink()
    os.mkfifo(log)
    assert "log_b64" not in hostagent.op_status_with_log(req)
