"""The README's set-up commands, run verbatim in a fresh clone.

The first command (install + quickstart) runs here inside a fresh venv that sees the
machine's packages (torch is already installed from disk), in a clone of this
repository's committed tree, with HOME pointed at a temp dir so that the host
`local` writes its remote_root there. The second command (the tests) is what CI runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.harness import lab

pytestmark = pytest.mark.e2e


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    setup = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", setup, re.S)]


def test_readme_has_exactly_two_setup_commands():
    commands = readme_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert "remotemac run playbooks/quickstart.yaml" in commands[0]
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == commands[1], "CI must run the README's test command"


@pytest.mark.timeout(1200)
def test_first_command_verbatim_in_a_new_clone(tmp_path: Path):
    """The README's first command, as is, in a fresh clone, from a shell with no venv.

    The command makes and activates its own venv (no --system-site-packages: the
    machine's packages are invisible, as on a laptop whose system pip refuses installs),
    installs torch's CPU build and the package, and runs the quickstart, whose host
    ``local`` then builds the workload's venv from that activated venv's python3.
    """
    if (
        subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True
        ).returncode
        != 0
    ):
        pytest.fail("the repository has no commit to clone")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REMOTEMAC_HOME", "VIRTUAL_ENV", "PYTHONPATH")
    }
    env.update(
        HOME=str(tmp_path / "home"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        XDG_STATE_HOME=str(tmp_path / "state"),
        # pip settings, not a change to the command: where the command's extra index
        # (download.pytorch.org) cannot be reached, pip would retry it five times per
        # package (~75 s here) before taking torch from the machine's find-links; and
        # byte-compiling torch's ~20,000 files on install costs ~20 s that the run's
        # imports do not need (Python compiles what it imports)
        PIP_RETRIES="0",
        PIP_COMPILE="0",  # (pip reads PIP_NO_COMPILE=1 as "compile": its --no-* quirk)
    )
    # what the CPU index would give, from this machine's disk, for a user whose pip has
    # no find-links (root's has): unreachable, pip fell back to PyPI's CUDA build
    wheels = lab.cpu_wheelhouse()
    if wheels and not env.get("PIP_FIND_LINKS"):
        env["PIP_FIND_LINKS"] = str(wheels)
    (tmp_path / "home").mkdir()
    command = readme_commands()[0]
    assert "venv" in command and "--system-site-packages" not in command
    # torch pinned, from PyTorch's CPU index (this machine may serve it from disk anyway)
    assert (
        "pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu"
        in command
    )
    proc = subprocess.run(
        ["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True, timeout=1150
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ACCEPTED" in proc.stdout
    runs = list((clone / "runs").iterdir())
    assert len(runs) == 1
    record = json.loads((runs[0] / "acceptance.json").read_text())
    assert record["verdict"] == "accepted"
    assert (runs[0] / "acceptance.md").exists()
    # the workload really ran on the venv's torch, seen through the workload's own venv
    target_env = json.loads((runs[0] / "env" / "target.json").read_text())
    assert target_env["torch"] and target_env["torch"].startswith("2.13")
    # remotemac's state went to the platform's user state dir, its host root under HOME
    assert (tmp_path / "state" / "remotemac" / "journal.sqlite3").exists()
    assert (tmp_path / "home" / "remotemac-quickstart" / "runs").is_dir()
    # the torch the user installed is a CPU build, not PyPI's multi-GB CUDA one: what the
    # README's CPU index is for. Asked of the build itself, not of its name: a "+cpu"
    # suffix is how download.pytorch.org labels its wheels, and a machine whose pip
    # config serves torch from elsewhere (a wheelhouse, a mirror) may label it otherwise.
    probe = subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-c", CUDA_PROBE],
        capture_output=True,
        text=True,
        env=env,
    )
    built = json.loads(probe.stdout or "{}")
    assert built.get("version", "").startswith("2.13.0"), probe.stdout + probe.stderr
    assert built["cuda"] is None and built["nvidia"] == [], built


#: torch's version, the CUDA it was built against (None for a CPU build), and the
#: nvidia-* wheels (cuDNN, cuBLAS, ...) that a CUDA build pulls into the venv
CUDA_PROBE = """
import importlib.metadata as md, json, torch
nvidia = sorted({d.metadata["Name"] for d in md.distributions()
                 if (d.metadata["Name"] or "").lower().startswith("nvidia-")})
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "nvidia": nvidia}))
"""


def test_quickstart_root_is_not_where_git_clone_puts_this_repository():
    """On ``local`` the quickstart's remote_root is in the user's real home; it was
    ``~/remotemac``, the very dir ``git clone …/remotemac`` makes there, so a user who
    cloned into their home got "remote_root holds 15 entries remotemac did not write"."""
    from remotemac.playbook import load_playbook

    pb = load_playbook(REPO / "playbooks" / "quickstart.yaml")
    assert pb.host == "local"
    assert Path(pb.remote_root).name not in ("remotemac", REPO.name), pb.remote_root
    assert pb.remote_root in (readme_commands() and (REPO / "README.md").read_text())
