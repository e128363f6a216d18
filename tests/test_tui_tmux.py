"""The TUI through a real tmux at 120x40 (issue 30): what the terminal shows, not the SVG.

A tester saw rows of a finished or re-attached run's screen cut near column 40
and ending in ``�``, staying so. Here the app runs in a real tmux pane (its own
server socket), streams lines into a live run that then ends (as a re-attached
run finishing), opens and closes a dialog, and ``capture-pane`` must show every
row whole: no ``�``, the side panel's border on every body row, every log line
either whole or running to the pane's edge, the footer whole. The last test shows
the cause and its fix: a non-blocking terminal that is not read for a moment.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)  # tmux is part of the test image (jobs run in it)

W, H = 120, 40
SIDE = 40  # the side panel's width (app.tcss): its border is column 40


#: run in the pane before the app, sharing its terminal: leaves the terminal's open file
#: description non-blocking and exits, as a program run before in the same shell may
SET_NONBLOCK = (
    "import fcntl, os; fcntl.fcntl(0, fcntl.F_SETFL, fcntl.fcntl(0, fcntl.F_GETFL) | os.O_NONBLOCK)"
)


class Pane:
    def __init__(self, tmp: Path, *argv: str, nonblocking: bool = False) -> None:
        self.socket = f"rm-tui-{os.getpid()}-{time.monotonic_ns()}"
        env = dict(os.environ, LANG="C.UTF-8", TERM="xterm-256color")
        env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        cmd = shlex.join([sys.executable, "-m", "tests.tuiscene", *argv])
        if nonblocking:
            cmd = f"{shlex.join([sys.executable, '-c', SET_NONBLOCK])}; exec {cmd}"
        self.tmux(
            "new-session", "-d", "-x", str(W), "-y", str(H), "-e", "LANG=C.UTF-8", cmd, env=env
        )

    def tmux(self, *args: str, env: dict | None = None) -> str:
        out = subprocess.run(
            ["tmux", "-u", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=20,
            env=env,
            check=True,
        )
        return out.stdout

    def rows(self) -> list[str]:
        return self.tmux("capture-pane", "-p", "-t", "0").split("\n")[:H]

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "0", *keys)

    def until(self, predicate, what: str, timeout: float = 30) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            rows = self.rows()
            if predicate("\n".join(rows)):
                return rows
            assert time.monotonic() < deadline, f"{what}: " + "\n".join(rows)
            time.sleep(0.1)

    def server_pid(self) -> int:
        return int(self.tmux("display-message", "-p", "#{pid}").strip())

    def tty_nonblocking(self) -> bool:
        """Whether the pane's terminal (its open file description) is non-blocking."""
        pid = self.tmux("display-message", "-p", "-t", "0", "#{pane_pid}").strip()
        info = Path(f"/proc/{pid}/fdinfo/0").read_text()
        flags = int(info.split("flags:")[1].split()[0], 8)
        return bool(flags & os.O_NONBLOCK)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


SCROLLBAR = re.compile(r"\s+[\u2580-\u259f]+$")
LINE = re.compile(r"│(?:\d\d:\d\d:\d\d )?(cpu|mps) +│ (.*)$")


def assert_whole(rows: list[str], expected_line) -> None:
    """No ``�``; the side border at column 40 on each body row; log lines whole or to the edge."""
    text = "\n".join(rows)
    assert "\ufffd" not in text, text
    body = rows[1 : H - 1]  # the header and the footer aside
    for n, row in enumerate(body, start=2):
        assert len(row) > SIDE - 1 and row[SIDE - 1] == "│", (n, row)
        m = LINE.search(row)
        if m:
            shown = SCROLLBAR.sub("", m.group(2)).rstrip()  # the log's scrollbar at the edge
            full = expected_line(shown)
            assert shown == full or (full.startswith(shown) and len(row) >= W - 2), (n, row)
    footer = rows[H - 1].rstrip()
    assert footer.endswith("? Keys") or footer.endswith("? more"), footer


def test_a_streamed_run_that_ends_renders_whole_in_tmux(tmp_path):
    pane = Pane(tmp_path, "stream", str(tmp_path / "scene"), "5000")
    try:

        def expected(shown: str) -> str:
            m = re.match(r"step (\d{6})", shown)
            assert m, shown
            i = int(m.group(1))
            return f"step {i:06d} loss 0.{i:05d} lr 1e-4 throughput 1234.5 samples/s"

        rows = pane.until(lambda t: "5,000 lines" in t, "all 5,000 lines in view")
        assert_whole(rows, expected)
        time.sleep(1.0)  # the run has ended: nothing repaints, the screen stays whole
        rows = pane.rows()
        assert_whole(rows, expected)
        pane.keys("?")
        pane.until(lambda t: "Keys: run" in t, "the help")
        assert "\ufffd" not in "\n".join(pane.rows())
        pane.keys("Escape")
        rows = pane.until(lambda t: "Keys: run" not in t, "the help closed")
        assert_whole(rows, expected)
    finally:
        pane.close()


def test_a_finished_run_renders_whole_in_tmux(tmp_path):
    scene = tmp_path / "scene"
    pane = Pane(tmp_path, "finished", str(scene))
    try:
        rows = pane.until(lambda t: "REJECTED" in t and "241 lines" in t, "the finished run")
        lines = {
            line
            for name in ("cpu.log", "mps.log")
            for line in (scene / "done" / "logs" / name).read_text().splitlines()
        }

        def expected(shown: str) -> str:
            return next((line for line in lines if line.startswith(shown)), "(none)")

        assert_whole(rows, expected)
    finally:
        pane.close()


def test_a_frame_written_while_the_terminal_is_not_reading_arrives_whole(tmp_path):
    """The cause of the cut rows ending in ``�`` (issue 30), through a real tmux 3.3a.

    Simulation, named so: a child run first in the pane leaves the terminal's open file
    description non-blocking (``O_NONBLOCK`` is shared by every process holding the
    terminal; a program in the same shell may leave it so), and the tmux server is
    stopped (SIGSTOP) for 2 s right after a key that opens the help on a finished run's
    screen, as a terminal that reads slower than the app writes (a loaded machine, a
    slow link to the client). The help's frame is larger than the pty's free space.
    Before: Python's stderr took what the kernel took and dropped the rest without an
    error, so the help stayed half drawn, rows cut (and a cut UTF-8 sequence eats the
    next glyph in tmux 3.3a, shows as ``�`` in newer tmux and most terminals) until
    something repainted those cells. Now: the capture equals the help drawn with tmux
    reading, and the screen goes on updating.
    """
    scene = tmp_path / "scene"
    pane = Pane(tmp_path, "finished", str(scene), nonblocking=True)
    server = 0
    try:
        pane.until(lambda t: "REJECTED" in t and "241 lines" in t, "the finished run")
        assert pane.tty_nonblocking()  # the provocation is in place
        pane.keys("?")
        pane.until(lambda t: "Keys: run" in t, "the help, tmux reading")
        time.sleep(0.5)
        help_rows = pane.rows()  # the references: the help and the run screen, whole
        pane.keys("Escape")
        pane.until(lambda t: "Keys: run" not in t, "the help closed, tmux reading")
        time.sleep(0.5)
        rows = pane.rows()
        server = pane.server_pid()
        for attempt in range(3):  # three times: each frame must arrive whole
            pane.keys("?")
            os.kill(server, signal.SIGSTOP)
            try:
                time.sleep(2.0)
            finally:
                os.kill(server, signal.SIGCONT)
            # the app is idle now: what the terminal shows 10 s on stays
            shown = pane.until(
                lambda t: t == "\n".join(help_rows), f"the help whole ({attempt})", 10
            )
            assert "\ufffd" not in "\n".join(shown)
            pane.keys("Escape")  # still updating: the run screen comes back whole
            pane.until(lambda t: t == "\n".join(rows), f"the run screen whole ({attempt})", 10)
    finally:
        if server:  # never leave the server stopped
            with contextlib.suppress(OSError):
                os.kill(server, signal.SIGCONT)
        pane.close()
