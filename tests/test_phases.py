"""Typed phases and phase results: the same strings and dicts on the wire as before."""

from __future__ import annotations

import json

import pytest

from remotemac.engine.phaseresults import LaunchResult, ProvisionResult, as_dict
from remotemac.phases import Phase, PhaseKey, follow_key, launch_key


def test_wire_names_round_trip_and_stay_plain_strings():
    names = ["provision", "sync", "launch:reference", "follow:target", "pull", "wipe"]
    for name in names:
        key = PhaseKey.parse(name)
        assert key.name == name and str(key) == name and type(key.name) is str
    assert launch_key("target").name == "launch:target"
    assert follow_key("reproduce") == PhaseKey(Phase.FOLLOW, "reproduce")
    # a Phase is its wire string: journal dicts keyed by name find it, JSON writes it bare
    assert {"provision": 1}[Phase.PROVISION] == 1
    assert json.dumps({"phase": Phase.PULL}) == '{"phase": "pull"}'


@pytest.mark.parametrize("name", ["launch", "follow", "pull:target", "deploy", "connect"])
def test_names_no_pipeline_writes_are_refused(name):
    with pytest.raises(ValueError):
        PhaseKey.parse(name)


def test_group_and_side_read_any_name():
    """The TUI reads journals of other versions: unknown names are grouped, not refused."""
    assert (
        PhaseKey.group("launch:target") == "launch" and PhaseKey.side("launch:target") == "target"
    )
    assert PhaseKey.group("connect") == "connect" and PhaseKey.side("connect") is None


def test_results_keep_the_journal_dicts_key_for_key():
    """Byte-compatible journal rows: the dataclass dicts dump to the JSON the dicts did."""
    prov = ProvisionResult(
        hosts={"remote": {"root": "/r"}},
        devices={"target": "mps"},
        project={"git": "abc"},
        summary="target=mps",
    )
    old = {
        "hosts": {"remote": {"root": "/r"}},
        "devices": {"target": "mps"},
        "project": {"git": "abc"},
        "summary": "target=mps",
    }
    assert json.dumps(as_dict(prov)) == json.dumps(old)
    launch = LaunchResult(session="s", mode="tmux", already=False, access=None, summary="s")
    assert list(as_dict(launch)) == ["session", "mode", "already", "access", "summary"]
    assert as_dict(None) == {} and as_dict({"a": 1}) == {"a": 1}
