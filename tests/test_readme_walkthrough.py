"""The README's example playbook and walkthrough, read out of README.md and run as written.

Against the fresh-host lab (tests/harness/lab.py): the sshd's login sees only a bare
Python 3.9 as ``python3``, no third-party module, as a rented Mac does. The example's
``environment`` (``python: "3.11"`` + requirements.lock with torch 2.13, which has no
wheel for 3.9) makes remotemac bring a CPython 3.11 and build the venv with uv; the
sensitive slice travels encrypted and is decrypted by the agent's own runtime.

The CPython archive is the lab's own relocatable 3.11 in the standalone builds'
layout (tests/harness/pbs.py: Simulation, the download site is out of reach here),
named by a downloads JSON through uv's ``UV_PYTHON_DOWNLOADS_JSON_URL`` as a
``file://`` URL: the host cannot fetch that itself, so the laptop downloads and
uploads it (the offline path, chosen by ``runtime_install: auto``).

What the test changes, and only this: the target device (``mps`` → ``cpu``, there is
no Mac here) and, in the walkthrough, the values a user fills in (the fingerprint the
provider published, the run id's unique part, the device label the run used). The
user's laptop is a HOME of its own whose ``~/.ssh/config`` names the host
``mac-rental``; the project sits at ``~/code/my-project``, as the walkthrough says.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.harness import pbs

pytestmark = pytest.mark.e2e

README = REPO / "README.md"

TRAIN_PY = '''\
"""A small classifier trained the way real projects do: argparse, a data dir of .npy
shards, AdamW, a checkpoint with its config, metrics and predictions under --out."""
import argparse
import glob
import json
import os
import time

import numpy as np
import torch

p = argparse.ArgumentParser()
p.add_argument("--device", default="cpu")
p.add_argument("--data", required=True)
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=600)
args = p.parse_args()
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
shards = sorted(glob.glob(os.path.join(args.data, "train", "*.npy")))
assert shards, "no shards under " + args.data
data = np.concatenate([np.load(s) for s in shards])
x = torch.tensor(data[:, :-1], dtype=torch.float32, device=args.device)
y = torch.tensor(data[:, -1], dtype=torch.long, device=args.device)
model = torch.nn.Sequential(torch.nn.Linear(x.shape[1], 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 3)).to(args.device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for epoch in range(args.epochs):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    time.sleep(0.005)  # the data loader's share of a real step
    if epoch % 100 == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
os.makedirs(os.path.join(args.out, "preds"), exist_ok=True)
with torch.no_grad():
    logits = model(x)
acc = (logits.argmax(1) == y).float().mean().item()
json.dump({"loss": loss.item(), "accuracy": acc, "shards": len(shards)},
          open(os.path.join(args.out, "metrics.json"), "w"))
torch.save(logits.cpu(), os.path.join(args.out, "preds", "train.pt"))
torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
            "config": {"out_dir": args.out, "device": args.device, "epochs": args.epochs}},
           os.path.join(args.out, "model.ckpt"))
print(f"done: accuracy {acc:.3f}", flush=True)
'''


def readme_section(title: str) -> str:
    text = README.read_text()
    return text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def readme_playbook_text() -> str:
    return re.findall(r"```yaml\n(.*?)```", readme_section("Walkthrough"), re.S)[0]


def readme_playbook() -> dict:
    from remotemac.playbook import parse_playbook

    return parse_playbook(readme_playbook_text()).model_dump()


def readme_walkthrough() -> list[str]:
    block = re.findall(r"```bash\n(.*?)```", readme_section("Walkthrough"), re.S)[0]
    lines = []
    for raw in block.splitlines():
        line = raw.split("  #", 1)[0].strip()
        if line.startswith("remotemac "):
            lines.append(line)
    return lines


def make_project(path: Path) -> list[Path]:
    """The project the example playbook describes: code, a lock file, a data dir."""
    (path / "data" / "train").mkdir(parents=True)
    (path / "data" / "val").mkdir()
    (path / "train.py").write_text(TRAIN_PY)
    (path / "requirements.lock").write_text("torch==2.13.0\nnumpy\n")
    (path / ".gitignore").write_text("runs/\n*.ckpt\n")
    rng = np.random.default_rng(0)
    shards = []
    for i in range(12):
        x = rng.normal(size=(64, 4))
        label = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
        shard = path / "data" / "train" / f"shard-{i:03d}.npy"
        np.save(shard, np.column_stack([x, label]).astype(np.float32))
        shards.append(shard)
    np.save(path / "data" / "val" / "val.npy", rng.normal(size=(8, 5)).astype(np.float32))
    return shards


def test_walkthrough_commands_are_what_this_test_runs():
    """The parser sees every walkthrough command (so a README edit cannot skip one)."""
    commands = readme_walkthrough()
    verbs = [c.split()[1] for c in commands]
    for verb in (
        "audit",
        "preflight",
        "check",
        "trust",
        "doctor",
        "run",
        "status",
        "logs",
        "wipe",
        "cleanup",
        "tui",
    ):
        assert verb in verbs, verb
    assert readme_playbook()["workload"]["target"]["device"] == "mps"


@pytest.mark.timeout(1500)
def test_readme_example_and_walkthrough_verbatim_on_a_fresh_host(sshd, tmp_path: Path):
    # `~` on the host is the login's $HOME: this sshd's own home in the lab
    host_root = sshd.home / "remotemac"
    laptop = tmp_path / "laptop-home"
    project = laptop / "code" / "my-project"
    project.mkdir(parents=True)
    shards = make_project(project)
    plaintext = {hashlib.sha256(p.read_bytes()).hexdigest() for p in shards}

    book = readme_playbook()
    assert book["host"] == "mac-rental" and book["data"]["classification"] == "sensitive"
    text = readme_playbook_text()
    assert text.count("target: {device: mps}") == 1
    # the one change: no Mac here
    (project / "my.yaml").write_text(text.replace("target: {device: mps}", "target: {device: cpu}"))

    # the user's ssh config names the rented host; no known_hosts yet: `trust` pins it
    known = laptop / ".ssh" / "known_hosts"
    known.parent.mkdir(mode=0o700)
    known.touch()
    sshd.write_ssh_config(laptop / ".ssh" / "config", "mac-rental", known_hosts=known)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REMOTEMAC_HOME", "XDG_STATE_HOME", "PYTHONPATH")
    }
    env.update(HOME=str(laptop), PYTHONPATH=str(REPO), COLUMNS="100")
    archive, sha = pbs.build_archive()
    listing = pbs.downloads_json(tmp_path / "downloads.json", archive.as_uri(), sha)
    env["UV_PYTHON_DOWNLOADS_JSON_URL"] = listing.as_uri()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "remotemac").write_text(f'#!/bin/sh\nexec {sys.executable} -m remotemac "$@"\n')
    (bindir / "remotemac").chmod(0o755)
    env["PATH"] = f"{bindir}:{env['PATH']}"

    run_id = ""
    outputs: dict[str, subprocess.CompletedProcess] = {}
    for command in readme_walkthrough():
        verb = command.split()[1]
        if verb == "tui":
            continue  # interactive: the same engine is driven by the Pilot tests
        line = command.replace("SHA256:…", sshd.fingerprint)
        if run_id:
            line = line.replace(" 7299 ", f" {run_id[-4:]} ").replace(
                "--device mps", "--device cpu-target"
            )
        proc = subprocess.run(
            ["bash", "-c", line],
            cwd=project,
            env=env,
            input="y\n",
            capture_output=True,
            text=True,
            timeout=900,
        )
        outputs[command] = proc
        allowed = {0, 1} if verb in ("doctor", "preflight") else {0}
        assert proc.returncode in allowed, (
            f"{line} → {proc.returncode}\n{proc.stdout[-2500:]}\n{proc.stderr[-2500:]}"
        )
        if command == "remotemac run my.yaml":
            run_id = next(p.name for p in (project / "runs").iterdir())

    doctor = next(p for c, p in outputs.items() if c.startswith("remotemac doctor"))
    assert "mps" in doctor.stdout.lower()
    # what the workload gets on a 3.9-only host, and why (after cleanup: nothing there)
    proc = subprocess.run(
        ["remotemac", "doctor", "mac-rental", "--playbook", "my.yaml", "--json"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert "remotemac will bring CPython 3.11" in checks["workload python"]["value"], checks
    assert "needs the Python remotemac brings" in checks["pins"]["value"], checks["pins"]
    assert run_id, "the walkthrough never ran the playbook"
    out = project / "runs" / run_id
    record = json.loads((out / "acceptance.json").read_text())
    assert record["verdict"] == "accepted", record["stopping_conditions"]
    compared = {f["path"]: f["ok"] for f in record["observations"]["results"]["files"]}
    assert compared.get("metrics.json") is True and compared.get("preds/train.pt") is True
    assert record["dataset"]["encrypted"] is True and record["dataset"]["files"] == 12
    assert record["environment"]["target"]["torch"].startswith("2.13")
    # the host had only 3.9: the venv was made from the CPython remotemac brought, by uv
    interpreter = record["environment"]["target"]["interpreter"]
    assert interpreter["version"] == pbs.lab_version(), interpreter
    assert interpreter["brought"]["dir"].startswith(str(host_root / "runtime") + "/")
    assert interpreter["interpreter"].startswith(interpreter["brought"]["dir"] + "/")
    assert interpreter["installer"] == "uv"
    log = (out / "logs" / "cpu-target.log").read_text()
    assert log.count("epoch 0 loss") == 1 and "done: accuracy" in log
    # the host: wiped after pull, no plaintext of the slice anywhere, then cleaned up
    host_files = [p for p in sshd.home.rglob("*") if p.is_file() and not p.is_symlink()]
    leaked = [
        p
        for p in host_files
        if p.stat().st_size < 1 << 20 and hashlib.sha256(p.read_bytes()).hexdigest() in plaintext
    ]
    assert leaked == [], leaked
    assert not host_root.exists(), "cleanup left the root behind"
    ledger = (out / "ledger.jsonl").read_text()
    assert "runtime" in ledger  # the agent brought its own crypto runtime
