"""The agent's shared helpers: one package probe, one atomic JSON write."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from remotemac.agent import agentutil, envfreeze, guards

AGENT = Path(__file__).resolve().parent.parent / "remotemac" / "agent"


def _dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def two_copies(tmp_path: Path, monkeypatch) -> str:
    """``shadowpkg`` 1.0 first on the path, 2.0 after it: ``import`` would load 1.0.

    The interpreter runs with ``-S`` (no site-packages): only the two copies are
    listed and the probe's ``import torch`` fails at once instead of taking seconds.
    """
    first, second = tmp_path / "first", tmp_path / "second"
    _dist(first, "shadowpkg", "1.0")
    _dist(second, "shadowpkg", "2.0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(first), str(second)]))
    python = tmp_path / "python-no-site"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)
    return str(python)


def test_record_and_drift_check_name_the_copy_that_is_imported(two_copies: str):
    """Both the environment record (envfreeze) and the drift check (guards) report the
    first copy on sys.path, as Python's import does; envfreeze used to keep the last."""
    frozen = envfreeze._probe(two_copies, two_copies)
    fingerprint = guards.op_env_fingerprint({"python": two_copies})
    assert frozen["packages"]["shadowpkg"] == "1.0"
    assert fingerprint["packages"]["shadowpkg"] == "1.0"


def test_write_json_atomic_never_writes_through_a_planted_link(tmp_path: Path):
    target = tmp_path / "status.json"
    victim = tmp_path / "victim"
    victim.write_text("keep")
    tmp = f"{target}.tmp-{os.getpid()}-{threading.get_ident()}"
    os.symlink(victim, tmp)  # the workload guessed the tmp name
    agentutil.write_json_atomic(str(target), {"a": 1}, indent=2, sort_keys=True, newline=True)
    assert victim.read_text() == "keep"
    assert target.read_text() == '{\n  "a": 1\n}\n' and not os.path.lexists(tmp)
    assert (target.stat().st_mode & 0o777) == 0o600
