"""Issue 31 item 6: the workload's secrets do not survive the wipe on the host.

The command carries a token (``API_KEY=… python3 train.py``) and ``workload.env`` another,
as users write them. After the run (pulled, verified, wiped) no file left on the host,
not the runner's ``status/<device>.json`` nor the resident agent's answer records in
``agent/calls/``, holds either (before: only ``*.spec.json`` was scrubbed). On the
laptop the journal keeps the playbook for ``attach`` (docs/contract.md, "Secrets"):
the promise there is a file only its owner can read, and that is checked too.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.test_cleanup_sshd import make_target, run_ids
from tests.test_failure_paths_sshd import results_project, write_book

pytestmark = pytest.mark.timeout(300)

COMMAND_SECRET = "sk-live-0123456789abcdefCMD"
ENV_SECRET = "hf_987654321secretENV"


def files_holding(root: Path, needles: list[str]) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def test_workload_secrets_are_gone_from_every_host_file_after_the_wipe(
    tmp_path, sshd_factory, ssh_env
):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    book = write_book(
        tmp_path,
        t,
        results_project(tmp_path),
        command=f"API_KEY={COMMAND_SECRET} python3 train.py {{output_dir}}",
        env={"HF_TOKEN": ENV_SECRET},
    )
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    [run_id] = run_ids(t.root)
    run_dir = t.root / "runs" / run_id
    assert (run_dir / "status").is_dir(), "status/ stays until cleanup: the test needs it"
    assert list((t.root / "agent").rglob("calls/*.json")), "no answer records to look at"
    assert files_holding(t.root, [COMMAND_SECRET, ENV_SECRET]) == []
    # the laptop's journal holds the playbook (attach needs it): only its owner reads it
    journal = t.rm_home / "journal.sqlite3"
    assert stat.S_IMODE(journal.stat().st_mode) & 0o077 == 0, oct(journal.stat().st_mode)
