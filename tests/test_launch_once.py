"""Two launches of one device's job at the same moment start it once (real tmux, real runner).

The host starts the target itself when the reference ends (runner.py ``_launch_next``),
and a laptop that re-attaches at that moment launches the target too (the journal has
not seen it start). Both asked the host's ``launch`` op; both found no live job, both
started one, and the second's ``tmux kill-session`` killed the first after a few lines:
the log then held those lines and the whole log again.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parent.parent / "remotemac" / "agent"

JOB = "import time\nfor i in range(30):\n    print('line', i, flush=True)\n    time.sleep(0.02)\n"


def _launch(request: dict) -> subprocess.Popen[str]:
    code = f"import sys; sys.path.insert(0, {str(AGENT.parent.parent)!r}); "
    code += "from remotemac.agent import hostagent; "
    code += "sys.exit(hostagent.main(['launch']))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(request))
    proc.stdin.close()
    return proc


@pytest.mark.parametrize("round_no", range(4))
def test_two_launches_at_once_run_the_job_once(tmp_path: Path, round_no: int):
    run_dir = tmp_path / "run"
    for sub in ("logs", "status"):
        (run_dir / sub).mkdir(parents=True)
    (tmp_path / "job.py").write_text(JOB)
    session = f"remotemac-launch-once-{tmp_path.name[-12:]}-{round_no}"
    request = {
        "run_dir": str(run_dir),
        "device": "cpu-target",
        "session": session,
        "command": f"{sys.executable} job.py",
        "env": {},
        "cwd": str(tmp_path),
        "skip_access_check": True,
    }
    try:
        procs = [_launch(request) for _ in range(2)]
        answers = []
        for proc in procs:
            assert proc.stdout is not None and proc.wait(timeout=60) is not None
            answers.append(json.loads(proc.stdout.read()))
        assert all(a["ok"] for a in answers), answers
        started = [a for a in answers if not a["result"].get("already_running")]
        assert len(started) == 1, answers
        status = run_dir / "status" / "cpu-target.json"
        deadline = time.monotonic() + 30
        while json.loads(status.read_text()).get("state") not in ("finished", "failed"):
            assert time.monotonic() < deadline, status.read_text()
            time.sleep(0.05)
        log = (run_dir / "logs" / "cpu-target.log").read_text().splitlines()
        assert log == [f"line {i}" for i in range(30)], log
    finally:
        subprocess.run(["tmux", "kill-session", "-t", "=" + session], capture_output=True)
