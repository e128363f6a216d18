"""The workload's venv from any interpreter (issue 14: the quickstart inside a venv).

These call the agent's ``ensure_venv`` op as the engine does (``hostagent.py
ensure_venv`` with JSON on stdin), with real interpreters and real venvs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from remotemac.agent.shared import agent_argv
from tests.harness import hostbuilt

AGENT = Path(__file__).resolve().parent.parent / "remotemac" / "agent" / "hostagent.py"


def ensure_venv(
    root: Path, python: str, *, key: str = "k", system_site: bool = True, path: str | None = None
) -> dict:
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    proc = subprocess.run(
        agent_argv(sys.executable, str(AGENT.parent), "hostagent", "ensure_venv", site=True),
        input=json.dumps(
            {"root": str(root), "key": key, "python": python, "system_site_packages": system_site}
        ).encode(),
        capture_output=True,
        env=env,
        timeout=300,
    )
    return json.loads(proc.stdout)


def make_parent_venv(where: Path, module: str) -> Path:
    """A venv (as a user's activated one) holding a module its base interpreter lacks."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    site = subprocess.run(
        [
            str(where / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, f"{module}.py").write_text("WHO = 'parent venv'\n")
    return where / "bin" / "python3"


def test_venv_from_a_venvs_python_sees_that_venvs_packages(tmp_path: Path):
    """The quickstart's failure: torch in the activated venv was invisible to the workload.

    ``python -m venv --system-site-packages`` from a venv's python links the *base*
    interpreter's site-packages; the op must also link the parent venv's.
    """
    parent = make_parent_venv(tmp_path / "user-venv", "rm_probe_parent")
    answer = ensure_venv(tmp_path / "root", str(parent))
    assert answer["ok"], answer
    result = answer["result"]
    assert result["interpreter_is_venv"] is True and result["reused"] is False
    seen = subprocess.run(
        [result["venv_python"], "-c", "import rm_probe_parent as m; print(m.WHO)"],
        capture_output=True,
        text=True,
    )
    assert seen.stdout.strip() == "parent venv", seen.stderr
    # the workload's own venv comes first: its packages shadow the parent's
    own = subprocess.run(
        [
            result["venv_python"],
            "-c",
            "import sys, sysconfig; p = sysconfig.get_paths()['purelib'];print(sys.path.index(p))",
        ],
        capture_output=True,
        text=True,
    )
    parent_site = result["parent_site"][0]
    where = subprocess.run(
        [result["venv_python"], "-c", f"import sys; print(sys.path.index({parent_site!r}))"],
        capture_output=True,
        text=True,
    )
    assert int(own.stdout) < int(where.stdout)


def test_same_name_two_interpreters_two_venvs(tmp_path: Path):
    """``python3`` from two different venvs never shares an environment (the key is the
    interpreter's identity, not the string)."""
    a = make_parent_venv(tmp_path / "a", "only_in_a").parent
    b = make_parent_venv(tmp_path / "b", "only_in_b").parent
    base_path = os.environ["PATH"]
    first = ensure_venv(tmp_path / "root", "python3", path=f"{a}:{base_path}")["result"]
    second = ensure_venv(tmp_path / "root", "python3", path=f"{b}:{base_path}")["result"]
    assert first["env_dir"] != second["env_dir"]
    again = ensure_venv(tmp_path / "root", "python3", path=f"{a}:{base_path}")["result"]
    assert again["env_dir"] == first["env_dir"] and again["reused"] is True
    # who built it is said on the reuse too (the record's environment.<side>.interpreter)
    assert first["installer"] == "pip" and again["installer"] == "pip"


def test_runs_starting_together_build_the_venv_once(tmp_path: Path):
    """Three runs on one host at once: one builds, the others reuse (no half-made venv),
    from a Python of the host's own."""
    host_python = hostbuilt.host_python()
    with ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(
                lambda _: ensure_venv(tmp_path / "root", host_python, system_site=False),
                range(3),
            )
        )
    assert all(a["ok"] for a in answers), answers
    assert sorted(a["result"]["reused"] for a in answers) == [False, True, True]
    assert len({a["result"]["env_dir"] for a in answers}) == 1


def test_unknown_interpreter_is_a_host_environment_error(tmp_path: Path):
    answer = ensure_venv(tmp_path / "root", "python3.99")
    assert answer["ok"] is False and answer["code"] == "no-python"
    assert "python3.99" in answer["error"] and "environment.python" in answer["error"]
