"""The agent runtime over a real OpenSSH sshd whose login is a bare host.

The sshd of tests/harness logs in as the fresh-host lab's user (tests/harness/lab.py):
its ``python3`` is a bare CPython 3.9 (pip and setuptools only), as a rented Mac's
/usr/bin/python3 is, and the agent runs on it with the default ``agent.python``.
Both ways in (pip on the host; wheels brought by the laptop over SFTP) end in an
encrypted sync whose plaintext lands only in RAM.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from remotemac.engine.agentclient import AgentClient
from remotemac.engine.ledger import Ledger
from remotemac.engine.runtime import ensure_runtime
from remotemac.engine.sync import sync_slice
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport
from tests.test_agent_runtime import make_data

pytestmark = [pytest.mark.timeout(300)]


@pytest.mark.asyncio
@pytest.mark.parametrize("method", ["online", "offline"])
async def test_encrypted_sync_over_sshd_with_agent_on_bare_python(sshd, ssh_env, tmp_path, method):
    home, cfg, alias = ssh_env(sshd)
    transport = SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg))
    root = sshd.home / "host-root"
    run_id = f"rt-sshd-{method}"
    ledger_path = tmp_path / "ledger.jsonl"
    agent = AgentClient(transport, str(root), Ledger(ledger_path))
    assert agent.python == "python3"  # the login's own: bare 3.9, no cryptography
    data = tmp_path / "data"
    paths = make_data(data, files=8)
    key = os.urandom(32)
    await transport.connect()
    try:
        bare = await transport.exec(["python3", "-c", "import cryptography"])
        assert bare.exit_code != 0 and b"ModuleNotFoundError" in bare.stderr
        prepared = await agent.call("prepare_run", {"root": str(root), "run_id": run_id})
        started = time.monotonic()
        runtime = await ensure_runtime(
            agent, home=tmp_path / "rmhome", method=method, run_id=run_id
        )
        cold = time.monotonic() - started
        assert runtime.method == method and runtime.reused is False
        assert runtime.extra["python"].startswith("3.9.")
        manifest, answer, _ = await sync_slice(
            transport,
            agent,
            root=data,
            paths=paths,
            run_dir=prepared["run_dir"],
            run_id=run_id,
            key=key,
            runtime_dir=runtime.dir,
        )
        assert answer["data_dir"].startswith("/dev/shm/")
        for entry in manifest.entries:
            assert (
                Path(answer["data_dir"], entry.path).read_bytes()
                == (data / entry.path).read_bytes()
            )
        started = time.monotonic()
        again = await ensure_runtime(agent, home=tmp_path / "rmhome", method=method)
        warm = time.monotonic() - started
        assert again.reused is True and again.dir == runtime.dir
        print(
            f"\n{method} over sshd: cold {cold:.2f} s (host side {runtime.seconds} s), "
            f"second {warm:.2f} s"
        )
    finally:
        await transport.close()
        shutil.rmtree(f"/dev/shm/remotemac-{run_id}", ignore_errors=True)
    ledger = [json.loads(x) for x in ledger_path.read_text().splitlines()]
    assert len([e for e in ledger if e["op"] == "install-runtime"]) == 1
    assert all(
        e["command"].startswith("python3 ")
        for e in ledger
        if e["op"] in ("sync-data", "runtime_ensure", "prepare_run")
    )
    # the key never reached the host's disk or the ledger
    assert not [p for p in root.rglob("*") if p.is_file() and key.hex().encode() in p.read_bytes()]
    assert key.hex() not in ledger_path.read_text()
