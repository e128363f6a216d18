"""The workload's environment as the host builds it, for tests on the host ``local``.

Why: a rented Mac's only Python is 3.9.6, which cannot install current torch, so
remotemac matches an interpreter by version (or brings one) and builds the workload's
venv under ``remote_root`` (docs/contract.md, "The workload's Python"). A test that
hands the host the test runner's ``sys.executable`` skips all of that: the workload then
runs in an environment the laptop's test venv lends it (remotemac, pytest and yaml
importable, torch from wherever the runner got it). The playbooks made here say what a
real project says instead: ``environment: {python: "3.11", requirements:
requirements.lock}``, a lock file in the project, and the product's own provision
matches the interpreter and builds the venv with uv.

What keeps it affordable: the venv (torch is ~800 MB unpacked) is built once per xdist
worker, by one real ``remotemac run`` of the ``lines`` workload into a worker-wide
``remote_root`` (:func:`warm_root`); every later run on that root finds it in the
product's own env cache (``<root>/envs/<key>``, keyed by the interpreter and the lock
file's bytes) and reuses it, as a user's second run on a rented host does (measured on
the 2-core machine: the first run 14-29 s, uv fetching torch's dependencies from PyPI;
a reusing run costs what a preinstalled one does, within the noise). A test that
inspects or removes its own root keeps a root of its own, and then a preinstalled
environment (conftest's ``make_preinstalled_playbook``), named so.

Where the host looks for interpreters: ``$REMOTEMAC_PYTHON_PATH`` is set to the OS's
own bin dirs (:data:`HOST_PYTHON_DIRS`), so the search never finds the test venv that
leads the runner's PATH. torch comes from the machine's CPU wheel (``PIP_FIND_LINKS``,
passed on to uv by the agent) or PyTorch's CPU index, never PyPI's CUDA build.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.harness import lab

REPO = Path(__file__).resolve().parents[2]
LINES_PROJECT = REPO / "tests" / "fixtures" / "projects" / "lines"
#: the lock file every host-built project carries (one env for all: same bytes, same key)
REQUIREMENTS_NAME = "requirements.lock"
REQUIREMENTS = "".join(f"{r}\n" for r in lab.HOST_TORCH_REQUIREMENTS)
#: the version a playbook asks for: the one the machine's CPU torch wheel is built for
PYTHON_VERSION = "3.11"
#: the host's own interpreters, as a host without the test venv has them
HOST_PYTHON_DIRS = "/usr/bin:/usr/local/bin:/opt/homebrew/bin"


def host_env() -> dict[str, str]:
    """The variables a run on the host ``local`` needs to build the workload's venv the
    way a host does: the interpreter search without the test venv, the CPU torch."""
    env = {"REMOTEMAC_PYTHON_PATH": HOST_PYTHON_DIRS}
    if lab.cpu_wheelhouse():
        env["PIP_FIND_LINKS"] = str(lab.WHEELS)
    else:
        env["PIP_EXTRA_INDEX_URL"] = "https://download.pytorch.org/whl/cpu"
    return env


def host_python() -> str:
    """A Python 3.11 of the host ``local``'s own (the OS's, else the lab's bare copy):
    for agent ops that take an interpreter, instead of the test runner's."""
    found = shutil.which(f"python{PYTHON_VERSION}", path=HOST_PYTHON_DIRS)
    if found:
        return found
    lab.ensure_lab()
    return str(lab.LAB_BIN / f"python{PYTHON_VERSION}")


def project_copy(src: Path, dest: Path, exclude: tuple[str, ...] = ("cache",)) -> Path:
    """``src`` copied to ``dest`` with the lock file a real project carries."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*exclude, "__pycache__"))
    (dest / REQUIREMENTS_NAME).write_text(REQUIREMENTS)
    return dest


def environment() -> dict:
    """The playbook's ``environment``: a version and a lock file, as a user writes it."""
    return {"python": PYTHON_VERSION, "requirements": REQUIREMENTS_NAME}


@dataclass(frozen=True)
class HostBuilt:
    """What a test on the host ``local`` needs for a host-built environment: the
    worker's warm ``root`` and a place (``tmp``, the test's own) for project copies."""

    root: Path
    tmp: Path

    def project(self, src: Path, name: str | None = None) -> Path:
        """``src`` with its lock file, copied once into the test's dir."""
        dest = self.tmp / f"project-{name or src.name}"
        return dest if dest.exists() else project_copy(src, dest)

    @staticmethod
    def environment() -> dict:
        return environment()


def _lent(path: str) -> bool:
    """Is ``path`` inside the test runner's venv (what ``sys.executable`` lent the host)?
    (A runner that is itself the OS's interpreter lends nothing a venv would not see.)"""
    if os.path.realpath(sys.prefix) == os.path.realpath(sys.base_prefix):
        return False
    return os.path.realpath(path).startswith(os.path.realpath(sys.prefix) + os.sep)


def assert_host_built(
    record: dict,
    root: Path,
    sides: tuple[str, ...] = ("reference", "target"),
    torch: bool = True,
) -> None:
    """The record says each side's workload ran in a venv the host built under ``root``
    from an interpreter it matched by version, with an installer named: not an
    interpreter the test lent it (``venv: false`` records no interpreter at all).
    ``torch``: the lock file's torch is what the workload saw."""
    ready = {
        json.loads(p.read_text())["interpreter"] for p in (root / "envs").glob("*/.remotemac-ready")
    }
    for side in sides:
        facts = record["environment"][side]
        made_from = facts.get("interpreter") or {}
        assert made_from.get("interpreter"), f"{side}: no venv was built: {facts}"
        assert not _lent(made_from["interpreter"]), f"{side}: the test's own Python: {made_from}"
        # made from an interpreter, not from a venv's python (the test venv's on PATH)
        assert made_from.get("interpreter_is_venv") is False, made_from
        assert made_from.get("version", "").startswith(PYTHON_VERSION + "."), made_from
        assert made_from.get("installer") in ("uv", "pip"), made_from
        assert made_from["interpreter"] in ready, (made_from, ready)
        if torch:
            assert str(facts.get("torch", "")).startswith("2.13."), facts


def venv_python(root: Path) -> str:
    """The python of the one venv the host built under ``root`` (``envs/<key>``, ready)."""
    (ready,) = (root / "envs").glob("*/.remotemac-ready")
    return str(ready.parent / "bin" / "python")


@dataclass(frozen=True)
class WarmRoot:
    """A worker-wide ``remote_root`` whose workload venv one real run built."""

    root: Path
    seconds: float  # what that first run took, the build included


def warm_root(base: Path) -> WarmRoot:
    """Run the ``lines`` workload once into ``base/root`` with the real CLI (the
    product's own provision builds the venv) and check the record says so."""
    project = project_copy(LINES_PROJECT, base / "project")
    root = base / "root"
    book = {
        "name": "warm",
        "host": "local",
        "remote_root": str(root),
        "project": {"path": str(project), "exclude": ["data/"]},
        "environment": environment(),
        "workload": {
            "command": "python3 emit.py --device {device} --out {output_dir} --lines 3 "
            "--seconds 0.1 --torch",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "15m",
        },
        "outputs": {"path": ".", "compare": [{"file": "result.json"}]},
        "stop_when": {"memory_growth": False},
    }
    path = base / "warm.yaml"
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    tmux = base / "tmux"
    tmux.mkdir(mode=0o700)
    env = {**os.environ, **host_env(), "TMUX_TMPDIR": str(tmux)}
    env.pop("REMOTEMAC_HOME", None)
    out = base / "out"
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "remotemac",
                "--home",
                str(base / "home"),
                "run",
                str(path),
                "--out",
                str(out),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, capture_output=True, check=False)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, f"the host-built warm-up run failed:\n{proc.stdout}\n{proc.stderr}"
    assert_host_built(json.loads((out / "acceptance.json").read_text()), root)
    return WarmRoot(root, seconds)
