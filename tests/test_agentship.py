"""One way to ship agent code (engine/agentship.py): the upload bundle and the in-memory
bootstrap that cleanup, claiming the root and doctor share."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from remotemac.engine import agentship
from remotemac.engine.agentship import (
    BOOTSTRAP,
    IN_MEMORY_ENTRIES,
    IN_MEMORY_ORDER,
    in_memory_payload,
    read_answer,
)
from remotemac.transport.base import ExecResult
from tests.test_hostfacts import _oldest_python
from tests.test_import_contracts import _checker

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "remotemac" / "agent"


def test_bootstrap_order_satisfies_every_sibling_import() -> None:
    """Each shipped module loads after the siblings it imports at load time, and each
    entry's prefix holds every sibling its modules import inside a function."""
    assert _checker().bootstrap_violations(IN_MEMORY_ORDER, IN_MEMORY_ENTRIES) == []


def test_order_check_fails_when_a_module_gains_an_import(tmp_path: Path) -> None:
    """A new import the order does not satisfy is caught: at load time (must come
    earlier), inside a function (must be shipped with the entry), or of a new module."""
    agent = tmp_path / "agent"
    shutil.copytree(AGENT, agent)
    check = _checker()
    with (agent / "procid.py").open("a") as f:  # procid loads early; guards comes later
        f.write("\nimport guards  # noqa\n")
    with (agent / "hostfacts.py").open("a") as f:  # doctor's facts ship hostfacts alone
        f.write("\ndef _late():\n    from remotemac.agent import procid  # noqa\n")
    (agent / "newmod.py").write_text("X = 1\n")
    with (agent / "cleanupops.py").open("a") as f:
        f.write("\nimport newmod  # noqa\n")
    found = check.bootstrap_violations(IN_MEMORY_ORDER, IN_MEMORY_ENTRIES, agent)
    assert any("procid imports guards when it loads" in line for line in found), found
    assert any("into hostfacts" in line and "imports procid" in line for line in found), found
    assert any("cleanupops imports newmod when it loads" in line for line in found), found
    # every later entry (rootclaim, pythons…) ships procid before hostfacts: no more
    assert len(found) == 3, found


def test_payload_ships_the_entrys_prefix_from_the_bundle() -> None:
    """Sources come from the same bundle that is uploaded; doctor's facts travel alone."""
    _, files = agentship.agent_bundle()
    payload = json.loads(
        zlib.decompress(in_memory_payload("hostfacts", "op_facts", {"remote_root": "/r"}))
    )
    assert [name for name, _ in payload["modules"]] == ["hostfacts"]
    cleanup = json.loads(zlib.decompress(in_memory_payload("cleanupops", "op_cleanup_host", {})))
    names = [name for name, _ in cleanup["modules"]]
    assert names[-1] == "cleanupops" and "agentruntime" not in names
    assert all(src == files[f"{name}.py"].decode() for name, src in cleanup["modules"])
    with pytest.raises(ValueError):
        in_memory_payload("dataops", "serve", {})


def _bootstrap(python: str, module: str, fn: str, req: dict, cwd: Path) -> ExecResult:
    """The bootstrap as a host runs it, from a directory with no agent file in reach."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(
        [python, "-c", BOOTSTRAP],
        input=in_memory_payload(module, fn, req),
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )
    return ExecResult("bootstrap", proc.returncode, proc.stdout, proc.stderr)


def test_every_entry_loads_and_answers_from_memory_on_python39(tmp_path: Path) -> None:
    """Each entry's modules load from stdin alone (Python 3.9 when this machine has it),
    answer one JSON line, and an exception is ``ok: false`` with exit 1."""
    python = _oldest_python()
    empty = tmp_path / "cwd"
    empty.mkdir()
    root = tmp_path / "root"
    plan = _bootstrap(
        python, "cleanupops", "op_cleanup_host", {"roots": [str(root)], "dry_run": True}, empty
    )
    assert plan.exit_code == 0, plan.stderr
    assert read_answer(plan)["ok"] is True and len(plan.text().splitlines()) == 1
    status = _bootstrap(python, "agentruntime", "op_runtime_status", {"root": str(root)}, empty)
    assert status.exit_code == 0, status.stderr
    assert read_answer(status)["result"]["present"] is False
    raised = _bootstrap(python, "agentruntime", "op_runtime_status", {}, empty)
    assert raised.exit_code == 1
    assert read_answer(raised) == {"ok": False, "error": "KeyError: 'root'"}
    assert not root.exists() and list(empty.iterdir()) == []


def _tree(top: Path) -> dict[str, int]:
    """Every path under ``top`` (files with their size, directories as -1)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), top)] = -1
        for name in filenames:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, top)] = os.lstat(path).st_size
    return found


@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_doctor_over_sshd_leaves_no_file_on_the_host(sshd, ssh_env) -> None:
    """doctor gathers every fact over real SSH and the host's home is as it was: no
    agent upload, no remote_root, no byte-code cache."""
    from remotemac.engine.doctorgather import doctor
    from remotemac.transport.options import SSHOptions
    from remotemac.transport.ssh import SSHTransport

    home, cfg, alias = ssh_env(sshd)
    root = sshd.home / "remotemac"
    before = _tree(sshd.home)
    transport = SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg))
    await transport.connect()
    try:
        report = await doctor(transport, alias, remote_root=str(root))
    finally:
        await transport.close()
    assert "collector_error" not in report.facts, report.facts
    assert report.facts["disk"]["path"] == str(sshd.home)
    runtime = report.facts["agent_runtime"]
    assert "error" not in runtime and runtime["present"] is False, runtime
    assert _tree(sshd.home) == before
    assert not root.exists()
