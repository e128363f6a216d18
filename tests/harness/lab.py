"""The fresh-host lab: the test sshd's login is a host as a rental delivers it.

Why: a rented Mac has only the OS's ``/usr/bin/python3`` (3.9, no third-party
module). A test whose "host" is the laptop's own venv (torch, cryptography, yaml
all importable) cannot see what breaks on a real host. So every test over sshd
logs in as a separate Unix user, :data:`LAB_USER`, whose session sees:

- ``python3`` / ``python3.9``: a copy of pyenv's Python 3.9 with only pip and
  setuptools (Debian's ``/usr/bin/python3`` carries ``python3-cryptography``, so it
  is no model of a Mac);
- no other Python: the default session's ``PATH=<bare bin>:/usr/bin:/bin`` (set by
  the fixture's sshd_config ``SetEnv``) starts with :data:`LAB_BARE_BIN`, which holds
  only ``python3``/``python3.9``/``pip3``; and ``REMOTEMAC_PYTHON_PATH`` names only that
  dir as where interpreters live, because this Debian machine's own
  ``/usr/bin/python3.11`` cannot be hidden from a session that needs ``/usr/bin``
  (on a Mac ``/usr/bin`` holds only the CLT's 3.9). Empty shell start-up files, so
  nothing of the test venv or /root/.pyenv leaks in;
- ``python3.11``: a bare copy of pyenv's 3.11 (stdlib, pip, setuptools) in the lab
  prefix, standing in for a Homebrew ``python3.11`` the user installed. Only a
  session with :func:`preinstalled_python_env` sees it (tests about a host that has
  the Python already, named so); the default host has only 3.9, as a rental does.

The copies live under :data:`LAB_ROOT` (``/root`` is 0700: the lab user could not
read pyenv's own tree). Their ``RUNPATH`` is rewritten to ``$ORIGIN/../lib`` so
they find their ``libpython`` anywhere (venvs, tmux jobs) without
``LD_LIBRARY_PATH``, as ``/usr/bin/python3`` does on a Mac.

Set-up is idempotent, needs root, and is serialised by a lock file so parallel
test sessions on one machine do not race. A stamp records the layout version.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.harness import ramstores


def _lab_user() -> str:
    """``$REMOTEMAC_LAB_USER``, else ``rmhost`` as root and the runner itself otherwise."""
    return os.environ.get("REMOTEMAC_LAB_USER") or ("rmhost" if os.geteuid() == 0 else _me())


def _me() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _lab_root() -> Path:
    """``$REMOTEMAC_LAB_ROOT``, else /opt/remotemac-lab as root, else a dir in the cache."""
    if os.environ.get("REMOTEMAC_LAB_ROOT"):
        return Path(os.environ["REMOTEMAC_LAB_ROOT"])
    if os.geteuid() == 0:
        return Path("/opt/remotemac-lab")
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "remotemac-lab"


LAB_USER = _lab_user()
#: the login is the runner itself (no root to add a user): sshd runs as that user and
#: the session's environment is scrubbed (SetEnv PATH/HOME, empty start-up files)
SAME_USER = _me() == LAB_USER
LAB_ROOT = _lab_root()
LAB_HOME = LAB_ROOT / "home" if SAME_USER else Path("/home") / LAB_USER
#: one prefix holding both interpreters, like /usr
LAB_PREFIX = LAB_ROOT / "usr"
LAB_BIN = LAB_PREFIX / "bin"
#: per-sshd dirs (session HOME, tmux sockets) live here, owned by the lab user
LAB_HOSTS = LAB_HOME / "lab"
#: authorized_keys files: sshd reads them as the login user, so not under root's /tmp
LAB_KEYS = LAB_ROOT / "authorized"
LAB_VENVS = LAB_ROOT / "venvs"
#: what the default session sees: only the 3.9, through wrappers (a Mac's
#: ``/usr/bin/python3`` is itself a shim that runs the CLT's interpreter)
LAB_BARE_BIN = LAB_ROOT / "bare-bin"
LAB_PATH = f"{LAB_BARE_BIN}:/usr/bin:/bin"
#: a host where the user installed a python3.11 (Homebrew on a Mac)
PREINSTALLED_PATH = f"{LAB_BIN}:/usr/bin:/bin"
BARE_NAMES = ("python3", "python3.9", "pip3", "pip3.9")
#: wheels on this machine's disk (torch's CPU build): pip looks here before the index
WHEELS = Path("/opt/wheels")
#: bump when the layout changes: a stale lab is rebuilt
LAB_VERSION = "4"
HOST_TORCH_REQUIREMENTS = ("torch==2.13.0", "numpy")
#: what may stay in a copied interpreter's site-packages (what python.org/Homebrew ship)
KEEP_SITE = re.compile(
    r"^(pip|setuptools|_distutils_hack|pkg_resources|distutils-precedence\.pth"
    r"|README\.txt)([-.].*)?$"
)
_ready = False


class LabError(RuntimeError):
    """The lab cannot be set up, or it is not bare."""


def pyenv_root() -> Path:
    """``$PYENV_ROOT``, else the runner's own ``~/.pyenv`` (a contributor's pyenv, on
    PATH or not), else root's (CI: ``/root/.pyenv``)."""
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    mine = Path.home() / ".pyenv"
    return mine if mine.is_dir() else Path("/root/.pyenv")


def pyenv_version(minor: str) -> Path:
    """The newest pyenv install of ``minor`` (e.g. ``3.9``)."""
    found = sorted(
        glob.glob(str(pyenv_root() / "versions" / f"{minor}.*")),
        key=lambda p: [int(x) for x in Path(p).name.split(".") if x.isdigit()],
    )
    found = [p for p in found if re.fullmatch(rf"{re.escape(minor)}\.\d+", Path(p).name)]
    if not found:
        raise LabError(
            f"lab: no pyenv Python {minor} under {pyenv_root()}/versions: "
            f"install it (`pyenv install {minor}`) to run the sshd tests"
        )
    return Path(found[-1])


# -- where the bare interpreters come from ---------------------------------------------


@dataclass(frozen=True)
class Source:
    """One installed CPython the lab copies: ``prefix`` holds ``bin/pythonX.Y`` and
    ``lib/pythonX.Y`` (pyenv's, uv's and the OS's layouts all do)."""

    kind: str  # pyenv | uv | os
    minor: str
    prefix: Path

    def describe(self) -> str:
        return f"python{self.minor}: {self.kind} {self.prefix}"


def uv_python_dir() -> Path:
    """Where ``uv python install`` puts its interpreters (``$UV_PYTHON_INSTALL_DIR``)."""
    if os.environ.get("UV_PYTHON_INSTALL_DIR"):
        return Path(os.environ["UV_PYTHON_INSTALL_DIR"])
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "uv" / "python"


def _newest(paths: list[str], minor: str, name_of) -> Path | None:
    """The newest ``minor.N`` among ``paths`` (``name_of`` maps a path to its version)."""
    wanted = [p for p in paths if re.fullmatch(rf"{re.escape(minor)}\.\d+", name_of(p) or "")]
    if not wanted:
        return None
    return Path(max(wanted, key=lambda p: [int(x) for x in name_of(p).split(".")]))


def find_source(minor: str) -> Source | None:
    """The bare CPython ``minor`` this machine has, in the lab's order of preference:
    pyenv's (what CI has), uv-managed (``uv python install``), the OS's own
    ``/usr/bin/pythonX.Y`` (its stdlib only: Debian's third-party modules live in
    dist-packages, which a copy does not see). None: the machine has none."""
    pyenv = glob.glob(str(pyenv_root() / "versions" / f"{minor}.*"))
    found = _newest(pyenv, minor, lambda p: Path(p).name)
    if found is not None and (found / "bin" / f"python{minor}").exists():
        return Source("pyenv", minor, found)
    uv = glob.glob(str(uv_python_dir() / f"cpython-{minor}.*-linux-*"))

    def uv_version(path: str) -> str:
        return Path(path).name.split("-")[1].split("+")[0]

    uv = [p for p in uv if (Path(p) / "bin" / f"python{minor}").exists()]
    found = _newest(uv, minor, uv_version)
    if found is not None:
        return Source("uv", minor, found)
    if Path(f"/usr/bin/python{minor}").exists() and Path(f"/usr/lib/python{minor}/os.py").exists():
        return Source("os", minor, Path("/usr"))
    return None


def bare_python(minor: str) -> str | None:
    """The path of the bare CPython ``minor`` :func:`find_source` finds (for root and a
    normal user alike), None when the machine has none: what tests and benches that
    run the agent under a bare interpreter use, never a path under /root."""
    found = find_source(minor)
    return str(found.prefix / "bin" / f"python{minor}") if found else None


def interpreter_source(minor: str) -> Source:
    """:func:`find_source`, else ``uv python install MINOR`` where uv is at hand (a
    laptop with neither pyenv nor the OS's minor), else a LabError saying what to do."""
    found = find_source(minor)
    if found is None and shutil.which("uv"):
        proc = subprocess.run(
            ["uv", "python", "install", minor], capture_output=True, text=True, timeout=600
        )
        found = find_source(minor)
        if found is None:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise LabError(f"lab: `uv python install {minor}` gave no Python {minor}: {tail}")
    if found is None:
        raise LabError(
            f"lab: no Python {minor} for the fresh-host lab: not in pyenv "
            f"({pyenv_root()}/versions), uv ({uv_python_dir()}) nor /usr/bin; "
            f"install one (`uv python install {minor}` or `pyenv install {minor}`)"
        )
    return found


def describe() -> str:
    """One line for the pytest header: whose login the lab is and which interpreters it
    copies (or would copy), so a failing sshd test's log says what host it ran on."""
    who = "the runner itself, scrubbed session" if SAME_USER else "a separate Unix user"
    parts = [f"lab: login {LAB_USER} ({who}), root {LAB_ROOT}"]
    for minor in ("3.9", "3.11"):
        found = find_source(minor)
        parts.append(found.describe() if found else f"python{minor}: none yet (uv python install)")
    return "; ".join(parts)


def session_env() -> dict[str, str]:
    """What the lab's sshd sets for every session (``SetEnv``), before a test's own."""
    env = {"PATH": LAB_PATH, "REMOTEMAC_PYTHON_PATH": str(LAB_BARE_BIN)}
    if WHEELS.is_dir():
        env["PIP_FIND_LINKS"] = str(WHEELS)
    return env


def preinstalled_python_env() -> dict[str, str]:
    """Session variables of a host where a python3.11 was installed before remotemac
    came (``SetEnv`` them, e.g. ``sshd_factory(extra_config=[...])``)."""
    return {"PATH": PREINSTALLED_PATH, "REMOTEMAC_PYTHON_PATH": PREINSTALLED_PATH}


def lab_ids() -> tuple[int, int]:
    entry = pwd.getpwnam(LAB_USER)
    return entry.pw_uid, entry.pw_gid


# -- set-up -----------------------------------------------------------------------


def ensure_lab() -> None:
    """Create the lab user and interpreters unless this layout version is in place."""
    global _ready
    if _ready:
        return
    if os.geteuid() != 0 and not SAME_USER:
        raise LabError(
            "lab: the fresh-host sshd lab needs root (it adds the user "
            f"{LAB_USER!r}); run the sshd tests as root, as CI does"
        )
    with _locked(LAB_ROOT.parent / ".remotemac-lab.lock"):
        if SAME_USER:
            _ensure_same_user_home()
        else:
            _ensure_user()
        stamp = LAB_ROOT / ".stamp"
        want = _stamp_text()
        if not (stamp.exists() and stamp.read_text() == want):
            _build_interpreters()
            stamp.write_text(want)
        _ensure_bare_bin()
        for path, mode in ((LAB_KEYS, 0o755), (LAB_HOSTS, 0o755), (LAB_VENVS, 0o755)):
            path.mkdir(parents=True, exist_ok=True)
            path.chmod(mode)
        uid, gid = lab_ids()
        for path in (LAB_HOSTS, LAB_VENVS):
            os.chown(path, uid, gid)
        _sweep_stale_hosts()
    _ready = True


def _ensure_bare_bin() -> None:
    """The default session's bin dir: wrappers that run the prefix's 3.9 (wrappers, not
    symlinks: a venv's ``home`` is then the prefix's own bin dir). Made beside the
    prefix, never in it, so a lab built by another checkout is neither rebuilt nor
    changed."""
    LAB_BARE_BIN.mkdir(mode=0o755, exist_ok=True)
    for name in BARE_NAMES:
        real = (
            LAB_BIN / name.replace("3", "3.9", 1) if name in ("python3", "pip3") else LAB_BIN / name
        )
        text = f'#!/bin/sh\nexec {real} "$@"\n'
        path = LAB_BARE_BIN / name
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_name(f".{name}.{os.getpid()}")
            tmp.write_text(text)
            tmp.chmod(0o755)
            os.replace(tmp, path)


def _sweep_stale_hosts(max_age_s: float = 12 * 3600) -> None:
    """Remove host dirs a killed test session left behind (none younger than 12 h:
    another session on this machine may be using them)."""
    now = time.time()
    for top in LAB_HOSTS.iterdir():
        with contextlib.suppress(OSError):
            if now - top.stat().st_mtime > max_age_s:
                HostDirs(top).remove()
                (LAB_KEYS / f"{top.name}.pub").unlink(missing_ok=True)


def _stamp_text() -> str:
    """The layout version and both sources' prefixes (pyenv's: the text CI has always had)."""
    return f"{LAB_VERSION} {interpreter_source('3.9').prefix} {interpreter_source('3.11').prefix}\n"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _ensure_user() -> None:
    try:
        pwd.getpwnam(LAB_USER)
    except KeyError:
        _run(
            [
                "useradd",
                "--create-home",
                "--home-dir",
                str(LAB_HOME),
                "--shell",
                "/bin/bash",
                "--user-group",
                LAB_USER,
            ]
        )
    # sshd without PAM refuses a locked account ('!' or '!!'); '*' is "no password" but usable
    if _shadow_password(LAB_USER) != "*":
        _run(["usermod", "--password", "*", LAB_USER])
    uid, gid = lab_ids()
    LAB_HOME.mkdir(mode=0o755, exist_ok=True)
    os.chown(LAB_HOME, uid, gid)
    # start-up files that add nothing (Debian's skel ones set PATH bits and aliases)
    for name in (".bashrc", ".profile", ".bash_profile", ".bash_logout"):
        path = LAB_HOME / name
        path.write_text("")
        os.chown(path, uid, gid)


def _ensure_same_user_home() -> None:
    """The same-user lab's session home base: start-up files that add nothing, so a
    login (HOME set by sshd's SetEnv) reads none of the runner's own."""
    LAB_HOME.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name in (".bashrc", ".profile", ".bash_profile", ".bash_logout"):
        (LAB_HOME / name).write_text("")


def _shadow_password(user: str) -> str:
    for line in Path("/etc/shadow").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == user:
            return fields[1]
    return ""


def _build_interpreters() -> None:
    """Both Pythons in one prefix, as /usr holds them: a venv's ``home`` is then the
    prefix's own bin dir, where CPython finds its stdlib (a symlinked ``python3`` in a
    foreign bin dir would make venvs fall back to the unreadable /root/.pyenv prefix)."""
    LAB_ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    LAB_ROOT.chmod(0o755)
    tmp = LAB_PREFIX.with_name(LAB_PREFIX.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "bin").mkdir(parents=True)
    (tmp / "lib").mkdir()
    for minor in ("3.9", "3.11"):
        copy_interpreter(interpreter_source(minor).prefix, tmp, minor)
    (tmp / "bin" / "python3").symlink_to("python3.9")
    (tmp / "bin" / "pip3").symlink_to("pip3.9")
    _chmod_readable(tmp)
    shutil.rmtree(LAB_PREFIX, ignore_errors=True)
    tmp.rename(LAB_PREFIX)


def copy_interpreter(src: Path, prefix: Path, minor: str) -> None:
    """Copy pyenv's Python ``minor`` into ``prefix``: the interpreter (RUNPATH made
    relative), its libpython, its stdlib without CPython's test suite, a site-packages
    with only pip and setuptools, and ``pipX.Y``."""
    stdlib = src / "lib" / f"python{minor}"
    site = stdlib / "site-packages"

    def skip(directory: str, names: list[str]) -> list[str]:
        here = Path(directory)
        if here == site:
            return [n for n in names if not KEEP_SITE.match(n)]
        if here == stdlib:
            # the test suite: 70-120 MB nobody imports; EXTERNALLY-MANAGED (uv's, the
            # OS's): a Mac's python3 has none
            return [n for n in names if n in ("test", "EXTERNALLY-MANAGED")]
        return []

    shutil.copytree(stdlib, prefix / "lib" / f"python{minor}", symlinks=True, ignore=skip)
    for lib in (src / "lib").glob(f"libpython{minor}*.so*"):
        shutil.copy2(lib, prefix / "lib" / lib.name, follow_symlinks=False)
    binary = prefix / "bin" / f"python{minor}"
    shutil.copy2(src / "bin" / f"python{minor}", binary)
    _relative_runpath(binary, str(src / "lib").encode())
    pip = prefix / "bin" / f"pip{minor}"
    if not (src / "bin" / f"pip{minor}").exists():  # the OS's: pip is a separate package
        return
    text = (src / "bin" / f"pip{minor}").read_text()
    first, _, rest = text.partition("\n")
    pip.write_text(f"#!{LAB_PREFIX / 'bin' / f'python{minor}'}\n{rest}")
    pip.chmod(0o755)


def _relative_runpath(binary: Path, absolute: bytes) -> None:
    """Rewrite an absolute RUNPATH in place to ``$ORIGIN/../lib`` (same length or less)."""
    data = binary.read_bytes()
    needle = absolute + b"\0"
    if needle not in data:
        return
    new = b"$ORIGIN/../lib"
    binary.write_bytes(data.replace(needle, new + b"\0" * (len(needle) - len(new))))


def _chmod_readable(top: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(top):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                mode = os.stat(path).st_mode
                os.chmod(path, 0o755 if mode & 0o111 else 0o644)


# -- per-sshd host dirs -----------------------------------------------------------


@dataclass(frozen=True)
class HostDirs:
    """One sshd's corner of the lab user's home: the session HOME and tmux's socket dir."""

    top: Path

    @property
    def home(self) -> Path:
        return self.top / "home"

    @property
    def tmux_dir(self) -> Path:
        return self.top / "tmux"

    @classmethod
    def create(cls) -> HostDirs:
        ensure_lab()
        uid, gid = lab_ids()
        top = Path(_mkdtemp(LAB_HOSTS))
        dirs = cls(top)
        for path in (top, dirs.home, dirs.tmux_dir):
            path.mkdir(mode=0o700, exist_ok=True)
            os.chown(path, uid, gid)
        return dirs

    def remove(self) -> None:
        """Stop this host's tmux server(s) and detached leftovers, remove the RAM stores
        of the runs under its dirs (a ``wipe: manual`` or lost run keeps its plaintext in
        /dev/shm, which outlives the test), then delete the dirs."""
        run_ids = ramstores.run_ids_under(self.top)
        try:
            self._remove_dirs()
        finally:  # the processes are gone by now: nothing refills a store
            ramstores.remove_stores(run_ids, {lab_ids()[0]})

    def _remove_dirs(self) -> None:
        for sock in self.tmux_dir.glob("tmux-*/*"):
            run_as_lab(["tmux", "-S", str(sock), "kill-server"], check=False)
        # a runner or workload still writing would refill a dir rmtree just emptied
        for _ in range(20):
            if not _kill_lab_processes_under(self.top):
                shutil.rmtree(self.top, ignore_errors=True)
                if not self.top.exists():
                    return
            time.sleep(0.1)
        shutil.rmtree(self.top, ignore_errors=True)


def _mkdtemp(parent: Path) -> str:
    """A short unique dir name (tmux socket paths must stay under 108 bytes)."""
    for _ in range(100):
        name = hashlib.sha1(os.urandom(8)).hexdigest()[:8]
        path = parent / name
        try:
            path.mkdir(mode=0o700)
            return str(path)
        except FileExistsError:
            continue
    raise LabError(f"lab: cannot create a host dir under {parent}")


def _kill_lab_processes_under(top: Path) -> list[int]:
    """SIGKILL lab-user processes whose cwd or command line is inside ``top``; the pids
    that were still there (empty: none left)."""
    uid, _ = lab_ids()
    prefix = str(top) + "/"
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if (cwd + "/").startswith(prefix) or prefix in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), 9)
                found.append(int(entry.name))
    return found


def run_as_lab(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 600,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``argv`` locally as the lab user, with the lab session's PATH (no sshd)."""
    uid, gid = lab_ids()
    full = {
        "HOME": str(LAB_HOME),
        "USER": LAB_USER,
        "LOGNAME": LAB_USER,
        "LANG": "C.UTF-8",
        **session_env(),
        **(env or {}),
    }
    # the same-user lab is already that user (and may not call setgroups)
    who = {} if SAME_USER else {"user": uid, "group": gid, "extra_groups": []}
    return subprocess.run(
        argv,
        env=full,
        **who,  # type: ignore[arg-type]
        capture_output=True,
        text=True,
        check=check,
        timeout=timeout,
        cwd=cwd or str(LAB_HOME),
    )


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(
            f"lab: {' '.join(argv)} failed ({proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()}"
        )


# -- a host with torch preinstalled (tests named *host_torch*) ----------------------


def cpu_torch_source() -> list[str]:
    """pip options that make ``torch==X`` the CPU build: the wheel on this machine's disk
    (``PIP_FIND_LINKS``, set for the lab's sessions too) or PyTorch's CPU index, never
    PyPI's multi-GB CUDA build (a ``+cpu`` local version sorts above the plain one)."""
    if cpu_wheelhouse():
        return ["--find-links", str(WHEELS)]
    return ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


def cpu_wheelhouse() -> Path | None:
    """This machine's wheel dir when it holds the pinned torch's CPU build, else None."""
    pin = next(r for r in HOST_TORCH_REQUIREMENTS if r.startswith("torch=="))
    return WHEELS if list(WHEELS.glob(f"torch-{pin.split('==')[1]}+cpu-*.whl")) else None


def ensure_host_torch_python() -> str:
    """A venv on the lab host with torch (CPU) and numpy, made once and cached.

    Built as the lab user from the bare ``python3.11`` with ``pip install``, as a
    user would on a Mac with Homebrew's Python; ``PIP_FIND_LINKS`` points pip at the
    CPU wheel on this machine's disk. Keyed by the interpreter and the requirements.
    """
    ensure_lab()
    key = hashlib.sha256(f"{_stamp_text()}{HOST_TORCH_REQUIREMENTS}".encode()).hexdigest()[:12]
    venv = LAB_VENVS / f"torch-{key}"
    python = venv / "bin" / "python"
    done = venv / ".complete"
    with _locked(LAB_ROOT.parent / ".remotemac-lab-venv.lock"):
        if done.exists():
            return str(python)
        shutil.rmtree(venv, ignore_errors=True)
        started = time.monotonic()
        run_as_lab([str(LAB_BIN / "python3.11"), "-m", "venv", str(venv)])
        pip = run_as_lab(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "-q",
                "--no-input",
                "--disable-pip-version-check",
                *cpu_torch_source(),
                *HOST_TORCH_REQUIREMENTS,
            ],
            check=False,
            env={"PIP_CACHE_DIR": str(LAB_VENVS / "pip-cache")},
        )
        if pip.returncode != 0:
            tail = "\n".join((pip.stderr or pip.stdout).strip().splitlines()[-5:])
            raise LabError(
                f"lab: pip install {' '.join(HOST_TORCH_REQUIREMENTS)} in {venv} failed:\n{tail}"
            )
        done.write_text(f"built in {time.monotonic() - started:.0f}s\n")
    return str(python)


# -- proof that the lab is bare ------------------------------------------------------

#: run by the login's ``python3`` over a real ssh session; prints one JSON object
PROBE = r"""
import importlib.util, json, os, shutil, subprocess, sys
def importable(python, module):
    code = "import importlib.util, sys; sys.exit(importlib.util.find_spec(%r) is None)" % module
    return subprocess.run([python, "-c", code]).returncode == 0
mods = ("cryptography", "torch", "numpy", "yaml")
# a python3.11 on PATH beyond this machine's own /usr/bin and /bin (Debian's, which
# the lab cannot hide: REMOTEMAC_PYTHON_PATH keeps remotemac from looking there)
py311 = next((os.path.join(d, "python3.11") for d in os.environ.get("PATH", "").split(":")
              if d not in ("/usr/bin", "/bin") and os.access(os.path.join(d, "python3.11"), os.X_OK)),
             None)
print(json.dumps({
    "user": os.environ.get("USER") or os.environ.get("LOGNAME"),
    "path": os.environ.get("PATH", ""),
    "env": {k: os.environ[k] for k in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME",
                                        "LD_LIBRARY_PATH", "PYENV_VERSION", "CONDA_PREFIX")
            if k in os.environ},
    "python3": shutil.which("python3"),
    "executable": os.path.realpath(sys.executable),
    "version": "%d.%d.%d" % sys.version_info[:3],
    "importable": [m for m in mods if importlib.util.find_spec(m) is not None],
    "python3.11": py311,
    "importable_311": [m for m in mods if py311 and importable(py311, m)],
}))
"""


def bare_problems(facts: dict) -> list[str]:
    """What makes a login *not* a host as a rental delivers it (empty: bare)."""
    problems = []
    if facts.get("user") != LAB_USER:
        problems.append(f"login user is {facts.get('user')!r}, not {LAB_USER!r}")
    if not facts.get("version", "").startswith("3.9."):
        problems.append(
            f"python3 is {facts.get('version')} ({facts.get('executable')}), not the OS-like 3.9"
        )
    if not str(facts.get("executable", "")).startswith(str(LAB_PREFIX) + "/"):
        problems.append(f"python3 resolves to {facts.get('executable')}, outside {LAB_PREFIX}")
    for entry in facts.get("path", "").split(":"):
        if entry.startswith("/root") or "venv" in entry or "pyenv" in entry or not entry:
            problems.append(f"PATH leaks {entry!r} (PATH={facts.get('path')})")
    for key, value in facts.get("env", {}).items():
        problems.append(f"the session sets {key}={value}")
    for module in facts.get("importable", []):
        problems.append(f"python3 can import {module}")
    if facts.get("python3.11"):
        problems.append(
            f"python3.11 on PATH ({facts['python3.11']}): a rental has only python3 3.9"
        )
    for module in facts.get("importable_311", []):
        problems.append(f"python3.11 can import {module}")
    return problems


def probe_login(ssh_argv: list[str]) -> dict:
    """Facts about a login, through ``ssh_argv`` (e.g. ``ssh -F cfg alias``) running
    the login's own ``python3`` on :data:`PROBE`."""
    import json

    proc = subprocess.run(
        [*ssh_argv, "python3", "-"], input=PROBE, capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        raise LabError(f"lab: probing the login failed ({proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def assert_bare(ssh_argv: list[str]) -> dict:
    """Fail loudly unless the login is a bare host; return its facts."""
    facts = probe_login(ssh_argv)
    problems = bare_problems(facts)
    if problems:
        raise LabError("lab: the test sshd's login is not a bare host:\n  " + "\n  ".join(problems))
    return facts
