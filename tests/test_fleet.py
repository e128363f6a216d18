"""Fleet runs over 16 real sshd instances on loopback, through the real CLI.

Each "Mac" is an OpenSSH sshd with its own port, remote_root (from the inventory
file's vars) and tmux server, so one can be lost without touching the others.
The workload is the stdlib ``lines`` emitter; tests whose records must be accepted
put a tensor on the CPU, which needs torch on the host: they say ``host_torch`` and
run on the lab host's torch interpreter (the harness needs torch to observe where
tensors live).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from remotemac.engine.context import fill_matrix, specialize
from remotemac.engine.fleet import (
    FleetRun,
    fleet_exit_code,
    fleet_hosts,
    plan_runs,
    variants,
)
from remotemac.engine.inventoryfile import HostVars, parse_inventory
from remotemac.engine.pool import TransportPool
from remotemac.errors import BadInput
from remotemac.playbook import parse_playbook
from tests import fleetkit as fk
from tests.harness.sshd import SSHD, free_port

pytestmark = pytest.mark.e2e

FLEET = 16


@pytest.fixture(scope="module")
def sixteen(tmp_path_factory, client_key, fresh_host_lab, host_torch_python):
    base = tmp_path_factory.mktemp("fleet16")
    servers: list[SSHD] = []

    def start(**kw) -> SSHD:
        server = SSHD(tmp_path_factory.mktemp("sshd"), client_key=client_key, **kw).start()
        servers.append(server)
        return server

    try:
        macs, config = fk.start_macs(FLEET, base, start)
        home = base / "home"
        fk.trust(home, macs)
        yield {
            "macs": macs,
            "config": config,
            "home": home,
            "base": base,
            "python": host_torch_python,
            "inventory": fk.write_inventory(base / "inventory.yaml", macs, rate=1.5),
        }
    finally:
        for server in servers:
            server.cleanup()


def _accepted_logins(server: SSHD) -> int:
    return server.log().count("Accepted publickey")


def test_host_torch_sixteen_hosts_all_accepted(sixteen):
    macs, base = sixteen["macs"], sixteen["base"]
    pb = fk.write_playbook(base / "fleet16.yaml", lines=4, seconds=0.2, python=sixteen["python"])
    out = base / "out-all"
    logins = [_accepted_logins(m.sshd) for m in macs]
    proc = fk.cli(
        "--ssh-config",
        str(sixteen["config"]),
        "run",
        str(pb),
        "--inventory",
        str(sixteen["inventory"]),
        "--forks",
        "16",
        "--out",
        str(out),
        home=sixteen["home"],
        cwd=base,
        timeout=600,
    )
    summary = json.loads((out / "fleet.json").read_text())
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:], summary["runs"])
    assert summary["exit_code"] == 0 and summary["counts"] == {"accepted": FLEET}
    assert sorted(r["host"] for r in summary["runs"]) == [m.alias for m in macs]
    for mac, row in zip(macs, sorted(summary["runs"], key=lambda r: r["host"]), strict=True):
        record = json.loads((out / mac.alias / "acceptance.json").read_text())
        assert record["verdict"] == "accepted" and record["run_id"] == row["run_id"]
        assert record["fleet"]["fleet_id"] == summary["fleet_id"]
        assert record["cost"]["hourly_rate"] == 1.5  # the inventory's var, not the playbook's 0
        # each host used its own remote_root (inventory var) and nothing else
        assert (mac.root / "runs" / row["run_id"]).is_dir()
    # connection economy: one SSH connection per host for all of the run's phases
    assert summary["connections"] == FLEET
    assert [_accepted_logins(m.sshd) - n for m, n in zip(macs, logins, strict=True)] == [1] * FLEET
    # the table names every host with its verdict
    for mac in macs:
        assert any(
            line.lstrip("│ ").startswith(mac.alias) and "accepted" in line
            for line in proc.stdout.splitlines()
        )
    # every run is a journal entry of its own
    status = fk.cli("status", "--json", home=sixteen["home"], cwd=base)
    rows = [json.loads(x) for x in status.stdout.splitlines()]
    mine = [r for r in rows if r["run_id"].startswith(summary["fleet_id"])]
    assert len(mine) == FLEET and {r["verdict"] for r in mine} == {"accepted"}


def test_host_torch_one_host_lost_mid_run_the_others_finish(sixteen):
    macs, base = sixteen["macs"], sixteen["base"]
    victim = macs[5]
    pb = fk.write_playbook(base / "fleet16lost.yaml", lines=20, seconds=5, python=sixteen["python"])
    out = base / "out-lost"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "remotemac",
            "--ssh-config",
            str(sixteen["config"]),
            "run",
            str(pb),
            "--inventory",
            str(sixteen["inventory"]),
            "--forks",
            "16",
            "--out",
            str(out),
        ],
        cwd=base,
        env={**os.environ, "REMOTEMAC_HOME": str(sixteen["home"])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = threading.Event()

    def kill_when_running() -> None:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            for status in (victim.root / "runs").glob("fleet16lost-*/status/cpu.json"):
                try:
                    state = json.loads(status.read_text()).get("state")
                except (OSError, ValueError):
                    continue
                if state == "running":
                    victim.kill_tmux()
                    killed.set()
                    return
            time.sleep(0.1)

    watcher = threading.Thread(target=kill_when_running, daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate(timeout=600)
    watcher.join(5)
    assert killed.is_set(), "the victim's job was never seen running"
    summary = json.loads((out / "fleet.json").read_text())
    assert proc.returncode == 4, (stdout[-3000:], stderr[-2000:], summary["runs"])
    assert summary["exit_code"] == 4 and summary["counts"] == {"accepted": FLEET - 1, "lost": 1}
    lost = [r for r in summary["runs"] if r["verdict"] == "lost"]
    assert [r["host"] for r in lost] == [victim.alias]
    assert lost[0]["exit_code"] == 4 and "lost" in lost[0]["reason"]
    record = json.loads((out / victim.alias / "acceptance.json").read_text())
    assert record["verdict"] != "accepted"
    assert any(c["code"] == "job-lost" for c in record["stopping_conditions"])
    for mac in macs:
        if mac is not victim:
            assert (
                json.loads((out / mac.alias / "acceptance.json").read_text())["verdict"]
                == "accepted"
            )
    lines = [x for x in stdout.splitlines() if x.lstrip("│ ").startswith(victim.alias)]
    assert any("lost" in x for x in lines), stdout[-3000:]


def test_unreachable_host_is_exit_3_and_never_stops_the_others(sshd_factory, tmp_path):
    """The reachable host runs torch-free on the bare host: its run completes (not
    accepted: nothing observed the tensors), and the fleet's exit is the unreachable's 3."""
    macs, config = fk.start_macs(1, tmp_path, sshd_factory)
    dead = SSHD(tmp_path / "dead-sshd")  # configured, never started: nothing listens
    dead.port = free_port()
    dead.write_ssh_config(config, "gone", known_hosts=tmp_path / "user_known_hosts")
    home = tmp_path / "home"
    fk.trust(home, macs)
    pb = fk.write_playbook(tmp_path / "partial.yaml", lines=3, seconds=0.1)
    out = tmp_path / "out"
    proc = fk.cli(
        "--ssh-config",
        str(config),
        "run",
        str(pb),
        "--hosts",
        "h00,gone",
        "--out",
        str(out),
        home=home,
        cwd=tmp_path,
        timeout=300,
    )
    summary = json.loads((out / "fleet.json").read_text())
    assert proc.returncode == 3, (proc.stdout[-2000:], summary["runs"])
    by_host = {r["host"]: r for r in summary["runs"]}
    assert by_host["h00"]["exit_code"] in (0, 1), by_host["h00"]
    assert by_host["h00"]["verdict"] not in ("unreachable", "lost")
    assert (out / "h00" / "acceptance.json").exists()
    assert (
        json.loads((out / "h00" / "results" / "cpu-target" / "result.json").read_text())["lines"]
        == 3
    )
    assert by_host["gone"]["verdict"] == "unreachable" and by_host["gone"]["exit_code"] == 3
    assert "refused" in by_host["gone"]["reason"]
    record = json.loads((out / "gone" / "acceptance.json").read_text())
    assert record["verdict"] == "incomplete" and "refused" in record["error"]


# ---------------------------------------------------------------- units, no hosts


PLAYBOOK = """
name: sweep
host: mac-a
workload:
  command: python3 train.py --bs {matrix.bs} --dtype {matrix.dtype} --out {output_dir}
matrix:
  bs: [8, 16]
  dtype: [float32, "it's {odd}"]
"""


def test_matrix_variants_spread_round_robin(tmp_path: Path):
    pb = parse_playbook(PLAYBOOK)
    assert variants(pb.matrix) == [
        {"bs": 8, "dtype": "float32"},
        {"bs": 8, "dtype": "it's {odd}"},
        {"bs": 16, "dtype": "float32"},
        {"bs": 16, "dtype": "it's {odd}"},
    ]
    runs = plan_runs(pb, ["a", "b"], None, tmp_path)
    assert [(r.host, r.variant["bs"]) for r in runs] == [("a", 8), ("b", 8), ("a", 16), ("b", 16)]
    assert runs[0].out_dir == tmp_path / "a" / "bs=8,dtype=float32"
    assert len({r.out_dir for r in runs}) == 4


def test_fill_matrix_quotes_and_keeps_other_placeholders():
    cmd = "python3 t.py --dtype {matrix.dtype} --out {output_dir} --json '{{}}'"
    filled = fill_matrix(cmd, {"dtype": "it's {odd}"})
    # the later .format of {output_dir} must see the quoted value literally
    assert (
        filled.format(output_dir="/o")
        == "python3 t.py --dtype 'it'\"'\"'s {odd}' --out /o --json '{}'"
    )
    pb = specialize(
        parse_playbook(PLAYBOOK),
        host="b",
        matrix={"bs": 8, "dtype": "float32"},
        remote_root="/srv/rm",
        hourly_rate=2.0,
    )
    assert pb.host == "b" and pb.hosts is None and pb.matrix is None
    assert pb.remote_root == "/srv/rm" and pb.cost.hourly_rate == 2.0
    assert "--bs 8 --dtype float32" in pb.workload.command


def test_fleet_exit_code_precedence(tmp_path: Path):
    def runs(*codes):
        return [
            FleetRun(i, f"h{i}", None, HostVars(), tmp_path, exit_code=c)
            for i, c in enumerate(codes)
        ]

    assert fleet_exit_code(runs(0, 0)) == 0
    assert fleet_exit_code(runs(0, 1)) == 1
    assert fleet_exit_code(runs(1, 3, 0)) == 3
    assert fleet_exit_code(runs(3, 4, 1)) == 4


INVENTORY = """
macs:
  vars: {hourly_rate: 1.1}
  hosts:
    mac-a: {rental_end: 2030-01-01T00:00:00+00:00}
    admin@10.0.0.7:2222: {remote_root: ~/rm, hourly_rate: 1.4}
linux:
  hosts: [gpu-box]
"""


def test_inventory_groups_and_vars():
    inv = parse_inventory(INVENTORY, "inv.yaml")
    assert inv.hosts() == ["mac-a", "admin@10.0.0.7:2222", "gpu-box"]
    assert inv.host_vars("mac-a").hourly_rate == 1.1
    assert inv.host_vars("admin@10.0.0.7:2222").hourly_rate == 1.4
    assert inv.host_vars("admin@10.0.0.7:2222").remote_root == "~/rm"
    assert inv.resolve(["linux", "mac-a"]) == ["gpu-box", "mac-a"]
    pb = parse_playbook(
        PLAYBOOK.replace('matrix:\n  bs: [8, 16]\n  dtype: [float32, "it\'s {odd}"]\n', "").replace(
            " --bs {matrix.bs} --dtype {matrix.dtype}", ""
        )
    )
    assert fleet_hosts(pb, ["macs"], inv) == ["mac-a", "admin@10.0.0.7:2222"]
    assert fleet_hosts(pb, None, inv) == inv.hosts()
    assert fleet_hosts(pb, ["x", "y"], None) == ["x", "y"]


@pytest.mark.parametrize(
    "text, needle",
    [
        ("g:\n  hosts:\n    a: {hourly_rat: 1}\n", "did you mean 'hourly_rate'"),
        ("g:\n  hosts:\n    a: {remote_root: /}\n", "remote_root"),
        ("g:\n  hosts:\n    a: {rental_end: 2030-01-01T00:00:00}\n", "timezone"),
        ("g:\n  hosts: []\n", "no hosts"),
        ("- a\n- b\n", "mapping of groups"),
        ("g:\n  hostz: [a]\n", "unknown key 'hostz'"),
    ],
)
def test_inventory_errors_are_one_line(text: str, needle: str):
    with pytest.raises(BadInput) as err:
        parse_inventory(text, "inv.yaml")
    assert needle in err.value.line() and "\n" not in err.value.line()


@pytest.mark.asyncio
async def test_pool_one_connection_per_host_close_only_releases(sshd, ssh_env):
    home, cfg, alias = ssh_env(sshd)
    from remotemac.engine.hosts import SSHOptions

    pool = TransportPool(home, SSHOptions(ssh_config=cfg), max_channels=2)
    seen: list = []
    a = pool.lease(alias, emit=seen.append, run_id="run-a")
    b = pool.lease(alias, emit=seen.append, run_id="run-b")
    await a.connect()
    await b.connect()
    assert pool.opened == 1 and a.shared is b.shared
    assert {e.run_id for e in seen if e.state == "connected"} == {"run-a", "run-b"}
    await a.close()  # a run ending must not cut the other run's link
    assert (await b.exec(["echo", "still"])).stdout == b"still\n"
    # 6 commands at once over a 2-channel cap all complete on the one connection
    results = await asyncio.gather(
        *(b.exec(["sh", "-c", f"sleep 0.2; echo {i}"]) for i in range(6))
    )
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(6)]
    assert sshd.log().count("Accepted publickey") == 1
    await pool.close_all()


@pytest.mark.asyncio
async def test_pool_lease_answers_the_link_interface_of_its_connection(sshd, ssh_env):
    """A lease answers has_link/host_key_fingerprint/link_stats from the shared link,
    synchronously, and a drill's drop through the lease is counted on that link."""
    home, cfg, alias = ssh_env(sshd)
    from remotemac.engine.hosts import SSHOptions

    pool = TransportPool(home, SSHOptions(ssh_config=cfg))
    lease = pool.lease(alias, run_id="run-a")
    await lease.connect()
    try:
        assert lease.has_link() is True
        assert lease.host_key_fingerprint() == sshd.fingerprint
        before = lease.link_stats()
        assert await lease.drop_connection("test") is True
        assert (await lease.exec(["true"])).ok  # reconnects through the normal path
        assert lease.link_stats().since(before) == {"disconnects": 1, "reconnects": 1}
    finally:
        await pool.close_all()


@pytest.mark.asyncio
async def test_local_transport_has_no_link_to_cut():
    from remotemac.transport.local import LocalTransport

    local = TransportPool(Path("/nonexistent"), None).lease("local")
    for t in (LocalTransport(), local):
        assert t.has_link() is False
        assert await t.drop_connection() is False
        assert t.host_key_fingerprint() is None
        assert t.link_stats().disconnects == 0
        with t.reconnect_wait_capped(1.0):
            pass
