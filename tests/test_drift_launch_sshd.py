"""The drift check before the target sees the environment as it was before the target
started, however late the laptop is (review of issue 36).

The check used to ask the host for a fingerprint beside the target's launch call; on
a host that starts the target itself when the reference ends (the same host's
``next``), the job had long started by then over a far link, and a job that changes
its own environment as it starts (a ``pip install`` at the top of the script) was
recorded as drift. The fingerprint is now taken inside the launch, before the runner
starts, and comes back in the launch answer.

Simulation of a far link: the laptop learns of the reference's end 2 s late (the
follow is held after it returns), so the target has started and changed its venv
before the laptop's launch phase begins. A real sshd, real tmux, a real venv; the
workload writes real ``.dist-info`` directories into its venv's site-packages.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml

from remotemac.engine import jobs
from tests.test_detached_faults import Timeline, run_pipeline_inprocess
from tests.test_detached_ssh import SSHHost, host_factory  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.sshd, pytest.mark.timeout(300)]

WORKLOAD = r"""
import os, sys, sysconfig

out = sys.argv[1]


def install(name):
    # what pip leaves behind: a dist-info directory in the venv's site-packages
    info = os.path.join(sysconfig.get_paths()["purelib"], name + "-1.0.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write("Metadata-Version: 2.1\nName: %s\nVersion: 1.0\n" % name)


if out.endswith("-target"):
    install("changed-by-the-target-at-its-start")  # the job's own doing: no drift
    print("target")
else:
    print("reference")
    install("changed-between-the-two-jobs")  # before the target started: a drift
"""


def playbook(host: SSHHost, base: Path) -> Path:
    project = base / "project"
    project.mkdir(parents=True)
    (project / "a.py").write_text(WORKLOAD)
    book = base / "drift.yaml"
    book.write_text(
        yaml.safe_dump(
            {
                "name": "drift-at-start",
                "host": host.alias,
                "remote_root": str(host.root),
                "project": {"path": str(project)},
                "workload": {
                    "command": "python a.py {output_dir}",
                    "reference": {"device": "cpu"},
                    "target": {"device": "cpu"},
                    "timeout": "5m",
                },
                "stop_when": {"memory_growth": False},
            },
            sort_keys=False,
        )
    )
    return book


def test_a_job_that_changes_its_venv_as_it_starts_is_not_drift_a_change_before_it_is(
    host_factory,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    host = host_factory()
    book = playbook(host, tmp_path / "book")
    follow = jobs.follow

    async def late(ctx, side, request):  # the far link: the laptop hears of the end late
        result = await follow(ctx, side, request)
        if side.role == "reference":
            await asyncio.sleep(2)
        return result

    monkeypatch.setattr(jobs, "follow", late)
    out = tmp_path / "out"
    _, code = asyncio.run(run_pipeline_inprocess(host, book, out, Timeline()))
    assert code in (0, 1), code
    assert (out / "logs" / "cpu-target.log").read_text() == "target\n"
    # the target did change its venv, and it did so long before the laptop's launch phase
    site = next((host.root / "envs").glob("*/lib/python*/site-packages"))
    assert (site / "changed-by-the-target-at-its-start-1.0.dist-info").is_dir()
    entries = [json.loads(x) for x in (out / "env" / "drift.jsonl").read_text().splitlines()]
    [check] = [e for e in entries if e["when"] == "before-target"]
    [change] = check["changes"]
    assert change["key"] == "lock_hash"
    # the reference's change is drift; the target's own, made as it started, is not
    assert [p["name"] for p in change["packages"]] == ["changed-between-the-two-jobs"]
    record = json.loads((out / "acceptance.json").read_text())
    [warning] = record["environment"]["drift"]["warnings"]
    assert {p["name"] for p in warning["packages"]} == {"changed-between-the-two-jobs"}
