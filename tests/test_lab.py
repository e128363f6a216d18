"""The fresh-host lab is what every sshd test runs against: prove it is bare.

A rented Mac has only the OS's ``python3`` (3.9, no third-party module). If the
lab's login leaked the test venv (torch, cryptography, yaml importable) the sshd
tests would pass on the laptop and fail on a real host, as issue 14 found.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import lab
from tests.harness.fixtures import ssh_argv


def login(server, tmp_path: Path) -> list[str]:
    return ssh_argv(server, tmp_path / f"ssh-{server.port}")


def run(argv: list[str], script: str) -> str:
    proc = subprocess.run([*argv, script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_login_is_a_bare_host(fresh_host_lab: dict) -> None:
    """The session fixture's own probe: the lab user, Python 3.9 from the lab prefix,
    nothing third-party importable, PATH exactly the lab's."""
    facts = fresh_host_lab
    assert facts["user"] == lab.LAB_USER
    assert facts["version"].startswith("3.9.")
    assert facts["importable"] == [] and facts["importable_311"] == []
    assert facts["path"] == lab.LAB_PATH
    assert facts["env"] == {}
    assert facts["python3.11"] is None  # a rental has no other Python: remotemac brings one
    assert lab.bare_problems(facts) == []


def test_probe_catches_a_preinstalled_python_on_the_default_host(sshd_factory, tmp_path) -> None:
    """The stand-in python3.11 is only for hosts named so: on PATH it is reported."""
    env = lab.preinstalled_python_env()
    server = sshd_factory(extra_config=[f"SetEnv PATH={env['PATH']}"])
    problems = lab.bare_problems(lab.probe_login(login(server, tmp_path)))
    assert problems == [
        f"python3.11 on PATH ({lab.LAB_BIN}/python3.11): a rental has only python3 3.9"
    ]


def test_probe_catches_the_test_venv_on_path(sshd_factory, tmp_path: Path) -> None:
    """The check can fail: a session whose PATH starts with the test interpreter's bin
    (what ``environment: {python: sys.executable}`` amounted to) is reported."""
    leaky = f"{Path(sys.executable).parent}:{lab.LAB_PATH}"
    server = sshd_factory(extra_config=[f"SetEnv PATH={leaky}"])
    problems = lab.bare_problems(lab.probe_login(login(server, tmp_path)))
    leak = f"PATH leaks {str(Path(sys.executable).parent)!r} (PATH={leaky})"
    if lab.SAME_USER:  # the login can run that venv's python3 too: more problems, this one
        assert leak in problems, problems
    else:
        assert problems == [leak]


def test_probe_catches_a_pythonpath_leak(sshd_factory, tmp_path: Path) -> None:
    """PATH alone is not enough: a session that sets PYTHONPATH (e.g. to the test's
    site-packages) is not a fresh host either."""
    import yaml

    site = str(Path(yaml.__file__).parent.parent)
    server = sshd_factory(extra_config=[f"SetEnv PYTHONPATH={site}"])
    problems = lab.bare_problems(lab.probe_login(login(server, tmp_path)))
    assert f"the session sets PYTHONPATH={site}" in problems


def test_root_login_is_not_a_bare_host(sshd_factory, tmp_path: Path) -> None:
    """Why the lab has its own user: root's login is the test runner's machine. The
    same-user lab (no root) cannot log in as root: there the runner's own session
    environment (its PATH, with the test venv) is what the scrubbing keeps out."""
    if lab.SAME_USER:
        server = sshd_factory(extra_config=[f"SetEnv PATH={Path(sys.executable).parent}:/usr/bin"])
        problems = lab.bare_problems(lab.probe_login(login(server, tmp_path)))
        assert any(p.startswith("PATH leaks") for p in problems), problems
        return
    server = sshd_factory(user="root")
    problems = lab.bare_problems(lab.probe_login(login(server, tmp_path)))
    assert "login user is 'root', not 'rmhost'" in problems


def test_the_lab_finds_a_bare_interpreter_without_pyenv(tmp_path: Path, monkeypatch) -> None:
    """A laptop without pyenv: a uv-managed CPython (``uv python install``'s layout) is
    found, and the header says so; with neither, the error names both ways to get one."""
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    uv = tmp_path / "uv"
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(uv))
    for version in ("3.9.7", "3.9.21", "3.9.3"):
        prefix = uv / f"cpython-{version}-linux-x86_64-gnu"
        (prefix / "bin").mkdir(parents=True)
        (prefix / "bin" / "python3.9").write_text("")
    found = lab.find_source("3.9")
    assert found == lab.Source("uv", "3.9", uv / "cpython-3.9.21-linux-x86_64-gnu")
    assert "python3.9: uv " in lab.describe()
    monkeypatch.setattr(lab.shutil, "which", lambda name: None)
    if lab.find_source("3.8") is None:  # no OS python3.8 on this machine either
        try:
            lab.interpreter_source("3.8")
        except lab.LabError as exc:
            assert "uv python install 3.8" in str(exc) and "pyenv install 3.8" in str(exc)
        else:
            raise AssertionError("no Python 3.8 anywhere, yet no LabError")


def test_a_venv_from_the_bare_python3_works(sshd, tmp_path: Path) -> None:
    """What the default ``environment`` does on the host: ``python3 -m venv`` from the
    lab's python3 gives a working 3.9 venv with pip, and no third-party module."""
    argv = login(sshd, tmp_path)
    env = sshd.home / "env"
    out = run(
        argv,
        f"python3 -m venv {env} && {env}/bin/python -c "
        "'import sys, pip; print(sys.version_info[:2], sys.prefix != sys.base_prefix)'"
        f" && {env}/bin/python -c 'import yaml' 2>/dev/null || echo no-yaml",
    )
    assert out.splitlines() == ["(3, 9) True", "no-yaml"]
    assert env.stat().st_uid == lab.lab_ids()[0]


def test_host_dirs_belong_to_the_lab_user_and_go_at_cleanup(sshd_factory) -> None:
    """remote_root under ``sshd.home`` is writable by the login; cleanup removes it with
    the host's tmux server."""
    server = sshd_factory()
    uid, _ = lab.lab_ids()
    assert server.home.stat().st_uid == uid and server.tmux_dir.stat().st_uid == uid
    assert server.tmux("new-session", "-d", "-s", "probe", "sleep 600").returncode == 0
    assert "probe" in server.tmux("list-sessions").stdout
    top = server.dirs.top
    server.cleanup()
    assert not top.exists()
    assert server.tmux("list-sessions").returncode != 0


def test_host_torch_python_has_torch_and_the_bare_one_not(
    sshd, host_torch_python: str, tmp_path: Path
) -> None:
    """The one opt-in for a host with torch preinstalled: a venv of the lab's bare
    python3.11 with torch's CPU build from this machine's disk, numpy beside it."""
    argv = login(sshd, tmp_path)
    out = run(argv, f"{host_torch_python} -c 'import torch, numpy; print(torch.__version__)'")
    assert out.endswith("+cpu")
    assert host_torch_python.startswith(str(lab.LAB_VENVS) + "/")
    bare = subprocess.run(
        [*argv, f"{lab.LAB_BIN}/python3.11 -c 'import torch'"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bare.returncode != 0 and "No module named 'torch'" in bare.stderr


def test_the_laptops_interpreter_is_out_of_reach(sshd, tmp_path: Path) -> None:
    """What keeps every sshd test honest: a playbook whose ``environment.python`` is the
    test runner's own interpreter cannot run on the lab host at all (root's home is
    0700), so no sshd test can pass ``sys.executable`` as the host's Python. The
    same-user lab (a contributor without root) logs in as the runner, whose own files
    it can reach by path: there the separate-user lab of CI is what keeps this."""
    if lab.SAME_USER:
        pytest.skip(
            "same-user lab: the runner's files are its login's; CI's separate user checks this"
        )
    proc = subprocess.run(
        [*login(sshd, tmp_path), f"{sys.executable} -c 'print(1)'"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc
