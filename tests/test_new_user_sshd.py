"""What a new user trips over, replayed through the real CLI against the real sshd lab host.

Each test is one thing a user did that went wrong in a first session with remotemac
(a hand wipe then an attach, a script reading ``--json``), run as the user ran it:
``python -m remotemac`` in a subprocess, a test sshd whose login is the fresh-host lab
(a bare Python 3.9), real tmux.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.test_detached_ssh import (  # noqa: F401 - host_factory is a fixture
    first_run_id,
    host_factory,
    wait_lines,
    write_playbook,
)

pytestmark = pytest.mark.timeout(180)
ACCEPT_PROJECT = Path(__file__).parent / "fixtures" / "projects" / "accept"


def _follow_stderr(host, run_id: str) -> str:
    """What `logs RUN --follow` says on stderr in its first 4 s (then Ctrl-C)."""
    follow = host.popen("logs", run_id, "--follow")
    try:
        return follow.communicate(timeout=4)[1]
    except subprocess.TimeoutExpired:
        follow.send_signal(signal.SIGINT)
        return follow.communicate(timeout=10)[1]


def _detached_run(host, tmp_path: Path, lines: int) -> str:
    """`run --detach` of a 20 s job on ``host``; its run id."""
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=lines, seconds=20)
    started = host.cli("run", str(pb), "--out", str(tmp_path / "out"), "--detach", timeout=150)
    assert started.returncode == 0, started.stderr
    return first_run_id(host.home)


def test_attach_after_a_hand_wipe_refuses_instead_of_syncing_the_data_again(
    host_factory,  # noqa: F811 - the fixture
    tmp_path: Path,
):
    """`run --detach`, `wipe RUN --yes`, `attach RUN`: exit 2 with one line saying the run
    was wiped; nothing is synced or launched again (before: the dataset went back to
    the host and, the wipe phase being "done", stayed there after the run)."""
    host = host_factory()
    run_id = _detached_run(host, tmp_path, lines=50)
    wiped = host.cli("wipe", run_id, "--yes", timeout=60)
    assert wiped.returncode == 0, wiped.stderr
    assert not (host.run_dir(run_id) / "data").exists()

    again = host.cli("attach", run_id, timeout=120)
    assert again.returncode == 2, again.stdout + again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("remotemac: error: "), again.stderr
    assert "wiped" in lines[0] and "remotemac run" in lines[0], lines[0]
    assert "Traceback" not in again.stderr
    # nothing went back to the host: no data dir, no RAM store of the run
    assert not (host.run_dir(run_id) / "data").exists()
    assert not list(Path("/dev/shm").glob(f"remotemac-{run_id}*"))
    status = host.cli("status", run_id, "--json", timeout=30)
    assert json.loads(status.stdout)["state"] != "running"


def test_run_json_against_a_changed_host_key_ends_with_a_json_line(
    host_factory,  # noqa: F811 - the fixture
    tmp_path: Path,
):
    """`run --json` when the host was re-keyed: exit 3, every stdout line is JSON and the
    last one is ``run_finished`` with the run id, exit code 3 and why (before: stdout was
    empty, the run id and the reason only on stderr)."""
    host = host_factory()
    host.sshd.restart(new_host_key=True)  # type: ignore[attr-defined]
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=5, seconds=1)
    proc = host.cli("run", str(pb), "--out", str(tmp_path / "out"), "--json", timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    last = events[-1]
    assert last["event"] == "run_finished" and last["exit_code"] == 3, events
    assert last["run_id"] == first_run_id(host.home) and last["verdict"] == "failed"
    assert "HOST KEY CHANGED" in last["detail"]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("remotemac: error: HOST KEY CHANGED"), err


def test_trust_without_a_terminal_is_declined_with_one_line(sshd_factory, ssh_env, tmp_path: Path):
    """`remotemac trust HOST` from a script, no --yes, stdin not a terminal: the host key
    is not pinned, exit 3 and one error line (before: click's bare "Aborted!", exit 1)."""
    server = sshd_factory()
    home, cfg, alias = ssh_env(server, trust=False)
    proc = subprocess.run(
        [sys.executable, "-m", "remotemac", "--home", str(home), "--ssh-config", str(cfg)]
        + ["trust", alias],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Aborted" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("remotemac: error: host key SHA256:"), err
    assert "not trusted" in err[0]
    assert proc.stdout.endswith("\n")  # the question's line is ended before the error
    known = home / "known_hosts"
    assert not known.exists() or server.fingerprint not in known.read_text()


def test_ctrl_c_before_any_job_does_not_claim_a_job_keeps_running(
    host_factory,  # noqa: F811 - the fixture
    tmp_path: Path,
):
    """SIGINT while `run` provisions: exit 130 and "stopped locally before a job was
    launched", not "the job keeps running on the host" (there is none yet); attach is
    still how to go on, and it finishes the run."""
    host = host_factory()
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=5, seconds=1)
    out = tmp_path / "out"
    proc = host.popen("run", str(pb), "--out", str(out), "--json")
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "phase_started" and event["phase"] == "provision":
            break
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    run_id = first_run_id(host.home)
    assert "keeps running" not in stderr, stderr
    assert "before a job was launched" in stderr and f"remotemac attach {run_id}" in stderr
    last = json.loads(stdout.splitlines()[-1])
    assert last["event"] == "run_finished" and last["exit_code"] == 130, last
    assert not list((host.run_dir(run_id) / "status").glob("*.json"))  # no job started
    done = host.cli("attach", run_id, timeout=150)
    assert done.returncode in (0, 1), done.stdout + done.stderr


def _journal_view(host, run_id: str) -> dict:
    """The run's journal state and phases as `status --json` shows them (not the live part)."""
    data = json.loads(host.cli("status", run_id, "--json", timeout=60).stdout)
    return {k: data[k] for k in ("state", "verdict", "exit_code", "finished_at", "phases")}


def test_host_torch_logs_follow_of_a_detached_run_tails_every_line_live_until_it_ends(
    host_factory,  # noqa: F811 - the fixture
    host_torch_python: str,
    tmp_path: Path,
):
    """`run --detach` of a torch job (reference, then target, about 5 s each), then
    `logs latest --follow --json`: each job's lines stream from the host as it prints
    them, every line once and in order, labelled with its device, and the command ends
    with exit 0 when the jobs end, naming `remotemac attach RUN` (before: it said nothing
    follows the job and waited forever). It is a viewer: the run's journal state is the
    same after it, and `attach` then finishes the run ACCEPTED, its logs holding exactly
    the lines the tail showed. The host has torch preinstalled (a rental does not)."""
    host = host_factory()
    pb = tmp_path / "pb.yaml"
    pb.write_text(
        yaml.safe_dump(
            {
                "name": "tail",
                "host": host.alias,
                "remote_root": str(host.root),
                "project": {"path": str(ACCEPT_PROJECT)},
                "environment": {"python": host_torch_python, "venv": False},
                "workload": {
                    "command": "python3 work.py --device {device} --out {output_dir} "
                    "--mode ok --seconds 5",
                    "reference": {"device": "cpu"},
                    "target": {"device": "cpu"},
                    "timeout": "5m",
                },
                "outputs": {"path": ".", "compare": [{"file": "preds.pt"}]},
                "stop_when": {"memory_growth": False},
                "wipe": "manual",
            }
        )
    )
    out = tmp_path / "out"
    started = host.cli("run", str(pb), "--out", str(out), "--detach", timeout=150)
    assert started.returncode == 0, started.stderr
    run_id = first_run_id(host.home)
    before = _journal_view(host, run_id)
    assert before["state"] == "detached", before
    tail = host.cli("logs", "latest", "--follow", "--json", timeout=150)
    assert tail.returncode == 0, tail.stdout + tail.stderr
    rows = [json.loads(line) for line in tail.stdout.splitlines()]
    shown = {d: [r["line"] for r in rows if r["device"] == d] for d in ("cpu", "cpu-target")}
    for device, lines in shown.items():
        steps = [line for line in lines if line.startswith("step ")]
        assert len(steps) >= 20 and lines[-1] == "done", (device, lines)
        assert steps == [f"step {i}" for i in range(1, len(steps) + 1)], (device, lines)
    assert len(rows) == sum(map(len, shown.values())), rows
    assert "finished" in tail.stderr and f"remotemac attach {run_id}" in tail.stderr, tail.stderr
    assert _journal_view(host, run_id) == before
    done = host.cli("attach", run_id, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _journal_view(host, run_id)["verdict"] == "accepted"
    for device, lines in shown.items():
        assert (out / "logs" / f"{device}.log").read_text().splitlines() == lines, device


def test_a_run_whose_terminal_was_closed_shows_interrupted_and_how_to_resume(
    host_factory,  # noqa: F811 - the fixture
    tmp_path: Path,
):
    """The terminal running `remotemac run` is closed (SIGHUP) mid-follow: the job runs
    on, but `status` said "running" forever (and `logs --follow` waited in silence).
    Now the run reads "interrupted" with `remotemac attach RUN`, and attach finishes it."""
    host = host_factory()
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=200, seconds=8)
    out = tmp_path / "out"
    proc = host.popen("run", str(pb), "--out", str(out))
    wait_lines(proc, out, 10)
    run_id = first_run_id(host.home)
    proc.send_signal(signal.SIGHUP)
    proc.communicate(timeout=30)
    table = host.cli("status", timeout=30)
    assert run_id in table.stdout and "interrupted" in table.stdout, table.stdout
    detail = host.cli("status", run_id, timeout=60)
    assert f"remotemac attach {run_id}" in detail.stdout, detail.stdout
    assert json.loads(host.cli("status", run_id, "--json").stdout)["state"] == "interrupted"
    stderr = _follow_stderr(host, run_id)
    assert "is interrupted" in stderr and f"remotemac attach {run_id}" in stderr, stderr
    done = host.cli("attach", run_id, timeout=120)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert json.loads(host.cli("status", run_id, "--json").stdout)["state"] == "finished"


def test_a_refused_remote_root_does_not_make_every_later_cleanup_fail(
    host_factory,  # noqa: F811 - the fixture
    tmp_path: Path,
):
    """A first playbook named a dir of the user's as remote_root: `run` refused it (exit
    2, nothing written). Every `cleanup HOST` after that ended "not clean" (exit 1), the
    root "failed: not made by remotemac", for a dir remotemac never touched."""
    host = host_factory()
    mine = host.sshd.host_dir("my-code")  # type: ignore[attr-defined]
    (mine / "keep.py").write_text("mine\n")
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=5, seconds=1)
    pb.write_text(pb.read_text().replace(str(host.root), str(mine)))
    refused = host.cli("run", str(pb), "--out", str(tmp_path / "out"), timeout=120)
    assert refused.returncode == 2 and "nothing was written" in refused.stderr, refused.stderr
    clean = host.cli("cleanup", host.alias, "--yes", "--json", timeout=120)
    record = json.loads(clean.stdout.strip().splitlines()[-1])
    assert clean.returncode == 0 and record["status"] == "clean", record
    assert (mine / "keep.py").read_text() == "mine\n"


def test_an_agent_python_missing_on_the_host_is_exit_6_and_names_it(
    host_factory,  # noqa: F811 - the fixture
    tmp_path: Path,
):
    """`agent: {python: python2.7}` on a host without it: exit 6 (an interpreter not on
    the host's PATH, docs/contract.md) naming python2.7 and agent.python; before: exit 3,
    "cleanup agent gave no answer (exit 127) ... (is python3 installed on the host?)"."""
    import yaml

    host = host_factory()
    pb = write_playbook(host, tmp_path / "pb.yaml", lines=5, seconds=1)
    book = yaml.safe_load(pb.read_text())
    book["agent"] = {"python": "python2.7"}
    pb.write_text(yaml.safe_dump(book))
    proc = host.cli("run", str(pb), "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 6, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "python2.7" in err[0] and "agent.python" in err[0], err
    assert "cleanup" not in err[0] and "is python3 installed" not in err[0], err[0]
