"""The Mac-shaped lab host's root parts, for a runner who is not root (tests/harness/maclab.py).

The README promises the suite passes as a normal user with sudo: without root or
passwordless sudo the lab says so in one line instead of failing somewhere inside
``useradd`` or ``unshare``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness import lab, maclab


@pytest.fixture
def normal_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(maclab, "_sudo_ok", None)
    monkeypatch.setattr(maclab, "_ready", False)


def _fake_sudo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # Simulation: `sudo -n true` exits 1 ("a password is required") without NOPASSWD
    (bin_dir / "sudo").write_text(f"#!/bin/sh\nexit {code}\n")
    (bin_dir / "sudo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_maclab_without_root_or_passwordless_sudo_says_what_it_needs_in_one_line(
    normal_user: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _fake_sudo(tmp_path, monkeypatch, 1)
    with pytest.raises(lab.LabError) as caught:
        maclab.ensure_maclab()
    message = str(caught.value)
    assert "\n" not in message
    assert "needs root or passwordless sudo" in message and "rmmac" in message, message


def test_maclab_as_a_normal_user_runs_its_root_parts_through_sudo_with_their_env(
    normal_user: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    _fake_sudo(tmp_path, monkeypatch, 0)
    monkeypatch.setenv("PYENV_ROOT", "/somewhere/pyenv")
    argv = maclab._root_python("setup")
    assert argv[:3] == ["sudo", "-n", "env"], argv
    assert f"PYTHONPATH={maclab.REPO}" in argv and "PYENV_ROOT=/somewhere/pyenv" in argv, argv
    assert argv[-3:] == ["-m", "tests.harness.maclab", "setup"], argv


def test_maclab_as_root_runs_its_root_parts_as_they_are(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert maclab.root_argv(["unshare", "-m"]) == ["unshare", "-m"]
