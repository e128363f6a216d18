"""Destroy only what is ours: a runtime or venv dir in the way that remotemac did not mark
(or marked as something else) is refused, never removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[2] / "remotemac" / "agent"

from remotemac.agent import agentruntime as art  # noqa: E402
from remotemac.agent.shared import agent_argv  # noqa: E402
from tests.harness import hostbuilt  # noqa: E402


def test_a_runtime_dir_in_the_way_that_is_not_ours_is_left_alone(tmp_path: Path):
    root = tmp_path / "root"
    final = Path(art.runtime_dir(str(root), art.host_tags()))
    final.mkdir(parents=True)
    (final / "thesis.tex").write_text("mine")
    with pytest.raises(art.RuntimeInstallError, match="not remotemac's runtime"):
        art.op_runtime_ensure({"root": str(root), "method": "offline"})
    assert (final / "thesis.tex").read_text() == "mine"


def test_an_unready_venv_marked_as_something_else_is_left_alone(tmp_path: Path):
    root = tmp_path / "root"
    claim = subprocess.run(
        agent_argv(sys.executable, str(AGENT), "hostagent", "prepare_run", site=True),
        input=json.dumps({"root": str(root), "run_id": "r1"}).encode(),
        capture_output=True,
    )
    assert json.loads(claim.stdout)["ok"], claim.stdout
    # what the identity of the host's own interpreter makes the env dir: ask the op
    # once, then plant
    host_python = hostbuilt.host_python()
    first = subprocess.run(
        agent_argv(sys.executable, str(AGENT), "hostagent", "ensure_venv", site=True),
        input=json.dumps({"root": str(root), "key": "k", "python": host_python}).encode(),
        capture_output=True,
    )
    env_dir = Path(json.loads(first.stdout)["result"]["env_dir"])
    os.remove(env_dir / ".remotemac-ready")
    marker = json.loads((env_dir / ".remotemac-owned").read_text())
    marker["kind"] = "run"  # someone else's claim on this directory
    (env_dir / ".remotemac-owned").write_text(json.dumps(marker))
    (env_dir / "keep.txt").write_text("not the venv's")
    again = subprocess.run(
        agent_argv(sys.executable, str(AGENT), "hostagent", "ensure_venv", site=True),
        input=json.dumps({"root": str(root), "key": "k", "python": host_python}).encode(),
        capture_output=True,
    )
    answer = json.loads(again.stdout)
    assert answer["ok"] is False and "left alone" in answer["error"], answer
    assert (env_dir / "keep.txt").exists()
