"""The Transport interface every phase is written against.

A transport reaches one host. It runs commands (the engine mostly runs the
shipped agent with JSON on stdin, so BSD/GNU tool differences never matter),
moves files, and reads a file from a byte offset (how logs are followed without
losing or repeating a line). Paths given to a transport are host paths; ``~`` is
expanded by :meth:`Transport.home` once, never by a shell.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

ProgressFn = Callable[[int], None]
"""Called with the number of bytes moved since the last call."""


class DownloadSink(Protocol):
    """Where :meth:`Transport.download_to` writes: an open file, or a wrapper of one
    (the pull hashes what it writes, so a file is never read twice)."""

    def seek(self, offset: int, whence: int = 0, /) -> int: ...

    def truncate(self, size: int | None = None, /) -> int: ...

    def write(self, data: bytes, /) -> int: ...


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command on the host."""

    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class RemoteStat:
    """What a listing says about one entry, without following links."""

    path: str
    size: int
    mtime: float
    kind: str  # "file" | "dir" | "link" | "other"
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class LinkStats:
    """How often this transport's link dropped and came back (the record's ``continuity``)."""

    disconnects: int = 0
    reconnects: int = 0

    def since(self, before: LinkStats) -> dict[str, int]:
        """The drops and reconnects after ``before``, as the record writes them."""
        return {
            "disconnects": self.disconnects - before.disconnects,
            "reconnects": self.reconnects - before.reconnects,
        }


class RemoteProcess(abc.ABC):
    """A command on the host with a byte stream each way (see :meth:`Transport.open_process`).

    Why: the dataset is streamed into the agent over one channel, so hashing,
    encryption, the link and the host's decryption all overlap, and the data key
    travels inside that stream, never in argv or the environment.
    """

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Send ``data`` to the command's stdin, waiting while the link is full."""

    @abc.abstractmethod
    async def write_eof(self) -> None:
        """Close the command's stdin."""

    @abc.abstractmethod
    async def readline(self) -> bytes:
        """One line of stdout (with its newline); ``b""`` at end of output."""

    async def readexactly(self, size: int) -> bytes:
        """Exactly ``size`` bytes of stdout; fewer (maybe ``b""``) only at end of output.

        Why: the resident agent's answers are length-prefixed frames.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot read frames")

    @abc.abstractmethod
    async def wait(self, timeout: float | None = None) -> int:
        """The exit code, after reading what is left of stdout and stderr."""

    @abc.abstractmethod
    def stderr_tail(self) -> str:
        """The last line the command wrote to stderr (after :meth:`wait`)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop talking to the command (it sees EOF or a hang-up) and free the channel."""

    def delivered(self) -> int | None:
        """Bytes written to stdin that the host has taken (the link's flow control gave
        their room back), or None when the link cannot tell.

        Why: a push measures its rate to choose its streams (engine/streamtuner.py);
        what it wrote runs ahead of what arrived by the bytes sitting in windows and
        queues, and a stream added fills its window at once, which reads as a gain."""
        return None

    def grow_window(self, size: int) -> bool:
        """Let the host send up to ``size`` bytes of stdout ahead of what was read, from
        now on; False when this link cannot (the caller then opens a new channel).

        Why: a pull chooses its channel's window by the round trip its opening took;
        raising it in place spares a second channel and a second start of the host's
        sender (two round trips and a Python start, issue 36)."""
        return False


class Transport(abc.ABC):
    """One host. Implementations: :mod:`.local` and :mod:`.ssh`."""

    #: a name for messages and the journal, e.g. ``local`` or ``me@mac:22``
    name: str = "?"
    #: seconds an operation keeps reconnecting before it gives up (``--reconnect-deadline``)
    reconnect_deadline: float = 600.0

    def link_owner(self) -> Transport:
        """The transport that owns the link (a pool lease answers its shared transport).

        Why: per-link services such as the resident agent are kept once per link.
        """
        return self

    # -- the link (SSH has one; ``local`` answers that there is nothing to cut) --------

    def has_link(self) -> bool:
        """Whether there is a network link that can drop (and be dropped on purpose)."""
        return False

    async def drop_connection(self, why: str = "dropped on purpose (drill)") -> bool:
        """Cut the link as a dead network would; the next operation reconnects.

        Why public: the disconnect drills (``run --drill disconnect``, the TUI's)
        must go through the transport so the drop is counted and announced like a
        real one. Returns False when there was no live link to cut.
        """
        return False

    def link_stats(self) -> LinkStats:
        """Drops and reconnects so far (zero for a transport without a link)."""
        return LinkStats()

    def spare_link(self) -> Transport | None:
        """A second, unconnected link to the same host; None where there is no limit to
        get past (``local``). The caller connects and closes it.

        Why: a bulk transfer over a long fat link needs more flow-control windows in
        flight than one connection may open channels (OpenSSH's MaxSessions, 10 by
        default); a second connection has its own.
        """
        return None

    def host_key_fingerprint(self) -> str | None:
        """SHA256 fingerprint of the key the host showed on this link; None without one."""
        return None

    async def round_trip(self) -> float | None:
        """Seconds for one round trip of the link itself, answered by the host's SSH
        server (no process started); None where there is no such link (``local``) or
        it cannot be measured now.

        Why: a push sizes its streams by the round trip, and a ping through a channel
        waits for a receiver to start on the host first; this one runs while the
        channel opens (engine/synctalk.py)."""
        return None

    @contextlib.contextmanager
    def reconnect_wait_capped(self, seconds: float) -> Iterator[None]:
        """Wait at most ``seconds`` between reconnect attempts inside this block.

        Why: a log follower wants the stream back within about a second of the link
        returning, while other operations back off further to spare the host.
        """
        yield

    async def __aenter__(self) -> Transport:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open the link (no-op for ``local``)."""

    def warm_up(self) -> None:  # noqa: B027 (a no-op unless the link has a use for it)
        """Start, in the background, what the first file operation would wait for (an
        SFTP session): its round trips then overlap others'. A no-op by default."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the link. Never stops anything running on the host."""

    @abc.abstractmethod
    async def home(self) -> str:
        """The host user's home directory, as an absolute path."""

    @abc.abstractmethod
    async def exec(
        self,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
    ) -> ExecResult:
        """Run ``argv`` on the host. Each element is shell-quoted by the transport.

        Secrets travel on ``stdin`` only, never in ``argv`` or the environment.
        With ``check=True`` a non-zero exit raises :class:`remotemac.errors.HostError`.
        """

    @abc.abstractmethod
    async def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        """Return up to ``max_bytes`` of ``path`` starting at byte ``offset``.

        Returns ``b""`` at end of file, raises FileNotFoundError if it does not exist.
        """

    @abc.abstractmethod
    async def put(self, local: str, remote: str, *, progress: ProgressFn | None = None) -> None:
        """Copy a local file to the host (parents must exist)."""

    @abc.abstractmethod
    async def get(self, remote: str, local: str, *, progress: ProgressFn | None = None) -> None:
        """Copy a host file to a local path."""

    @abc.abstractmethod
    async def write_bytes(self, remote: str, data: bytes, *, mode: int = 0o600) -> None:
        """Write a small file on the host atomically (temp name then rename)."""

    @abc.abstractmethod
    async def stat(self, remote: str) -> RemoteStat | None:
        """lstat one path; ``None`` when it does not exist."""

    @abc.abstractmethod
    async def listdir(self, remote: str) -> list[RemoteStat]:
        """Entries of a directory (not recursive, links not followed)."""

    @abc.abstractmethod
    async def makedirs(self, remote: str, mode: int = 0o700) -> None:
        """Create a directory and its parents; fine if it exists."""

    async def stream_exec(
        self, argv: list[str], *, stdin: bytes | None = None
    ) -> AsyncIterator[bytes]:
        """Yield a command's stdout as it comes (default: all at once)."""
        result = await self.exec(argv, stdin=stdin)
        yield result.stdout

    async def open_process(
        self,
        argv: list[str],
        *,
        reconnect_within: float | None = None,
        window: int | None = None,
    ) -> RemoteProcess:
        """Start ``argv`` on the host with streamed stdin/stdout (not retried on a dead link).

        ``reconnect_within``: if the link is down, reconnect for at most this many
        seconds (default: the transport's whole reconnect deadline). ``window``: the
        bytes the host may send before we acknowledge them (SSH's channel window; a
        pull from a far host raises it so one channel fills the link), where the
        transport has one.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot stream to a command")

    async def download_to(
        self,
        remote: str,
        dst: DownloadSink,
        offset: int = 0,
        *,
        progress: ProgressFn | None = None,
        limit: int | None = None,
    ) -> int:
        """Write ``remote[offset:limit]`` into the open local file ``dst`` at ``offset``.

        ``limit``: never write past this many bytes of the file (a pull caps each file
        at the size the host listed: a file that grows, or a host that lies, cannot
        fill the laptop's disk).

        Why: a pull that was interrupted continues where its ``.part`` file ends, and
        the caller opens the local file itself (no symlink followed). Returns the
        number of bytes written.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot download from an offset")
