"""A failing command run with ``--json`` still answers in JSON on stdout.

A script that reads ``remotemac status RUN --json`` (or ``logs``, ``audit``, ``doctor``,
``run``) parses stdout; on a failure it found nothing there and had to scrape stderr.
Now stdout carries one JSON object, ``{"error": line, "exit_code": code}`` (the shape
``preflight --json`` already used), and stderr keeps its one ``remotemac: error:`` line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import remotemac, remotemac_in_process


def assert_json_error(proc, code: int, words: str) -> dict:
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    answer = json.loads(lines[0])
    assert answer["exit_code"] == code == proc.returncode, (answer, proc.returncode)
    assert words in answer["error"], answer
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0] == f"remotemac: error: {answer['error']}", proc.stderr
    return answer


@pytest.mark.parametrize(
    "args",
    [
        ("status", "zzzz", "--json"),
        ("logs", "zzzz", "--json"),
        ("attach", "zzzz", "--json"),
        ("logs", "--json", "latest"),
    ],
)
def test_unknown_run_id_with_json_is_a_json_error(tmp_path: Path, args: tuple[str, ...]):
    proc = remotemac_in_process("--home", str(tmp_path / "home"), *args)
    assert_json_error(proc, 2, "run")


def test_audit_of_a_missing_dir_with_json_is_a_json_error(tmp_path: Path):
    proc = remotemac_in_process("audit", str(tmp_path / "nope"), "--json")
    assert_json_error(proc, 2, "does not exist")


def test_run_of_a_bad_playbook_with_json_is_a_json_error(tmp_path: Path):
    """The real process: stdout is JSON lines only, the last says why and the exit code."""
    book = tmp_path / "pb.yaml"
    book.write_text("name: x\nhost: local\nremote_rot: ~/r\nworkload: {command: 'true'}\n")
    proc = remotemac("--home", str(tmp_path / "home"), "run", str(book), "--json")
    assert_json_error(proc, 2, "did you mean 'remote_root'")


def test_without_json_stdout_stays_empty(tmp_path: Path):
    proc = remotemac_in_process("--home", str(tmp_path / "home"), "status", "zzzz")
    assert proc.returncode == 2 and proc.stdout == ""


@pytest.mark.parametrize("host", ["nosuchalias.invalid", "127.0.0.1:1"])
def test_a_host_never_reached_says_no_job_is_running(tmp_path: Path, host: str):
    """`run --host <typo>`: exit 3, one line, and no "the job keeps running on the host …
    remotemac attach" (nothing was launched: the first connect failed); the journal says
    failed, not detached. Issue 31 item 9: and no run is left behind (it would be
    ``latest``)."""
    from tests.conftest import LINES_PROJECT

    book = tmp_path / "pb.yaml"
    book.write_text(
        f"name: typo\nhost: local\nremote_root: {tmp_path / 'root'}\n"
        f"project: {{path: {LINES_PROJECT}, exclude: ['data/']}}\n"
        "workload: {command: 'python3 emit.py', target: {device: cpu}}\n"
    )
    home = str(tmp_path / "home")
    proc = remotemac("--home", home, "run", str(book), "--host", host, "--json", timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("remotemac: error: "), err
    assert "keeps running" not in err[0] and "attach" not in err[0], err[0]
    last = json.loads(proc.stdout.splitlines()[-1])
    assert last["event"] == "run_finished" and last["verdict"] == "failed", last
    assert "nothing was started" in last["detail"], last
    status = remotemac("--home", home, "status", "latest", "--json")
    assert status.returncode == 2 and "no runs" in json.loads(status.stdout)["error"], status


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("status", "--hostt"), "No such option '--hostt'"),
        (("bogus",), "No such command 'bogus'"),
        (("run",), "Missing argument 'PLAYBOOK'"),
        (("status", "--json", "--hostt"), "No such option '--hostt'"),
    ],
)
def test_click_usage_errors_are_remotemac_error_lines(tmp_path: Path, args, words):
    """click's own errors (an unknown option or command, a missing argument) are one
    ``remotemac: error:`` line naming the command's --help, exit 2; JSON under --json
    (was click's ``Usage: … Error: No such option``, never JSON)."""
    proc = remotemac_in_process("--home", str(tmp_path / "home"), *args)
    assert proc.returncode == 2
    if "--json" in args:
        assert_json_error(proc, 2, words)
        return
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"remotemac: error: {words}") and line.endswith(" --help)"), line


def test_click_usage_error_in_a_real_process(tmp_path: Path):
    proc = remotemac("--home", str(tmp_path / "home"), "status", "--hostt", "--json")
    assert_json_error(proc, 2, "No such option '--hostt'")
    assert "Usage:" not in proc.stderr
