"""The README's contributor section, read out of README.md and run as written.

A new contributor's first failure was ``No module named pytest``: the README said to
run the fast subset but never to install the test extras. This runs the section's two
lines in a fresh clone, in a fresh venv: the install line as written, then the
fast-subset line with ``--collect-only`` added (running the whole subset is the fast
suite itself; what the lines promise is that they work in order in a new venv). The
venv sees the machine's packages (``--system-site-packages``: torch is not
downloaded again), so pip's work is the editable install of the clone.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def contributor_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Contributing", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [line.strip() for block in blocks for line in block.strip().splitlines()]


def test_contributor_section_installs_the_test_extras_before_the_fast_subset():
    """The order a contributor types them: the extras (which carry pytest), then pytest."""
    install, fast = contributor_commands()
    assert install.startswith("pip install") and "test]" in install
    pyproject = (REPO / "pyproject.toml").read_text()
    test_extra = pyproject.split("\ntest = [", 1)[1].split("\n]", 1)[0]
    assert re.search(r'^\s*"pytest>=', test_extra, re.M), test_extra
    assert fast.startswith("python -m pytest") and "not sshd and not e2e and not slow" in fast


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_contributor_lines_verbatim_in_a_fresh_venv(tmp_path: Path):
    """Both lines, as written, in a fresh clone and venv: the install succeeds and the
    fast subset collects hundreds of tests, none of them an sshd, e2e or slow one."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_RETRIES="0",
    )
    install, fast = contributor_commands()
    proc = subprocess.run(
        ["bash", "-c", install], cwd=clone, env=env, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = subprocess.run(
        ["bash", "-c", f"{fast} --collect-only -p no:cacheprovider"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    found = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", proc.stdout)
    assert found, proc.stdout[-1000:]
    selected, total, deselected = map(int, found.groups())
    assert selected > 300 and deselected > 50 and selected + deselected == total
    # the clone's code is what ran: the editable install points into the clone
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import remotemac; print(remotemac.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert where.startswith(str(clone)), where
