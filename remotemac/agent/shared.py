"""What the laptop and the host compute the same way, so both import this one module.

Why one module: the laptop imports from the agent only what both sides share (the
import-linter contract "laptop code imports from the agent only ..."): the declared
protocol (protocol.py), the stream crypto (streamcrypt.py) and this: the one boot line
every agent process starts with, the Python request syntax (``"3.11"``, ``">=3.10"``),
and the agent runtime's pins and wheel tags. The agent's own modules import these from
here too (pythons.py and agentruntime.py keep the names), so each is defined once.

Standard library only, Python 3.9, no sibling imports: it travels ahead of the modules
that import it in the in-memory bootstrap (engine/agentship.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import TYPE_CHECKING, Any, List, Optional, Set, Tuple

if TYPE_CHECKING:  # the annotations only: this module imports no sibling when it runs
    from .protocol import JsonObject

# ------------------------------------------------------------------ the one boot
#
# How every process of the agent starts on the host: one boot, the agent as a package.
#
# Why one boot: the agent's modules import each other relatively (``from . import
# safefs``), so they must load as one package, never as loose scripts whose imports
# depend on the directory they happen to run from. :data:`BOOT` (``python3 -c``) makes
# the agent directory named in ``argv[1]`` the package :data:`PACKAGE`, imports the module
# that path names and calls its ``main(args)``. The laptop starts the resident agent, the
# one-shot ``hostagent`` and the sync receiver with it (engine/agentship.py); the agent
# starts the job's runner and the dead-man with it (:func:`agent_argv`). An imported
# module loads from the bytecode its first start cached beside it (``__pycache__``),
# where a script is compiled on every start.
#
# ``-c`` puts the current directory first on ``sys.path``: the boot takes it off
# before it imports anything (a job's directory may hold a ``types.py``).
# The path stays in argv (``<agent dir>/runner.py …``): wipe and cleanup recognise the
# agent's own processes by it. One line, no newline: ``ps`` output is read line by line.
#
# Modules that run inside the workload's interpreter (harness, optrace, ckptconvert,
# jobsite, observer) are not started this way: they load what they need by path under
# private names, so a user module of the same name is neither shadowed nor used.
# Standard library only, Python 3.9.

#: the agent's package name on the host (``remotemac.agent`` on the laptop)
PACKAGE = "rmagent"

BOOT = (
    "import sys;sys.path[:1]=[p for p in sys.path[:1] if p];import importlib,types;"
    "d,_,f=sys.argv[1].rpartition('/');p=types.ModuleType('rmagent');p.__path__=[d];"
    "sys.modules['rmagent']=p;"
    "sys.exit(importlib.import_module('rmagent.'+f[:-3]).main(sys.argv[2:]))"
)


def agent_argv(
    python: str, agent_dir: str, module: str, *args: str, site: bool = False
) -> List[str]:
    """The argv that runs ``module.main(args)`` of the agent in ``agent_dir`` under ``python``.

    ``site``: keep site-packages (the runner: the job's environment is its own);
    without it ``-S``: stdlib only, and a host Python with a large site costs
    0.2-0.4 s per start.
    """
    return (
        [python]
        + ([] if site else ["-S"])
        + ["-c", BOOT, "%s/%s.py" % (agent_dir, module)]
        + list(args)
    )


# ------------------------------------------------------------------ the job's sitecustomize
#
# How remotemac gets into every Python process a command starts, whatever its shape
# (``bash run.sh``, torchrun's workers, ``sh -c``): jobsite.py, copied as
# ``sitecustomize.py`` into a directory of its own, first on PYTHONPATH. The run loads
# observer.py with it on the host (runner.prepare_observer); preflight loads optrace.py
# with it on the laptop (checks/preflight.py). One mechanism, set up here for both.


def install_jobsite(
    agent_dir: str, site_dir: str, obs_dir: str, env: dict, module: str = "observer"
) -> None:
    """Copy ``agent_dir/jobsite.py`` to ``site_dir/sitecustomize.py`` and point ``env``
    at it: PYTHONPATH first, REMOTEMAC_OBSERVE_DIR/AGENT/MODULE. ``site_dir`` holds
    nothing else, so no agent module can shadow a user's."""
    import os
    import shutil

    os.makedirs(site_dir, exist_ok=True)
    shutil.copyfile(
        os.path.join(agent_dir, "jobsite.py"), os.path.join(site_dir, "sitecustomize.py")
    )
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = site_dir + (os.pathsep + rest if rest else "")
    env["REMOTEMAC_OBSERVE_DIR"] = obs_dir
    env["REMOTEMAC_OBSERVE_AGENT"] = agent_dir
    env["REMOTEMAC_OBSERVE_MODULE"] = module


# ------------------------------------------------------------------ the Python request syntax

_CLAUSE = re.compile(r"^(>=|<=|==|~=|!=|>|<)?\s*(\d+)\.(\d+)(?:\.(\d+))?(\.\*)?$")

Version = Tuple[int, ...]
Clause = Tuple[str, Version]


def parse_spec(text: Any) -> Optional[List[Clause]]:
    """``"3.11"`` → ``[("==", (3, 11))]``; ``">=3.10,<3.13"`` → two clauses; an
    interpreter name or path (``python3``, ``/usr/bin/python3``) → None."""
    if not isinstance(text, str) or not text.strip():
        return None
    clauses = []
    for part in text.split(","):
        found = _CLAUSE.match(part.strip())
        if not found:
            return None
        op, major, minor, patch, _star = found.groups()
        version = (int(major), int(minor)) + ((int(patch),) if patch is not None else ())
        clauses.append((op or "==", version))
    return clauses


def looks_like_spec(text: str) -> bool:
    """True for what is meant as a version (starts with a digit or a comparison)."""
    return bool(re.match(r"^\s*(>=|<=|==|~=|!=|>|<|\d)", text or ""))


def version_of(text: str) -> Version:
    return tuple(int(x) for x in re.findall(r"\d+", text or "")[:3])


def matches(spec: List[Clause], version: Version) -> bool:
    """Does ``version`` (major, minor, patch) satisfy every clause? ``==3.11`` means 3.11.*."""
    for op, want in spec:
        have = version[: len(want)]
        if op == "==" and have != want:
            return False
        if op == "!=" and have == want:
            return False
        if op == ">=" and have < want:
            return False
        if op == ">" and have <= want:
            return False
        if op == "<=" and have > want:
            return False
        if op == "<" and have >= want:
            return False
        if op == "~=" and (have < want or version[: len(want) - 1] != want[:-1]):
            return False
    return True


# ------------------------------------------------------------------ the agent runtime's pins and wheel tags

#: the pinned set: the newest cryptography that ships cp39-abi3 wheels for macOS
#: arm64 and manylinux x86_64/aarch64 (checked with ``pip download --only-binary=:all:
#: --platform … --python-version 3.9.6``), with the dependencies it pulls there
PINS: Tuple[Tuple[str, str], ...] = (
    ("cryptography", "50.0.2"),
    ("cffi", "2.0.0"),
    ("pycparser", "2.23"),
)
#: glibc minor versions below this have no manylinux wheels worth looking for
MANYLINUX_MIN_MINOR = 17


class RuntimeInstallError(Exception):
    """The runtime cannot be installed or used; ``tail`` holds pip's last lines."""

    def __init__(self, message: str, code: str = "host-env", tail: Optional[List[str]] = None):
        super().__init__(message)
        self.code = code
        self.tail = tail or []


def requirements() -> List[str]:
    return ["%s==%s" % pin for pin in PINS]


def platform_tags(
    system: str, machine: str, mac_release: str = "", glibc: Tuple[int, int] = (0, 0)
) -> List[str]:
    """Wheel platform tags this host accepts, most specific first (what pip's
    ``packaging`` would say, for the two systems remotemac meets)."""
    system = system.lower()
    if system == "darwin":
        arch = {"aarch64": "arm64"}.get(machine, machine)
        parts = (mac_release or "11.0").split(".")
        major = int(parts[0]) if parts[0].isdigit() else 11
        minor = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        if major == 10 and minor >= 16 and arch == "arm64":
            major = 11  # an old-SDK Python's compatibility answer; every arm64 Mac runs 11+
        tags: List[str] = []
        if major >= 11:
            for m in range(major, 10, -1):
                tags.append("macosx_%d_0_%s" % (m, arch))
                tags.append("macosx_%d_0_universal2" % m)
            start = 16
        else:
            start = minor
        x86 = arch == "x86_64"
        for m in range(start, 3, -1):
            if x86:
                tags.append("macosx_10_%d_x86_64" % m)
            if m >= 9 or not x86:
                tags.append("macosx_10_%d_universal2" % m)
        return tags
    if system == "linux":
        arch = {"arm64": "aarch64"}.get(machine, machine)
        major, minor = glibc
        tags = []
        if major == 2 and minor >= MANYLINUX_MIN_MINOR:
            for m in range(minor, MANYLINUX_MIN_MINOR - 1, -1):
                tags.append("manylinux_2_%d_%s" % (m, arch))
                if m == 17:
                    tags.append("manylinux2014_%s" % arch)
        return tags
    return []


def runtime_key(tags: JsonObject) -> str:
    """Content hash: pinned set + interpreter (major.minor) + platform tags."""
    ident = {
        "pins": requirements(),
        "python": tags["python_tag"],
        "platforms": tags["platforms"],
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def supported(tags: JsonObject) -> Set[Tuple[str, str, str]]:
    """The (python, abi, platform) triples a wheel may carry to install here."""
    impl = tags["implementation"]
    major, minor = (int(x) for x in tags["python"].split(".")[:2])
    plats = list(tags["platforms"])
    out: Set[Tuple[str, str, str]] = set()
    own = "%s%d%d" % (impl, major, minor)
    for plat in plats:
        out.add((own, own, plat))
        out.add((own, "none", plat))
        if impl == "cp":
            for m in range(minor, 1, -1):  # abi3: built for 3.m, loads on any later 3.x
                out.add(("cp%d%d" % (major, m), "abi3", plat))
    for m in range(minor, -1, -1):
        for plat in plats:
            out.add(("py%d%d" % (major, m), "none", plat))
        out.add(("py%d%d" % (major, m), "none", "any"))
    for plat in plats:
        out.add(("py%d" % major, "none", plat))
    out.add(("py%d" % major, "none", "any"))
    out.add((own, "none", "any"))
    return out


def parse_wheel_name(filename: str) -> Tuple[str, str, Set[Tuple[str, str, str]]]:
    """(normalised name, version, tag triples) of ``name-ver[-build]-py-abi-plat.whl``."""
    if not filename.endswith(".whl"):
        raise RuntimeInstallError("%s is not a wheel" % filename, "bad-wheel")
    parts = filename[:-4].split("-")
    if len(parts) not in (5, 6):
        raise RuntimeInstallError("%s is not a wheel file name" % filename, "bad-wheel")
    name, version = parts[0], parts[1]
    py, abi, plat = parts[-3:]
    triples = {(p, a, q) for p in py.split(".") for a in abi.split(".") for q in plat.split(".")}
    return normalise_name(name), version, triples


def normalise_name(name: str) -> str:
    """A distribution name as wheel file names and pins compare it."""
    return re.sub(r"[-_.]+", "_", name).lower()
