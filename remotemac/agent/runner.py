"""The detached runner: ``python3 runner.py SPEC.json`` (inside tmux or daemonised).

It starts the workload with stdout and stderr appended to ``logs/<device>.log``
(so a reader that remembers a byte offset never misses or repeats a line), keeps
``status/<device>.json`` current with a heartbeat, enforces the timeout, and
writes the final state and exit code last — after the log is complete — so the
orchestrator can learn the end of the job even if it was away when it happened.

Standard library only, Python 3.9+.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from . import (
    ckptconvert,  # sibling: which checkpoints the safe loader reads as they are
    memsample,  # sibling: one memory row of a process tree, the job's own use in it
    obsmerge,  # sibling files: this script runs from the agent dir
    procid,  # sibling: who a process is (start time, command line), for safe kills
    proctree,
    protocol,  # the job states the laptop reads (protocol.JobState)
    safefs,  # sibling: file writes that never go through a planted link
)
from .agentutil import format_mib
from .hostagent import JobSpec, JobStatusFile
from .protocol import JsonObject
from .shared import install_jobsite

HEARTBEAT_S = 2.0
#: the job's memory (RSS summed over its process tree) is sampled this often
MEMORY_SAMPLE_S = 0.5
AGENT_DIR = os.path.dirname(os.path.abspath(__file__))
KILL_GRACE_S = 10.0
#: after its tmux session is destroyed the workload gets this long to exit on SIGTERM
HANGUP_GRACE_S = 2.0
#: free disk is checked this often (statvfs is cheap): a fast writer fills a volume in seconds
DISK_CHECK_S = 0.5
#: a workload stopped for lack of disk gets this long to exit on SIGTERM before SIGKILL
STORAGE_GRACE_S = 5.0


#: a full disk (or quota): the status and log writes must not end the runner
DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def _write_status(path: str, status: JobStatusFile) -> None:
    """The status, atomically; on a full disk in place instead, and marked so.

    The atomic write needs a new file's blocks, which a disk the job filled does not
    have; before, the runner died on ENOSPC with no final state, and the laptop said
    "the job was lost … was the host rebooted?". Rewriting the existing file reuses
    its own blocks (a status is a few hundred bytes), so the final state still lands.
    """
    try:
        safefs.write_json_atomic(path, status.to_json())
        return
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
    with contextlib.suppress(OSError):  # the atomic write's empty tmp file
        os.unlink("%s.tmp-%d-%d" % (path, os.getpid(), threading.get_ident()))
    if status.disk_full is None:
        status.disk_full = "the host's disk is full (ENOSPC)"
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            data = json.dumps(status.to_json()).encode()
            os.ftruncate(fd, 0)
            os.write(fd, data)
        finally:
            os.close(fd)


def _log(log_fd: int, data: bytes) -> None:
    """A line of remotemac's own into the job's log: lost, not fatal, on a full disk."""
    with contextlib.suppress(OSError):
        os.write(log_fd, data)


def build_argv(spec: JobSpec, platform: str | None = None) -> list[str]:
    """The workload's argv: ``/bin/sh -c COMMAND``, on macOS too (see caffeinate_argv)."""
    return ["/bin/sh", "-c", spec.command]


def caffeinate_argv(spec: JobSpec, pid: int, platform: str | None = None) -> list[str] | None:
    """``caffeinate -i -w PID`` on macOS (None elsewhere, without caffeinate, or off by
    request): the Mac stays awake for exactly the job's life.

    Why beside the job and not around it: ``caffeinate -i CMD`` forks and execs CMD, so
    the job would be a level further down and its exit status (a death by signal above
    all: undocumented) would come through caffeinate. ``-w`` watches the job instead.
    ``platform`` defaults to ``sys.platform`` (tests pass ``"darwin"`` to simulate a Mac).
    """
    platform = platform or sys.platform
    if platform != "darwin" or not spec.caffeinate:
        return None
    caffeinate = shutil.which("caffeinate") or (
        "/usr/bin/caffeinate" if os.access("/usr/bin/caffeinate", os.X_OK) else None
    )
    return [caffeinate, "-i", "-w", str(pid)] if caffeinate else None


def _start_caffeinate(argv: list[str] | None) -> subprocess.Popen[bytes] | None:
    if argv is None:
        return None
    try:  # its own session: a kill of the job's group is not a kill of the assertion
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return None


def _stop_caffeinate(proc: subprocess.Popen[bytes] | None) -> None:
    """Reap it: it ends by itself once the job's pid is gone (``-w``)."""
    if proc is None:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class ObserveSpec(protocol.Message):
    """The spec's ``observe``: where the job's observer writes (``dir``), the merged
    observation (``obs_path``), the device, and the divergence ``trace`` (steps, path)."""

    dir: str = ""
    obs_path: Optional[str] = None
    device: Optional[str] = None
    fallback: Optional[str] = None
    interval: Any = None
    trace: Optional[JsonObject] = None
    #: a drill pass (opdrill.py): step, path, call, out, save or input
    drill: Optional[JsonObject] = None

    def trace_target(self) -> Optional[Tuple[int, str]]:
        """(steps, path) of the divergence trace, or None when there is none."""
        trace = ObserveTrace.from_json(self.trace or {})
        return (int(trace.steps), str(trace.path)) if trace.steps and trace.path else None


@dataclass
class ObserveTrace(protocol.Message):
    """``observe.trace``: record the first ``steps`` optimizer steps to ``path``."""

    steps: Any = None
    path: Optional[str] = None


def prepare_observer(observe: ObserveSpec, env: dict[str, str]) -> None:
    """Put the observer's sitecustomize first on the job's PYTHONPATH (see jobsite.py).

    Its own directory holds nothing else, so no agent module can shadow a user's.
    """
    install_jobsite(AGENT_DIR, os.path.join(observe.dir, "site"), observe.dir, env)
    env["REMOTEMAC_OBSERVE_DEVICE"] = str(observe.device or "cpu")
    env["REMOTEMAC_OBSERVE_FALLBACK"] = str(observe.fallback or "diagnostic")
    env["REMOTEMAC_OBSERVE_INTERVAL"] = str(observe.interval or 1.0)
    trace = observe.trace_target()
    if trace is not None:
        # the divergence trace (modtrace.py); absent, the observer loads nothing for it
        env["REMOTEMAC_TRACE_STEPS"] = str(trace[0])
        env["REMOTEMAC_TRACE_PATH"] = trace[1]
        os.makedirs(os.path.dirname(trace[1]), exist_ok=True)
    if observe.drill:
        # one module call run alone under an op trace, then the process ends (opdrill.py)
        env["REMOTEMAC_DRILL"] = json.dumps(observe.drill)


class JobMemory:
    """The job's memory over time: its own use (PSS on Linux, phys_footprint on macOS)
    and RSS summed over its process tree, plus Metal's driver memory summed over the
    observed processes when the job runs on MPS."""

    def __init__(self, spec: JobSpec, started: float) -> None:
        self.path = spec.metrics_path
        self.observe = ObserveSpec.from_json(spec.observe or {})
        self.mps = str(self.observe.device or "").startswith("mps")
        self.started = started
        self.peak = 0
        self.max_processes = 0

    def sample(self, root: int, now: float) -> None:
        """Append one sample, unless an observed process of the tree is past its end.

        A process whose observer wrote its final record is in atexit or tearing down:
        its memory falls as it frees everything, and a leak's last samples must not
        read as memory that stopped growing.
        """
        got = proctree.tree_rss(root, session_leader=True)
        if not got.pids:
            return
        records = obsmerge.read_records(self.observe.dir) if self.observe.dir else []
        if any(r.get("finished") and r.get("pid") in got.pids for r in records):
            return
        self.peak = max(self.peak, got.rss_bytes)
        self.max_processes = max(self.max_processes, len(got.pids))
        row: JsonObject = {"t": round(now - self.started, 3)}  # one line of metrics_path
        row.update(memsample.tree_row(got.pids, got.rss_bytes))
        if self.observe.dir:
            # where the job is: torch imported (observed > 0), optimizer steps taken;
            # the memory trend's warm-up is counted from there (decide.memory_stable)
            live = [r for r in records if r.get("pid") in got.pids]
            row["observed"] = len(live)
            row["steps"] = sum(int(r.get("optimizer_steps") or 0) for r in live)
        if self.mps:
            mps = obsmerge.mps_driver_bytes(records, got.pids)
            if mps is not None:
                row["mps_driver_allocated_bytes"] = mps
        if self.path:
            # a full disk loses a sample, not the runner
            with contextlib.suppress(OSError), open(self.path, "a") as fh:
                fh.write(json.dumps(row) + "\n")

    def merge(self) -> None:
        """Refresh the job's merged observation (status/<label>.obs.json)."""
        if self.observe.dir and self.observe.obs_path:
            with contextlib.suppress(OSError):
                obsmerge.write_merged(
                    self.observe.dir, self.observe.obs_path, str(self.observe.device or "")
                )


@dataclass
class VolumeFree:
    """One watched volume's free space (bytes), and the least seen since the job began."""

    path: str
    free: int
    total: int
    min_free_seen: int = 0

    def to_json(self) -> JsonObject:
        return {
            "path": self.path,
            "free": self.free,
            "total": self.total,
            "min_free_seen": self.min_free_seen,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> VolumeFree:
        return cls(data["path"], data["free"], data["total"], data.get("min_free_seen", 0))


def _free(path: str) -> VolumeFree | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return VolumeFree(path, free, st.f_blocks * st.f_frsize, free)


class DiskWatch:
    """Free space of remote_root's volume (and of the RAM store), checked every DISK_CHECK_S.

    Why it stops *before* the volume is full: once it is, the job's log, the status
    file and the record of the run can no longer be written. The job is stopped when
    the volume has less than ``min_free`` left, or would have at the next check at
    the rate it is being filled.
    """

    def __init__(self, cfg: JsonObject) -> None:
        """``cfg``: the spec's ``disk`` (``paths`` by name, ``min_free``, ``warn_free``)."""
        self.paths: Dict[str, Optional[str]] = dict(cfg.get("paths") or {})
        self.min_free = int(cfg.get("min_free") or 0)
        self.warn_free = int(cfg.get("warn_free") or 2 * self.min_free)
        self.seen: Dict[str, VolumeFree] = {}
        self.last: tuple[float, int] | None = None
        self.warning: str | None = None

    def check(self, now: float) -> str | None:
        """Update the figures; the reason to stop the job, or None."""
        for name, path in self.paths.items():
            if not path:
                continue
            got = _free(path)
            if got is None:
                continue
            before = self.seen.get(name)
            got.min_free_seen = min(got.free, before.min_free_seen if before else got.free)
            self.seen[name] = got
        root = self.seen.get("root")
        if root is None or not self.min_free:
            return None
        free = root.free
        rate = 0.0
        if self.last is not None and now > self.last[0]:
            rate = max(0.0, (self.last[1] - free) / (now - self.last[0]))
        self.last = (now, free)
        projected = free - rate * DISK_CHECK_S * 2
        if free < self.min_free or projected < self.min_free:
            why = "only %s free on %s (min_free_disk %s)" % (
                format_mib(free),
                root.path,
                format_mib(self.min_free),
            )
            if free >= self.min_free:
                why += ", filling at %s/s" % format_mib(rate)
            return why
        if free < self.warn_free and self.warning is None:
            self.warning = "low disk: %s free on %s; the job is stopped below %s" % (
                format_mib(free),
                root.path,
                format_mib(self.min_free),
            )
        ram = self.seen.get("ram")
        if ram and ram.total and ram.free < 0.05 * ram.total and self.warning is None:
            self.warning = "the RAM store %s is almost full: %s free of %s" % (
                ram.path,
                format_mib(ram.free),
                format_mib(ram.total),
            )
        return None

    def report(self) -> JsonObject:
        """The status file's ``disk``: the floors, and each volume by name."""
        seen = {name: v.to_json() for name, v in self.seen.items()}
        return {"min_free": self.min_free, "warn_free": self.warn_free, **seen}


def _marker(log_fd: int, log_path: str, text: str) -> None:
    """Append ``text`` on a line of its own (the lost job may have left half a line)."""
    prefix = b""
    try:
        size = os.path.getsize(log_path)
        if size:
            with open(log_path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    prefix = b"\n"
    except OSError:
        pass
    os.write(log_fd, prefix + text.encode("utf-8", "replace") + b"\n")


def run(spec_path: str) -> int:
    """Run the job SPEC describes to its end; the status file is written last."""
    with open(spec_path) as fh:
        spec = JobSpec.from_json(json.load(fh))
    status_path, log_path = spec.status_path, spec.log_path
    env = _job_env(spec)
    status = _initial_status(spec)
    log_fd = _open_log(spec, log_path)
    argv = build_argv(spec)
    try:
        child = subprocess.Popen(
            argv,
            cwd=spec.cwd or None,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
        )
    except OSError as exc:
        _log(log_fd, ("remotemac: could not start the workload: %s\n" % exc).encode())
        os.close(log_fd)
        status.state, status.exit_code = protocol.JobState.FAILED, 127
        status.ended_at, status.reason = time.time(), str(exc)
        _write_status(status_path, status)
        return 127
    job = _Job(spec, status, child, log_fd)
    awake = job.note_child(argv)
    _write_status(status_path, status)
    job.install_signals()
    code = job.watch()
    os.close(log_fd)
    job.memory.merge()
    if job.hangup is not None:
        # no final state: to the orchestrator this is a job that vanished with its
        # session (like a reboot); it reports ``lost`` once the heartbeat is stale
        status.hangup_at, status.hangup = time.time(), job.hangup
        _write_status(status_path, status)
        return 1
    _stop_caffeinate(awake)
    state = job.finish(code, env)
    _launch_next(spec, state)
    return 0


def _job_env(spec: JobSpec) -> dict[str, str]:
    """The workload's environment: ours, the spec's on top, unbuffered, maybe observed."""
    env = dict(os.environ)
    env.update(spec.env)
    env["PYTHONUNBUFFERED"] = "1"
    if spec.observe:
        prepare_observer(ObserveSpec.from_json(spec.observe), env)
    return env


def _initial_status(spec: JobSpec) -> JobStatusFile:
    """The status as the job starts: what the laptop needs to find and judge it."""
    return JobStatusFile(
        state=protocol.JobState.RUNNING,
        device=spec.device,
        runner_pid=os.getpid(),
        runner_start=procid.identity(os.getpid()),
        mode=spec.mode or "",
        started_at=time.time(),
        heartbeat_at=time.time(),
        command=spec.command,
        session=spec.session,
        relaunched=spec.relaunch or None,
    )


def _open_log(spec: JobSpec, log_path: str) -> int:
    """The log opened for appending (a reader's byte offset stays valid), marked on relaunch."""
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    marker = spec.relaunch.get("marker") if isinstance(spec.relaunch, dict) else None
    if marker:
        # written by this runner only, once: a retried launch finds the job running
        _marker(log_fd, log_path, marker)
    return log_fd


class _Job:
    """One running workload: the watch loop's state (why it was stopped, its memory,
    the disk), kept together so each step of the loop is a method, not a closure."""

    def __init__(
        self,
        spec: JobSpec,
        status: JobStatusFile,
        child: subprocess.Popen[bytes],
        log_fd: int,
    ) -> None:
        self.spec = spec
        self.status = status
        self.status_path = spec.status_path
        self.child = child
        self.log_fd = log_fd
        started = float(status.started_at or time.time())
        #: why the runner stopped the job (``detail`` says more), or None
        self.reason: Optional[str] = None
        self.detail: Optional[str] = None
        #: why the job's tmux session went (the runner stopped it, with no final state)
        self.hangup: Optional[str] = None
        self.memory = JobMemory(spec, started)
        self.disk = DiskWatch(spec.disk) if spec.disk else None
        timeout = spec.timeout
        self.deadline = started + float(timeout or 0) if timeout else None

    def note_child(self, argv: list[str]) -> subprocess.Popen[bytes] | None:
        """Keep the host awake for the child and note who it is; returns caffeinate's process."""
        caffeinate = caffeinate_argv(self.spec, self.child.pid)
        awake = _start_caffeinate(caffeinate)
        if caffeinate:
            self.status.caffeinate = caffeinate
        self.status.child_pid = self.child.pid
        # wipe and cleanup signal this pid only while it is still this very process
        self.status.child_start = procid.identity(self.child.pid)
        self.status.child_argv = argv
        self.status.child_cmdline = procid.cmdline(self.child.pid)
        return awake

    def install_signals(self) -> None:
        """SIGTERM stops the job; SIGHUP too under tmux (its session is gone)."""

        def on_signal(signum: int, _frame: Any) -> None:
            self.reason = "signal %d" % signum
            _terminate(self.child)

        def on_hangup(_signum: int, _frame: Any) -> None:
            # tmux only hangs up a pane when its session is destroyed (kill-session,
            # kill-server), never when a client detaches: the job's home is gone.
            self.hangup = "the tmux session was killed"
            _terminate(self.child, grace=HANGUP_GRACE_S)

        signal.signal(signal.SIGTERM, on_signal)
        if self.spec.mode == "tmux":
            signal.signal(signal.SIGHUP, on_hangup)
        else:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # daemonised: no terminal to lose

    def watch(self) -> int:
        """Wait for the child, sampling memory and disk, beating, enforcing the timeout."""
        next_beat = time.time() + HEARTBEAT_S
        while True:
            try:
                return self.child.wait(timeout=min(DISK_CHECK_S, MEMORY_SAMPLE_S))
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            self.memory.sample(self.child.pid, now)
            if self.disk is not None:
                self._check_disk(self.disk, now)
            if now < next_beat:
                continue
            next_beat = now + HEARTBEAT_S
            self._beat(now)
            if self.deadline and now > self.deadline and self.reason is None:
                self.reason = protocol.JobState.TIMEOUT
                _log(self.log_fd, b"remotemac: timeout reached, stopping the workload\n")
                _terminate(self.child)

    def _check_disk(self, disk: DiskWatch, now: float) -> None:
        """Stop the job on a disk below its floor; note a warning once."""
        why = disk.check(now)
        if why and self.reason is None and self.hangup is None:
            self.reason, self.detail = protocol.JobState.STORAGE_LIMIT, why
            _log(self.log_fd, ("remotemac: %s: stopping the workload\n" % why).encode())
            _terminate(self.child, grace=STORAGE_GRACE_S)
        self.status.disk = disk.report()
        if disk.warning and self.status.disk_warning is None:
            self.status.disk_warning = disk.warning
            _write_status(self.status_path, self.status)

    def _beat(self, now: float) -> None:
        """The heartbeat: the status with the memory so far and the current command line."""
        self.memory.merge()
        self.status.heartbeat_at = now
        self.status.peak_rss_bytes = self.memory.peak
        self.status.processes = self.memory.max_processes
        line = procid.cmdline(self.child.pid)  # the shell may have exec'd the command since
        if line and self.child.poll() is None:
            self.status.child_cmdline = line
        _write_status(self.status_path, self.status)

    def final_state(self, code: int) -> str:
        """The job's final state: the runner's reason to stop it, else its exit code."""
        reason = self.reason
        if reason in (protocol.JobState.TIMEOUT, protocol.JobState.STORAGE_LIMIT):
            return reason
        if reason:
            return protocol.JobState.STOPPED
        return protocol.JobState.FINISHED if code == 0 else protocol.JobState.FAILED

    def finish(self, code: int, env: dict[str, str]) -> str:
        """Write the final status (after converting checkpoints); returns the state."""
        state = self.final_state(code)
        status = self.status
        if state == protocol.JobState.FINISHED and self.spec.convert:
            # before the final state: the orchestrator pulls once it reads "finished"
            status.converted = convert_checkpoints(self.spec, env)
        status.state, status.exit_code = state, code
        status.ended_at = status.heartbeat_at = time.time()
        status.peak_rss_bytes = self.memory.peak
        if self.reason:
            status.reason = self.detail or self.reason
        if self.disk is not None:
            status.disk = self.disk.report()
        _write_status(self.status_path, status)
        return state


#: the converter of pickled checkpoints gets this long (a large model loads slowly)
CONVERT_TIMEOUT_S = 600.0


@dataclass
class ConvertSpec(protocol.Message):
    """The spec's ``convert``: the workload's ``python`` converts the checkpoints below
    ``dir`` that match ``patterns``."""

    python: str = ""
    dir: str = ""
    patterns: Optional[List[str]] = None


def convert_checkpoints(spec: JobSpec, job_env: dict[str, str]) -> JsonObject:
    """Run ckptconvert.py under the workload's interpreter, in the job's directory and
    environment (not observed: it is remotemac's step, not the job's), once the job
    ended: whole-model pickles become tensors here, never unpickled on the laptop.
    ckptconvert's answer (the status file's ``converted``).

    No interpreter is started when no file needs it (ckptconvert.reads_safely_as_is):
    the answer is then the one it would have given."""
    conv = ConvertSpec.from_json(spec.convert or {})
    patterns = conv.patterns or ["**/*"]
    if not _needs_converting(conv.dir, patterns):
        return {"converted": [], "failed": {}}  # no interpreter started for nothing
    env = dict(job_env)
    for var in [k for k in env if k.startswith("REMOTEMAC_OBSERVE")]:
        del env[var]
    site = os.path.join(ObserveSpec.from_json(spec.observe or {}).dir or "\0", "site")
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != site]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        env.pop("PYTHONPATH", None)
    request = json.dumps({"dir": conv.dir, "patterns": patterns})
    try:
        proc = subprocess.run(
            [conv.python, os.path.join(AGENT_DIR, "ckptconvert.py")],
            input=request.encode(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=spec.cwd or None,
            env=env,
            timeout=CONVERT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"converted": [], "failed": {}, "error": str(exc)}
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        return {"converted": [], "failed": {}, "error": "exit %d: %s" % (proc.returncode, tail)}


def _needs_converting(out_dir: str, patterns: list[str]) -> bool:
    """Does a compare rule match a file torch.save may have written (.pt, .pth.tar …)
    that the safe loader may refuse as it is? The files ckptconvert.py leaves alone
    (links, its own copies) are left out, as there.

    Why not start the converter for every checkpoint: it imports the workload's torch,
    2-3 s of a loaded 2-core host after each side's job, to find that a state_dict
    loads as it is (measured on mnist's ``mnist_cnn.pt``: 2.8 s of a 10 s side)."""
    from pathlib import Path

    root = Path(out_dir)
    try:
        for pattern in patterns:
            for path in root.glob(pattern):
                if not path.name.lower().endswith(ckptconvert.TORCH_SUFFIXES):
                    continue
                rel = path.relative_to(root).parts
                if path.is_symlink() or rel[0] == ckptconvert.CONVERTED_DIR:
                    continue
                if path.is_file() and not ckptconvert.reads_safely_as_is(str(path)):
                    return True
    except (OSError, ValueError):
        return False
    return False


def _launch_next(spec: JobSpec, state: str) -> None:
    """Start the next device's job on the host itself, so the chain needs no laptop."""
    nxt = spec.next
    if not nxt or state != protocol.JobState.FINISHED:
        # a reference that failed, timed out or was stopped: the target's result would
        # be compared with nothing; the laptop records it "not launched" and says why
        return
    from . import hostagent

    try:
        hostagent.op_launch(nxt)
    except Exception as exc:  # the orchestrator relaunches on attach
        with open(spec.status_path + ".next-error", "w") as fh:
            fh.write("could not start the next job: %s\n" % exc)


def _terminate(child: subprocess.Popen[bytes], grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the workload's process group, SIGKILL after a grace period."""
    try:
        os.killpg(child.pid, signal.SIGTERM)
    except OSError:
        return

    def kill_later() -> None:
        time.sleep(grace)
        if child.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(child.pid, signal.SIGKILL)

    threading.Thread(target=kill_later, daemon=True).start()


def main(args: list[str]) -> int:
    """``runner SPEC`` (see shared.py): run the job the spec file describes."""
    return run(args[0])
