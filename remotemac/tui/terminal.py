"""The TUI's terminal output: every byte of every frame reaches the terminal (issue 30).

Textual's Linux driver writes its frames through ``sys.__stderr__``, a text stream
whose buffer is the raw file: a ``write`` the kernel takes only in part is not
retried, and one it refuses (``EAGAIN``) is dropped, both without an error. That
happens whenever the terminal's open file description is non-blocking; the
``O_NONBLOCK`` flag lives there, shared by every process holding the terminal (the
shell, a program it ran before, any child that inherited it), so remotemac cannot
rule it out. Then a frame larger than the pty's free space (about 15 KB on Linux)
loses its tail whenever the terminal reads slower than the app writes: a row cut
mid-character (``�``), and since Textual sends only what changed afterwards, the cut
stays until a full repaint. Here each frame is written whole with ``os.write`` in a
loop that waits while the terminal is full; the terminal's flags are left as they are
(they are not ours alone).
"""

from __future__ import annotations

import os
import select
import sys
from typing import Any, TextIO

from textual.driver import Driver

WAIT_S = 1.0  # one wait for the terminal to take more; the loop waits as long as it must


def write_all(fd: int, data: bytes) -> None:
    """Write ``data`` whole to ``fd``, blocking or not: short writes go on where they
    stopped, ``EAGAIN`` waits for the fd to be writable. An error (the terminal gone)
    raises, as a blocking write would."""
    view = memoryview(data)
    while view:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            sent = 0
        if sent:
            view = view[sent:]
        else:
            select.select([], [fd], [], WAIT_S)


class WholeWrites:
    """The file Textual's writer thread writes frames to: whole writes, same encoding."""

    def __init__(self, stream: TextIO) -> None:
        self.fd = stream.fileno()
        self.encoding = stream.encoding or "utf-8"
        self.errors = stream.errors or "strict"

    def write(self, text: str) -> int:
        write_all(self.fd, text.encode(self.encoding, self.errors))
        return len(text)

    def flush(self) -> None:
        """Nothing is held back: each write went out whole."""

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return os.isatty(self.fd)


def driver_class(default: type[Driver]) -> type[Driver]:
    """Textual's Linux driver writing through :class:`WholeWrites`; any other driver
    (Windows, headless for tests, one named by ``TEXTUAL_DRIVER``) as it is."""
    if default.__module__ != "textual.drivers.linux_driver":
        return default

    class WholeFrameDriver(default):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if sys.__stderr__ is not None:
                self._file = WholeWrites(sys.__stderr__)

    WholeFrameDriver.__name__ = WholeFrameDriver.__qualname__ = "WholeFrameDriver"
    return WholeFrameDriver
