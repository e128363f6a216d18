"""Facts about the host that decide whether it can run an MPS job (``remotemac doctor``).

Runs ON THE HOST: Python 3.9, standard library only. The orchestrator sends this
file's source from memory (engine/agentship.py: nothing is written on the host) and
calls :func:`op_facts` with ``{"remote_root": ..., "venv_python": ...}``; the facts
come back as one JSON object. Only facts are gathered here; judging them (what is fit, what to
fix) happens locally in :mod:`remotemac.checks.doctor`, so the rules can change
without re-shipping anything.

Every command runs without a shell, with a timeout and ``LC_ALL=C`` (a host in a
decimal-comma locale prints ``9,9Gi``), and is looked up on the SSH session's
PATH plus the usual macOS locations (a non-interactive SSH PATH on macOS does
not contain ``/opt/homebrew/bin``). Parsers are pure functions of the text a
command printed, so they are tested on recorded real macOS outputs.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

#: a JSON object as it travels: the facts and their sections, built here and sent as they
#: are (protocol.JsonObject's twin: this module travels alone and imports no sibling)
JsonObject = Dict[str, Any]

RunFn = Callable[[Sequence[str]], tuple[int, str, str]]
"""argv -> (exit code, stdout, stderr); injectable so tests can replay outputs."""

NA = "n/a"
"""Value of a macOS-only fact on another OS."""

SCHEMA = 1
EXTRA_PATH = ("/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")
PYTHON_NAMES = ("python3",) + tuple(f"python3.{minor}" for minor in range(9, 15))
SYSTEM_PYTHON = "/usr/bin/python3"
CMD_TIMEOUT = 15.0
MPS_PROBE_TIMEOUT = 180.0  # the first ``import torch`` on a cold disk can take a minute

MPS_PROBE = (
    "import json\n"
    "try:\n"
    "    import torch\n"
    "except Exception as exc:\n"
    "    print(json.dumps({'torch': None, 'error': repr(exc)[:300]}))\n"
    "else:\n"
    "    mps = getattr(torch.backends, 'mps', None)\n"
    "    print(json.dumps({'torch': torch.__version__,\n"
    "                      'built': bool(mps is not None and mps.is_built()),\n"
    "                      'available': bool(mps is not None and mps.is_available())}))\n"
)


# --------------------------------------------------------------------------- parsers


def parse_sw_vers(text: str) -> dict[str, str]:
    """``sw_vers`` output -> {product_name, product_version, build_version[, product_version_extra]}.

    Split on the first ``:`` then strip: macOS 13+ pads with two TABs, older
    releases with one, and a Rapid Security Response adds ``ProductVersionExtra``.
    """
    keys = {
        "ProductName": "product_name",
        "ProductVersion": "product_version",
        "ProductVersionExtra": "product_version_extra",
        "BuildVersion": "build_version",
    }
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in keys:
            out[keys[name.strip()]] = value.strip()
    return out


def version_tuple(text: str | None) -> tuple[int, ...]:
    """``"13.3.1"`` -> (13, 3, 1); leading digits only, so ``"3.12.0rc1"`` -> (3, 12, 0)."""
    parts: list[int] = []
    for piece in (text or "").strip().split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group(0)))
    return tuple(parts)


def parse_sysctl_value(text: str) -> Any | None:
    """Output of ``sysctl -n KEY`` -> int when it is an integer, else the stripped string.

    Empty output (a key that exists without a value) gives ``None``.
    """
    value = text.strip()
    if not value:
        return None
    if re.fullmatch(r"-?\d+", value):
        return int(value)
    return value


@dataclass
class PmsetSettings:
    """``pmset -g``: each setting's value (int or str) and the notes some carry."""

    settings: Dict[str, Union[int, str]] = field(default_factory=dict)
    notes: Dict[str, str] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        """{setting: value, ..., "notes": {setting: "(...)"}} (no "notes" without one)."""
        out: JsonObject = dict(self.settings)
        if self.notes:
            out["notes"] = dict(self.notes)
        return out

    def pick(self, wanted: Sequence[str]) -> JsonObject:
        """The ``wanted`` settings (None when absent) and their notes, as facts."""
        out: JsonObject = {key: self.settings.get(key) for key in wanted}
        out["notes"] = {k: v for k, v in self.notes.items() if k in wanted}
        return out


def parse_pmset_g(text: str) -> PmsetSettings:
    """``pmset -g`` -> its settings (int or str) and notes ``{setting: "(...)"}``.

    Keys may contain spaces (``Sleep On Power Button 1``); a value may be followed
    by a parenthesised note (``sleep 1 (sleep prevented by ...)``). Both the
    "System-wide power settings" (``SleepDisabled``) and "Currently in use"
    sections land in one mapping.
    """
    out: Dict[str, Union[int, str]] = {}
    notes: Dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.endswith(":"):
            continue
        match = re.match(r"^(.+?)\s+(\S+)(?:\s+(\(.*\)))?$", line)
        if not match:
            continue
        key, value, note = match.group(1).strip(), match.group(2), match.group(3)
        out[key] = int(value) if re.fullmatch(r"-?\d+", value) else value
        if note:
            notes[key] = note
    return PmsetSettings(out, notes)


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE_RE = re.compile(r"^(\d+(?:[.,]\d+)?)([BKMGTP]?)i?$")


def parse_size(text: str, block: int = 1) -> int | None:
    """A df size cell -> bytes: ``9,9Gi`` / ``9.9G`` / ``0Bi`` (human) or a block count."""
    match = _SIZE_RE.match(text.strip())
    if not match:
        return None
    number = float(match.group(1).replace(",", "."))
    unit = match.group(2)
    return int(number * (_UNITS[unit] if unit else block))


@dataclass(frozen=True)
class DfRow:
    """One volume of ``df`` output, sizes in bytes."""

    filesystem: str
    size_bytes: Optional[int]
    used_bytes: Optional[int]
    avail_bytes: Optional[int]
    capacity: Optional[str]
    mounted_on: str

    @property
    def mount(self) -> str:
        return self.mounted_on.rstrip("/") or "/"

    def to_json(self) -> JsonObject:
        return {
            "filesystem": self.filesystem,
            "size_bytes": self.size_bytes,
            "used_bytes": self.used_bytes,
            "avail_bytes": self.avail_bytes,
            "capacity": self.capacity,
            "mounted_on": self.mounted_on,
        }


def parse_df(text: str) -> List[DfRow]:
    """``df`` output (BSD or GNU; ``-h``, ``-k``, ``-P`` or 512-blocks) -> rows in bytes.

    The block unit comes from the header (``512-blocks``, ``1K-blocks``,
    ``1024-blocks``; ``Size`` means human units). Filesystem names (``map
    auto_home``) and mount points (``/Volumes/Parallels Tools``) may contain
    spaces, the numeric cells never do, so a row is split around them.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("Filesystem"):
        return []
    header = lines[0].split()
    nvals = len(header) - 3  # minus "Filesystem", "Mounted", "on"
    unit = header[1]
    match = re.match(r"^(\d+)([KMG]?)-blocks$", unit)
    block = int(match.group(1)) * _UNITS[match.group(2)] if match else 1
    rows = []
    for line in lines[1:]:
        tokens = line.split()
        start = next(
            (i for i in range(1, len(tokens)) if parse_size(tokens[i], block) is not None), None
        )
        if start is None or len(tokens) < start + nvals + 1:
            continue
        vals = tokens[start : start + nvals]
        rows.append(
            DfRow(
                filesystem=" ".join(tokens[:start]),
                size_bytes=parse_size(vals[0], block),
                used_bytes=parse_size(vals[1], block),
                avail_bytes=parse_size(vals[2], block),
                capacity=vals[3] if nvals > 3 else None,
                mounted_on=" ".join(tokens[start + nvals :]),
            )
        )
    return rows


def df_volume_for(rows: List[DfRow], path: str) -> Optional[DfRow]:
    """The df row whose mount point is the longest prefix of ``path``."""
    best: Optional[DfRow] = None
    for row in rows:
        mount = row.mount
        inside = path == mount or mount == "/" or path.startswith(mount + "/")
        if inside and (best is None or len(mount) > len(best.mount)):
            best = row
    return best


def parse_python_version(text: str) -> str | None:
    """``Python 3.9.6`` (stdout, or stderr on Python 2) -> ``"3.9.6"``."""
    match = re.search(r"Python (\d+\.\d+(?:\.\d+)?\S*)", text)
    return match.group(1) if match else None


def parse_tmux_version(text: str) -> str | None:
    """``tmux 3.3a`` / ``tmux next-3.5`` -> ``"3.3a"`` / ``"next-3.5"``."""
    match = re.match(r"^tmux\s+(\S+)", text.strip())
    return match.group(1) if match else None


def parse_mps_probe(text: str) -> Optional[JsonObject]:
    """The last JSON line the MPS probe printed (torch may print warnings before it)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


# --------------------------------------------------------------------------- running


def default_search_path() -> str:
    """The session PATH followed by the macOS places tools live (deduplicated)."""
    seen: list[str] = []
    for entry in os.environ.get("PATH", "").split(os.pathsep) + list(EXTRA_PATH):
        if entry and entry not in seen:
            seen.append(entry)
    return os.pathsep.join(seen)


def subprocess_run(argv: Sequence[str], timeout: float = CMD_TIMEOUT) -> tuple[int, str, str]:
    """Run argv without a shell; a missing program is 127, a timeout 124 (as a shell says)."""
    env = dict(os.environ, LC_ALL="C", LANG="C")
    try:
        proc = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after {timeout:.0f}s"
    except OSError as exc:
        return 126, "", f"{argv[0]}: {exc}"
    return (
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


class Host:
    """Command lookup on a fixed search path plus the injectable runner."""

    def __init__(self, run: RunFn | None, search_path: str | None) -> None:
        self.search_path = search_path if search_path is not None else default_search_path()
        self._run = run
        self.errors: list[str] = []

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.search_path)

    def which_all(self, name: str) -> list[str]:
        """Every executable ``name`` on the search path, like ``which -a``."""
        found: list[str] = []
        for entry in self.search_path.split(os.pathsep):
            candidate = os.path.join(entry, name)
            if entry and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                found.append(candidate)
        return found

    def run(self, argv: Sequence[str], timeout: float = CMD_TIMEOUT) -> tuple[int, str, str]:
        if self._run is not None:
            return self._run(argv)
        return subprocess_run(argv, timeout)

    def cmd(self, name: str, *args: str) -> tuple[int, str, str] | None:
        """Run a tool by name; ``None`` when it is not installed."""
        path = self.which(name)
        if path is None:
            return None
        return self.run([path] + list(args))

    def sysctl(self, key: str) -> Any | None:
        """``sysctl -n KEY``; ``None`` for an unknown oid or no sysctl."""
        result = self.cmd("sysctl", "-n", key)
        if result is None or result[0] != 0:
            return None
        return parse_sysctl_value(result[1])


# --------------------------------------------------------------------------- facts


def _uname(host: Host, flag: str, fallback: str) -> str:
    result = host.cmd("uname", flag)
    if result is not None and result[0] == 0 and result[1].strip():
        return result[1].split()[0]
    return fallback


def _macos(host: Host) -> Any:
    result = host.cmd("sw_vers")
    if result is None or result[0] != 0:
        host.errors.append("sw_vers failed")
        return None
    return parse_sw_vers(result[1])


def _arch(host: Host, darwin: bool) -> JsonObject:
    machine = _uname(host, "-m", platform.machine())
    if not darwin:
        return {"machine": machine, "translated": NA, "arm64_hardware": NA}
    translated = host.sysctl("sysctl.proc_translated")  # unknown oid on Intel Macs
    arm64 = host.sysctl("hw.optional.arm64")
    return {
        "machine": machine,
        "translated": translated == 1,
        "arm64_hardware": arm64 == 1 if arm64 is not None else None,
    }


def linux_cpu_model() -> str | None:
    """The first "model name" of /proc/cpuinfo (Linux hosts: a reference box, CI)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _hardware(host: Host, darwin: bool) -> JsonObject:
    if darwin:
        return {
            "chip": host.sysctl("machdep.cpu.brand_string"),
            "ncpu": host.sysctl("hw.ncpu"),
            "memory_bytes": host.sysctl("hw.memsize"),
        }
    chip = linux_cpu_model()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    return {"chip": chip, "ncpu": os.cpu_count(), "memory_bytes": memory}


def _vm(host: Host, darwin: bool) -> Any:
    if not darwin:
        return NA
    value = host.sysctl("kern.hv_vmm_present")
    return {"hv_vmm_present": None if value is None else value == 1}


def _clt(host: Host, darwin: bool) -> Any:
    if not darwin:
        return NA
    result = host.cmd("xcode-select", "-p")
    if result is None or result[0] != 0 or not result[1].strip():
        return {"path": None}
    return {"path": result[1].strip()}


def _pythons(host: Host, clt_present: bool) -> list[dict[str, str]]:
    """Every python3 / python3.N on the search path with its version, once per real file.

    On macOS without the command line tools ``/usr/bin/python3`` is only a stub
    that opens an install dialog on the Mac's screen, so it is not run then.
    """
    paths: list[str] = []
    seen = set()
    for name in PYTHON_NAMES:
        for path in host.which_all(name):
            real = os.path.realpath(path)
            if real in seen or (path == SYSTEM_PYTHON and not clt_present):
                continue
            seen.add(real)
            paths.append(path)

    def version(path: str) -> str | None:
        rc, out, err = host.run([path, "--version"])
        return parse_python_version(out + "\n" + err) if rc == 0 else None

    # At once: a version manager's shims (pyenv: one per python3.N) take ~0.1 s each.
    with ThreadPoolExecutor(max_workers=max(1, len(paths))) as pool:
        versions = list(pool.map(version, paths))
    return [{"path": p, "version": v} for p, v in zip(paths, versions) if v]


def _tool(host: Host, name: str, version_args: Sequence[str], parse: Any) -> Any:
    path = host.which(name)
    if path is None:
        return None
    info: JsonObject = {"path": path, "version": None}
    if version_args:
        rc, out, _err = host.run([path] + list(version_args))
        if rc == 0:
            info["version"] = parse(out)
    return info


def _disk(host: Host, remote_root: str) -> JsonObject:
    """Free space of the volume ``remote_root`` is (or will be) on."""
    probe = os.path.abspath(os.path.expanduser(remote_root))
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        st = os.statvfs(probe)
        return {
            "path": probe,
            "free_bytes": st.f_bavail * st.f_frsize,
            "total_bytes": st.f_blocks * st.f_frsize,
            "source": "statvfs",
        }
    except (OSError, AttributeError) as exc:
        result = host.cmd("df", "-P", "-k", probe)
        row = df_volume_for(parse_df(result[1]), probe) if result and result[0] == 0 else None
        if row is None:
            return {"path": probe, "error": f"statvfs: {exc}; df gave nothing usable"}
        return {
            "path": probe,
            "free_bytes": row.avail_bytes,
            "total_bytes": row.size_bytes,
            "source": "df",
        }


def _pmset(host: Host, darwin: bool) -> Any:
    if not darwin:
        return NA
    result = host.cmd("pmset", "-g")
    if result is None or result[0] != 0:
        return None
    wanted = ("sleep", "disksleep", "displaysleep", "standby", "SleepDisabled")
    return parse_pmset_g(result[1]).pick(wanted)


#: the Mac-shaped test lab's darwin switch (agent/safefs.py reads it for the agent); this
#: collector runs from memory alone, so it reads the same variable to answer for the
#: same branch deadman.schedule takes there. A real host never sets it.
LAB_DARWIN_ENV = "REMOTEMAC_LAB_DARWIN"


def _deadman(host: Host, darwin: bool) -> JsonObject:
    """Which guard a run's dead-man wipe would get here, and why (agent/deadman.py).

    Why: the record says which guard held for a run; doctor says it before one, so a
    user knows whether launchd or a sleeper the host's own reboot ends would guard it.
    On macOS a run tries ``bootstrap gui/UID``, then ``user/UID`` (legacy ``load`` only
    counts when ``launchctl print`` finds the label in one of them): a domain that
    ``launchctl print`` does not show cannot hold the job, so the first one it shows is
    the run's guard; none shown means the sleeper.
    """
    darwin = darwin or (os.environ.get(LAB_DARWIN_ENV) == "1" and sys.platform.startswith("linux"))
    if not darwin:
        return {"method": "sleeper", "why": "not macOS: no launchd"}
    uid = os.getuid()
    refused = []
    for domain in ("gui/%d" % uid, "user/%d" % uid):
        result = host.cmd("launchctl", "print", domain)
        if result is not None and result[0] == 0:
            return {
                "method": "launchd",
                "domain": domain,
                "verified": "launchctl print %s" % domain,
                "refused": refused,
            }
        why = "launchctl not found" if result is None else _last_line(result)
        refused.append({"domain": domain, "why": why})
    return {
        "method": "sleeper",
        "why": "launchctl print shows neither launchd domain",
        "refused": refused,
    }


def _last_line(result: tuple[int, str, str]) -> str:
    lines = (result[2] or result[1]).strip().splitlines()
    return "exit %d: %s" % (result[0], lines[-1][:200] if lines else "no output")


def find_venv_python(remote_root: str) -> str | None:
    """The newest ``<remote_root>/envs/*/bin/python`` remotemac made, if any."""
    root = os.path.expanduser(remote_root)
    candidates = [
        p
        for p in glob.glob(os.path.join(root, "envs", "*", "bin", "python"))
        if os.access(p, os.X_OK)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda p: os.path.getmtime(os.path.dirname(p)))


def _mps(host: Host, venv_python: str | None) -> Any:
    if not venv_python:
        return None
    path = os.path.expanduser(venv_python)
    rc, out, err = host.run([path, "-c", MPS_PROBE], MPS_PROBE_TIMEOUT)
    probe = parse_mps_probe(out) if rc == 0 else None
    if probe is None:
        last = (err.strip().splitlines() or [f"exit {rc}"])[-1]
        return {"python": path, "error": last[:300]}
    probe["python"] = path
    return probe


def collect_facts(
    run: RunFn | None = None,
    remote_root: str = "~/remotemac",
    venv_python: str | None = None,
    search_path: str | None = None,
) -> JsonObject:
    """Gather every fact ``doctor`` judges. Never raises for a missing tool.

    ``search_path`` replaces the lookup PATH (tests point it at shims);
    ``venv_python`` defaults to the newest venv under ``remote_root/envs``.
    """
    host = Host(run, search_path)
    os_name = _uname(host, "-s", platform.system())
    darwin = os_name == "Darwin"
    venv = venv_python or find_venv_python(remote_root)

    def pythons() -> list[dict[str, str]]:
        clt = _clt(host, darwin)
        return _pythons(host, not darwin or (isinstance(clt, dict) and bool(clt.get("path"))))

    # The probes are independent commands: run them at once, so doctor waits for the
    # slowest (the MPS probe's ``import torch``) rather than for their sum.
    probes: dict[str, Callable[[], Any]] = {
        "mps": lambda: _mps(host, venv),
        "pythons": pythons,
        "clt": lambda: _clt(host, darwin),
        "macos": lambda: _macos(host) if darwin else NA,
        "arch": lambda: _arch(host, darwin),
        "hardware": lambda: _hardware(host, darwin),
        "vm": lambda: _vm(host, darwin),
        "tmux": lambda: _tool(host, "tmux", ["-V"], parse_tmux_version),
        "brew": lambda: _tool(host, "brew", [], None),  # `brew --version` may self-update
        "disk": lambda: _disk(host, remote_root),
        "pmset": lambda: _pmset(host, darwin),
        "deadman": lambda: _deadman(host, darwin),
    }
    with ThreadPoolExecutor(max_workers=len(probes)) as pool:
        futures = {key: pool.submit(probe) for key, probe in probes.items()}
        found = {key: future.result() for key, future in futures.items()}
    facts: JsonObject = {
        "schema": SCHEMA,
        "os": os_name,
        "python_running": {"executable": sys.executable, "version": platform.python_version()},
    }
    facts.update(found)
    facts["errors"] = sorted(host.errors)  # appended from the probes' threads
    facts["clock"] = time.time()  # last, so it is close to when the orchestrator gets the reply
    return facts


def op_facts(req: JsonObject) -> JsonObject:
    """The facts for ``{"remote_root": ..., "venv_python": ...}`` (doctor's in-memory call)."""
    return collect_facts(
        remote_root=req.get("remote_root") or "~/remotemac",
        venv_python=req.get("venv_python"),
    )
