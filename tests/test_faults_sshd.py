"""Issue 16's bad link during the long transfers: a 3,000-step training job whose link is
cut every 2 s while its dataset syncs, and while a 200 MiB result file is pulled.

Real sshd (the lab host: a bare python3 3.9 login and its own tmux server), the fault
proxy in front, the whole pipeline in this process as ``remotemac run`` runs it. The
workload is tests/fixtures/projects/trainer: a shell command that ``cd``s and sets an
environment variable, a script that checks the dataset in a child process, trains
with a checkpoint (a pickled config dict) every 500 steps and writes its metrics
and, here, a 200 MiB ``weights.bin``.

Cuts come every 2 s for the whole run. So that the transfer under test spans several
cuts whatever this machine's speed, the cutter also cuts inside it each time it has
made a set progress since the last cut (files the host verified, bytes pulled: the
phase's own progress events).

Two shorter tests hold the deadline's two sides: a download that gains ground on every
reconnect outlives the reconnect deadline; a sync that cannot reach the host stops at it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pickle
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from remotemac.engine.agentclient import AgentClient
from remotemac.engine.sync import sync_slice
from remotemac.errors import TransientHostError
from remotemac.events import PhaseFinished, PhaseProgress, PhaseStarted
from remotemac.phases import Phase
from tests.conftest import REPO
from tests.harness import ramstores
from tests.harness.lab import lab_ids
from tests.test_detached_faults import Timeline, run_pipeline_inprocess
from tests.test_detached_ssh import local_lines
from tests.test_resident_sshd import LabHost, _transport, lab_host  # noqa: F401 - a fixture

pytestmark = [pytest.mark.timeout(900), pytest.mark.e2e, pytest.mark.slow]

TRAINER = REPO / "tests" / "fixtures" / "projects" / "trainer"
MIB = 1 << 20


def make_dataset(root: Path, *, small: int, small_kib: int, large_mib: tuple[int, ...]) -> int:
    """Token shards (many small files) and large token files, plus MANIFEST.json with each
    file's size and SHA-256 (what the workload checks on the host). Returns the file count."""
    manifest: dict[str, dict[str, Any]] = {}

    def put(rel: str, size: int) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        manifest[rel] = {"size": size, "sha256": hashlib.sha256(data).hexdigest()}

    for i in range(small):
        put(f"shards/{i // 100:02d}/shard-{i:05d}.bin", small_kib * 1024)
    for i, mib in enumerate(large_mib):
        put(f"tokens-{i}.bin", mib * MIB)
    (root / "MANIFEST.json").write_text(json.dumps(manifest, sort_keys=True))
    return len(manifest) + 1


def trainer_playbook(
    host: LabHost,
    path: Path,
    data: Path,
    *,
    steps: int,
    seconds: float,
    weights_mib: int = 0,
    reference: bool = False,
) -> Path:
    """The trainer on the lab host: target only, or reference and target (both CPU)."""
    command = (
        "cd src && TRAIN_SEED=7 python3 train.py --device {device} --data {data_dir} "
        f"--out {{output_dir}} --steps {steps} --seconds {seconds} --weights-mib {weights_mib}"
        ' && echo "train.sh: exit $?"'
    )
    doc = {
        "name": "trainer",
        "host": host.alias,
        "remote_root": str(host.root),
        "project": {"path": str(TRAINER)},
        "environment": {"python": "python3", "venv": False},
        "data": {"path": str(data), "classification": "public", "encrypt": False},
        "workload": {
            "command": command,
            "reference": {"device": "cpu"} if reference else None,
            "target": {"device": "cpu"},
            "timeout": "15m",
        },
        # the verdict rests on the small JSON; the 200 MiB file is pulled and verified
        "outputs": {
            "path": ".",
            "compare": [{"file": "metrics.json", "keys": ["final_loss"], "rtol": 1e-9}],
        },
        "stop_when": {"memory_growth": False},
        "wipe": "after_pull",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def trainer_lines(steps: int, files: int, size: int, weights_mib: int) -> list[str]:
    """Every line train.py (and its data check, and the shell) prints, in order."""
    import math

    out = [f"data: {files} files, {size} bytes, every sha256 matches"]
    for step in range(1, steps + 1):
        out.append(f"step {step:06d} of {steps}: loss {4.0 * math.exp(-step / 1000.0) + 0.5:.6f}")
        if step % 500 == 0 or step == steps:
            out.append(f"step {step:06d}: saved checkpoint to ckpt.pkl")
    if weights_mib:
        out.append(f"wrote weights.bin: {weights_mib} MiB")
    out += [f"training done: {steps} steps", "train.sh: exit 0"]
    return out


class Cutter(threading.Thread):
    """Cut the link every ``every`` s for the whole run; inside ``phase``, also each time
    the phase has made ``step`` progress since the last cut: bytes moved (its byte
    progress events), or with ``unit="verified"`` files the host verified (one event each).

    ``cuts`` lists ``(seconds since start, phase running, links the cut closed)``.
    """

    def __init__(
        self,
        proxy: Any,
        timeline: Timeline,
        *,
        every: float,
        phase: str,
        step: int,
        unit: str = "bytes",
    ) -> None:
        super().__init__(daemon=True)
        self.proxy, self.timeline = proxy, timeline
        self.every, self.phase, self.step, self.unit = every, phase, step, unit
        self.stop = threading.Event()
        self.cuts: list[tuple[float, str, int]] = []

    def run(self) -> None:
        t0 = last_cut = time.monotonic()
        seen, moved, prev, current = 0, 0, 0, ""
        while not self.stop.wait(0.02):
            events = self.timeline.snapshot()[seen:]
            seen += len(events)
            for _, event in events:
                if isinstance(event, PhaseStarted):
                    current = event.phase
                elif isinstance(event, PhaseFinished) and event.phase == current:
                    current = ""
                elif (
                    isinstance(event, PhaseProgress)
                    and event.phase == self.phase
                    and event.unit == self.unit
                ):
                    if self.unit == "verified":
                        moved += 1
                    else:  # pull counts bytes for the whole phase
                        moved += event.done - prev if event.done >= prev else event.done
                        prev = event.done
            now = time.monotonic()
            if now - last_cut >= self.every or (current == self.phase and moved >= self.step):
                self.cuts.append((round(now - t0, 2), current, self.proxy.cut()))
                last_cut, moved = now, 0

    def during(self, phase: str) -> list[tuple[float, str, int]]:
        """The cuts that closed a live link while ``phase`` ran."""
        return [c for c in self.cuts if c[1] == phase and c[2] > 0]


def clean_run(host: LabHost, tmp: Path, *, reference: bool) -> tuple[Any, int]:
    """The same workload, small, over a link nobody cuts: the exit code and verdict to match."""
    data = tmp / "clean-data"
    make_dataset(data, small=3, small_kib=4, large_mib=())
    pb = trainer_playbook(
        host, tmp / "clean.yaml", data, steps=20, seconds=0.5, reference=reference
    )
    return asyncio.run(run_pipeline_inprocess(host, pb, tmp / "clean", Timeline()))


def cut_run(host: LabHost, pb: Path, out: Path, *, phase: str, **step: Any) -> tuple:
    timeline = Timeline()
    cutter = Cutter(host.proxy, timeline, every=2.0, phase=phase, **step)
    cutter.start()
    try:
        ctx, code = asyncio.run(run_pipeline_inprocess(host, pb, out, timeline))
    finally:
        cutter.stop.set()
        cutter.join(30)
        host.proxy.restore()
    phases = ctx.journal.phases(ctx.run_id)
    failed = {k: v["result"] for k, v in phases.items() if v["state"] != "done"}
    assert "wipe" in ctx.results and not failed, (code, failed, cutter.cuts)
    return ctx, code, cutter


def check_finished_like_a_clean_run(
    ctx: Any, code: int, clean: tuple[Any, int], out: Path, lines: list[str], labels: list[str]
) -> None:
    """Each log line once and in order, outputs pulled and verified, wipe verified, the
    clean run's verdict and exit code."""
    clean_ctx, clean_code = clean
    assert code == clean_code, (code, clean_code, ctx.result(Phase.RECORD))
    assert ctx.result(Phase.RECORD).verdict == clean_ctx.result(Phase.RECORD).verdict
    for label in labels:
        assert local_lines(out, label) == lines, label
        results = out / "results" / label
        metrics = json.loads((results / "metrics.json").read_text())
        assert metrics["steps"] == 3000, metrics
        ckpt = pickle.loads((results / "ckpt.pkl").read_bytes())
        assert ckpt["iter_num"] == 3000 and ckpt["config"]["device"] == "cpu", ckpt["config"]
        pulled = {f.path: f for f in ctx.result(Phase.PULL).files(label)}
        assert {"metrics.json", "ckpt.pkl"} <= set(pulled), pulled
    wipe = ctx.result(Phase.WIPE)
    assert wipe.done and wipe.verified, wipe


@pytest.mark.timeout(900)
def test_3000_steps_with_the_link_cut_every_2s_during_sync(lab_host: LabHost, tmp_path: Path):  # noqa: F811
    """A 182 MiB slice (600 shards of 256 KiB, token files of 20 and 12 MiB) synced through
    cuts every 2 s plus one per 60 files the host verified: the sync resumes after each
    cut with what the host verified (more attempts than the four a count once allowed),
    the workload finds every file's SHA-256 as in the manifest, and the run ends as a
    clean run does."""
    host = lab_host
    clean = clean_run(host, tmp_path, reference=False)
    data = tmp_path / "dataset"
    files = make_dataset(data, small=600, small_kib=256, large_mib=(20, 12))
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    manifest_bytes = size - (data / "MANIFEST.json").stat().st_size
    # 16 s of job: ~8 cuts while it runs (14 s gave 7 here; at least 5 are asked below)
    pb = trainer_playbook(host, tmp_path / "pb.yaml", data, steps=3000, seconds=16)
    out = tmp_path / "out"
    # one cut per 60 verified files: the sync of 182 MiB takes 1.5 s here, and the host's
    # acknowledgements come in bursts that can cross two steps at once (per 100 files,
    # CI once saw 4 cuts in the sync)
    ctx, code, cutter = cut_run(host, pb, out, phase="sync", step=60, unit="verified")
    in_sync = cutter.during("sync")
    assert len(in_sync) >= 5, cutter.cuts
    (synced,) = ctx.result(Phase.SYNC).hosts.values()
    transfer = synced.transfer
    # more attempts than the four a count once allowed (two cuts can fall on one attempt:
    # the verified-file cuts come in bursts since the host batches its acks)
    assert transfer.attempts > 4 and synced.files == files, transfer
    # the cuts went on through the job and past it (every 2 s for the whole run)
    assert len(cutter.during("follow:target")) >= 5, cutter.cuts
    lines = trainer_lines(3000, files - 1, manifest_bytes, 0)
    check_finished_like_a_clean_run(ctx, code, clean, out, lines, ["cpu"])


@pytest.mark.timeout(900)
def test_3000_steps_with_the_link_cut_every_2s_during_pull_of_200_mib(
    lab_host: LabHost,  # noqa: F811
    tmp_path: Path,
):
    """Reference and target each write a 200 MiB weights.bin next to their metrics.json:
    the pull goes through cuts every 2 s plus one per 40 MiB moved, resumes inside the
    file after each, and every pulled file matches the SHA-256 the workload computed
    as it wrote it; the verdict rests on metrics.json as in a clean run."""
    host = lab_host
    clean = clean_run(host, tmp_path, reference=True)
    data = tmp_path / "dataset"
    files = make_dataset(data, small=4, small_kib=64, large_mib=())
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    manifest_bytes = size - (data / "MANIFEST.json").stat().st_size
    # the job itself is paced short (4 s a side, still cut every 2 s): the pull is the
    # transfer under test here; the sync test holds the cuts through a long follow
    pb = trainer_playbook(
        host, tmp_path / "pb.yaml", data, steps=3000, seconds=4, weights_mib=200, reference=True
    )
    out = tmp_path / "out"
    ctx, code, cutter = cut_run(host, pb, out, phase="pull", step=40 * MIB)
    assert len(cutter.during("pull")) >= 5, cutter.cuts
    labels = sorted(ctx.result(Phase.PULL).sides)
    assert len(labels) == 2, labels
    for label in labels:
        weights = out / "results" / label / "weights.bin"
        metrics = json.loads((out / "results" / label / "metrics.json").read_text())
        assert weights.stat().st_size == 200 * MIB
        digest = hashlib.sha256()
        with weights.open("rb") as fh:
            for block in iter(lambda fh=fh: fh.read(8 * MIB), b""):
                digest.update(block)
        assert digest.hexdigest() == metrics["weights_sha256"], label
        assert not list((out / "results" / label).glob(".*.rmpart")), label
        # resumed inside the file after each cut, never started over
        pulled = ctx.result(Phase.PULL).sides[label]
        listed = sum(int(f.size or 0) for f in pulled.files)
        assert listed <= (pulled.downloaded or 0) < listed + 16 * MIB, pulled
    assert ctx.result(Phase.COMPARE).files and all(f.ok for f in ctx.result(Phase.COMPARE).files), (
        ctx.result(Phase.COMPARE)
    )
    lines = trainer_lines(3000, files - 1, manifest_bytes, 200)
    check_finished_like_a_clean_run(ctx, code, clean, out, lines, labels)


@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_a_download_that_keeps_moving_outlives_the_reconnect_deadline(
    sshd, fault_proxy, ssh_env, tmp_path: Path
):
    """A 48 MiB file at 8 MB/s (6 s) with the link cut every second and a 3 s reconnect
    deadline: each cut resumes at the byte reached, and since every attempt moved the
    file on, the deadline counts from the last progress, not from the first cut (it
    used to give up 3 s after the first cut, half way through)."""
    proxy = fault_proxy(sshd)
    src = sshd.host_dir("root") / "weights.bin"
    data = os.urandom(48 * MIB)
    src.write_bytes(data)
    proxy.throttle(8_000_000)
    stop, cuts = threading.Event(), []

    def cut_every_second() -> None:
        while not stop.wait(1.0):
            cuts.append(proxy.cut())

    events: list = []
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=3) as t:
        await t.stat(str(src))  # connected before the cuts start
        cutter = threading.Thread(target=cut_every_second, daemon=True)
        cutter.start()
        try:
            with (tmp_path / "weights.bin").open("w+b") as fh:
                moved = await t.download_to(str(src), fh, 0, limit=len(data))
        finally:
            stop.set()
            cutter.join(10)
            proxy.restore()
    assert moved == len(data) and t.disconnects >= 3, (moved, t.disconnects, cuts)
    assert (tmp_path / "weights.bin").read_bytes() == data


@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_a_sync_that_cannot_reach_the_host_stops_at_the_deadline(
    sshd, fault_proxy, ssh_env, tmp_path: Path
):
    """The other side of retry by deadline: once the host stops answering (the proxy
    cuts the link mid-stream and refuses every new connection) the sync stops with
    TransientHostError (exit 3) when it has lost the link for the reconnect deadline,
    neither retrying forever nor waiting out a count of attempts."""
    data = tmp_path / "data"
    make_dataset(data, small=20, small_kib=64, large_mib=(8,))
    paths = sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file())
    proxy = fault_proxy(sshd)
    proxy.throttle(2_000_000)  # about 5 s of sending: the cut lands mid-stream
    root = sshd.host_dir("root")
    stopped: list[float] = []

    def on_event(event: object) -> None:
        if isinstance(event, PhaseProgress) and event.unit == "verified" and not stopped:
            stopped.append(time.monotonic())
            proxy.refuse(True)
            proxy.cut()

    # the id names the RAM store (/dev/shm/remotemac-<id>, machine-global): this
    # process's own, removed however the test ends (the cut sync never wipes it)
    run_id = f"cut-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        async with _transport(ssh_env(sshd, proxy), [], reconnect_deadline=3) as t:
            agent = AgentClient(t, str(root))
            prepared = await agent.call("prepare_run", {"root": str(root), "run_id": run_id})
            with pytest.raises(TransientHostError):
                await sync_slice(
                    t,
                    agent,
                    root=data,
                    paths=paths,
                    run_dir=prepared["run_dir"],
                    run_id=run_id,
                    key=None,
                    emit=on_event,
                )
    finally:
        ramstores.remove_stores({run_id}, {lab_ids()[0]})
    assert stopped, "the sync never verified a file"
    took = time.monotonic() - stopped[0]
    assert 2 <= took < 15, took
