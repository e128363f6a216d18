"""The resident agent over the real sshd and the fault proxy (issue 16).

- one agent process serves many calls, several in flight, over one exec channel;
- a non-idempotent call cut mid-way is answered from the host's record, not run twice;
- a link that stays down past the reconnect deadline stops the run locally with exit 3
  and the ``attach`` hint while the job keeps running;
- a 3,000-line job with the link cut every 2 s for the whole run plus one 40 s
  blackhole completes: every line once and in order, results pulled and verified,
  wipe verified, the exit code of a clean run.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from remotemac.agent.protocol import Op
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.ledger import Ledger
from remotemac.phases import Phase
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport
from tests.conftest import LINES_PROJECT
from tests.test_detached_faults import Timeline, run_pipeline_inprocess
from tests.test_detached_ssh import (
    SSHHost,
    expected_lines,
    first_run_id,
    local_lines,
    wait_lines,
)

pytestmark = pytest.mark.timeout(300)


class LabHost(SSHHost):
    """A lab sshd (bare python3 3.9 login, its own tmux server) behind a fault proxy."""

    def tmux(self, *args: str):
        return self.sshd.tmux(*args)  # type: ignore[attr-defined]


@pytest.fixture
def lab_host(sshd_factory, ssh_env, fault_proxy) -> LabHost:
    server = sshd_factory()
    proxy = fault_proxy(server)
    home, cfg, alias = ssh_env(
        server,
        proxy,
        extra={"ServerAliveInterval": "1", "ServerAliveCountMax": "3", "ConnectTimeout": "5"},
    )
    return LabHost(home, cfg, alias, server.host_dir("root"), str(server.tmux_dir), server, proxy)


def _transport(env: tuple, events: list, **kw: object) -> SSHTransport:
    home, cfg, alias = env
    kw.setdefault("keepalive_interval", 1)
    kw.setdefault("keepalive_count_max", 3)
    kw.setdefault("connect_timeout", 2)
    return SSHTransport(
        alias, home_dir=home, options=SSHOptions(ssh_config=cfg, **kw), emit=events.append
    )  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_one_agent_process_serves_many_calls_at_once(sshd, ssh_env, tmp_path: Path):
    """40 calls, 10 in flight at a time: one resident process, one start, ids matched;
    it runs on the lab host's bare python3 3.9."""
    events: list = []
    root = sshd.host_dir("root")
    async with _transport(ssh_env(sshd), events) as t:
        await t.makedirs(str(root))
        agent = AgentClient(t, str(root), Ledger(tmp_path / "ledger.jsonl"))
        for _ in range(4):
            answers = await asyncio.gather(*(agent.call("ping") for _ in range(10)))
            assert all(a["python"].startswith("3.9.") for a in answers), answers[0]
        session = agent.session()
        assert session.starts == 1 and len(session.cpu_by_pid) == 1
        assert agent.host_cpu_s > 0
        await agent.close()
    entries = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    assert [e["via"] for e in entries if e["op"] == "ping"] == ["resident"] * 40
    # every answer was recorded on the host, under the bound
    assert 0 < len(list((root / "agent" / "calls").glob("*.json"))) <= 512


@pytest.mark.asyncio
async def test_a_status_with_the_jobs_log_is_never_recorded_on_the_host(
    sshd, ssh_env, tmp_path: Path
):
    """The follow's ``status`` carries the job's log bytes: the resident agent answers it
    unrecorded, so no poll leaves a copy of the log (and what the job printed) in
    ``agent/calls``, outside the run dir and past its wipe; a ``ping`` still is recorded."""
    root = sshd.host_dir("root")
    run_dir = sshd.host_dir("jobs") / "r1"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "status").mkdir()
    (run_dir / "logs" / "cpu.log").write_text("epoch 1 token=hunter2-LOGLINE\n")
    async with _transport(ssh_env(sshd), []) as t:
        agent = AgentClient(t, str(root), Ledger(tmp_path / "ledger.jsonl"))
        await agent.call("ping")
        answer = await agent.call(
            Op.STATUS, {"run_dir": str(run_dir), "device": "cpu", "log_from": 0}
        )
        assert "log_b64" in answer, answer  # the log came with the status
        await agent.close()
    records = list((root / "agent" / "calls").glob("*.json"))
    assert records, "the ping was not recorded: the store is not in use at all"
    assert not [r for r in records if "log_b64" in r.read_text()], records


@pytest.mark.asyncio
async def test_a_call_cut_midway_is_answered_from_the_record(
    sshd, fault_proxy, ssh_env, tmp_path: Path
):
    """ensure_venv is not idempotent (it makes a venv; its answer says ``reused``): cut the
    link while it runs. The retried call gets the recorded answer (``reused: False``) and
    the interpreter that builds the venv ran once (counted), instead of a second run or
    "it may or may not have completed"."""
    proxy = fault_proxy(sshd)
    events: list = []
    root = sshd.host_dir("root")
    runs = sshd.host_dir("bin") / "interpreter-runs.txt"
    wrapper = sshd.host_dir("bin") / "python-counting"
    wrapper.write_text(f'#!/bin/sh\necho "run $*" >> {runs}\nsleep 2\nexec python3 "$@"\n')
    wrapper.chmod(0o755)
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=60) as t:
        await t.makedirs(str(root))
        agent = AgentClient(t, str(root), Ledger(tmp_path / "ledger.jsonl"))
        await agent.call("ping")
        call = asyncio.ensure_future(
            agent.call(
                "ensure_venv",
                {
                    "root": str(root),
                    "key": "k1",
                    "python": str(wrapper),
                    "system_site_packages": False,
                    "requirements": None,
                },
                timeout=120,
            )
        )
        deadline = time.monotonic() + 60
        while not runs.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert runs.exists(), "the venv build never started"
        assert proxy.cut() >= 1
        answer = await asyncio.wait_for(call, 120)
        assert agent.session().starts == 2
        await agent.close()
    assert t.disconnects >= 1
    # the op also asks the interpreter who it is (-I -c …): count the builds
    builds = [ln for ln in runs.read_text().splitlines() if " -m venv " in ln]
    assert len(builds) == 1, f"the venv was built more than once: {builds}"
    assert answer["reused"] is False, answer
    entries = [json.loads(x) for x in (tmp_path / "ledger.jsonl").read_text().splitlines()]
    venv = [e for e in entries if e["op"] == "ensure_venv"]
    assert len(venv) == 1 and "answer recorded before the link dropped" in venv[0]["command"]


@pytest.mark.asyncio
async def test_claiming_the_root_survives_a_cut(sshd, fault_proxy, ssh_env, tmp_path: Path):
    """The first thing a run does on the host is claim its root (an exec of the agent from
    stdin). Cut the link while it runs: the claim is run again on the new link and adopts
    the root the first attempt made (same root id), instead of failing the run with
    "it may or may not have completed"."""
    proxy = fault_proxy(sshd)
    events: list = []
    root = sshd.host_dir("root") / "claimed"
    runs = sshd.host_dir("bin") / "claim-runs.txt"
    wrapper = sshd.host_dir("bin") / "python-slow"
    wrapper.write_text(f'#!/bin/sh\necho "run" >> {runs}\nsleep 2\nexec python3 "$@"\n')
    wrapper.chmod(0o755)
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=60) as t:
        agent = AgentClient(t, str(root), Ledger(tmp_path / "ledger.jsonl"), python=str(wrapper))
        claim = asyncio.ensure_future(agent.claim("run-1"))
        deadline = time.monotonic() + 60
        while not runs.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert runs.exists(), "the claim never started"
        assert proxy.cut() >= 1
        root_id = await asyncio.wait_for(claim, 120)
    assert t.disconnects >= 1
    assert len(runs.read_text().splitlines()) == 2  # run again on the new link
    marker = json.loads((root / ".remotemac-owned").read_text())
    assert root_id and marker["root_id"] == root_id, (root_id, marker)


def _playbook(
    host,
    path: Path,
    *,
    lines: int,
    seconds: float,
    wipe: str = "after_pull",
    deadline: str | None = None,
) -> Path:
    data = {
        "name": "resident",
        "host": host.alias,
        "remote_root": str(host.root),
        "project": {"path": str(LINES_PROJECT), "exclude": ["data/"]},
        "environment": {"python": "python3", "venv": False},
        "data": {"path": str(LINES_PROJECT / "data"), "classification": "public", "encrypt": False},
        "workload": {
            "command": f"python3 emit.py --device {{device}} --data {{data_dir}} "
            f"--out {{output_dir}} --lines {lines} --seconds {seconds}",
            "reference": None,
            "target": {"device": "cpu"},
            "timeout": "10m",
        },
        "outputs": {"path": "."},
        "stop_when": {"memory_growth": False},
        "wipe": wipe,
    }
    if deadline:
        data["connection"] = {"reconnect_deadline": deadline}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_past_the_reconnect_deadline_the_run_stops_with_exit_3_and_the_job_runs_on(
    lab_host: LabHost, tmp_path: Path
):
    """Blackhole the link mid-follow with a 6 s deadline: exit 3, ``remotemac attach
    <id>`` printed, a countdown shown, and the job still running on the host."""
    host = lab_host
    # the run gives up ~14 s after the blackhole starts (keepalive + the 6 s deadline), 17 s
    # into the job; a 32 s job is still running then with room for a loaded machine
    pb = _playbook(host, tmp_path / "pb.yaml", lines=400, seconds=32, wipe="manual")
    out = tmp_path / "out"
    proc = host.popen("run", str(pb), "--out", str(out), "--reconnect-deadline", "6s")
    wait_lines(proc, out, 20)
    host.proxy.blackhole()
    started = time.monotonic()
    try:
        stdout, stderr = proc.communicate(timeout=90)
    finally:
        host.proxy.restore()
    took = time.monotonic() - started
    run_id = first_run_id(host.home)
    assert proc.returncode == 3, stderr
    assert f"remotemac attach {run_id}" in stderr, stderr
    assert "gives up in" in stdout + stderr  # the countdown was shown
    assert took < 45, took
    status = host.status(run_id)
    assert status.get("state") == "running", status
    assert host.tmux("has-session", "-t", f"=remotemac-{run_id}-cpu").returncode == 0
    # and once the link is back, attach finishes the run with every line once
    done = host.cli("attach", run_id, timeout=240)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert local_lines(out)[1:] == expected_lines(400)[1:]


def _cut_every(
    proxy, seconds: float, stop: threading.Event, blackhole_at: float, blackhole_s: float, log: list
) -> None:
    """Cut the link every ``seconds`` for the whole run; once, blackhole it for a while."""
    t0 = time.monotonic()
    blackholed = False
    while not stop.wait(seconds):
        if not blackholed and time.monotonic() - t0 >= blackhole_at:
            blackholed = True
            proxy.blackhole()
            log.append(("blackhole", time.monotonic() - t0))
            if stop.wait(blackhole_s):
                proxy.restore()
                return
            proxy.restore()
            log.append(("restore", time.monotonic() - t0))
            continue
        log.append(("cut", time.monotonic() - t0, proxy.cut()))


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_3000_lines_through_a_cut_every_2s_and_a_40s_blackhole(lab_host: LabHost, tmp_path: Path):
    """The issue's bad link: cut every 2 s for the whole run, one 40 s blackhole.

    Every line once and in order, the result pulled and verified, the wipe
    verified, the exit code and verdict of a clean run.
    """
    host = lab_host
    # the exit code of the same workload over a clean link (no torch: "incomplete", 1)
    clean_ctx, clean_code = asyncio.run(
        run_pipeline_inprocess(
            host,
            _playbook(host, tmp_path / "clean.yaml", lines=30, seconds=1),
            tmp_path / "clean",
            Timeline(),
        )
    )
    pb = _playbook(host, tmp_path / "pb.yaml", lines=3000, seconds=60)
    out = tmp_path / "out"
    timeline = Timeline()
    stop = threading.Event()
    faults: list = []
    cutter = threading.Thread(
        target=_cut_every, args=(host.proxy, 2.0, stop, 12.0, 40.0, faults), daemon=True
    )
    cutter.start()
    try:
        ctx, code = asyncio.run(run_pipeline_inprocess(host, pb, out, timeline))
    finally:
        stop.set()
        cutter.join(60)
        host.proxy.restore()
    cuts = [f for f in faults if f[0] == "cut"]
    # cut every 2 s from the start to the end of the run, around the 40 s blackhole
    kinds = [f[0] for f in faults]
    assert "restore" in kinds and kinds.index("blackhole") >= 4, faults
    assert len(cuts) >= 8 and kinds[-1] == "cut", faults
    assert code == clean_code, (code, clean_code)
    assert ctx.result(Phase.RECORD).verdict == clean_ctx.result(Phase.RECORD).verdict
    got = local_lines(out)
    assert got[0].startswith("device=cpu data_files=")  # the count depends on the sync mode
    assert got[1:] == expected_lines(3000)[1:]
    pulled = ctx.result(Phase.PULL).files("cpu")
    assert any(f.path == "result.json" and len(f.sha256 or "") == 64 for f in pulled), pulled
    assert json.loads((out / "results" / "cpu" / "result.json").read_text())["lines"] == 3000
    wipe = ctx.result(Phase.WIPE)
    assert wipe.done and wipe.verified, wipe
    assert ctx.continuity.disconnects >= 8
    cpu = json.loads((out / "acceptance.json").read_text())["cpu"]
    assert cpu["host_s"] > 0 and cpu["laptop_s"] > 0 and cpu["agent_calls"] > 10, cpu
