"""The import rules CI checks: the agent is stdlib-only, the engine never reaches a terminal."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _checker():
    spec = importlib.util.spec_from_file_location(
        "check_agent_imports", REPO / "scripts" / "check_agent_imports.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_agent_imports_only_the_standard_library_and_itself() -> None:
    assert _checker().violations() == []


def test_the_agent_checker_flags_third_party_and_the_rest_of_remotemac(tmp_path: Path) -> None:
    agent = tmp_path / "remotemac" / "agent"
    agent.mkdir(parents=True)
    (agent / "sibling.py").write_text("import os\n")
    (agent / "bad.py").write_text(
        "import json\nimport sibling\nfrom remotemac.agent import sibling as s\n"
        "def f():\n    import numpy\n    from remotemac.errors import BadInput\n"
        "    import torch  # agent-imports: lazy (the workload's torch)\n"
    )
    found = _checker().violations(agent)
    assert [line.split(": ", 1)[1] for line in found] == ["numpy", "remotemac.errors"]


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_engine_and_checks_never_import_a_front_end() -> None:
    proc = subprocess.run(["lint-imports"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "broken" not in proc.stdout.split("Contracts:")[-1].replace("0 broken", "")
