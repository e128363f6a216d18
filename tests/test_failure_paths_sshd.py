"""Failure paths that lose nothing and leave nothing (issue 31, items 1-5 and 7).

The one rule these tests hold the CLI to: whatever was not verified on the laptop
stays on the host in a state ``pull``/``attach`` can finish, the message says what is
kept and the command that gets it, and after that command ``cleanup`` leaves the host
clean. Every test drives the real CLI against the real sshd of tests/harness (the
fresh-host lab: bare python3 3.9, the job needs no torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness.maclab import root_argv
from tests.security.test_hostile_pull_sshd import journal_row
from tests.test_cleanup_sshd import Target, make_target, run_ids, tree

pytestmark = pytest.mark.timeout(300)

#: a job whose results are known on the laptop: ``metrics.json`` and a 2 MiB model
RESULTS_JOB = r"""
import json, os, sys
out = sys.argv[1]
name = sys.argv[2] if len(sys.argv) > 2 else ""
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "metrics.json"), "w") as fh:
    json.dump({"loss": 0.25, "acc": 0.9}, fh)
with open(os.path.join(out, "model.pth.tar"), "wb") as fh:
    fh.write(bytes(range(256)) * 8192)
if name:
    with open(os.path.join(out, name), "w") as fh:
        fh.write("a result with a long name\n")
print("wrote results", flush=True)
"""

MODEL = bytes(range(256)) * 8192


def results_project(tmp_path: Path, job: str = RESULTS_JOB) -> Path:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text(job)
    (project / "data" / "a.txt").write_text("some data\n")
    return project


def write_book(
    tmp_path: Path,
    t: Target,
    project: Path,
    command: str = "python3 train.py {output_dir}",
    env: dict[str, str] | None = None,
    **extra,
) -> Path:
    book = {
        "name": "results",
        "host": t.alias,
        "remote_root": str(t.root),
        "project": {"path": str(project), "exclude": ["data/"]},
        "environment": {"venv": False},  # the host's own python3: the job needs no torch
        "data": {"path": str(project / "data"), "classification": "public"},
        "workload": {
            "command": command,
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
            **({"env": env} if env else {}),
        },
        "outputs": {"path": "."},
        "stop_when": {"memory_growth": False},
    }
    book.update(extra)
    path = tmp_path / "results.yaml"
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    return path


def pulled(out: Path) -> dict[str, str]:
    """Every pulled result under ``out/results``: relative path → sha256."""
    root = out / "results"
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_every_result_verified(out: Path, extra: tuple[str, ...] = ()) -> None:
    """Both sides' results are on the laptop, whole, and the record says verified."""
    got = pulled(out)
    labels = {name.split("/", 1)[0] for name in got}
    assert len(labels) == 2, got
    model = hashlib.sha256(MODEL).hexdigest()
    for label in labels:
        assert got[f"{label}/model.pth.tar"] == model, got
        assert f"{label}/metrics.json" in got, got
        for name in extra:
            assert f"{label}/{name}" in got, got
    record = json.loads((out / "acceptance.json").read_text())
    assert record["wipe"]["done"] is True and record["wipe"]["verified"] is True, record["wipe"]


def assert_cleanup_clean(t: Target, cwd: Path, leave: tuple[str, ...] | list[str] = ()) -> None:
    proc = t.cli("cleanup", t.alias, "--remote-root", str(t.root), "--yes", "--json", cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["status"] == "clean", record
    assert [p for p in tree(t.host_home) if p not in leave] == []


# ------------------------------------------------------------------ item 1


@pytest.mark.parametrize("recover", ["attach", "pull"])
def test_outputs_kept_after_a_refused_pull_are_pulled_once_the_limit_is_raised(
    tmp_path, sshd_factory, ssh_env, recover
):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    book = write_book(
        tmp_path, t, results_project(tmp_path), outputs={"path": ".", "max_bytes": "1MiB"}
    )
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out))
    assert proc.returncode == 5, proc.stdout + proc.stderr
    [run_id] = run_ids(t.root)
    # the message says what is kept and the command that gets it
    assert "kept on the host" in proc.stderr, proc.stderr
    assert f"remotemac attach {run_id} --max-bytes" in proc.stderr, proc.stderr
    assert (t.root / "runs" / run_id / "out").is_dir()
    if recover == "attach":
        again = t.cli("attach", run_id, "--max-bytes", "8MiB")
        assert again.returncode in (0, 1), again.stdout + again.stderr
    else:
        again = t.cli("pull", "latest", "--max-bytes", "8MiB")
        assert again.returncode == 0, again.stdout + again.stderr
        # what pull did not do (compare, record) attach finishes
        again = t.cli("attach", run_id)
        assert again.returncode in (0, 1), again.stdout + again.stderr
    assert_every_result_verified(out)
    assert not (t.root / "runs" / run_id / "out").exists()  # verified here: gone there
    assert journal_row(t.rm_home, run_id)["state"] == "finished"
    assert_cleanup_clean(t, tmp_path)


# ------------------------------------------------------------------ item 2


def test_a_result_name_of_255_bytes_is_pulled_with_the_rest(tmp_path, sshd_factory, ssh_env):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    long_name = "checkpoint-" + "e" * 235 + ".pth.tar"  # 254 bytes: legal on ext4 and APFS
    assert 248 <= len(long_name.encode()) <= 255
    book = write_book(
        tmp_path,
        t,
        results_project(tmp_path),
        command=f"python3 train.py {{output_dir}} {long_name}",
    )
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr
    assert_every_result_verified(out, extra=(long_name,))
    assert not list(out.rglob("*.rmpart"))
    assert_cleanup_clean(t, tmp_path)


# ------------------------------------------------------------------ item 3


def start_cli(t: Target, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "remotemac", "--ssh-config", str(t.ssh_config), *args],
        env=dict(os.environ, **t.env()),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_runs_at_once_into_one_out_dir_one_is_refused_up_front(tmp_path, sshd_factory, ssh_env):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    book = write_book(tmp_path, t, results_project(tmp_path))
    out = tmp_path / "out"
    procs = [start_cli(t, "run", str(book), "--out", str(out)) for _ in range(2)]
    done = [(p.wait(timeout=240), *p.communicate()) for p in procs]
    codes = sorted(code for code, _, _ in done)
    assert codes in ([0, 2], [1, 2]), done
    [(_, _, refused)] = [d for d in done if d[0] == 2]
    assert "remotemac: error:" in refused and "--out" in refused, refused
    # exactly one run reached the host, and the dir holds that run alone
    [run_id] = run_ids(t.root)
    ledger = [json.loads(x) for x in (out / "ledger.jsonl").read_text().splitlines()]
    assert ledger and {e.get("run_id", run_id) for e in ledger} == {run_id}
    record = json.loads((out / "acceptance.json").read_text())
    assert record["run_id"] == run_id
    for log in (out / "logs").glob("*.log"):
        lines = log.read_text().splitlines()
        assert lines.count("wrote results") == 1, (log, lines)
    assert_every_result_verified(out)
    assert_cleanup_clean(t, tmp_path)


# ------------------------------------------------------------------ item 4


def test_attach_after_cleanup_writes_nothing_on_the_host(tmp_path, sshd_factory, ssh_env):
    t = make_target(tmp_path, sshd_factory, ssh_env)
    book = write_book(tmp_path, t, results_project(tmp_path))
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    [run_id] = run_ids(t.root)
    assert_cleanup_clean(t, tmp_path)
    again = t.cli("attach", run_id)
    assert again.returncode == proc.returncode, again.stdout + again.stderr
    assert tree(t.host_home) == [], "attach re-created remote_root on the host"
    assert_cleanup_clean(t, tmp_path)


def test_cleanup_removes_a_root_that_holds_only_remotemacs_agent(tmp_path, sshd_factory, ssh_env):
    """Simulation of what an older remotemac's ``attach`` left after a cleanup: the root
    without its marker, holding only ``agent/<version>/`` with the agent's own marker
    (AgentClient.install writes it). Before: "not made by remotemac", exit 1, for ever."""
    t = make_target(tmp_path, sshd_factory, ssh_env)
    agent = t.root / "agent" / "0123abcd"
    marker = json.dumps({"kind": "agent", "version": "0123abcd", "root_id": "r1"})
    made = t.sshd.run_as_user(
        [
            "sh",
            "-c",
            f"mkdir -p {agent} && printf '%s' '{marker}' > {agent}/.remotemac-owned"
            f" && echo print > {agent}/hostagent.py && echo v > {agent}/.complete",
        ]
    )
    assert made.returncode == 0, made.stderr
    assert_cleanup_clean(t, tmp_path)


# ------------------------------------------------------------------ item 7

BANNER = 'Welcome to your rented Mac mini!\n{"not": "the agent"}\n'


def test_a_login_shell_that_prints_a_banner_still_claims_runs_and_cleans_up(
    tmp_path, sshd_factory, ssh_env
):
    """The host's shell start-up prints text on stdout before every command, as a
    .bashrc with an ``echo`` does (bash sources it for every command sshd runs): here
    the .bashrc of this sshd's own session HOME (the shared lab user's start-up files
    stay empty). Before: the claim ran, then "agent … gave no answer (exit 0): no
    output … is python3 installed on the host?", exit 3; cleanup failed the same way."""
    t = make_target(tmp_path, sshd_factory, ssh_env)
    rc = t.sshd.host_dir("rc") / "bashrc"
    rc.write_text("echo 'Welcome to your rented Mac mini!'\necho '{\"not\": \"the agent\"}'\n")
    rc.chmod(0o644)
    made = t.sshd.run_as_user(["sh", "-c", f'cp {rc} "$HOME/.bashrc"'])
    assert made.returncode == 0, made.stderr
    probe = subprocess.run(
        [
            "ssh",
            "-F",
            str(t.ssh_config),
            "-o",
            f"UserKnownHostsFile={t.rm_home / 'known_hosts'}",
            t.alias,
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout == BANNER, ("the banner is not printed: the test proves nothing", probe)
    book = write_book(tmp_path, t, results_project(tmp_path))
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    assert_every_result_verified(out)
    assert_cleanup_clean(t, tmp_path, leave=[".bashrc"])


# ------------------------------------------------------------------ item 5

FILL_JOB = r"""
import json, os, sys, time
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "metrics.json"), "w") as fh:
    json.dump({"loss": 0.25}, fh)
with open(os.path.join(out, "model.pth.tar"), "wb") as fh:
    fh.write(bytes(range(256)) * 8192)
print("filling the disk", flush=True)
try:
    with open(os.path.join(out, "cache.bin"), "wb") as fh:
        while True:
            fh.write(b"x" * 65536)
            fh.flush()
except OSError as exc:
    print("disk full:", exc, flush=True)
os.unlink(os.path.join(out, "cache.bin")) if sys.argv[2:] == ["free"] else None
time.sleep(5)  # the runner's heartbeats fall on the full disk
sys.exit(3)
"""


@pytest.fixture
def small_disk(sshd_factory):
    """A 24 MiB tmpfs beside the host's home, the lab user's: remote_root goes on it
    (mounted as root, or through ``sudo -n`` as a normal user: maclab.root_argv)."""
    server = sshd_factory()
    mount = server.host_dir("small-disk")
    uid, gid = os.stat(mount).st_uid, os.stat(mount).st_gid
    subprocess.run(
        root_argv(
            ["mount", "-t", "tmpfs", "-o", f"size=24m,uid={uid},gid={gid},mode=0755"]
            + ["tmpfs", str(mount)]
        ),
        check=True,
    )
    try:
        yield server, mount
    finally:
        subprocess.run(root_argv(["umount", "-l", str(mount)]), check=False)


def small_disk_target(small_disk, ssh_env) -> tuple[Target, Path]:
    """The lab host whose ``remote_root`` is on the small tmpfs, and that tmpfs."""
    server, mount = small_disk
    rm_home, cfg, alias = ssh_env(server)
    t = Target(alias, cfg, rm_home, server.home, server.tmux_dir, mount / "remotemac", server)
    return t, mount


def test_a_disk_filled_by_the_job_still_ends_in_a_final_state_and_a_wipe(
    tmp_path, small_disk, ssh_env
):
    t, mount = small_disk_target(small_disk, ssh_env)
    book = write_book(
        tmp_path,
        t,
        results_project(tmp_path, FILL_JOB),
        stop_when={"memory_growth": False, "min_free_disk": "1KiB"},
    )
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out))
    text = proc.stdout + proc.stderr
    assert "was the host rebooted" not in text and "internal error" not in text, text
    assert proc.returncode in (1, 4, 6), text
    if proc.returncode == 6:  # the target could not start on the full disk: said so
        assert "disk is full" in proc.stderr and "permissions" not in proc.stderr, text
    [run_id] = run_ids(t.root)
    status = json.loads((t.root / "runs" / run_id / "status" / "cpu.json").read_text())
    # a final state: the job's own exit, or the runner's storage stop
    assert status["state"] in ("failed", "storage-limit"), status
    assert_data_wiped_outputs_kept(t, run_id, pulled=proc.returncode != 3)
    proc = t.cli("cleanup", t.alias, "--remote-root", str(t.root), "--yes", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not t.root.exists()
    assert not list(Path("/dev/shm").glob(f"remotemac-{run_id}*")), "the RAM store stayed"


#: the reference writes its results, then leaves the host's disk full (a file outside
#: its out/, the user's to free) and ends well: the target cannot be launched
LEAVE_FULL_JOB = r"""
import json, os, sys
out, filler = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "metrics.json"), "w") as fh:
    json.dump({"loss": 0.25}, fh)
with open(os.path.join(out, "model.pth.tar"), "wb") as fh:
    fh.write(bytes(range(256)) * 8192)
print("wrote results", flush=True)
try:
    with open(filler, "ab") as fh:
        while True:
            fh.write(b"x" * 65536)
            fh.flush()
except OSError as exc:
    print("disk full:", exc, flush=True)
"""


def assert_data_wiped_outputs_kept(t: Target, run_id: str, pulled: bool = False) -> None:
    """The run's data is gone from the host (RAM store, decrypted slice) and its key from
    the laptop; its outputs, unless verified here (``pulled``), and logs stay for
    ``attach``."""
    from remotemac.data.keys import key_path

    run_dir = t.root / "runs" / run_id
    assert not list(Path("/dev/shm").glob(f"remotemac-{run_id}*")), "the RAM store stayed"
    assert not (run_dir / "data").exists(), sorted(p.name for p in run_dir.iterdir())
    assert not key_path(t.rm_home, run_id).exists(), "the data key stayed"
    assert (run_dir / "logs").is_dir(), sorted(p.name for p in run_dir.iterdir())
    if not pulled:
        assert list((run_dir / "out").rglob("metrics.json")), "the outputs were not kept"


def test_a_disk_left_full_wipes_the_data_keeps_the_outputs_and_attach_gets_them(
    tmp_path, small_disk, ssh_env
):
    """The target cannot start on the disk the reference left full (exit 3): the run's
    data (RAM store, slice, key) is wiped then and there, the reference's outputs stay,
    the message says so and names the command; once space is freed ``attach`` verifies
    them here and ``cleanup`` leaves the host clean."""
    t, mount = small_disk_target(small_disk, ssh_env)
    filler = mount / "filler.bin"
    book = write_book(
        tmp_path,
        t,
        results_project(tmp_path, LEAVE_FULL_JOB),
        command=f"python3 train.py {{output_dir}} {filler}",
        stop_when={"memory_growth": False, "min_free_disk": 0},
    )
    out = tmp_path / "out"
    proc = t.cli("run", str(book), "--out", str(out))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 6, text  # host environment: the disk (docs/contract.md)
    [run_id] = run_ids(t.root)
    assert "disk is full" in proc.stderr, text
    assert "kept on the host" in proc.stderr and f"remotemac attach {run_id}" in proc.stderr, text
    assert_data_wiped_outputs_kept(t, run_id)
    filler.unlink()  # the user frees some space
    again = t.cli("attach", run_id)
    assert again.returncode in (0, 1), again.stdout + again.stderr
    got = pulled(out)
    [label] = {name.split("/", 1)[0] for name in got}  # the reference's: the target never ran
    assert got[f"{label}/model.pth.tar"] == hashlib.sha256(MODEL).hexdigest(), got
    assert f"{label}/metrics.json" in got, got
    record = json.loads((out / "acceptance.json").read_text())
    assert record["wipe"]["done"] is True and record["wipe"]["verified"] is True, record["wipe"]
    assert not (t.root / "runs" / run_id / "out").exists()
    proc = t.cli("cleanup", t.alias, "--remote-root", str(t.root), "--yes", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not t.root.exists()


# ------------------------------------------------------------------ across phases

SLOW_JOB = RESULTS_JOB.replace("import json, os, sys", "import json, os, sys, time\ntime.sleep(3)")


@pytest.mark.parametrize(
    "phase",
    [
        "provision",
        "sync",
        "launch:reference",
        "follow:reference",
        "launch:target",
        "follow:target",
        "pull",
        "wipe",
    ],
)
def test_sigkill_of_the_laptop_in_any_phase_then_attach_loses_nothing(
    tmp_path, sshd_factory, ssh_env, phase
):
    """The property "nothing unverified is lost", for one fault (SIGKILL of the laptop
    process) in each phase: the documented recovery (``attach``) ends with every result
    verified here and ``cleanup`` clean."""
    import signal
    import time

    t = make_target(tmp_path, sshd_factory, ssh_env)
    book = write_book(tmp_path, t, results_project(tmp_path, SLOW_JOB))
    out = tmp_path / "out"
    # the run's own event stream says when the phase starts (a journal read every 20 ms
    # could miss a short phase on a loaded machine: the fault then never came)
    proc = start_cli(t, "run", str(book), "--out", str(out), "--json")
    deadline = time.monotonic() + 120
    seen: list[str] = []
    while True:
        assert time.monotonic() < deadline, seen[-5:]
        line = proc.stdout.readline()
        assert line, ("the run ended before the fault", seen[-5:], proc.communicate())
        seen.append(line)
        event = json.loads(line)
        if event.get("event") == "phase_started" and event.get("phase") == phase:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    run_id = event["run_id"]  # killed as provision starts, the host has no run dir yet
    again = t.cli("attach", run_id)
    assert again.returncode in (0, 1), again.stdout + again.stderr
    assert_every_result_verified(out)
    for log in (out / "logs").glob("*.log"):
        assert log.read_text().splitlines().count("wrote results") == 1, log
    assert_cleanup_clean(t, tmp_path)
