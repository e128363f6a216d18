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
