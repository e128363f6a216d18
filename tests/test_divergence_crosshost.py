"""Issue 35's drill-down when the reference and the target are on two hosts: the input
the reference's drill pass saved crosses to the target's host through the laptop
(engine/drillpass._copy_between), and the target's pass must run on those very bytes.

Simulation: both hosts are real OpenSSH sshd instances on loopback, each with its own
HOME (so its own ``remote_root``) and tmux server, logged in as the lab user; both
sides run the nanoGPT-shaped trainer (tests/fixtures/projects/gpttrace) on the CPU
under the lab host's torch interpreter (a host with torch preinstalled, hence
``host_torch``); the target alone scales one MLP's output by 1 + 1e-3 (TRACE_SCALE),
standing in for an MPS kernel that computes something else.

The copy's failures (the link cut for good half way, the target host's disk full) are
driven on ``_copy_between`` itself, over the same real transports, sshd, fault proxy
and tmpfs, with a stand-in for the run's context (the three things the copy reads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from remotemac.acceptance.drill import load_drill
from remotemac.engine import drillpass
from remotemac.engine.context import Side
from remotemac.errors import HostError, RemotemacError, TransientHostError
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport
from tests import fleetkit as fk
from tests.conftest import REPO
from tests.harness.maclab import root_argv

PROJECT = REPO / "tests" / "fixtures" / "projects" / "gpttrace"
PERTURBED = "transformer.h.1.mlp"
ROOT = "rm-root"  # remote_root, under each host's own HOME


def _leftovers(root: Path) -> list[Path]:
    """What a run could leave of the drill's data on a host: the saved or copied input
    (``drill-input.pt``, a ``.part-*`` of it), any tensor file, the traces."""
    if not root.exists():
        return []
    return [
        p
        for p in root.rglob("*")
        if p.name.startswith("drill-input") or p.suffix == ".pt" or ".trace" in p.name
    ]


@pytest.mark.e2e
def test_host_torch_the_target_on_another_host_drills_on_the_references_bytes(
    sshd_factory, tmp_path, host_torch_python
):
    config = tmp_path / "ssh_config"
    empty = tmp_path / "user_known_hosts"
    empty.touch()
    ref_host, tgt_host = sshd_factory(), sshd_factory()
    ref_host.write_ssh_config(config, "ref-box", known_hosts=empty)
    tgt_host.write_ssh_config(config, "mac-b", known_hosts=empty)
    home = tmp_path / "home"
    home.mkdir()
    (home / "known_hosts").write_text(ref_host.known_hosts_line() + tgt_host.known_hosts_line())
    pb = fk.write_playbook(
        tmp_path / "cross.yaml",
        host="mac-b",
        python=host_torch_python,
        remote_root=f"~/{ROOT}",
        project={"path": str(PROJECT)},
        workload={
            "command": "python train.py --device {device} --out {output_dir} --iters 3",
            "reference": {"device": "cpu", "host": "ref-box"},
            "env": {"TRACE_SCALE": "1e-3"},
            "trace": {"steps": 1},
        },
        outputs={"path": ".", "compare": [{"file": "ckpt.pt", "rtol": 1e-5, "atol": 1e-7}]},
    )
    out = tmp_path / "out"
    proc = fk.cli(
        "--ssh-config", str(config), "run", str(pb), "--out", str(out), home=home, cwd=tmp_path
    )
    assert (out / "acceptance.json").exists(), (proc.stdout[-3000:], proc.stderr[-3000:])
    record = json.loads((out / "acceptance.json").read_text())
    assert proc.returncode == 1 and record["verdict"] == "rejected", proc.stderr[-3000:]
    env = record["environment"]
    assert env["reference"]["host"] == f"{ref_host.user}@127.0.0.1:{ref_host.port}"
    assert env["target"]["host"] == f"{tgt_host.user}@127.0.0.1:{tgt_host.port}"
    div = record["divergence"]
    assert div["kind"] == "divergence" and div["first"]["path"] == PERTURBED, div["detail"]
    # the drill ran on both hosts and names the scale's mul inside the perturbed MLP
    drill = div["drill"]
    assert drill["ran"] is True, drill["detail"]
    assert (drill["path"], drill["call"], drill["step"]) == (PERTURBED, 0, 0)
    assert (drill["first"]["op"], drill["first"]["module"]) == ("aten::mul", PERTURBED)
    assert drill["only_target"] == [f"aten::mul in {PERTURBED}"]
    # the target's pass loaded the very bytes the reference's saved on the other host:
    # the reference hashed the file it wrote there, the target the bytes it loaded here
    ref_header, ref_ops = load_drill(out / "logs" / "cpu.drill.jsonl")
    tgt_header, tgt_ops = load_drill(out / "logs" / "cpu-target.drill.jsonl")
    assert tgt_header["input"] == "reference" and ref_header["input"] == "own"
    saved = ref_header["input_sha256"]
    assert isinstance(saved, str) and len(saved) == 64
    assert tgt_header["input_sha256"] == saved == drill["input_sha256"]
    # and so every op before the scale, run on the reference's input, is bit-identical
    assert [(o.op, o.out) for o in tgt_ops[: len(ref_ops)]] == [(o.op, o.out) for o in ref_ops]
    assert "drill-down not run" not in proc.stdout + proc.stderr  # (a drill-skip warning)
    # each pass ran on its own host: each drill job's files were made on that host
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    launches = {e["host"] for e in ledger if e["op"] == "launch"}
    assert launches == {env["reference"]["host"], env["target"]["host"]}
    # nothing of the input is left anywhere: not on either host after the wipe (the
    # saved input on the reference's, the copy on the target's), not on the laptop
    for server in (ref_host, tgt_host):
        assert _leftovers(server.home / ROOT) == [], server.home
    assert not list(out.rglob("*drill-input*")) and not list(out.rglob("*.part"))


# ------------------------------------------------------------ the copy's failure paths


@dataclasses.dataclass
class _Binding:
    transport: SSHTransport


@dataclasses.dataclass
class _Outputs:
    max_bytes: int = 1 << 30


@dataclasses.dataclass
class _Playbook:
    outputs: _Outputs = dataclasses.field(default_factory=_Outputs)


@dataclasses.dataclass
class _Ctx:
    """The three things ``_copy_between`` reads of the run's context (the sides'
    transports, ``outputs.max_bytes``, ``--out``): the transports are real."""

    out_dir: Path
    hosts: dict[str, _Binding]
    playbook: _Playbook = dataclasses.field(default_factory=_Playbook)

    def host_for(self, side: Side) -> _Binding:
        return self.hosts[side.host_key]


REF = Side("reference", "cpu", "cpu", "reference")
TGT = Side("target", "cpu", "cpu-target", "remote")


def _transport(env: tuple, **kw: object) -> SSHTransport:
    home, cfg, alias = env
    kw.setdefault("keepalive_interval", 1)
    kw.setdefault("keepalive_count_max", 2)
    kw.setdefault("connect_timeout", 2)
    options = SSHOptions(ssh_config=cfg, **kw)  # type: ignore[arg-type]
    return SSHTransport(alias, home_dir=home, options=options, emit=lambda e: None)


def _saved_input(server, size: int) -> tuple[str, str]:
    """A stand-in for the reference's saved input on its host (random bytes: the copy
    never loads it), readable by the lab user; its path and sha256."""
    where = server.host_dir("ref-run") / "drill-input.pt"
    data = os.urandom(size)
    subprocess.run(root_argv(["tee", str(where)]), input=data, stdout=subprocess.DEVNULL)
    return str(where), hashlib.sha256(data).hexdigest()


def _copy(ctx: _Ctx, remote: str, to: str, expect: str | None) -> None:
    asyncio.run(_copy_async(ctx, remote, to, expect))


async def _copy_async(ctx: _Ctx, remote: str, to: str, expect: str | None) -> None:
    async with ctx.hosts["reference"].transport, ctx.hosts["remote"].transport:
        await drillpass._copy_between(ctx, REF, remote, TGT, to, expect)  # type: ignore[arg-type]


@pytest.mark.timeout(90)
def test_a_copy_whose_link_is_cut_for_good_leaves_no_input_on_the_target(
    sshd_factory, fault_proxy, ssh_env, tmp_path
):
    """The target's link is cut half way through the upload and stays refused past the
    reconnect deadline: the copy fails with a transient error (a drill-skip warning in
    the run, never a crash), and nothing stands at the input's name on the target's
    host; the partial file, under the run's directory, is the wipe's."""
    ref_host, tgt_host = sshd_factory(), sshd_factory()
    remote, digest = _saved_input(ref_host, 6 << 20)
    proxy = fault_proxy(tgt_host)
    proxy.throttle(2 << 20)
    dest = tgt_host.host_dir("tgt-run") / "drill-input.pt"
    ctx = _Ctx(
        tmp_path / "out",
        {
            "reference": _Binding(_transport(ssh_env(ref_host))),
            "remote": _Binding(_transport(ssh_env(tgt_host, proxy), reconnect_deadline=3)),
        },
    )
    ctx.out_dir.mkdir()

    async def cut_midway() -> None:
        copying = asyncio.ensure_future(
            _copy_async(ctx, remote, str(dest), digest)  # opens both links
        )
        for _ in range(200):  # the upload has begun: a file is there, whatever its name
            if list(dest.parent.glob("drill-input.pt*")):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        proxy.refuse()
        proxy.cut()
        await copying

    with pytest.raises(TransientHostError):
        asyncio.run(cut_midway())
    proxy.restore()
    assert not dest.exists()
    parts = list(dest.parent.glob("drill-input.pt.part-*"))
    assert all(p.stat().st_size < 6 << 20 for p in parts)  # it was cut half way
    assert not list(ctx.out_dir.iterdir())  # the laptop's staging file is gone


@pytest.fixture
def small_target(sshd_factory):
    """The target host with a 4 MiB tmpfs (the lab user's) where the copy lands."""
    server = sshd_factory()
    mount = server.host_dir("small-disk")
    uid, gid = os.stat(mount).st_uid, os.stat(mount).st_gid
    subprocess.run(
        root_argv(["mount", "-t", "tmpfs", "-o", f"size=4m,uid={uid},gid={gid},mode=0755"])
        + ["tmpfs", str(mount)],
        check=True,
    )
    try:
        yield server, mount
    finally:
        subprocess.run(root_argv(["umount", "-l", str(mount)]), check=False)


def test_a_copy_the_target_disk_refuses_is_an_error_and_leaves_nothing_there(
    sshd_factory, small_target, ssh_env, tmp_path
):
    """6 MiB of input onto a 4 MiB disk: the copy fails with the host's disk-full error
    (the run's drill-skip warning), and the target's disk holds nothing of it, neither
    at the input's name nor under the temporary one."""
    ref_host = sshd_factory()
    tgt_host, mount = small_target
    remote, digest = _saved_input(ref_host, 6 << 20)
    ctx = _Ctx(
        tmp_path / "out",
        {
            "reference": _Binding(_transport(ssh_env(ref_host))),
            "remote": _Binding(_transport(ssh_env(tgt_host))),
        },
    )
    ctx.out_dir.mkdir()
    with pytest.raises(RemotemacError, match="full"):
        _copy(ctx, remote, str(mount / "drill-input.pt"), digest)
    assert list(mount.iterdir()) == []
    assert not list(ctx.out_dir.iterdir())


def test_a_copy_is_whole_and_checked_against_the_references_sha256(sshd_factory, ssh_env, tmp_path):
    """The copy lands byte for byte, under a run directory whose name a shell would
    split or expand (the rename is a command on the host: its paths are quoted); bytes
    that are not the ones the reference's op trace names are refused before anything
    reaches the target."""
    ref_host, tgt_host = sshd_factory(), sshd_factory()
    remote, digest = _saved_input(ref_host, 3 << 20)
    dest = tgt_host.host_dir("tgt run's $HOME;*") / "drill-input.pt"

    def ctx() -> _Ctx:
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        return _Ctx(
            out,
            {
                "reference": _Binding(_transport(ssh_env(ref_host))),
                "remote": _Binding(_transport(ssh_env(tgt_host))),
            },
        )

    with pytest.raises(HostError, match="not the 000000000000 its op trace names"):
        _copy(ctx(), remote, str(dest), "0" * 64)
    assert list(dest.parent.iterdir()) == []
    _copy(ctx(), remote, str(dest), digest)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == digest
    assert [p.name for p in dest.parent.iterdir()] == ["drill-input.pt"]
    assert not list((tmp_path / "out").iterdir())
