"""Which Python the workload gets: a version request matched against the host's interpreters.

Why: a rented Mac has one Python, the Command Line Tools' ``/usr/bin/python3`` 3.9,
and current torch needs 3.10 or later. So ``environment.python`` may name a version
(``"3.11"``, ``">=3.10"``) instead of an interpreter; this module looks for one that
matches where interpreters live on a Mac (PATH, ``/usr/bin``, Homebrew's
``/opt/homebrew/bin`` and ``/usr/local/bin``) and among those remotemac brought earlier
(``<root>/runtime/python-*/python/bin``). When none matches, the laptop brings a
relocatable CPython (engine/hostpython.py, agent/bring.py).

Standard library only, Python 3.9; doctor runs it from memory. The request syntax is
shared.py's (the laptop parses it the same way).
"""

from __future__ import annotations

import contextlib
import glob
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .protocol import JsonObject
from .shared import Clause, Version, looks_like_spec, matches, parse_spec, version_of  # noqa: F401

#: where remotemac unpacks the interpreters it brings, below ``<root>/runtime``
BROUGHT_GLOB = "python-*"
MARKER = ".complete"
SEARCH_DIRS = ("/usr/bin", "/opt/homebrew/bin", "/usr/local/bin")
#: where to look instead (a PATH-like list): the host's owner can narrow the search
ENV_SEARCH = "REMOTEMAC_PYTHON_PATH"
_NAME = re.compile(r"^python3(\.\d+)?$")


def pbs_platform() -> Dict[str, str]:
    """This host as python-build-standalone (and uv) name platforms: os, arch, libc."""
    system = platform.system().lower()
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), "")
    arch = arch or platform.machine().lower()
    if system == "darwin":
        libc = "none"
    else:
        libc = "gnu" if (platform.libc_ver()[0] or "") == "glibc" else "musl"
    return {"os": system, "arch": arch, "libc": libc}


def brought_dirs(root: str) -> List[str]:
    """Complete interpreters remotemac brought under ``root`` (newest name first)."""
    base = os.path.join(os.path.expanduser(root), "runtime")
    found = glob.glob(os.path.join(base, BROUGHT_GLOB))
    return sorted((d for d in found if os.path.isfile(os.path.join(d, MARKER))), reverse=True)


def candidates(root: Optional[str]) -> List[Tuple[str, bool]]:
    """(path, brought by remotemac) of every python3 / python3.X worth asking."""
    seen: List[Tuple[str, bool]] = []
    if os.environ.get(ENV_SEARCH):
        dirs = [d for d in os.environ[ENV_SEARCH].split(os.pathsep) if d]
    else:
        dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
        dirs += [d for d in SEARCH_DIRS if d not in dirs]
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            path = os.path.join(directory, name)
            if _NAME.match(name) and os.access(path, os.X_OK) and os.path.isfile(path):
                seen.append((path, False))
    if root:
        for directory in brought_dirs(root):
            for path in sorted(glob.glob(os.path.join(directory, "python", "bin", "python3.*"))):
                if re.search(r"python3\.\d+$", path):
                    seen.append((path, True))
    return seen


def ask_version(path: str) -> Optional[str]:
    """The interpreter's ``major.minor.patch``, or None when it does not start."""
    try:
        res = subprocess.run(
            [path, "-I", "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    text = res.stdout.decode("utf-8", "replace").strip()
    return text if res.returncode == 0 and re.match(r"^\d+\.\d+\.\d+$", text) else None


@dataclass(frozen=True)
class FoundPython:
    """One interpreter seen on the host: its path, real file, version, and whether
    remotemac brought it (under ``<root>/runtime``) or the host has it."""

    path: str
    real: str
    version: str
    brought: bool

    def to_json(self) -> JsonObject:
        return {
            "path": self.path,
            "real": self.real,
            "version": self.version,
            "brought": self.brought,
        }


def op_find_python(req: JsonObject) -> JsonObject:
    """The interpreter for ``spec`` on this host, or None, with every one that was seen.

    Request: ``spec`` (a version request), ``root`` (remote_root). Answer: ``python``
    (path or None), ``version``, ``brought``, ``pythons`` ([{path, real, version,
    brought}]), ``platform`` (os, arch, libc for the archive to bring).
    """
    spec = parse_spec(req.get("spec")) or []
    pythons: List[FoundPython] = []
    reals = set()
    for path, brought in candidates(req.get("root")):
        real = os.path.realpath(path)
        if real in reals:
            continue
        reals.add(real)
        version = ask_version(path)
        if version:
            pythons.append(FoundPython(path, real, version, brought))
    fitting = [p for p in pythons if spec and matches(spec, version_of(p.version))]
    # the newest that fits; among equals, what the host has before what remotemac brought
    fitting.sort(key=lambda p: (version_of(p.version), not p.brought), reverse=True)
    best = fitting[0] if fitting else None
    return {
        "spec": req.get("spec"),
        "python": best.path if best else None,
        "version": best.version if best else None,
        "brought": bool(best and best.brought),
        "pythons": [p.to_json() for p in pythons],
        "platform": pbs_platform(),
        "brought_dirs": [
            {"path": d, "bytes": _tree_bytes(d)} for d in brought_dirs(req.get("root") or "~")
        ],
    }


def _tree_bytes(top: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total
