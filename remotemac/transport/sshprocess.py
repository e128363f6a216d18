"""One exec channel of the ssh transport as a :class:`RemoteProcess`, and how a command
is framed and its session opened.

Why a module of its own: transport/ssh.py keeps the connection, its link and the SFTP
file operations; what one channel does (streams, a dead link made transient, the
banner a login shell prints cut off) reads on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncssh
from asyncssh.constants import MSG_CHANNEL_WINDOW_ADJUST
from asyncssh.packet import UInt32

from remotemac.errors import TransientHostError
from remotemac.transport.base import RemoteProcess

T = TypeVar("T")

LINK_ERRORS = (
    asyncssh.DisconnectError,  # includes ConnectionLost
    asyncssh.sftp.SFTPConnectionLost,
    asyncssh.sftp.SFTPNoConnection,
    ConnectionError,
    BrokenPipeError,
    EOFError,
)


def _send_window(proc: asyncssh.SSHClientProcess) -> int | None:
    window = getattr(getattr(proc, "channel", None), "_send_window", None)
    return window if isinstance(window, int) else None


class SSHProcess(RemoteProcess):
    """One exec channel with its stdin and stdout as streams; a dead link is transient."""

    def __init__(
        self,
        host: str,
        conn: asyncssh.SSHClientConnection,
        proc: asyncssh.SSHClientProcess,
        what: str,
        *,
        mark_dead: Callable[[asyncssh.SSHClientConnection, str], None],
        release: Callable[[], None],
    ) -> None:
        """``mark_dead`` tells the transport its link dropped; ``release`` frees the
        channel slot this process holds (once, at close)."""
        self._host = host
        self._conn = conn
        self._proc = proc
        self._what = what
        self._mark_dead = mark_dead
        self._release = release
        self._released = False
        self._err = b""
        self._framed = False
        self._written = 0
        #: the send window the channel opened with: what the host credits back beyond
        #: it is what it has taken (see delivered)
        self._window0 = _send_window(proc)

    def _lost(self, exc: BaseException) -> TransientHostError:
        self._mark_dead(self._conn, f"{type(exc).__name__}: {exc}".strip())
        return TransientHostError(
            f"the link to {self._host} dropped during `{self._what}`",
            hint="it resumes on the next attempt",
        )

    async def write(self, data: bytes) -> None:
        self._written += len(data)
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except LINK_ERRORS as exc:
            if not self._conn.is_closed() and isinstance(exc, BrokenPipeError):
                raise  # the command closed its stdin (it exited); the link is fine
            raise self._lost(exc) from None

    def delivered(self) -> int | None:
        """Written bytes the host's sshd has credited back (SSH window adjusts): sent on
        the wire (written minus what waits for window) plus the window left, minus the
        window the channel opened with. sshd credits in halves of its window, so this
        lags by up to 1 MiB per channel; asyncssh keeps no such count, hence its
        channel's (private) counters, and None should they ever be missing."""
        chan = getattr(self._proc, "channel", None)
        window = _send_window(self._proc)
        waiting = getattr(chan, "_send_buf_len", None)
        if window is None or self._window0 is None or not isinstance(waiting, int):
            return None
        return max(0, self._written - waiting + window - self._window0)

    def grow_window(self, size: int) -> bool:
        """The channel's receive window raised to ``size`` at once (a window adjust sent
        now, and every later adjust tops it up to ``size``). asyncssh sets the window
        only when a channel opens, hence its channel's (private) counters; False should
        they ever be missing, or when the window is already as big."""
        chan = getattr(self._proc, "channel", None)
        init = getattr(chan, "_init_recv_window", None)
        left = getattr(chan, "_recv_window", None)
        send = getattr(chan, "send_packet", None)
        if not (isinstance(init, int) and isinstance(left, int) and callable(send)):
            return False
        if size <= init:
            return size == init
        try:
            send(MSG_CHANNEL_WINDOW_ADJUST, UInt32(size - init))
        except LINK_ERRORS:
            return False  # the link dropped: the caller's next read says so
        chan._init_recv_window = size  # type: ignore[union-attr]
        chan._recv_window = left + size - init  # type: ignore[union-attr]
        return True

    async def write_eof(self) -> None:
        try:
            self._proc.stdin.write_eof()
        except LINK_ERRORS as exc:
            raise self._lost(exc) from None

    async def _past_banner(self) -> None:
        """Drop what the login shell printed before the command (up to STDOUT_MARK)."""
        if self._framed:
            return
        self._framed = True
        try:
            await self._proc.stdout.readuntil(STDOUT_MARK)
        except asyncio.IncompleteReadError:
            return  # the command never started: its end (or the link's) comes next
        except LINK_ERRORS as exc:
            raise self._lost(exc) from None

    async def readline(self) -> bytes:
        await self._past_banner()
        try:
            line = await self._proc.stdout.readline()
        except LINK_ERRORS as exc:
            raise self._lost(exc) from None
        if not line and self._conn.is_closed():
            raise self._lost(ConnectionResetError("link closed"))
        return as_bytes(line)

    async def readexactly(self, size: int) -> bytes:
        await self._past_banner()
        try:
            return as_bytes(await self._proc.stdout.readexactly(size))
        except asyncio.IncompleteReadError as exc:
            if self._conn.is_closed():
                raise self._lost(ConnectionResetError("link closed")) from None
            return as_bytes(exc.partial)
        except LINK_ERRORS as exc:
            raise self._lost(exc) from None

    async def wait(self, timeout: float | None = None) -> int:
        try:
            self._err = as_bytes(await asyncio.wait_for(self._proc.stderr.read(), timeout))
            done = await asyncio.wait_for(self._proc.wait(), timeout)
        except LINK_ERRORS as exc:
            raise self._lost(exc) from None
        if done.exit_status is None and done.exit_signal is None and self._conn.is_closed():
            raise self._lost(ConnectionResetError("link closed before the command finished"))
        return done.returncode if done.returncode is not None else -1

    def stderr_tail(self) -> str:
        lines = self._err[-4096:].decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else ""

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._proc.close()
        if not self._released:
            self._released = True
            self._release()


def as_bytes(data: object) -> bytes:
    if data is None:
        return b""
    return data if isinstance(data, bytes) else str(data).encode()


#: what the host's shell prints right before running a command: whatever a login
#: shell's start-up prints on stdout before it (a .bashrc's ``echo``, a rental's
#: banner) is cut off at this mark, so the agent's answer, frames and streams are read
#: from the command's own output only
STDOUT_MARK = b"\x1eremotemac:stdout\x1e\n"
_PRINT_MARK = "printf '\\036remotemac:stdout\\036\\n'; "


def framed_command(argv: list[str]) -> str:
    """``argv`` as one shell command line (each element quoted), after the mark."""
    return _PRINT_MARK + " ".join(shlex.quote(str(arg)) for arg in argv)


def after_mark(stdout: bytes) -> bytes:
    """A command's stdout without what came before :data:`STDOUT_MARK`."""
    at = stdout.find(STDOUT_MARK)
    return stdout if at < 0 else stdout[at + len(STDOUT_MARK) :]


def short_cmd(argv: list[str], limit: int = 60) -> str:
    text = " ".join(str(a) for a in argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def refused_session_retried(
    conn: asyncssh.SSHClientConnection, start: Callable[[], Awaitable[T]], within: float = 3.0
) -> T:
    """Open a session channel, retrying while sshd refuses it on a live link.

    sshd frees a closed session's slot only when its privilege-separated monitor
    has reaped it, a moment after the client saw the channel close; a login that
    is not root (every rented Mac) then gets "open failed" for a channel that
    is within MaxSessions. Nothing ran on a refused channel, so a retry is safe.
    """
    deadline = time.monotonic() + within
    pause = 0.02
    while True:
        try:
            return await start()
        except asyncssh.ChannelOpenError as exc:
            # OpenSSH answers "open failed" with OPEN_CONNECT_FAILED for a session it will
            # not open now; a missing subsystem or a forbidden forward is another code
            refused = exc.code == asyncssh.OPEN_CONNECT_FAILED and exc.reason == "open failed"
            if not refused or conn.is_closed() or time.monotonic() + pause > deadline:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.4)
