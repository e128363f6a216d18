"""Freeze one side's environment: OS, chip, Python, every installed package, torch.

Runs on the host (Python 3.9, stdlib). The package list and torch facts come from
the workload's own interpreter (the venv), asked in a subprocess, so the agent
never imports torch itself. ``importlib.metadata`` is used rather than ``pip
freeze`` because a venv made ``--without-pip`` has no pip.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

from .agentutil import PACKAGES_PROBE, write_json_atomic
from .protocol import JsonObject

_PROBE = (
    PACKAGES_PROBE
    + r"""
import json, os, platform, sys
d = {"python": sys.version.split()[0], "implementation": platform.python_implementation(),
     "executable": sys.executable, "machine": platform.machine()}
try:
    d["packages"] = installed_packages()
except Exception as exc:
    d["packages"] = None
    d["packages_error"] = str(exc)
try:
    import torch
except Exception as exc:
    d["torch"] = None
    d["torch_error"] = type(exc).__name__ + ": " + str(exc)[:200]
else:
    d["torch"] = torch.__version__
    d["mps_built"] = bool(torch.backends.mps.is_built())
    d["mps_available"] = bool(torch.backends.mps.is_available())
    d["cuda_available"] = bool(torch.cuda.is_available())
    d["cuda_version"] = torch.version.cuda
try:
    import numpy
    d["numpy"] = numpy.__version__
except Exception:
    d["numpy"] = None
d["_paths"] = [p for p in sys.path if p and os.path.isdir(p)]
print(json.dumps(d))
"""
)


def _first_line(argv: list) -> str:
    try:
        out = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.decode("utf-8", "replace").strip().splitlines()[0] if out.strip() else ""


@dataclass(frozen=True)
class HostIdentity:
    """OS, version, arch and chip of this host (the environment record's host part);
    ``translated`` and ``vm`` are macOS's (Rosetta, a virtual machine)."""

    os: str
    arch: str
    hostname: str
    os_version: str
    chip: str
    translated: Optional[bool] = None
    vm: Optional[bool] = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "os": self.os,
            "arch": self.arch,
            "hostname": self.hostname,
            "os_version": self.os_version,
            "chip": self.chip,
        }
        if self.translated is not None:
            out["translated"] = self.translated
        if self.vm is not None:
            out["vm"] = self.vm
        return out


def host_facts() -> HostIdentity:
    """OS, version, arch and chip of this host, without the workload's interpreter."""
    system, arch, hostname = platform.system(), platform.machine(), platform.node()
    if sys.platform == "darwin":
        return HostIdentity(
            os=system,
            arch=arch,
            hostname=hostname,
            os_version=platform.mac_ver()[0] or _first_line(["sw_vers", "-productVersion"]),
            chip=_first_line(["sysctl", "-n", "machdep.cpu.brand_string"]),
            translated=_first_line(["sysctl", "-n", "sysctl.proc_translated"]) == "1",
            vm=_first_line(["sysctl", "-n", "kern.hv_vmm_present"]) == "1",
        )
    from . import hostfacts

    return HostIdentity(
        os=system,
        arch=arch,
        hostname=hostname,
        os_version=platform.release(),
        chip=hostfacts.linux_cpu_model() or "",
    )


def env_stamp(resolved: str, paths: list) -> list:
    """What must not change for a cached freeze to stand: the interpreter file, every
    directory on its ``sys.path`` (a package installed or removed changes its
    directory's mtime) and the OS release."""
    stamp: list = [os.uname().release]
    for path in [resolved] + list(paths):
        try:
            st = os.stat(path)
        except OSError:
            stamp.append([path, None])
            continue
        stamp.append([os.path.realpath(path), st.st_mtime_ns, st.st_size])
    return stamp


def _probe(python: str, resolved: str) -> dict:
    res = subprocess.run(
        [resolved, "-c", _PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300
    )
    if res.returncode != 0:
        tail = res.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        raise RuntimeError("the workload interpreter %s does not start: %s" % (python, tail))
    return json.loads(res.stdout.decode().strip().splitlines()[-1])


def _load_cached(cache: str, resolved: str) -> Optional[dict]:
    try:
        with open(cache) as fh:
            saved = json.load(fh)
        if saved["stamp"] == env_stamp(resolved, saved["paths"]):
            return dict(saved["frozen"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def op_freeze_env(req: dict) -> dict:
    """The environment's facts; with ``cache`` (a path per environment key) the package
    probe (1.7 s on a Python with torch) runs only when the environment changed."""
    python = req["python"]
    resolved = python if os.path.sep in python else (shutil.which(python) or python)
    cache = req.get("cache")
    frozen = _load_cached(cache, resolved) if cache else None
    cached = frozen is not None
    if frozen is None:
        frozen = _probe(python, resolved)
        paths = frozen.pop("_paths", [])
        if cache:
            os.makedirs(os.path.dirname(cache), mode=0o700, exist_ok=True)
            write_json_atomic(
                cache, {"stamp": env_stamp(resolved, paths), "paths": paths, "frozen": frozen}
            )
    frozen.pop("_paths", None)
    frozen.update(host_facts().to_json())
    frozen["pytorch_env"] = {k: v for k, v in os.environ.items() if k.startswith("PYTORCH_")}
    frozen["freeze_cached"] = cached
    return frozen
