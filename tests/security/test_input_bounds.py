"""Issue 31 item 11: input is bounded before it is parsed, and refused in one line.

As the user meets it, through the real CLI: ``timeout:`` with 5,000 digits was
``internal error: ValueError: Exceeds the limit (4300 digits)``; ``run /dev/zero
--dry-run`` (or ``--inventory /dev/zero``) grew until the kernel's OOM killer ended
it; ``--inventory /etc/shadow`` echoed the file's first line in its error; a
1,000,000-variant matrix or 100,000 hosts passed ``check`` and ``--dry-run`` ran
past a minute. Each test runs in a subprocess with a 4 GiB address-space limit so a
regression fails the test instead of the machine.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

# every case is a real CLI process (1-4 s each on the loaded 2-core machine)
pytestmark = pytest.mark.slow

SHADOW_LIKE = (
    "root:$6$Zq4Ws1cR$kT0pSecretHashThatMustNeverBePrinted0123456789abcdefABCDEF:20228:0:99999:7:::\n"
    "daemon:*:20228:0:99999:7:::\n"
)


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real CLI, with its memory capped (a runaway read fails, not the machine)."""
    return subprocess.run(
        [sys.executable, "-m", "remotemac", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limited,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def one_line_exit_2(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("remotemac: error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert len(lines[0]) < 400, lines[0]
    return lines[0]


def playbook(tmp_path: Path, **overrides) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "train.py").write_text("print('hi')\n")
    data = {
        "name": "bounds",
        "host": "local",
        "project": {"path": str(proj)},
        "workload": {"command": "python train.py", "timeout": "5m"},
        **overrides,
    }
    path = tmp_path / "bounds.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("where", ["workload.timeout", "data.max_bytes", "hosts"])
def test_a_number_of_5000_digits_is_one_line_naming_its_line(tmp_path: Path, where: str):
    book = playbook(tmp_path)
    text = book.read_text()
    digits = "9" * 5000
    if where == "workload.timeout":
        text = text.replace("timeout: 5m", f"timeout: {digits}")
    elif where == "data.max_bytes":
        text += f"data: {{path: proj, max_bytes: {digits}}}\n"
    else:
        text += f"hosts: [{digits}]\n"
    book.write_text(text)
    for args in (("check", str(book)), ("run", str(book), "--dry-run")):
        line = one_line_exit_2(cli(*args))
        assert "digits" in line and "bounds.yaml:" in line, line


@pytest.mark.parametrize("option", ["playbook", "--inventory"])
def test_dev_zero_as_playbook_or_inventory_is_refused_not_read_until_oom(
    tmp_path: Path, option: str
):
    args = (
        ("run", "/dev/zero", "--dry-run")
        if option == "playbook"
        else ("run", str(playbook(tmp_path)), "--dry-run", "--inventory", "/dev/zero")
    )
    started = time.monotonic()
    line = one_line_exit_2(cli(*args, timeout=30))
    assert time.monotonic() - started < 20
    assert "/dev/zero" in line and "not a regular file" in line, line


def test_a_fifo_as_inventory_is_refused_without_waiting_for_a_writer(tmp_path: Path):
    fifo = tmp_path / "inv.fifo"
    os.mkfifo(fifo)
    line = one_line_exit_2(
        cli("run", str(playbook(tmp_path)), "--dry-run", "--inventory", str(fifo), timeout=30)
    )
    assert "not a regular file" in line, line


def test_a_playbook_larger_than_the_cap_is_refused_by_size(tmp_path: Path):
    book = playbook(tmp_path)
    with open(book, "a") as fh:
        fh.write("# padding\n" * 200_000)  # 2 MB of comments
    line = one_line_exit_2(cli("check", str(book)))
    assert "MiB" in line and "at most" in line, line


def _shadow_files(tmp_path: Path) -> list[Path]:
    fake = tmp_path / "shadow"
    fake.write_text(SHADOW_LIKE)
    real = Path("/etc/shadow")
    return [fake] + ([real] if os.access(real, os.R_OK) else [])


def test_an_inventory_that_is_a_secret_file_is_never_echoed(tmp_path: Path):
    book = playbook(tmp_path)
    for secret in _shadow_files(tmp_path):
        proc = cli("run", str(book), "--dry-run", "--inventory", str(secret))
        line = one_line_exit_2(proc)
        content = secret.read_text()
        for record in content.splitlines():
            for field in record.split(":"):
                if len(field) >= 6:  # user names, hashes: none of it is shown
                    assert field not in proc.stderr + proc.stdout, (field[:3], line)
        assert str(secret) in line


def test_a_million_variant_matrix_is_refused_quickly_with_the_limit(tmp_path: Path):
    matrix = {f"k{i}": list(range(10)) for i in range(6)}  # 10**6 variants
    book = playbook(
        tmp_path,
        matrix=matrix,
        workload={"command": "python train.py --k {matrix.k0}", "timeout": "5m"},
    )
    for args in (("check", str(book)), ("run", str(book), "--dry-run")):
        started = time.monotonic()
        line = one_line_exit_2(cli(*args, timeout=60))
        assert time.monotonic() - started < 15
        assert "1000000 variants" in line and "at most 1000" in line, line
    proc = cli("check", str(book), "--json")
    assert proc.returncode == 2 and not json.loads(proc.stdout)["ok"]


def test_100000_hosts_are_refused_quickly_with_the_limit(tmp_path: Path):
    book = playbook(tmp_path)
    with open(book, "a") as fh:
        fh.write("hosts: [" + ", ".join(f"m{i}" for i in range(100_000)) + "]\n")
    started = time.monotonic()
    line = one_line_exit_2(cli("check", str(book), timeout=60))
    assert time.monotonic() - started < 15
    assert "100000 hosts" in line and "at most 1000" in line, line


def test_an_inventory_of_100000_hosts_is_refused_with_the_limit(tmp_path: Path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("macs: [" + ", ".join(f"m{i}" for i in range(100_000)) + "]\n")
    started = time.monotonic()
    line = one_line_exit_2(
        cli("run", str(playbook(tmp_path)), "--dry-run", "--inventory", str(inv), timeout=60)
    )
    assert time.monotonic() - started < 15
    assert "100000 hosts" in line and "at most 1000" in line, line
