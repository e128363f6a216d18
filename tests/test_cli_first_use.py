"""First-use slips on the command line that used to pass silently or end unclearly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import remotemac, remotemac_in_process


def test_a_missing_identity_file_is_refused_not_ignored(tmp_path: Path):
    """`remotemac -i ~/.ssh/id_rsa_typo doctor HOST`: the key file the user named does
    not exist; before, it was dropped silently and another key (or none) was tried."""
    missing = tmp_path / "id_typo"
    proc = remotemac_in_process("-i", str(missing), "--home", str(tmp_path / "h"), "status")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(missing) in proc.stderr and "does not exist" in proc.stderr


def test_cleanup_help_says_what_each_option_does():
    """`remotemac cleanup --help` listed --dry-run, --yes and --json bare, and did not say
    that --remote-root adds a root: every root the journal knows for HOST is cleaned
    (a user cleaning "just ~/rmlive" saw every other root go too)."""
    proc = remotemac_in_process("cleanup", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for option in ("--dry-run", "--yes", "--json", "--remote-root"):
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(option))
        assert len(line.split()) > 2, line  # the option and its words
    assert "every remote_root the journal knows" in text


def test_every_option_of_every_command_says_what_it_does():
    """`--help` of doctor, audit and preflight listed --json, --remote-root, --seconds bare."""
    import click

    from remotemac.cli import main

    bare = [
        f"{name} {'/'.join(p.opts)}"
        for name, cmd in main.commands.items()
        for p in cmd.params
        if isinstance(p, click.Option) and not p.help
    ]
    assert bare == []


def test_compare_with_files_outside_tolerance_is_not_shown_with_a_tick():
    """A run whose target failed showed "✓ compare  0/2 files within tolerance": the
    tick read as a pass. The compare phase is shown failed when a file is outside
    tolerance (the phase still ran; the record says which files)."""
    from remotemac.engine.pipeline import phase_ok
    from remotemac.phases import Phase, PhaseKey

    compare = PhaseKey(Phase.COMPARE)
    assert phase_ok(compare, {"within_tolerance": False, "summary": "0/2 files"}) is False
    assert phase_ok(compare, {"within_tolerance": True}) is True
    assert phase_ok(compare, {"within_tolerance": None}) is True  # nothing to compare


def test_the_wipe_summary_does_not_count_what_is_kept_by_design_as_remaining():
    """The quickstart ended "✓ wipe 6 removed, 4 remaining": three of the four were the
    run's logs, project and status, kept until cleanup by design; "remaining" read as
    data left behind on the host."""
    from remotemac.engine.wipe import wipe_summary

    removed = ["h:/r/runs/x/data", "h:/r/runs/x/out", "local:data key of x (crypto-shredded)"]
    kept = [
        f"h:/r/runs/x/{sub} (kept until cleanup; 5 entries, 6749 bytes)"
        for sub in ("logs", "project", "status")
    ]
    assert wipe_summary(removed, kept, True) == (
        "3 removed, 3 kept until cleanup (logs, project, status)"
    )
    stuck = ["h:/r/runs/x/data (still there)"]
    assert wipe_summary(removed, kept + stuck, False) == (
        "3 removed, 3 kept until cleanup (logs, project, status), 1 remaining (not verified)"
    )
    assert wipe_summary(removed, [], True) == "3 removed, 0 remaining"


def test_every_json_output_is_json_lines(tmp_path: Path):
    """`run --dry-run --json` and `audit --json` printed an indented document (124 of
    126 lines not JSON by themselves) where every other --json output, `run --json`'s
    events among them, is one JSON object per line: a reader of JSON lines broke."""
    import json

    from tests.conftest import LINES_PROJECT

    book = tmp_path / "pb.yaml"
    book.write_text(
        f"name: j\nhost: local\nremote_root: {tmp_path / 'root'}\n"
        f"project: {{path: {LINES_PROJECT}, exclude: ['data/']}}\n"
        "workload: {command: 'python3 emit.py', target: {device: cpu}}\n"
    )
    for args in (
        ("run", str(book), "--dry-run", "--json"),
        ("audit", str(LINES_PROJECT), "--json"),
    ):
        proc = remotemac_in_process("--home", str(tmp_path / "home"), *args)
        assert proc.returncode == 0, proc.stderr
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        assert len(lines) == 1, (args, lines[:3])
        assert isinstance(json.loads(lines[0]), dict)


def test_run_refuses_an_out_dir_holding_another_runs_record(tmp_path: Path):
    """`run my.yaml --out runs/<an earlier run>`: the earlier run's acceptance record and
    logs were overwritten and its ledger mixed with the new one's, while the journal
    still pointed the earlier run at that dir. Now: exit 2, one line, nothing touched."""
    from tests.conftest import LINES_PROJECT

    book = tmp_path / "pb.yaml"
    book.write_text(
        f"name: o\nhost: local\nremote_root: {tmp_path / 'root'}\n"
        f"project: {{path: {LINES_PROJECT}, exclude: ['data/']}}\n"
        "workload: {command: 'python3 emit.py', target: {device: cpu}}\n"
    )
    earlier = tmp_path / "runs" / "o-20261201-000000-abcd"
    (earlier / "logs").mkdir(parents=True)
    (earlier / "acceptance.json").write_text('{"run_id": "o-20261201-000000-abcd"}')
    (earlier / "logs" / "cpu.log").write_text("the earlier run's line\n")
    home = str(tmp_path / "home")
    proc = remotemac_in_process("--home", home, "run", str(book), "--out", str(earlier))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "acceptance.json" in err[0] and "--out" in err[0], err
    assert (earlier / "acceptance.json").read_text() == '{"run_id": "o-20261201-000000-abcd"}'
    assert (earlier / "logs" / "cpu.log").read_text() == "the earlier run's line\n"
    assert not (tmp_path / "root").exists()
    assert "no runs yet" in remotemac_in_process("--home", home, "status").stdout


def test_run_with_an_out_dir_it_cannot_create_is_one_line_exit_2(tmp_path: Path):
    """`run my.yaml --out /proc/x`: "internal error: FileNotFoundError ... (rerun with
    -v)", exit 1, and a run left "created" in the journal for ever. Now: exit 2, one line
    naming --out, no run registered."""
    from tests.conftest import LINES_PROJECT

    book = tmp_path / "pb.yaml"
    book.write_text(
        f"name: o\nhost: local\nremote_root: {tmp_path / 'root'}\n"
        f"project: {{path: {LINES_PROJECT}, exclude: ['data/']}}\n"
        "workload: {command: 'python3 emit.py', target: {device: cpu}}\n"
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    home = str(tmp_path / "home")
    proc = remotemac_in_process("--home", home, "run", str(book), "--out", str(blocker / "x"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("remotemac: error: --out "), err
    assert "internal error" not in proc.stderr
    assert "no runs yet" in remotemac_in_process("--home", home, "status").stdout


def test_the_tui_without_a_terminal_is_one_line_exit_2(tmp_path):
    """`remotemac tui` from a script, a pipe or cron (stdin /dev/null, stdout a pipe):
    one line and exit 2 that says what to use instead. Before: Textual wrote escape
    codes into the pipe and waited for keys that never came (a hang)."""
    proc = subprocess.run(
        [sys.executable, "-m", "remotemac", "--home", str(tmp_path / "home"), "tui"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "remotemac: error: the TUI needs a terminal: stdin or stdout is not one (open it in "
        "a terminal; a script runs `remotemac run PLAYBOOK --json`)"
    ], proc.stderr


def test_check_reports_path_problems_with_value_errors_in_one_pass(tmp_path: Path):
    """A playbook with a bad duration, a bad size and two paths that do not exist: one
    ``check`` names all four, in the file's order (the paths used to appear only after
    the values were fixed and check was run again)."""
    book = tmp_path / "pb.yaml"
    book.write_text(
        "name: two-pass\n"
        "host: local\n"
        "remote_root: ~/rm-x\n"
        "project: {path: ./nope}\n"
        "data: {path: ./nodata, classification: public}\n"
        "workload:\n"
        "  command: python train.py\n"
        "  timeout: forever\n"
        "  target: {device: mps}\n"
        "stop_when: {max_memory: lots}\n"
    )
    proc = remotemac("check", str(book), "--json")
    assert proc.returncode == 2
    problems = json.loads(proc.stdout)["problems"]
    keys = [line.split(": ", 2)[1] for line in problems]
    assert keys == ["project.path", "data.path", "workload.timeout", "stop_when.max_memory"]
    assert problems[0].startswith(f"{book}:4:") and "does not exist" in problems[0]
    assert problems[1].startswith(f"{book}:5:") and str(tmp_path / "nodata") in problems[1]
