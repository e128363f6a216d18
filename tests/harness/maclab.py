"""The Mac-shaped lab host: an sshd whose login sees what a rented Mac shows (Simulation).

Why: the bare Linux lab (:mod:`tests.harness.lab`) differs from a Mac exactly where
no test looked (issue 28): name rules of APFS/HFS+, no ``/proc``, BSD ``ps``,
``caffeinate``, launchd over SSH, RAM disks, ``/tmp`` being a symlink. This host
keeps its own Unix user (:data:`MAC_USER`) and root (:data:`MAC_ROOT`), so the
shared Linux lab is untouched, and runs each sshd in its own mount namespace
(``unshare -m``, as root) in which:

(A normal user with passwordless sudo runs it too: exactly the root parts - the
user and dirs, each host's corner, the namespace's root process, stopping and
removing them - run through ``sudo -n`` (:func:`root_argv`), as the same
``python -m tests.harness.maclab`` entry points with their environment given
explicitly, since sudo scrubs it. Without root or such sudo: one LabError line.)


- the session ``HOME`` is a FUSE loopback with HFS+ name rules
  (:mod:`tests.harness.macfs`: case-insensitive, case-preserving, NFD, 1-second
  times), backed by a root-only dir under :data:`MAC_ROOT`;
- ``hdiutil attach -nomount ram://N`` + ``diskutil erasevolume HFS+ NAME /dev/diskN``
  (stand-ins) ask this namespace's root process (the "disk arbitration" below) to
  mount a fresh such volume at ``/Volumes/NAME`` with a block node ``/dev/diskN``
  whose ``st_rdev`` is the volume's ``st_dev``, as the agent checks; ``hdiutil
  detach`` refuses while files are open (``Resource busy``) unless ``-force``;
- ``/proc`` is an empty tmpfs; the real one is bound at a path only the ``ps``
  stand-in reads (also bound over ``/bin/ps``, which the agent calls by path);
- ``/dev`` is a tmpfs with the usual nodes bound in, plus the disks above;
- ``python3`` is the lab's bare 3.9 only (a copy with an absolute RUNPATH: without
  ``/proc`` the loader cannot expand ``$ORIGIN``); Debian's ``/usr/bin/python3*``
  are hidden;
- ``~/tmp`` is a symlink to ``~/private/tmp``, like ``/tmp`` -> ``/private/tmp``;
- ``REMOTEMAC_LAB_DARWIN=1`` makes the agent take its darwin branches (read once,
  in ``remotemac/agent/safefs.py``); ``uname``, ``sw_vers``, ``sysctl``, ``pmset``,
  ``xcode-select`` replay the M1/Sonoma recordings (``shims/replay.py``);
  ``caffeinate``, ``launchctl``, ``mdutil``, ``tmutil`` are stand-ins in
  ``tests/fixtures/macos/maclab/`` (each says what it models and from where).

Entry points: :class:`MacSSHD` (an :class:`~tests.harness.sshd.SSHD` started in
the namespace), and ``python -m tests.harness.maclab init CONFIG`` (the
namespace's root process; run by MacSSHD through ``unshare``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.harness import lab
from tests.harness.sshd import SSHD
from tests.harness.sshd import _session_processes as sshd_sessions

MAC_USER = "rmmac"
MAC_HOME = Path("/home") / MAC_USER
MAC_ROOT = Path("/opt/remotemac-maclab")
MAC_PREFIX = MAC_ROOT / "usr"
MAC_PYTHON = MAC_PREFIX / "bin" / "python3.9"
#: per-sshd stand-in copies and state (readable by the lab user)
MAC_HOSTS = MAC_ROOT / "hosts"
#: per-sshd backing stores of the FUSE volumes (root only: "the disk")
MAC_BACKING = MAC_ROOT / "backing"
MAC_KEYS = MAC_ROOT / "authorized"
#: where the real /proc is bound in each namespace; only the ps stand-in reads it
MAC_PSPROC = MAC_ROOT / "psproc"
#: where the real /dev is bound before /dev is replaced
MAC_DEVSTASH = MAC_ROOT / "devstash"
#: an empty mode-000 file bound over what the host must not have
MAC_ABSENT = MAC_ROOT / "absent"
#: the Debian Pythons the namespace hides (a Mac has none of them)
HIDDEN_PYTHONS = ("/usr/bin/python3", "/usr/bin/python3.11", "/usr/bin/python3-config")
#: inside a namespace: where the lab's own interpreter stays reachable when it is one of
#: HIDDEN_PYTHONS (a venv of the OS Python): in the root-only MAC_BACKING
MAC_OWN_PYTHON = MAC_BACKING / ".lab-python"
#: the session's home dirs per sshd, as the lab's (on the real disk: mount points)
MAC_TOPS = MAC_HOME / "lab"
VOLUMES = Path("/Volumes")
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "macos"
STANDINS = FIXTURES / "maclab"
REPLAYED = ("uname", "sw_vers", "sysctl", "pmset", "xcode-select")
SCENARIO = "m1_sonoma14.json"
_LAYOUT = "2"
_ready = False
_sudo_ok: bool | None = None
#: what the root entry points need of the runner's environment (sudo scrubs it)
_PASSED_ENV = ("PYENV_ROOT", "REMOTEMAC_LAB_USER", "REMOTEMAC_LAB_ROOT")


def root_argv(argv: list[str]) -> list[str]:
    """``argv`` as root: itself when we are root (CI), else behind ``sudo -n``.

    Why not a skip: the README promises the suite passes as a normal user with sudo.
    """
    if os.geteuid() == 0:
        return argv
    global _sudo_ok
    if _sudo_ok is None:
        try:
            _sudo_ok = subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0
        except FileNotFoundError:
            _sudo_ok = False
    if not _sudo_ok:
        raise lab.LabError(
            "maclab: the Mac-shaped lab host needs root or passwordless sudo (`sudo -n true` "
            f"failed): it adds the user {MAC_USER!r} and runs sshd in a mount namespace as root"
        )
    return ["sudo", "-n", *argv]


def _root_python(*args: str) -> list[str]:
    """This module's entry point ``args`` as root, with the environment it needs."""
    env = [f"PYTHONPATH={REPO}"]
    env += [f"{k}={os.environ[k]}" for k in _PASSED_ENV if k in os.environ]
    return root_argv(["env", *env, sys.executable, "-m", "tests.harness.maclab", *args])


def _run_root(*args: str) -> str:
    """Run an entry point as root; its stdout, or a LabError with its last line."""
    proc = subprocess.run(_root_python(*args), capture_output=True, text=True, cwd=str(REPO))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise lab.LabError(f"maclab: `{' '.join(args)}` as root failed: {tail}")
    return proc.stdout.strip()


def mac_ids() -> tuple[int, int]:
    entry = pwd.getpwnam(MAC_USER)
    return entry.pw_uid, entry.pw_gid


# -- set-up (once per machine, idempotent) ----------------------------------------


def ensure_maclab() -> None:
    """The user, the 3.9 copy and the fixed dirs; serialised like the Linux lab."""
    global _ready
    if _ready:
        return
    if os.geteuid() != 0:
        _run_root("setup")
        _ready = True
        return
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd runs as root (sudo too)
    lab.ensure_lab()  # its 3.9 prefix is what we copy (read-only)
    with lab._locked(MAC_ROOT.parent / ".remotemac-maclab.lock"):
        _ensure_user()
        stamp = MAC_ROOT / ".stamp"
        want = f"{_LAYOUT} {lab._stamp_text()}"
        if not (stamp.exists() and stamp.read_text() == want):
            _copy_python()
            stamp.write_text(want)
        for path in (MAC_HOSTS, MAC_KEYS, MAC_PSPROC, MAC_DEVSTASH):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(0o755)
        MAC_PSPROC.chmod(0o711)
        MAC_BACKING.mkdir(mode=0o700, exist_ok=True)
        MAC_OWN_PYTHON.touch(mode=0o700, exist_ok=True)  # a mount point only
        if not MAC_ABSENT.exists():
            MAC_ABSENT.touch()
        MAC_ABSENT.chmod(0)
        VOLUMES.mkdir(mode=0o755, exist_ok=True)  # a mount point only; empty outside
        MAC_TOPS.mkdir(mode=0o755, exist_ok=True)
        os.chown(MAC_TOPS, *mac_ids())
    _ready = True


def _ensure_user() -> None:
    try:
        pwd.getpwnam(MAC_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--home-dir", str(MAC_HOME), "--shell", "/bin/bash"]
            + ["--user-group", MAC_USER],
            check=True,
            capture_output=True,
        )
    subprocess.run(["usermod", "--password", "*", MAC_USER], check=True, capture_output=True)
    uid, gid = mac_ids()
    MAC_HOME.mkdir(mode=0o755, exist_ok=True)
    os.chown(MAC_HOME, uid, gid)
    for name in (".bashrc", ".profile", ".bash_profile", ".bash_logout"):
        (MAC_HOME / name).write_text("")
        os.chown(MAC_HOME / name, uid, gid)


def _copy_python() -> None:
    """The Linux lab's bare 3.9, with RUNPATH made absolute (no /proc: no $ORIGIN)."""
    tmp = MAC_PREFIX.with_name("usr.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bin").mkdir(parents=True)
    (tmp / "lib").mkdir()
    src = lab.LAB_PREFIX
    shutil.copytree(src / "lib" / "python3.9", tmp / "lib" / "python3.9", symlinks=True)
    for lib in (src / "lib").glob("libpython3.9*"):
        shutil.copy2(lib, tmp / "lib" / lib.name, follow_symlinks=False)
    data = (src / "bin" / "python3.9").read_bytes()
    old = b"$ORIGIN/../lib\0"
    at = data.index(old)
    # the lab wrote $ORIGIN/../lib into the slot of pyenv's absolute path, NUL-padded
    slot = len(old)
    while data[at + slot] == 0:
        slot += 1
    new = str(MAC_PREFIX / "lib").encode()
    if len(new) >= slot:
        raise lab.LabError(f"maclab: {new!r} does not fit the RUNPATH slot ({slot} bytes)")
    patched = data[:at] + new + b"\0" * (slot - len(new)) + data[at + slot :]
    (tmp / "bin" / "python3.9").write_bytes(patched)
    (tmp / "bin" / "python3").symlink_to("python3.9")
    pip = (src / "bin" / "pip3.9").read_text().split("\n", 1)[1]
    (tmp / "bin" / "pip3").write_text(f"#!{MAC_PYTHON}\n{pip}")
    for name in ("python3.9", "pip3"):
        (tmp / "bin" / name).chmod(0o755)
    lab._chmod_readable(tmp)
    shutil.rmtree(MAC_PREFIX, ignore_errors=True)
    tmp.rename(MAC_PREFIX)


# -- one host ------------------------------------------------------------------------


class MacHost:
    """One sshd's corner: session dirs, stand-in copies, backing stores."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.top = MAC_TOPS / name
        self.home = self.top / "home"
        self.tmux_dir = self.top / "tmux"
        self.bin = MAC_HOSTS / name / "bin"
        self.state = MAC_HOSTS / name / "state"
        self.backing = MAC_BACKING / name
        self.socket = MAC_HOSTS / name / "da.sock"
        self.config = MAC_HOSTS / name / "init.json"

    @classmethod
    def create(cls) -> MacHost:
        ensure_maclab()
        if os.geteuid() != 0:
            return cls(_run_root("create", str(os.getuid())))
        return cls.create_here()

    @classmethod
    def create_here(cls, owner: int | None = None) -> MacHost:
        """As root; ``owner``: the sudo caller, who writes the config and key files."""
        uid, gid = mac_ids()
        host = cls(os.path.basename(lab._mkdtemp(MAC_TOPS)))
        for path in (host.top, host.home, host.tmux_dir):
            path.mkdir(mode=0o700, exist_ok=True)
            os.chown(path, uid, gid)
        (MAC_HOSTS / host.name).mkdir(mode=0o755)
        host.state.mkdir(mode=0o700)
        os.chown(host.state, uid, gid)
        (host.backing / "home").mkdir(parents=True, mode=0o700)
        os.chown(host.backing / "home", uid, gid)
        host._install_standins()
        if owner is not None:
            for path in (host.config, MAC_KEYS / f"{host.name}.pub"):
                path.touch(mode=0o644)
                os.chown(path, owner, -1)
        return host

    def _install_standins(self) -> None:
        macos = MAC_HOSTS / self.name / "macos"
        shutil.copytree(FIXTURES, macos, ignore=shutil.ignore_patterns("maclab", "__pycache__"))
        self.bin.mkdir()
        cfg = {
            "socket": str(self.socket),
            "proc": str(MAC_PSPROC),
            "state": str(self.state),
            "samples": str(macos),
        }
        (self.bin / "maclab.json").write_text(json.dumps(cfg))
        for src in STANDINS.iterdir():
            if src.name.endswith(".py") or src.name.startswith(("_", ".")):
                if src.name == "_standin.py":
                    shutil.copy(src, self.bin / src.name)
                continue
            text = src.read_text()
            first, _, rest = text.partition("\n")
            # bound over /bin/ps too: find _standin.py by this host's bin dir, not __file__
            rest = rest.replace(
                "os.path.dirname(os.path.abspath(__file__))", repr(str(self.bin)), 1
            )
            (self.bin / src.name).write_text(f"#!{MAC_PYTHON} -S\n{rest}")
        scenario = macos / "shims" / "scenarios" / SCENARIO
        for name in REPLAYED:
            (self.bin / name).write_text(
                "#!/bin/sh\n# Simulation: replays the M1/Sonoma recordings (shims/replay.py)\n"
                f"REMOTEMAC_SHIM_DIR={macos / 'shims'} REMOTEMAC_SHIM_SCENARIO={scenario} "
                f'exec {MAC_PYTHON} -S {macos / "shims" / "replay.py"} {name} "$@"\n'
            )
        for path in self.bin.iterdir():
            path.chmod(0o755)
        lab._chmod_readable(MAC_HOSTS / self.name)
        os.chown(self.state, *mac_ids())
        self.state.chmod(0o700)

    def session_env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}:{MAC_PREFIX / 'bin'}:/usr/bin:/bin",
            "HOME": str(self.home),
            "TMUX_TMPDIR": str(self.tmux_dir),
            "REMOTEMAC_LAB_DARWIN": "1",
        }

    def read_state(self, name: str) -> str:
        """A stand-in's log in the host's state dir (the lab user's: root reads it)."""
        path = self.state / name
        if os.geteuid() == 0:
            return path.read_text()
        return subprocess.run(
            root_argv(["cat", str(path)]), capture_output=True, text=True, check=True
        ).stdout

    def remove(self) -> None:
        if os.geteuid() != 0:
            _run_root("remove", self.name)  # with the key file, in a root-owned dir
            return
        for sock in self.tmux_dir.glob("tmux-*/*"):
            with contextlib.suppress(Exception):
                subprocess.run(
                    ["tmux", "-S", str(sock), "kill-server"],
                    user=mac_ids()[0],
                    capture_output=True,
                    timeout=10,
                )
        for _ in range(20):
            if not _kill_user_processes(mac_ids()[0], [str(self.top), str(MAC_HOSTS / self.name)]):
                break
            time.sleep(0.1)
        shutil.rmtree(self.top, ignore_errors=True)
        shutil.rmtree(MAC_HOSTS / self.name, ignore_errors=True)
        shutil.rmtree(self.backing, ignore_errors=True)


def _kill_user_processes(uid: int, prefixes: list[str]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            cwd = os.readlink(entry / "cwd")
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any((cwd + "/").startswith(p + "/") or p + "/" in cmd for p in prefixes):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
                found.append(int(entry.name))
    return found


class MacSSHD(SSHD):
    """An OpenSSH sshd whose sessions see the Mac-shaped host (module docstring)."""

    def __init__(self, workdir: Path | None = None, **kwargs: object) -> None:
        kwargs.setdefault("user", MAC_USER)
        super().__init__(workdir, **kwargs)  # type: ignore[arg-type]
        self.lab = False
        self.mac = MacHost.create()

    @property
    def home(self) -> Path:
        return self.mac.home

    @property
    def tmux_dir(self) -> Path:
        return self.mac.tmux_dir

    @property
    def dirs(self) -> lab.HostDirs:  # type: ignore[override]
        return lab.HostDirs(self.mac.top)

    @property
    def symlinked_dir(self) -> Path:
        """``~/tmp``, a symlink to ``~/private/tmp`` (as ``/tmp`` on a Mac)."""
        return self.mac.home / "tmp"

    def session_env(self) -> dict[str, str]:
        env = self.mac.session_env()
        for line in self.extra_config:
            words = line.split()
            if words and words[0].lower() == "setenv":
                env.update(word.split("=", 1) for word in words[1:])  # type: ignore[misc]
        return env

    def _authorized_keys_path(self) -> Path:
        return MAC_KEYS / f"{self.mac.name}.pub"

    def host_path(self, path: Path | str) -> Path:
        """Where a path of the host's HOME lives on this machine's disk (NFD names)."""
        rel = Path(path).relative_to(self.mac.home)
        return self.mac.backing / "home" / rel

    def in_namespace(self, argv: list[str], *, as_user: bool = True) -> list[str]:
        """``argv`` wrapped to run inside this host's mount namespace (as its user)."""
        if self.proc is None:
            raise RuntimeError("the Mac-shaped host is not running")
        prefix = root_argv(["nsenter", "-t", str(self._init_pid()), "-m", "--"])
        if as_user:
            uid, gid = mac_ids()
            prefix += ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        return prefix + argv

    def run_as_user(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        kwargs.setdefault("check", False)
        env = {"LANG": "C.UTF-8", "USER": MAC_USER, "LOGNAME": MAC_USER, **self.session_env()}
        return subprocess.run(  # type: ignore[call-overload]
            self.in_namespace(["env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]),
            capture_output=True,
            text=True,
            **kwargs,
        )

    def _init_pid(self) -> int:
        """The namespace's root process: ``proc`` itself, or (sudo) its descendant."""
        assert self.proc is not None
        if os.geteuid() == 0:
            return self.proc.pid
        frontier = [self.proc.pid]
        while frontier:
            pid = frontier.pop()
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if argv[1:4] == [b"-m", b"tests.harness.maclab", b"init"]:
                    return pid
            with contextlib.suppress(OSError):
                frontier += map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        raise RuntimeError("the Mac-shaped host's root process is gone")

    def stop(self, *, kill_sessions: bool = True) -> None:
        """As :meth:`SSHD.stop`; through sudo the root processes get their signals by it."""
        if os.geteuid() != 0 and self.proc is not None:
            with contextlib.suppress(RuntimeError):
                init_pid = self._init_pid()
                pids = sshd_sessions(init_pid) if kill_sessions else []
                if pids:
                    subprocess.run(root_argv(["kill", "-KILL", *map(str, pids)]), check=False)
                subprocess.run(root_argv(["kill", "-TERM", str(init_pid)]), check=False)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=5)
            kill_sessions = False
        super().stop(kill_sessions=kill_sessions)

    def start(self, port: int | None = None, timeout: float = 20.0) -> SSHD:
        as_root = _root_python("init", str(self.mac.config), "--")
        if os.geteuid() != 0:  # sudo -n env VARS unshare … python -m tests.harness.maclab
            at = as_root.index(sys.executable)
            self._launch_prefix = [*as_root[:at], "unshare", "-m", "--propagation", "private"]
            self._launch_prefix += as_root[at:]
            return super().start(port, timeout)
        self._launch_prefix = [
            "unshare",
            "-m",
            "--propagation",
            "private",
            sys.executable,
            "-m",
            "tests.harness.maclab",
            "init",
            str(self.mac.config),
            "--",
        ]
        return super().start(port, timeout)

    def _popen_argv(self) -> list[str]:
        self.mac.config.write_text(
            json.dumps(
                {
                    "name": self.mac.name,
                    "home": str(self.mac.home),
                    "backing": str(self.mac.backing),
                    "socket": str(self.mac.socket),
                    "standins": str(self.mac.bin),
                }
            )
        )
        return [*self._launch_prefix, *super()._popen_argv()]

    def cleanup(self) -> None:
        self.stop()
        self.mac.remove()
        self._authorized_keys_path().unlink(missing_ok=True)
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


# -- inside the namespace: the host's root process -------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
MNT_FORCE, MNT_DETACH = 1, 2


def _mount(argv: list[str]) -> None:
    subprocess.run(["mount", *argv], check=True, capture_output=True)


def _umount(path: str, flags: int = 0) -> int:
    """0, or the errno of umount2 (EBUSY: files are open)."""
    if _libc.umount2(path.encode(), flags) != 0:
        return ctypes.get_errno()
    return 0


#: what ``_fuse`` execs: None (sys.executable), or MAC_OWN_PYTHON (see _keep_own_python)
_own_python: str | None = None


def _keep_own_python() -> None:
    """Before HIDDEN_PYTHONS go: bind this interpreter's binary at MAC_OWN_PYTHON if it
    is one of them, so the FUSE daemons of RAM disks made later still start.

    Why: as a normal user the lab runs from the contributor's venv, whose ``python`` is
    a symlink to ``/usr/bin/python3.11``; hidden, it is a mode-000 file ("Permission
    denied"), and ``diskutil erasevolume`` failed. The daemon keeps ``sys.executable``
    as its argv[0], so Python still finds the venv (pyvenv.cfg) and its fusepy.
    """
    global _own_python
    real = os.path.realpath(sys.executable)
    if real in {os.path.realpath(h) for h in HIDDEN_PYTHONS if os.path.lexists(h)}:
        _mount(["--bind", real, str(MAC_OWN_PYTHON)])
        _own_python = str(MAC_OWN_PYTHON)


def _fuse(backing: str, mountpoint: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.macfs", backing, mountpoint],
        executable=_own_python,
        stdin=subprocess.DEVNULL,
        cwd=str(REPO),
    )
    for _ in range(200):
        if os.path.ismount(mountpoint):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.025)
    raise RuntimeError(f"macfs did not mount {mountpoint}")


class DiskArbitration:
    """Mounts RAM-disk volumes for the hdiutil/diskutil stand-ins (a root service, as
    diskarbitrationd is): one JSON request per connection on a Unix socket."""

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.next = 4  # the first RAM disk is /dev/disk4 on the recorded machines
        self.disks: dict[str, dict] = {}
        self.lock = threading.Lock()

    def serve(self) -> None:
        path = self.cfg["socket"]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        os.chmod(path, 0o666)
        srv.listen(16)
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            uid = int.from_bytes(creds[4:8], "little")
            gid = int.from_bytes(creds[8:12], "little")
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            try:
                req = json.loads(data)
                with self.lock:
                    answer = getattr(self, "op_" + req["op"])(req, uid, gid)
            except Exception as exc:  # noqa: BLE001 - the stand-in prints it
                answer = {"error": f"{type(exc).__name__}: {exc}"}
            conn.sendall(json.dumps(answer).encode() + b"\n")

    def op_attach(self, req: dict, uid: int, gid: int) -> dict:
        device = f"/dev/disk{self.next}"
        self.next += 1
        os.mknod(device, 0o640 | stat.S_IFBLK, os.makedev(1, 200 + self.next))
        self.disks[device] = {"sectors": int(req["sectors"]), "uid": uid, "mount": None}
        return {"device": device}

    def op_erase(self, req: dict, uid: int, gid: int) -> dict:
        device = req["device"]
        disk = self.disks.get(device)
        if disk is None:
            return {"error": f"Could not find disk: {device}", "code": 1}
        if disk["mount"]:
            self._unmount(device, force=True)
        name = req["name"]
        mount = VOLUMES / name
        mount.mkdir(exist_ok=True)
        backing = Path(self.cfg["backing"]) / device.rsplit("/", 1)[-1]
        shutil.rmtree(backing, ignore_errors=True)
        backing.mkdir(mode=0o755)
        os.chown(backing, uid, gid)
        disk["proc"] = _fuse(str(backing), str(mount))
        disk["mount"] = str(mount)
        disk["backing"] = str(backing)
        os.unlink(device)
        dev = os.stat(mount).st_dev
        os.mknod(device, 0o640 | stat.S_IFBLK, dev)
        os.mknod(device + "s1", 0o640 | stat.S_IFBLK, dev)
        return {"mount": str(mount), "disk": device.rsplit("/", 1)[-1]}

    def _unmount(self, device: str, force: bool) -> int:
        disk = self.disks[device]
        if not disk.get("mount"):
            return 0
        err = _umount(disk["mount"], (MNT_FORCE | MNT_DETACH) if force else 0)
        if err:
            return err
        with contextlib.suppress(Exception):
            disk["proc"].wait(timeout=10)
        with contextlib.suppress(OSError):
            os.rmdir(disk["mount"])
        disk["mount"] = None
        return 0

    def op_unmount(self, req: dict, uid: int, gid: int) -> dict:
        device = self._device_of(req["target"])
        if device is None:
            return {"error": "not found", "code": 1}
        err = self._unmount(device, bool(req.get("force")))
        return {"busy": True} if err else {"device": device}

    def op_detach(self, req: dict, uid: int, gid: int) -> dict:
        device = self._device_of(req["target"])
        if device is None:
            return {"error": "no such image", "code": 1}
        err = self._unmount(device, bool(req.get("force")))
        if err:
            return {"busy": True}
        disk = self.disks.pop(device)
        for node in (device, device + "s1"):
            with contextlib.suppress(OSError):
                os.unlink(node)
        shutil.rmtree(disk.get("backing") or "/nonexistent", ignore_errors=True)
        return {"device": device}

    def _device_of(self, target: str) -> str | None:
        if target in self.disks:
            return target
        for device, disk in self.disks.items():
            if disk.get("mount") and os.path.normpath(target) == disk["mount"]:
                return device
        return None

    def op_list(self, req: dict, uid: int, gid: int) -> dict:
        return {d: {"mount": v.get("mount")} for d, v in self.disks.items()}

    def shutdown(self) -> None:
        for device in list(self.disks):
            with contextlib.suppress(Exception):
                self._unmount(device, force=True)


def _replace_dev() -> None:
    """/dev as a tmpfs holding the nodes a session needs, so RAM disks get /dev/diskN."""
    _mount(["--rbind", "/dev", str(MAC_DEVSTASH)])
    _mount(["-t", "tmpfs", "-o", "mode=755,size=1m", "maclab-dev", "/dev"])
    for name in ("null", "zero", "full", "random", "urandom", "tty", "fuse"):
        (Path("/dev") / name).touch()
        _mount(["--bind", str(MAC_DEVSTASH / name), f"/dev/{name}"])
    Path("/dev/shm").mkdir()
    _mount(["--rbind", str(MAC_DEVSTASH / "shm"), "/dev/shm"])
    # a devpts of its own: /dev/ptmx finds its instance as the sibling "pts" of itself
    Path("/dev/pts").mkdir()
    _mount(["-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620", "devpts", "/dev/pts"])
    for name, target in (
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"/dev/{name}")
    _umount(str(MAC_DEVSTASH), MNT_DETACH)


def init(config_path: str, sshd_argv: list[str]) -> int:
    """The namespace's root process: mounts, disk arbitration, then sshd as a child."""
    cfg = json.loads(Path(config_path).read_text())
    uid, gid = mac_ids()
    home_fs = _fuse(str(Path(cfg["backing"]) / "home"), cfg["home"])
    # ~/tmp -> ~/private/tmp, as /tmp -> /private/tmp on a Mac
    private = Path(cfg["home"]) / "private" / "tmp"
    private.mkdir(parents=True)
    os.chown(private.parent, uid, gid)
    os.chown(private, uid, gid)
    os.symlink("private/tmp", Path(cfg["home"]) / "tmp")
    os.lchown(Path(cfg["home"]) / "tmp", uid, gid)
    _mount(["-t", "tmpfs", "-o", "mode=755,size=1m", "maclab-volumes", str(VOLUMES)])
    _mount(["--bind", "/proc", str(MAC_PSPROC)])
    _replace_dev()
    _keep_own_python()
    for hidden in HIDDEN_PYTHONS:
        if os.path.lexists(hidden):
            _mount(["--bind", str(MAC_ABSENT), hidden])
    _mount(["--bind", str(Path(cfg["standins"]) / "ps"), "/usr/bin/ps"])
    _mount(["-t", "tmpfs", "-o", "mode=555,size=64k", "maclab-noproc", "/proc"])
    arbiter = DiskArbitration(cfg)
    threading.Thread(target=arbiter.serve, daemon=True).start()
    for _ in range(100):
        if os.path.exists(cfg["socket"]):
            break
        time.sleep(0.01)
    sshd = subprocess.Popen(sshd_argv)

    def stop(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            sshd.terminate()

    signal.signal(signal.SIGTERM, stop)
    code = sshd.wait()
    arbiter.shutdown()
    _umount(cfg["home"], MNT_DETACH)
    with contextlib.suppress(Exception):
        home_fs.wait(timeout=5)
    return code


if __name__ == "__main__":
    if sys.argv[1] == "init":
        split = sys.argv.index("--")
        sys.exit(init(sys.argv[2], sys.argv[split + 1 :]))
    # the root parts a sudo caller asks for (root_argv): set-up, one host, its removal
    if sys.argv[1] == "setup":
        sys.exit(ensure_maclab())
    if sys.argv[1] == "create":
        print(MacHost.create_here(owner=int(sys.argv[2])).name)
        sys.exit(0)
    if sys.argv[1] == "remove":
        MacHost(sys.argv[2]).remove()
        (MAC_KEYS / f"{sys.argv[2]}.pub").unlink(missing_ok=True)
        sys.exit(0)
    sys.exit(f"usage: {sys.argv[0]} init CONFIG -- SSHD-ARGV | setup | create UID | remove NAME")
