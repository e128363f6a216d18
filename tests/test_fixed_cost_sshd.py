"""The fixed cost of a trivial run, counted in what it waits for (issue 36).

A warm trivial two-device run (reference and target ``python3 a.py`` on cpu, one
small result each, no data) through a real sshd: every exec channel it opens and
every SFTP operation it makes are counted on the real transport. The cuts of issue
36 are each an operation that no longer happens: the root claimed and the agent's
install checked by one exec that goes on as the resident agent (no ``printenv HOME`` for an absolute root, no SFTP
stat), the project inside the extract call (no SFTP put), the follow through the
agent's waiting ``status`` (no SFTP read of the log), a small pull over the SFTP
session (no sender exec channel, no directory listing). Counts, not times: the
test cannot be made to pass by a fast machine.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
from pathlib import Path

import pytest
import yaml

from remotemac.phases import Phase
from remotemac.transport.ssh import SSHTransport
from tests.test_detached_faults import Timeline, run_pipeline_inprocess
from tests.test_detached_ssh import SSHHost, host_factory  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(300)]

COUNTED = ("exec", "open_process", "put", "read_from", "listdir", "stat", "download_to")


def trivial_playbook(host: SSHHost, base: Path) -> Path:
    """Reference and target ``python3 a.py`` on cpu, one small result each."""
    project = base / "project"
    project.mkdir(parents=True)
    (project / "a.py").write_text(
        "import json, os, sys\n"
        "print('hello')\n"
        "with open(os.path.join(sys.argv[1], 'result.json'), 'w') as f:\n"
        "    json.dump({'ok': 1}, f)\n"
    )
    book = base / "trivial.yaml"
    book.write_text(
        yaml.safe_dump(
            {
                "name": "trivial",
                "host": host.alias,
                "remote_root": str(host.root),
                "project": {"path": str(project)},
                "environment": {"venv": False},
                "workload": {
                    "command": "python3 a.py {output_dir}",
                    "reference": {"device": "cpu"},
                    "target": {"device": "cpu"},
                    "timeout": "5m",
                },
                "outputs": {"path": "."},
                "stop_when": {"memory_growth": False},
            },
            sort_keys=False,
        )
    )
    return book


def count_operations(monkeypatch: pytest.MonkeyPatch) -> collections.Counter:
    """Count the transport's operations (exec channels, SFTP requests) as they run."""
    counts: collections.Counter = collections.Counter()
    for name in COUNTED:
        original = getattr(SSHTransport, name)

        def counted(original=original, name=name):
            @functools.wraps(original)
            async def wrapper(self, *args, **kwargs):
                counts[name] += 1
                return await original(self, *args, **kwargs)

            return wrapper

        monkeypatch.setattr(SSHTransport, name, counted())
    return counts


def test_a_warm_trivial_run_opens_one_exec_channel_and_no_sftp_transfer_but_its_results(
    host_factory,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    host = host_factory()
    book = trivial_playbook(host, tmp_path / "book")
    # the first run installs the agent below the root (SFTP writes): not counted
    _, code = asyncio.run(run_pipeline_inprocess(host, book, tmp_path / "cold", Timeline()))
    assert code in (0, 1)
    counts = count_operations(monkeypatch)
    ctx, code = asyncio.run(run_pipeline_inprocess(host, book, tmp_path / "warm", Timeline()))
    # the trivial job imports no torch: INCOMPLETE (1), after the whole pipeline
    assert code in (0, 1), code
    # every phase ran, and each side's result came down verified
    pulled = ctx.result(Phase.PULL)
    for label in ("cpu", "cpu-target"):
        [result] = pulled.files(label)
        assert result.path == "result.json" and len(result.sha256) == 64
        local = tmp_path / "warm" / "results" / label / "result.json"
        assert json.loads(local.read_text()) == {"ok": 1}
    assert ctx.result(Phase.WIPE).verified
    assert (tmp_path / "warm" / "logs" / "cpu.log").read_text() == "hello\n"
    assert (tmp_path / "warm" / "logs" / "cpu-target.log").read_text() == "hello\n"
    # one exec channel: the claim (from memory) that goes on as the resident agent; no
    # $HOME exec (the root is absolute), no pull sender (a small pull goes over SFTP)
    assert counts["exec"] == 0, counts
    # (so that one channel answered every agent call of the run)
    assert counts["open_process"] == 1, counts
    # no SFTP put (the project travels in the extract call), no SFTP read of a log
    # (the follow reads it through the agent), no directory listing (one lstat a file)
    assert counts["put"] == 0 and counts["read_from"] == 0 and counts["listdir"] == 0, counts
    # the SFTP downloads: each side's result and its observations, nothing else
    assert counts["download_to"] <= 4 * 2, counts
