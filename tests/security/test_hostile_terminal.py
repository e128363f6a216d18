"""Issue 15 item 9: the job's output cannot drive the user's terminal.

A real run on the ``local`` host whose job prints OSC 52 (a clipboard write), OSC 0
(a window title), ``ESC[2J`` (clear screen), a C1 CSI, BEL, a bare carriage return
and a bidi override. ``remotemac run`` and ``remotemac logs`` show them escaped;
``logs --raw`` passes them through. Before the fix both printed them as they came.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from remotemac.events import LogLine, Warning
from remotemac.termsafe import escape_controls
from tests.conftest import remotemac
from tests.harness import hostbuilt

HOSTILE = (
    "\x1b]52;c;aGFja2VkIGNsaXBib2FyZA==\x07",
    "\x1b]0;pwned title\x07",
    "\x1b[2J",
    "\x9b31m",
    "\x07",
    "\x1b[31mred\x1b[0m",
)
JOB = r"""
import sys
sys.stdout.write("clip:\x1b]52;c;aGFja2VkIGNsaXBib2FyZA==\x07 title:\x1b]0;pwned title\x07\n")
sys.stdout.write("clear:\x1b[2J c1:\x9b31m bell:\x07 cr:over\rwrite bidi:\u202egnp.exe\n")
sys.stdout.write("colour:\x1b[31mred\x1b[0m\n")
sys.stdout.flush()
import json, os
os.makedirs(sys.argv[1], exist_ok=True)
json.dump({"value": 1.0}, open(os.path.join(sys.argv[1], "result.json"), "w"))
"""
CONTROL_BYTES = ("\x1b", "\x07", "\x9b", "\u202e", "\r")


def escape_book(tmp_path: Path) -> Path:
    project = tmp_path / "esc-project"
    (project / "data").mkdir(parents=True)
    (project / "esc.py").write_text(JOB, encoding="utf-8")
    (project / "data" / "a.txt").write_text("a\n")
    book = {
        "name": "esc",
        "host": "local",
        "remote_root": str(tmp_path / "host-root"),
        "project": {"path": str(project)},
        # torch-free: the host builds an empty venv from a 3.11 it has
        "environment": {"python": hostbuilt.PYTHON_VERSION},
        "data": {"path": str(project / "data"), "classification": "public"},
        "workload": {
            "command": "python3 esc.py {output_dir}",
            "reference": None,
            "target": {"device": "cpu"},
            "timeout": "2m",
        },
        "outputs": {"path": "."},
        "stop_when": {"memory_growth": False},
    }
    path = tmp_path / "esc.yaml"
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    return path


@pytest.mark.e2e
def test_run_and_logs_escape_the_jobs_terminal_controls_and_raw_keeps_them(
    tmp_path, rm_home, host_pythons
):
    book = escape_book(tmp_path)
    run = remotemac("run", str(book), "--out", str(tmp_path / "out"), timeout=240)
    assert run.returncode in (0, 1), run.stdout + run.stderr
    for control in CONTROL_BYTES:
        assert control not in run.stdout, f"run printed {control!r}"
    assert "\\x1b]52;c;" in run.stdout and "\\x1b[2J" in run.stdout
    run_id = next(line.split()[1] for line in run.stdout.splitlines() if line.startswith("run "))
    record = json.loads((tmp_path / "out" / "acceptance.json").read_text())
    hostbuilt.assert_host_built(record, tmp_path / "host-root", ("target",), torch=False)

    logs = remotemac("logs", run_id)
    assert logs.returncode == 0, logs.stderr
    for control in CONTROL_BYTES:
        assert control not in logs.stdout, f"logs printed {control!r}"
    assert "\\x1b]0;pwned title\\x07" in logs.stdout and "\\u202e" in logs.stdout
    assert "cr:over\\x0dwrite" in logs.stdout

    raw = remotemac("logs", run_id, "--raw")
    assert raw.returncode == 0
    assert all(seq in raw.stdout for seq in HOSTILE)


def test_rich_renderer_escapes_log_lines_and_host_text_and_does_not_parse_their_markup():
    from rich.console import Console

    from remotemac.render import RichRenderer

    render = RichRenderer()
    render.console = Console(file=io.StringIO(), force_terminal=True, width=200, highlight=False)
    render(LogLine("r", device="mps", line="x\x1b]52;c;QUJD\x07y [/] [bold]z"))
    render(Warning("r", message="host said \x1b[2J[/oops]", code="w"))
    shown = render.console.file.getvalue()
    assert "\x1b]52" not in shown and "\x1b[2J" not in shown and "\x07" not in shown
    assert "\\x1b]52;c;QUJD\\x07" in shown and "[/]" in shown and "[/oops]" in shown

    raw = RichRenderer(raw=True)
    raw.console = Console(file=io.StringIO(), force_terminal=True, width=200, highlight=False)
    raw(LogLine("r", device="mps", line="\x1b]0;title\x07"))
    assert "\x1b]0;title\x07" in raw.console.file.getvalue()


def test_tui_log_view_lines_are_escaped():
    from remotemac.tui.model import RunLive

    live = RunLive("r", host="local", name="n")
    live.apply(LogLine("r", device="mps", line="\x1b[2J\x1b]52;c;QUJD\x07ok"))
    [line] = live.lines.since(0)
    assert (line.device, line.text) == ("mps", escape_controls("\x1b[2J\x1b]52;c;QUJD\x07ok"))
    assert "\x1b" not in line.text and "\x07" not in line.text


def test_escape_controls_keeps_tab_newline_and_plain_text():
    text = "a\tb\nc é ✓ 中文\r\n"
    assert escape_controls(text) == "a\tb\nc é ✓ 中文\n"
    assert escape_controls("\x00\x1f\x7f\x85\u200f") == "\\x00\\x1f\\x7f\\x85\\u200f"
