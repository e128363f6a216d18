"""The TUI's frames reach a non-blocking terminal whole (issue 30), on a real pty.

Simulation, named so: a real pseudo-terminal whose slave side is non-blocking (as a
terminal is when any process sharing it set ``O_NONBLOCK``), and a reader on the
master side that drains slowly (a terminal reading slower than the app writes): the
first test shows the
cause, Python's own stderr stream dropping bytes without an error; the second that
:class:`~remotemac.tui.terminal.WholeWrites` loses none. The third checks that the
app runs its frames through it on a real terminal and leaves tests' headless driver
alone.
"""

from __future__ import annotations

import io
import os
import pty
import threading
import time

import pytest
from textual.drivers.headless_driver import HeadlessDriver
from textual.drivers.linux_driver import LinuxDriver

from remotemac.tui.terminal import WholeWrites, driver_class

#: a frame of the run screen's kind: box drawing, blocks, sparkline glyphs (3 bytes each)
FRAME = ("\x1b[1;1H" + "─" * 39 + "│" + "▁▂▃▄▅▆▇█" * 10 + "\r\n") * 200


class SlowTerminal:
    """A pty whose slave is non-blocking; its master is read 4 KiB per 5 ms."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        os.set_blocking(self.slave, False)
        self.got = bytearray()
        self.stop = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        time.sleep(0.2)  # not reading at first: the pty fills up
        while not self.stop.is_set():
            try:
                self.got += os.read(self.master, 4096)
            except OSError:
                return
            time.sleep(0.005)

    def __enter__(self) -> SlowTerminal:
        import termios
        import tty

        tty.setraw(self.slave)  # bytes as written: no \n -> \r\n on the way
        termios.tcflush(self.slave, termios.TCIOFLUSH)
        self.reader.start()
        return self

    def received(self, size: int, timeout: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout
        while len(self.got) < size and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        return bytes(self.got)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        os.close(self.slave)
        os.close(self.master)
        self.reader.join(2)


def test_pythons_own_stderr_stream_drops_bytes_on_a_non_blocking_terminal():
    """The cause: a text stream over the raw file (as ``sys.__stderr__`` is) writes what
    the kernel takes and drops the rest, with no error; the frame arrives cut."""
    data = FRAME.encode()
    with SlowTerminal() as term:
        stream = io.TextIOWrapper(
            io.FileIO(term.slave, "w", closefd=False), encoding="utf-8", write_through=True
        )
        assert isinstance(stream.buffer, io.FileIO)
        for _ in range(3):
            stream.write(FRAME)  # no exception
            stream.flush()
        got = term.received(3 * len(data), timeout=2.0)
    assert len(got) < 3 * len(data)  # bytes lost, and no error said so


def test_whole_writes_lose_no_byte_on_a_non_blocking_terminal():
    data = FRAME.encode()
    with SlowTerminal() as term:
        out = WholeWrites(io.TextIOWrapper(io.FileIO(term.slave, "w", closefd=False), "utf-8"))
        for _ in range(3):
            assert out.write(FRAME) == len(FRAME)
        out.flush()
        got = term.received(3 * len(data))
    assert got == data * 3


@pytest.mark.asyncio
async def test_the_app_writes_its_frames_through_whole_writes(tmp_path, monkeypatch):
    from tests import tuiscene

    app, _ = tuiscene.finished_run(tmp_path)
    cls = app.get_driver_class()
    assert issubclass(cls, LinuxDriver) and cls is not LinuxDriver
    assert driver_class(HeadlessDriver) is HeadlessDriver  # Pilot tests: unchanged
    with open(os.devnull) as stdin:  # the driver takes sys.__stdin__'s fd when made
        monkeypatch.setattr("sys.__stdin__", stdin)
        driver = cls(app)
    assert isinstance(driver._file, WholeWrites)


SPAWNS = {
    "subprocess": {"run", "Popen", "call", "check_call", "check_output"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
}


def test_no_laptop_subprocess_inherits_the_terminal():
    """Every process remotemac starts on the laptop gets its own stdin, never the terminal
    a TUI draws on: a child holding the terminal can change its shared flags (as
    ``O_NONBLOCK``) or take its keys. The agent runs on the host, audit rules only name
    calls. Before: ``git`` (the project's revision, at every run) and ``ps`` inherited it."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "remotemac"
    missing = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith(("remotemac/agent/", "remotemac/checks/audit_rules/")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            if not (isinstance(owner, ast.Name) and node.func.attr in SPAWNS.get(owner.id, ())):
                continue
            if not any(k.arg == "stdin" for k in node.keywords):
                missing.append(f"{rel}:{node.lineno}")
    assert missing == []
