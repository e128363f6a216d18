"""The agent's answers, the ledger's lines and the wipe's views read into named types
and write back key for key: what the agent sends and what remotemac writes keeps its
shape (unknown keys too), and one op's answer is never read as another's.

Fast tier (no marker): pure data, no host.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from remotemac.agent.protocol import JobStatus, Op
from remotemac.engine.agentanswers import (
    ANSWERS,
    AgentAnswer,
    ClaimAnswer,
    DeadmanJob,
    OutputListing,
    StopAnswer,
    WipeAnswer,
)
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.ledger import AgentStep, Ledger, LedgerEntry, format_entry
from remotemac.engine.phaseresults import RamStore

# answers as the agent writes them (agent/cleanupops.py, wipeops.py, deadman.py, hostagent.py)
SAMPLES: list[tuple[type, dict[str, Any]]] = [
    (
        ClaimAnswer,
        {"root": "/u/rm", "real_root": "/private/u/rm", "root_id": "ab12", "created": True},
    ),
    (ClaimAnswer, {"refused": "it is a symlink (to /x); give the real path"}),
    (
        WipeAnswer,
        {
            "removed": ["tmux:rm-a", "deadman:label"],
            "remaining": ["/r/logs (kept until cleanup; small)"],
            "steps": [{"argv": ["tmux", "kill-session", "-t", "rm-a"], "code": 0, "time": 1.5}],
            "verified": True,
        },
    ),
    (
        DeadmanJob,
        {
            "method": "launchd",
            "label": "com.remotemac.wipe.r1",
            "deadline": 1700000000.0,
            "spec": "/r/deadman/r1.json",
            "run_id": "r1",
            "plist": "/Users/me/Library/LaunchAgents/x.plist",  # a key this side does not name
        },
    ),
    (DeadmanJob, {"method": "sleeper", "pid": 4242, "spec": "/r/d.json", "deadline": 5.0}),
    (StopAnswer, {"stopped": True, "left_alone": ["pid 12 (reused by another process)"]}),
    (OutputListing, {"entries": [{"path": "a", "kind": "file", "size": 3}]}),
    (AgentAnswer, {"ok": True, "result": {"x": 1}, "replayed": True, "cpu_s": 0.25}),
    (AgentAnswer, {"ok": False, "error": "boom", "code": "host-env", "tail": ["a", "b"]}),
    (AgentStep, {"argv": ["launchctl", "bootout", "gui/501/x"], "code": 3, "time": 2.0}),
]


@pytest.mark.parametrize(("kind", "data"), SAMPLES, ids=lambda v: getattr(v, "__name__", ""))
def test_an_answer_reads_and_writes_back_key_for_key(kind: type, data: dict[str, Any]) -> None:
    message = kind.from_json(json.loads(json.dumps(data)))
    assert message.to_json() == data
    assert kind.from_json(message.to_json()) == message


def test_the_named_fields_are_what_the_agent_wrote() -> None:
    wipe = WipeAnswer.from_json(SAMPLES[2][1])
    assert wipe.verified is True and wipe.removed == ["tmux:rm-a", "deadman:label"]
    assert wipe.steps == [AgentStep(argv=["tmux", "kill-session", "-t", "rm-a"], code=0, time=1.5)]
    launchd, sleeper = DeadmanJob.from_json(SAMPLES[3][1]), DeadmanJob.from_json(SAMPLES[4][1])
    assert (launchd.who, sleeper.who) == ("com.remotemac.wipe.r1", "4242")
    assert launchd.extra == {"plist": "/Users/me/Library/LaunchAgents/x.plist"}
    assert ClaimAnswer.from_json(SAMPLES[1][1]).root_id is None
    # an old agent's answer without the optional keys reads with the old defaults
    assert StopAnswer.from_json({}).left_alone == [] and WipeAnswer.from_json({}).verified is False


def test_a_ledger_line_is_written_and_read_back_as_it_was(tmp_path) -> None:
    ledger = Ledger(tmp_path / "ledger.jsonl")
    ledger.append("mac", ["tmux", "new"], None, op="launch", seconds=0.12345)
    ledger.append_steps("mac", "wipe", [{"argv": ["sudo", "rm"], "code": 0, "time": 7.0}])
    lines = [json.loads(s) for s in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert list(lines[0]) == [
        "time",
        "host",
        "op",
        "command",
        "exit_code",
        "privileged",
        "seconds",
        "via",
    ]
    assert lines[0]["exit_code"] is None and lines[0]["seconds"] == 0.123
    assert lines[1]["via"] == "agent" and lines[1]["privileged"] is True and lines[1]["time"] == 7.0
    for line in lines:
        assert LedgerEntry.from_json(line).to_json() == line
    assert "[sudo]" in format_entry(lines[1]) and "(agent)" in format_entry(lines[1])


def test_a_ram_store_view_keeps_what_the_sync_wrote() -> None:
    data = {"path": "/Volumes/rm-r1", "kind": "hdiutil", "device": "/dev/disk4", "size": 9}
    store = RamStore.from_json(data)
    assert (store.path, store.kind, store.device) == ("/Volumes/rm-r1", "hdiutil", "/dev/disk4")
    assert store.to_json() == data
    assert RamStore.from_json({}).path is None  # a run whose data is on disk


def test_ask_refuses_to_read_one_ops_answer_as_anothers() -> None:
    """The table is the declaration: every op read through ``ask`` has its type, and a
    type that is not the op's is refused before anything is sent."""
    assert ANSWERS[Op.STATUS] is JobStatus and ANSWERS[Op.WIPE_RUN_DATA] is WipeAnswer
    client = AgentClient.__new__(AgentClient)  # never reaches a transport: refused first
    with pytest.raises(TypeError, match="WipeAnswer"):
        asyncio.run(client.ask(Op.WIPE_RUN_DATA, {}, StopAnswer))
    with pytest.raises(TypeError):
        asyncio.run(client.ask(Op.CHECK_SPACE, {}, StopAnswer))  # no declared answer type
