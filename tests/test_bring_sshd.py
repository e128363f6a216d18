"""Bringing the workload's Python to a lab host whose only Python is 3.9, over a real sshd.

The lab's login (tests/harness/lab.py) sees only a bare ``python3`` 3.9, as a rented
Mac does. The CPython archive is the lab's own relocatable 3.11 in the standalone
builds' layout (tests/harness/pbs.py, Simulation: the real download site is out of
reach here), listed in a downloads JSON through uv's ``UV_PYTHON_DOWNLOADS_JSON_URL``.
Online, the host downloads it from a loopback mirror; a preinstalled host
(``preinstalled_python_env``) uses its own 3.11 and nothing is brought.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remotemac.engine.agentclient import AgentClient
from remotemac.engine.hostpython import ensure_python
from remotemac.engine.ledger import Ledger
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport
from tests.conftest import REPO
from tests.harness import lab, pbs

pytestmark = [pytest.mark.timeout(600)]


def _cli(home: Path, cfg: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("REMOTEMAC_HOME", "PYTHONPATH")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "remotemac", "--home", str(home), "--ssh-config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.asyncio
async def test_a_python_brought_online_from_a_mirror_is_used_listed_and_cleaned_up(
    sshd, ssh_env, tmp_path, monkeypatch
):
    home, cfg, alias = ssh_env(sshd)
    archive, sha = pbs.build_archive()
    root = sshd.home / "remotemac"
    transport = SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg))
    agent = AgentClient(transport, str(root), Ledger(tmp_path / "ledger.jsonl"))
    await transport.connect()
    try:
        await agent.claim("bring-online")
        with pbs.serve(archive.parent) as mirror:
            listing = pbs.downloads_json(tmp_path / "d.json", f"{mirror}/{archive.name}", sha)
            monkeypatch.setenv("UV_PYTHON_DOWNLOADS_JSON_URL", listing.as_uri())
            got = await ensure_python(
                agent,
                "3.11",
                home=tmp_path / "rmhome",
                method="online",
                emit=lambda e: None,
                run_id="bring-online",
            )
        assert got.brought is True and got.version == pbs.lab_version()
        assert got.dir is not None and got.dir.startswith(str(root / "runtime") + "/")
        assert not (tmp_path / "rmhome" / "downloads").exists()  # the laptop fetched nothing
        assert got.python is not None
        run = await transport.exec([got.python, "-c", "import sys; print(sys.prefix)"])
        assert run.exit_code == 0 and run.stdout.decode().strip() == f"{got.dir}/python"
        again = await agent.call("find_python", {"root": str(root), "spec": ">=3.10"})
        assert again["python"] == got.python and again["brought"] is True
        # a later run finds it: its record still names what remotemac brought
        reused = await ensure_python(
            agent,
            "3.11",
            home=tmp_path / "rmhome",
            method="online",
            emit=lambda e: None,
            run_id="bring-online-2",
        )
        assert (reused.python, reused.dir, reused.reused) == (got.python, got.dir, True)
        assert reused.as_brought()["dir"] == got.dir
    finally:
        await transport.close()
    ledger = (tmp_path / "ledger.jsonl").read_text()
    assert "bring-python" in ledger and "(online," in ledger
    inventory = json.loads((root / "inventory.json").read_text())["items"]
    assert got.dir in [i["path"] for i in inventory]
    proc = _cli(home, cfg, "cleanup", alias, "--remote-root", str(root), "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not root.exists()


@pytest.mark.asyncio
async def test_a_host_with_a_preinstalled_python_uses_its_own(sshd_factory, ssh_env, tmp_path):
    """Simulation of a Mac where the user installed Homebrew's python3.11."""
    env = lab.preinstalled_python_env()
    server = sshd_factory(extra_config=["SetEnv " + " ".join(f"{k}={v}" for k, v in env.items())])
    home, cfg, alias = ssh_env(server)
    root = server.home / "remotemac"
    transport = SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg))
    agent = AgentClient(transport, str(root), Ledger(tmp_path / "ledger.jsonl"))
    await transport.connect()
    try:
        await agent.claim("preinstalled")
        got = await ensure_python(
            agent, "3.11", home=None, method="offline", emit=lambda e: None, run_id="p"
        )
    finally:
        await transport.close()
    assert got.to_json() == {
        "python": str(lab.LAB_BIN / "python3.11"),
        "version": pbs.lab_version(),
        "brought": False,
    }
    assert not (root / "runtime").exists()


def test_doctor_on_a_3_9_only_host_says_what_it_brings_and_that_torch_2_13_needs_it(
    sshd, ssh_env, tmp_path
):
    home, cfg, alias = ssh_env(sshd)
    archive, sha = pbs.build_archive()
    project = tmp_path / "proj"
    project.mkdir()
    (project / "requirements.lock").write_text("torch==2.13.0\nnumpy\n")
    (project / "train.py").write_text("print('hi')\n")
    book = project / "pb.yaml"
    for python, verdict in (('"3.11"', "warn"), ("python3", "fail")):
        book.write_text(
            "name: t\nhost: x\nremote_root: ~/remotemac\nproject: {path: .}\n"
            f"environment: {{python: {python}, requirements: requirements.lock}}\n"
            "workload:\n  command: python train.py\n  reference: {device: cpu, on: remote}\n"
            "  target: {device: cpu}\n"
        )
        listing = pbs.downloads_json(tmp_path / "d.json", archive.as_uri(), sha)
        os.environ["UV_PYTHON_DOWNLOADS_JSON_URL"] = listing.as_uri()
        try:
            proc = _cli(home, cfg, "doctor", alias, "--playbook", str(book), "--json")
        finally:
            del os.environ["UV_PYTHON_DOWNLOADS_JSON_URL"]
        checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
        wp, pins = checks["workload python"], checks["pins"]
        if verdict == "warn":
            assert wp["status"] == "warn", wp
            assert (
                "remotemac will bring CPython 3.11" in wp["value"] and "MiB download" in wp["value"]
            )
            assert pins["status"] == "ok" and "needs the Python remotemac brings" in pins["value"]
        else:
            assert wp["status"] == "ok" and wp["value"].startswith("3.9."), wp
            assert pins["status"] == "fail", pins
            assert "torch==2.13.0 has no wheel for CPython 3.9 on linux x86_64" in pins["value"]


def test_doctor_on_the_linux_lab_says_the_host_side_sleeper_guards_a_run(sshd, ssh_env):
    """Off macOS there is no launchd: doctor says a run's dead-man is the sleeper, and why."""
    home, cfg, alias = ssh_env(sshd)
    proc = _cli(home, cfg, "doctor", alias, "--json")
    row = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["dead-man"]
    assert row["value"] == "host-side sleeper", row
    assert row["why"].startswith("not macOS: no launchd"), row
