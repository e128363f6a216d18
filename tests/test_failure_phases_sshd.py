"""The property "nothing unverified is lost", across phases, for the link (issue 31,
"Done when"; the SIGKILL of the laptop is in tests/test_failure_paths_sshd.py, the
disks filled by the job in the same file).

For each phase of a run, one fault lands as that phase starts (the run's own event
stream says when), then the documented recovery runs: none for a short cut, the command
the run's last line names for a link down past the reconnect deadline (``attach``, or
``wipe`` when it was the wipe that could not finish). It must end with every result
verified on the laptop, every log line there once, and ``cleanup`` clean. The faults
are real: the TCP fault proxy of tests/harness in front of the real sshd cuts the
link or refuses new connections."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests import test_failure_paths_sshd as failure_paths
from tests.harness.maclab import root_argv
from tests.test_cleanup_sshd import Target
from tests.test_failure_paths_sshd import (
    MODEL,
    RESULTS_JOB,
    assert_cleanup_clean,
    assert_every_result_verified,
    pulled,
    results_project,
    start_cli,
    write_book,
)

pytestmark = pytest.mark.timeout(420)

#: the job of the SIGKILL property test: a few seconds, so each follow phase is long
#: enough for a fault to land in it
SLOW_JOB = RESULTS_JOB.replace("import json, os, sys", "import json, os, sys, time\ntime.sleep(3)")

#: every phase a run goes through, as its events name them
PHASES = [
    "provision",
    "sync",
    "launch:reference",
    "follow:reference",
    "launch:target",
    "follow:target",
    "pull",
    "wipe",
]


def wait_for_phase(proc: subprocess.Popen, phase: str, timeout: float = 180) -> list[str]:
    """Read the run's ``--json`` events until ``phase`` starts; the lines read so far."""
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while True:
        assert time.monotonic() < deadline, seen[-5:]
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, ("the run ended before the fault", seen[-5:], proc.communicate())
        seen.append(line)
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == "phase_started" and event.get("phase") == phase:
                return seen


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def assert_logs_once(out: Path) -> None:
    logs = list((out / "logs").glob("*.log"))
    assert len(logs) == 2, logs
    for log in logs:
        assert log.read_text().splitlines().count("wrote results") == 1, log


def last_error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    return lines[-1] if lines else ""


# ------------------------------------------------------------------ the link


def proxied_target(tmp_path: Path, sshd_factory, fault_proxy, ssh_env):
    server = sshd_factory()
    proxy = fault_proxy(server)
    rm_home, cfg, alias = ssh_env(server, proxy)
    t = Target(alias, cfg, rm_home, server.home, server.tmux_dir, server.home / "remotemac", server)
    return t, proxy


@pytest.mark.parametrize("phase", PHASES)
def test_a_link_cut_in_any_phase_is_survived_by_the_run_itself(
    tmp_path, sshd_factory, fault_proxy, ssh_env, phase
):
    """The link drops (both TCP ends closed, as a dropped NAT entry) as the phase starts,
    and again a moment later: the run reconnects on its own and ends as a clean run
    does, with no recovery command at all."""
    t, proxy = proxied_target(tmp_path, sshd_factory, fault_proxy, ssh_env)
    book = write_book(tmp_path, t, results_project(tmp_path, SLOW_JOB))
    out = tmp_path / "out"
    proc = start_cli(t, "run", str(book), "--out", str(out), "--json")
    wait_for_phase(proc, phase)
    cuts = proxy.cut()
    time.sleep(0.3)
    cuts += proxy.cut()
    assert cuts >= 1, "no connection was open: the cut proves nothing"
    code, stdout, stderr = finish(proc)
    assert code in (0, 1), (code, stderr[-3000:])
    assert "internal error" not in stderr, stderr
    assert_every_result_verified(out)
    assert_logs_once(out)
    assert_cleanup_clean(t, tmp_path)


@pytest.mark.parametrize("phase", PHASES)
def test_a_link_down_past_the_deadline_in_any_phase_then_attach_loses_nothing(
    tmp_path, sshd_factory, fault_proxy, ssh_env, phase
):
    """The host becomes unreachable as the phase starts (open connections cut, new ones
    refused) for longer than the reconnect deadline: the run stops with exit 3 and one
    line naming ``remotemac attach <run-id>``; once the link is back that command ends
    with every result verified here and ``cleanup`` clean."""
    t, proxy = proxied_target(tmp_path, sshd_factory, fault_proxy, ssh_env)
    book = write_book(tmp_path, t, results_project(tmp_path, SLOW_JOB))
    out = tmp_path / "out"
    proc = start_cli(t, "run", str(book), "--out", str(out), "--json", "--reconnect-deadline", "3")
    wait_for_phase(proc, phase)
    proxy.refuse(True)
    proxy.cut()
    try:
        code, stdout, stderr = finish(proc)
    finally:
        proxy.restore()
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    if code in (0, 1):
        # the phase's last call was answered before the link went: nothing was left
        # to do on the host (the wipe's verification may be the last call of a run)
        assert phase == "wipe", (phase, code, stderr[-3000:])
    else:
        assert code == 3, (code, stderr[-3000:])
        hint = re.search(r"remotemac (attach|wipe) ([\w.-]+)", stderr)
        assert hint, stderr[-3000:]
        command, run_id = hint.groups()
        # the wipe's own recovery is the wipe again (results are pulled by then); any
        # earlier phase's is attach, which picks the run up where it stopped
        assert command == ("wipe" if phase == "wipe" else "attach"), (phase, stderr[-3000:])
        again = t.cli(command, run_id, *(["--yes"] if command == "wipe" else []))
        assert again.returncode in (0, 1), again.stdout + again.stderr
    assert_every_result_verified(out)
    assert_logs_once(out)
    assert_cleanup_clean(t, tmp_path)


# ------------------------------------------------------------------ the disk

#: the 24 MiB tmpfs fixture of the disk-full item tests, shared
small_disk = failure_paths.small_disk


def fill(mount: Path) -> Path:
    """Fill the host's disk to the last byte, as another tenant's job would (as root, or
    through ``sudo -n``: the lab user's tmpfs); the file is what the user frees."""
    filler = mount / "someone-elses.bin"
    subprocess.run(
        root_argv(["sh", "-c", f"cat /dev/zero > {filler} 2>/dev/null; exit 0"]), check=True
    )
    assert filler.stat().st_size > 0
    return filler


def free(filler: Path) -> None:
    subprocess.run(root_argv(["rm", "-f", str(filler)]), check=True)


#: the job for the disk: its results are written first, then it runs on for 3 s, so a
#: disk filled while it follows hits the runner's own writes (log, heartbeat, status)
WRITE_THEN_WAIT_JOB = RESULTS_JOB.replace(
    'print("wrote results", flush=True)',
    'print("wrote results", flush=True)\nimport time\ntime.sleep(3)',
)


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 120) -> None:
    """Read the run's ``--json`` events until a job's log line ``text`` comes."""
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"no log line {text!r}"
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, ("the run ended before the line", proc.communicate())
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == "log_line" and event.get("line") == text:
                return


@pytest.mark.parametrize("phase", PHASES)
def test_a_disk_filled_in_any_phase_then_the_named_command_loses_nothing(
    tmp_path, small_disk, ssh_env, phase
):
    """The host's disk (a 24 MiB tmpfs holding ``remote_root``) is filled to the last
    byte by something that is not the run, as the phase starts (in a follow phase: once
    the job has written its results, so what fills up is the runner's own log, heartbeat
    and status), and stays full until the run stops. The run either shrugs it off or
    stops with a named error (never "internal error", never "was the host rebooted")
    whose last line names the command that finishes it; once the user frees the space,
    that command (``attach``, ``wipe``, or ``run`` again when nothing was made yet) ends
    with every result verified on the laptop, every log line there once, and
    ``cleanup`` clean."""
    t, mount = failure_paths.small_disk_target(small_disk, ssh_env)
    book = write_book(
        tmp_path,
        t,
        results_project(tmp_path, WRITE_THEN_WAIT_JOB),
        stop_when={"memory_growth": False, "min_free_disk": 0},
    )
    out = tmp_path / "out"
    proc = start_cli(t, "run", str(book), "--out", str(out), "--json")
    wait_for_phase(proc, phase)
    if phase.startswith("follow:"):
        wait_for_line(proc, "wrote results")
    filler = fill(mount)
    try:
        code, stdout, stderr = finish(proc)
    finally:
        free(filler)
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    assert "was the host rebooted" not in stderr, stderr
    if code not in (0, 1):
        last = last_error_line(stderr)
        hint = re.search(r"remotemac (attach|wipe|pull|run) ([\w./-]+)", last)
        assert hint, (phase, code, stderr[-3000:])
        command, arg = hint.groups()
        extra = ["--yes"] if command == "wipe" else []
        if command == "run":
            assert arg == "PLAYBOOK" or Path(arg).name == book.name, last
            arg, extra = str(book), ["--out", str(out)]
        again = t.cli(command, arg, *extra)
        assert again.returncode in (0, 1), (phase, command, again.stdout + again.stderr)
    ran = SIDES_THAT_RAN.get(phase, ("cpu", "cpu-target"))
    if len(ran) == 2:
        assert_every_result_verified(out)
        assert_logs_once(out)
    else:
        assert_sides_verified_and_the_rest_not_launched(out, ran)
    assert_cleanup_clean(t, tmp_path)


#: a launch the full disk refused wipes the run's data then and there (it must not
#: outlive the run: docs/contract.md, "What survives a failure"), so the sides not
#: launched yet never run; what the sides before made is kept and verified. (A launch
#: that got in before the disk was full runs a job that fails on it: its own outputs
#: are what it managed to write, and the verdict says it failed.)
SIDES_THAT_RAN = {
    "launch:reference": (),
    "follow:reference": ("cpu",),
    "launch:target": ("cpu",),
}


def assert_sides_verified_and_the_rest_not_launched(out: Path, ran: tuple[str, ...]) -> None:
    """The sides that ran have their results here, whole; each other side either ran
    whole too, or is recorded as not launched because the host's disk was full (or as
    failed, its job having started just before), and the run is not accepted."""
    got = pulled(out)
    labels = {name.split("/", 1)[0] for name in got}
    assert set(ran) <= labels, got
    model = hashlib.sha256(MODEL).hexdigest()
    whole = {label for label in labels if got.get(f"{label}/model.pth.tar") == model}
    assert set(ran) <= whole, got
    record = json.loads((out / "acceptance.json").read_text())
    assert record["wipe"]["done"] is True and record["wipe"]["verified"] is True, record["wipe"]
    if whole == {"cpu", "cpu-target"}:
        return
    assert record["verdict"] != "accepted", record
    md = (out / "acceptance.md").read_text()
    assert "not launched: the host's disk was full" in md or "workload-failed" in md, md
