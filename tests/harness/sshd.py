"""Start a real Debian OpenSSH sshd on a random loopback port, for tests.

Why a real sshd: the SPEC's promises (strict host keys, reconnects, SFTP) are
about how remotemac behaves against OpenSSH, so tests talk to OpenSSH itself,
not to a Python stand-in. Each instance lives in its own temp dir with its own
host key; the client key is shared per test session (one ``ssh-keygen`` call)
unless a test asks for its own. Start-up is about 0.1 s.

By default the login is the fresh-host lab's user (:mod:`tests.harness.lab`): a
host as a rental delivers it, with only a bare Python 3.9 as ``python3``. Each
instance gets its own session ``HOME`` and tmux socket dir under that user's home
(``sshd.home``, ``sshd.tmux_dir``), removed by :meth:`SSHD.cleanup`.
``user=getpass.getuser()`` logs in as the test runner instead (root in CI: not a
bare host, since root's shell start-up puts pyenv first).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.harness import lab

SSHD_BIN = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class ClientKey:
    """An unencrypted ed25519 client key pair the test sshd accepts."""

    private: Path
    public: Path

    @classmethod
    def generate(cls, directory: Path, name: str = "id_ed25519", passphrase: str = "") -> ClientKey:
        directory.mkdir(parents=True, exist_ok=True)
        private = directory / name
        _keygen(private, passphrase=passphrase, comment="remotemac-test-client")
        return cls(private=private, public=Path(f"{private}.pub"))


def _keygen(path: Path, *, passphrase: str = "", comment: str = "") -> None:
    for stale in (path, Path(f"{path}.pub")):
        stale.unlink(missing_ok=True)
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", passphrase, "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    path.chmod(0o600)


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def fingerprint_of(pubkey_path: Path) -> str:
    """``SHA256:...`` of a public key file, as ``ssh-keygen -l`` prints it."""
    out = subprocess.run(
        [SSH_KEYGEN, "-l", "-E", "sha256", "-f", str(pubkey_path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[1]


class SSHD:
    """One OpenSSH server in the foreground (``-D -e``) with its own temp dir.

    ``sftp=False`` leaves out the sftp subsystem (to test that error);
    ``extra_config`` lines are appended to sshd_config verbatim, except ``SetEnv``
    lines, which are merged into one after the lab's (sshd honours only the first
    ``SetEnv`` line; a test's variable overrides the lab's of the same name).
    ``user`` is the login; None means the lab user.
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        client_key: ClientKey | None = None,
        sftp: bool = True,
        extra_config: list[str] | tuple[str, ...] = (),
        host: str = LOOPBACK,
        user: str | None = None,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rm-sshd-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host = host
        self.lab = user is None or user == lab.LAB_USER
        self.user = lab.LAB_USER if self.lab else (user or getpass.getuser())
        self._dirs: lab.HostDirs | None = None
        self.sftp = sftp
        self.extra_config = list(extra_config)
        self.client_key = client_key or ClientKey.generate(self.workdir / "client")
        self.host_key = self.workdir / "ssh_host_ed25519_key"
        self.config_path = self.workdir / "sshd_config"
        self.log_path = self.workdir / "sshd.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.generations = 0
        _keygen(self.host_key, comment="remotemac-test-host")

    # -- lifecycle -----------------------------------------------------------------

    def start(self, port: int | None = None, timeout: float = 10.0) -> SSHD:
        """Start sshd and return once it answers with its SSH banner."""
        if self.proc is not None:
            raise RuntimeError("sshd already running")
        if os.geteuid() == 0:
            # privilege separation needs this empty dir when sshd runs as root
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        authorized = self._authorized_keys_path()
        authorized.write_bytes(self.client_key.public.read_bytes())
        attempts = 1 if port else 5
        last_log = ""
        for _ in range(attempts):
            self.port = port or free_port(self.host)
            self._write_config(authorized)
            log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
            try:
                self.proc = subprocess.Popen(
                    self._popen_argv(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                )
            finally:
                log.close()
            if self._wait_ready(timeout):
                self.generations += 1
                return self
            last_log = self.log_path.read_text(errors="replace")[-2000:]
            self._kill()
        raise RuntimeError(f"sshd did not start on {self.host}:{self.port}: {last_log}")

    def stop(self, *, kill_sessions: bool = True) -> None:
        """Stop sshd; with ``kill_sessions`` also every connection it was serving.

        Without it, open sessions survive, as on a real host when sshd restarts.
        """
        if kill_sessions and self.proc is not None:
            for pid in _session_processes(self.proc.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._kill()

    def restart(self, *, new_host_key: bool = False, kill_sessions: bool = True) -> SSHD:
        """Restart on the same port, optionally with a freshly generated host key."""
        port = self.port
        self.stop(kill_sessions=kill_sessions)
        if new_host_key:
            _keygen(self.host_key, comment="remotemac-test-host-rotated")
        return self.start(port=port)

    def cleanup(self) -> None:
        """Stop sshd, the host's tmux server and leftovers; remove its host dirs."""
        self.stop()
        if self.lab and self._dirs is not None:
            self._dirs.remove()
            self._authorized_keys_path().unlink(missing_ok=True)
        elif self._dirs is not None:
            self.tmux("kill-server")
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> SSHD:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- facts tests need ----------------------------------------------------------

    @property
    def spec(self) -> str:
        """``user@127.0.0.1:port``: the host spec remotemac accepts."""
        return f"{self.user}@{self.host}:{self.port}"

    @property
    def dirs(self) -> lab.HostDirs:
        """This host's dirs, made on first use (an sshd never started leaves nothing)."""
        if self._dirs is None:
            if self.lab:
                self._dirs = lab.HostDirs.create()
            else:
                self._dirs = lab.HostDirs(self.workdir / "host")
                for path in (self._dirs.home, self._dirs.tmux_dir):
                    path.mkdir(parents=True, exist_ok=True)
        return self._dirs

    @property
    def home(self) -> Path:
        """The session's ``HOME`` on the host: put ``remote_root`` under it."""
        return self.dirs.home

    @property
    def tmux_dir(self) -> Path:
        """The session's ``TMUX_TMPDIR``: this host's own tmux server lives here."""
        return self.dirs.tmux_dir

    @property
    def authorized_keys(self) -> Path:
        """The file sshd takes client keys from (empty it to revoke the key)."""
        return self._authorized_keys_path()

    def host_dir(self, name: str) -> Path:
        """A dir beside ``home`` that the login can write (a canary, a second root)."""
        path = self.dirs.top / name
        path.mkdir(exist_ok=True)
        if self.lab:
            os.chown(path, *lab.lab_ids())
        return path

    def session_env(self) -> dict[str, str]:
        """What sshd sets for every session of this host (its merged ``SetEnv``)."""
        env = {**lab.session_env(), "HOME": str(self.home)} if self.lab else {}
        env["TMUX_TMPDIR"] = str(self.tmux_dir)
        for line in self.extra_config:
            words = line.split()
            if words and words[0].lower() == "setenv":
                env.update(word.split("=", 1) for word in words[1:])  # type: ignore[misc]
        return env

    def run_as_user(self, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        """Run ``argv`` on this machine as the login user, with the session's environment
        (e.g. to look at the host's tmux server as the host sees it)."""
        kwargs.setdefault("check", False)
        if self.lab:
            return lab.run_as_lab(argv, env=self.session_env(), **kwargs)  # type: ignore[arg-type]
        env = {**os.environ, **self.session_env()}
        env.pop("TMUX", None)
        return subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,  # noqa: PLW1510
            **kwargs,
        )  # type: ignore[call-overload]

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        """``tmux ARGS`` against this host's tmux server, as the login user."""
        return self.run_as_user(["tmux", *args])

    @property
    def host_pubkey(self) -> Path:
        return Path(f"{self.host_key}.pub")

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(self.host_pubkey)

    def known_hosts_line(self, name: str | None = None) -> str:
        """A known_hosts line for this sshd (``[host]:port`` form, as ssh writes it)."""
        name = name or (self.host if self.port == 22 else f"[{self.host}]:{self.port}")
        keytype, blob = self.host_pubkey.read_text().split()[:2]
        return f"{name} {keytype} {blob}\n"

    def write_known_hosts(self, path: Path, *, append: bool = True) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a" if append else "w") as fh:
            fh.write(self.known_hosts_line())
        return path

    def ssh_config_block(
        self,
        alias: str,
        *,
        known_hosts: Path | None = None,
        port: int | None = None,
        extra: dict[str, str] | None = None,
    ) -> str:
        """One ``Host`` block reaching this sshd (``port`` overrides, e.g. a proxy's)."""
        lines = [
            f"Host {alias}",
            f"  HostName {self.host}",
            f"  Port {port or self.port}",
            f"  User {self.user}",
            f"  IdentityFile {self.client_key.private}",
            "  IdentitiesOnly yes",
            "  StrictHostKeyChecking yes",
        ]
        if known_hosts is not None:
            lines.append(f"  UserKnownHostsFile {known_hosts}")
        for key, value in (extra or {}).items():
            lines.append(f"  {key} {value}")
        return "\n".join(lines) + "\n"

    def write_ssh_config(self, path: Path, alias: str = "testhost", **kwargs: object) -> Path:
        """Write (append) an ssh_config file with one ``Host alias`` block for this sshd."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as fh:
            fh.write(self.ssh_config_block(alias, **kwargs))  # type: ignore[arg-type]
        return path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # -- internals -----------------------------------------------------------------

    def _write_config(self, authorized: Path) -> None:
        lines = [
            f"Port {self.port}",
            f"ListenAddress {self.host}",
            f"HostKey {self.host_key}",
            f"PidFile {self.workdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {authorized}",
            "StrictModes no",
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "AllowTcpForwarding yes",
            "X11Forwarding no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "MaxStartups 100:30:200",
            "LogLevel VERBOSE",
        ]
        if self.sftp:
            lines.append("Subsystem sftp internal-sftp")
        env = self.session_env()
        if env:
            lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()))
        lines.extend(
            x
            for x in self.extra_config
            if x.split()[:1] != ["SetEnv"] and x.split()[:1] != ["setenv"]
        )
        self.config_path.write_text("\n".join(lines) + "\n")

    def _popen_argv(self) -> list[str]:
        """What starts this sshd (the Mac-shaped host wraps it in its namespace)."""
        return [SSHD_BIN, "-D", "-e", "-f", str(self.config_path)]

    def _authorized_keys_path(self) -> Path:
        """sshd reads authorized_keys as the login user: the lab's live where it can."""
        if self.lab:
            return lab.LAB_KEYS / f"{self.dirs.top.name}.pub"
        return self.workdir / "authorized_keys"

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0) as sock:
                    if sock.recv(8).startswith(b"SSH-"):
                        return True
            except OSError:
                time.sleep(0.01)
        return False

    def _kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _session_processes(pid: int) -> list[int]:
    """sshd's per-connection processes below ``pid``, at any depth, from /proc.

    For a non-root login privilege separation puts the session's network process
    (running as the user) under a root monitor: killing only the monitor would leave
    the connection up. A session's own commands are left alone (their connection
    going away is what ends them, as on a real host).
    """
    parent_of: dict[int, int] = {}
    name_of: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            head, tail = (entry / "stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        parent_of[int(entry.name)] = int(tail.split()[1])
        name_of[int(entry.name)] = head.split("(", 1)[1]
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        for child, parent in parent_of.items():
            if parent == current and name_of.get(child) == "sshd":
                found.append(child)
                frontier.append(child)
    return found


def start_sshd(workdir: Path | None = None, **kwargs: object) -> SSHD:
    """Create and start an :class:`SSHD` (see its arguments)."""
    return SSHD(workdir, **kwargs).start()  # type: ignore[arg-type]
