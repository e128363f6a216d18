"""The ``ssh`` transport: one asyncssh connection per host, exec channels plus SFTP.

Why one connection: a handshake costs round trips and auth; channels are cheap.
OpenSSH allows 10 sessions per connection (MaxSessions), so a semaphore keeps
exec channels at ``max_channels`` (8) plus the one SFTP session.

When the link dies (RST, FIN, or keepalive finding it silently dead), the
transport emits ``disconnected``, reconnects with backoff (see
:mod:`.reconnect`) and re-runs the interrupted operation if it is idempotent:
reads, stat, listdir, get, put (restarted from zero), makedirs, write_bytes, and
exec only when the caller passes ``idempotent=True``. A non-idempotent exec
raises :class:`TransientHostError` instead, because it may or may not have run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import posixpath
import secrets
import stat as statmod
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import asyncssh

from remotemac.errors import HostDiskFull, HostError, TransientHostError
from remotemac.events import ConnectionState, Event
from remotemac.transport.base import (
    DownloadSink,
    ExecResult,
    LinkStats,
    ProgressFn,
    RemoteProcess,
    RemoteStat,
    Transport,
)
from remotemac.transport.fastdata import flush_channel_directly
from remotemac.transport.options import SSHOptions
from remotemac.transport.reconnect import reconnect
from remotemac.transport.sshconfig import resolve
from remotemac.transport.sshconnect import (
    SFTPUnavailable,
    lost_reason,
    open_connection,
)
from remotemac.transport.sshprocess import (
    LINK_ERRORS,
    STDOUT_MARK,
    SSHProcess,
    after_mark,
    as_bytes,
    framed_command,
    refused_session_retried,
    short_cmd,
)

T = TypeVar("T")

#: SFTP tuning (see scripts/bench_transport.py): OpenSSH's sftp-server accepts
#: reads/writes up to 255 KiB (limits@openssh.com); 64 in flight fill a fast link.
SFTP_BLOCK_SIZE = 255 * 1024
SFTP_MAX_REQUESTS = 64
#: read requests in flight over every download of one transport at once: 64 x 255 KiB
#: (16 MiB) is twice the bandwidth-delay product of 100 MB/s at 80 ms, and the most a
#: pull holds in memory however many files it fetches together (more only queues up
#: in the link, delaying every other answer: 96 was no faster)
SFTP_READS_IN_FLIGHT = 64

#: the largest SSH packet a channel with a raised ``window`` accepts (asyncssh's default
#: is 32 KiB): a pull's host sends 1 MiB frames, and each packet costs the laptop's
#: event loop a decrypt and a dispatch in Python
PULL_PACKET = 256 << 10
#: how long a round-trip measurement waits for sshd's answer (a link this slow is
#: measured through a channel instead, or not at all)
ROUND_TRIP_WAIT_S = 5.0


def _no_passphrase(_path: Path) -> str | None:
    return None


class SSHTransport(Transport):
    """A host reached over SSH, as the user's own ``ssh`` would reach it."""

    def __init__(
        self,
        host_spec: str,
        *,
        home_dir: Path,
        options: SSHOptions | None = None,
        emit: Callable[[Event], None] | None = None,
        run_id: str = "",
    ) -> None:
        opts = options or SSHOptions()
        self.spec = host_spec
        self.options = opts
        self.home_dir = Path(home_dir)
        self.params = resolve(host_spec, ssh_config=opts.ssh_config, identity=opts.identity)
        self.name = self.params.display
        self.reconnect_deadline = opts.deadline_s
        self.run_id = run_id
        self._emit_fn = emit
        self._conn: asyncssh.SSHClientConnection | None = None
        self._jumps: list[asyncssh.SSHClientConnection] = []
        self._sftp: asyncssh.SFTPClient | None = None
        self._sftp_lock = asyncio.Lock()
        self._warming: asyncio.Future | None = None
        self._link_lock = asyncio.Lock()
        self._channels = asyncio.Semaphore(opts.max_channels)
        self._read_slots = asyncio.Semaphore(SFTP_READS_IN_FLIGHT)  # see download_to
        self._closing: set[asyncio.Task] = set()
        self._generation = 0
        self._closed = False
        self._home: str | None = None
        self._watch: asyncio.Task | None = None
        #: counts for the acceptance record's ``continuity`` section
        self.disconnects = 0
        self.reconnects = 0
        #: longest wait between reconnect attempts; a log follower lowers it so the
        #: stream resumes within about a second of the link coming back
        self.reconnect_max_wait = 30.0

    # -- link management -----------------------------------------------------------

    def _emit(self, state: str, **kw: object) -> None:
        if self._emit_fn is not None:
            self._emit_fn(ConnectionState(self.run_id, host=self.name, state=state, **kw))  # type: ignore[arg-type]

    def spare_link(self) -> SSHTransport:
        """Another connection to this host with the same options (see Transport).

        It never asks for a passphrase (a key the user unlocked once is not asked for
        twice: without an agent holding it, the spare link just fails to connect) and
        announces nothing (its drops are not the main link's)."""
        options = dataclasses.replace(self.options, passphrase_prompt=_no_passphrase)
        return SSHTransport(self.spec, home_dir=self.home_dir, options=options, run_id=self.run_id)

    async def connect(self) -> None:
        """Open the link once (no retry: a wrong host or key should fail fast)."""
        async with self._link_lock:
            if self._conn is not None:
                return
            self._closed = False
            await self._open()
            self._emit("connected")

    def warm_up(self) -> None:
        """Open the SFTP session in the background (a failure is left for the first
        operation that needs it to report): three round trips off the path."""
        if self._conn is None or self._sftp is not None or self._warming is not None:
            return

        async def warm() -> None:
            with contextlib.suppress(Exception):
                await self._sftp_client()

        self._warming = asyncio.ensure_future(warm())

    async def _open(self) -> None:
        conn, jumps = await open_connection(self.params, self.options, self.home_dir)
        self._conn, self._jumps, self._sftp = conn, jumps, None
        self._generation += 1
        self._watch = asyncio.ensure_future(self._watch_link(conn, self._generation))

    async def _watch_link(self, conn: asyncssh.SSHClientConnection, generation: int) -> None:
        """Notice a dead link even when no operation is running (keepalive, RST)."""
        with contextlib.suppress(Exception):
            await conn.wait_closed()
        if not self._closed and generation == self._generation and self._conn is conn:
            self._mark_dead(conn, "link closed")

    def _mark_dead(self, conn: asyncssh.SSHClientConnection, why: str) -> None:
        if self._conn is not conn:
            return
        why = lost_reason(conn) or why
        self._conn, self._sftp = None, None
        for jump in self._jumps:
            jump.close()
        self._jumps = []
        conn.abort()
        self.disconnects += 1
        self._emit("disconnected", detail=why)

    def has_link(self) -> bool:
        return True

    async def drop_connection(self, why: str = "dropped on purpose (drill)") -> bool:
        """Abort the current connection as a dead link would (``run --drill disconnect``).

        The next operation reconnects through the normal path. Returns False when
        there was no live connection to drop.
        """
        conn = self._conn
        if conn is None or conn.is_closed():
            return False
        self._mark_dead(conn, why)
        return True

    def link_stats(self) -> LinkStats:
        return LinkStats(disconnects=self.disconnects, reconnects=self.reconnects)

    def host_key_fingerprint(self) -> str | None:
        """The SHA256 fingerprint of the key the host showed on the live connection."""
        conn = self._conn
        if conn is None:
            return None
        key = conn.get_server_host_key()
        return key.get_fingerprint("sha256") if key is not None else None

    async def round_trip(self) -> float | None:
        """One keepalive request sshd answers itself (see Transport.round_trip); None
        without a live link, or should asyncssh's (private) global request go away."""
        conn = self._conn
        request = getattr(conn, "_make_global_request", None)
        if conn is None or conn.is_closed() or request is None:
            return None
        started = time.monotonic()
        try:
            await asyncio.wait_for(request(b"keepalive@openssh.com"), ROUND_TRIP_WAIT_S)
        except Exception:
            return None
        if conn.is_closed() or self._conn is not conn:
            return None  # a dropped link fails pending requests at once: no round trip
        return time.monotonic() - started

    @contextlib.contextmanager
    def reconnect_wait_capped(self, seconds: float) -> Iterator[None]:
        """Lower the longest wait between reconnect attempts for a while (a log
        follower resumes within about a second of the link coming back)."""
        old = self.reconnect_max_wait
        self.reconnect_max_wait = min(old, seconds)
        try:
            yield
        finally:
            self.reconnect_max_wait = old

    async def close(self) -> None:
        self._closed = True
        conn, self._conn, self._sftp = self._conn, None, None
        if self._watch is not None:
            self._watch.cancel()
        if self._warming is not None:
            self._warming.cancel()
            self._warming = None
        if conn is not None:
            conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.wait_closed(), 5)
        for jump in self._jumps:
            jump.close()
        self._jumps = []

    async def _link(self, deadline_s: float | None = None) -> asyncssh.SSHClientConnection:
        """The live connection, reconnecting if it died, for at most ``deadline_s`` seconds
        (default: the whole reconnect deadline)."""
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        async with self._link_lock:
            if self._conn is not None and not self._conn.is_closed():
                return self._conn
            if self._conn is not None:
                self._mark_dead(self._conn, "link closed")
            if self._closed:
                raise HostError(f"transport to {self.name} is closed", hint="connect() again")
            if self._generation == 0:
                await self._open()
                self._emit("connected")
            else:
                budget = self.reconnect_deadline if deadline_s is None else deadline_s
                await reconnect(
                    self._open,
                    host=self.name,
                    deadline=max(0.0, budget),
                    emit=self._emit_fn,
                    run_id=self.run_id,
                    total_deadline=self.reconnect_deadline,
                    initial_wait=min(0.5, self.reconnect_max_wait),
                    max_wait=self.reconnect_max_wait,
                )
                self.reconnects += 1
            assert self._conn is not None
            return self._conn

    async def _sftp_client(self) -> asyncssh.SFTPClient:
        conn = await self._link()
        async with self._sftp_lock:
            if self._sftp is not None and self._conn is conn:
                return self._sftp
            try:
                self._sftp = await refused_session_retried(conn, conn.start_sftp_client)
            except asyncssh.ChannelOpenError as exc:
                if conn.is_closed() or self._conn is not conn:
                    raise ConnectionResetError("link closed") from None
                if "request failed" in exc.reason.lower():
                    # sshd opened the session but refused the "sftp" subsystem request
                    raise SFTPUnavailable(
                        f"the SFTP subsystem is missing on {self.name}",
                        hint="enable `Subsystem sftp` in the host's sshd_config",
                    ) from None
                raise SFTPUnavailable(
                    f"cannot open an SFTP session on {self.name}: {exc.reason}",
                    hint="too many sessions? check MaxSessions in the host's sshd_config",
                ) from None
            except (asyncssh.SFTPError, asyncssh.ProcessError) as exc:
                if isinstance(exc, LINK_ERRORS):
                    raise
                raise SFTPUnavailable(
                    f"the SFTP subsystem is missing on {self.name}",
                    hint="enable `Subsystem sftp` in the host's sshd_config",
                ) from None
            return self._sftp

    def deadline_left(self, since: float | None) -> float:
        """Seconds of the reconnect deadline left for an operation that first lost the
        link at ``since`` (monotonic; ``None``: it has not lost it yet)."""
        if since is None:
            return self.reconnect_deadline
        return self.reconnect_deadline - (time.monotonic() - since)

    async def _run(
        self,
        what: str,
        op: Callable[[], Awaitable[T]],
        *,
        idempotent: bool,
        progress: Callable[[], int] | None = None,
    ) -> T:
        """Run ``op``; on a dead link reconnect and, if idempotent, run it again.

        Retries are bounded by time, not by count: a link that stays up two seconds
        at a time still gets every short operation through, and an operation that
        has been losing the link for ``reconnect_deadline`` seconds gives up.
        ``progress`` (a resumable operation's position): when it moved since the last
        loss, the deadline starts again (a long download that gains ground on every
        reconnect is not stopped half way).
        """
        first_loss: float | None = None
        mark = progress() if progress is not None else 0
        while True:
            left = self.deadline_left(first_loss)
            if left <= 0:
                raise TransientHostError(
                    f"{what} on {self.name} kept losing the link for"
                    f" {self.reconnect_deadline:.0f} s (the reconnect deadline)",
                    hint="check the network, then re-attach",
                )
            conn = await self._link(left)
            try:
                return await op()
            except LINK_ERRORS as exc:
                if self._closed:
                    raise HostError(f"transport to {self.name} closed during {what}") from None
                with contextlib.suppress(Exception):
                    # let asyncssh finish closing so the cause (e.g. keepalive) is known
                    await asyncio.wait_for(conn.wait_closed(), 1)
                self._mark_dead(conn, f"{type(exc).__name__}: {exc}".strip())
                if progress is not None and progress() != mark:
                    mark, first_loss = progress(), None
                if first_loss is None:
                    first_loss = time.monotonic()
                if not idempotent:
                    raise TransientHostError(
                        f"the link to {self.name} dropped during {what}; it may or may not"
                        f" have completed",
                        hint="the transport reconnects on the next call",
                    ) from None

    # -- Transport API -------------------------------------------------------------

    async def home(self) -> str:
        """The login's ``$HOME``: what ``~`` means to the agent and the job on the host.

        Why not SFTP's ``realpath(".")``: that is the directory sshd starts sessions in
        (the passwd entry's home). When a host sets ``HOME`` otherwise (sshd's
        ``SetEnv``, a login script), the agent's ``expanduser`` and the laptop would
        then disagree about where ``~/remotemac`` is. The SFTP answer stays the
        fallback for a login whose shell prints nothing.
        """
        if self._home is None:
            result = await self.exec(["printenv", "HOME"], timeout=30, idempotent=True)
            home = result.stdout.decode("utf-8", "replace").strip()
            if result.exit_code != 0 or not home.startswith("/"):

                async def op() -> str:
                    return await (await self._sftp_client()).realpath(".")

                home = await self._run("home", op, idempotent=True)
            self._home = home
        return self._home

    async def exec(
        self,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
        idempotent: bool = False,
    ) -> ExecResult:
        """Run ``argv`` (each element shell-quoted); see :meth:`Transport.exec`.

        ``idempotent=True`` allows a re-run after a reconnect.
        """
        command = framed_command(argv)

        async def op() -> ExecResult:
            conn = await self._link()
            async with self._channels:
                try:
                    done = await refused_session_retried(
                        conn,
                        lambda: conn.run(
                            command, input=stdin, encoding=None, timeout=timeout, check=False
                        ),
                    )
                except asyncssh.TimeoutError:
                    raise HostError(
                        f"`{short_cmd(argv)}` timed out after {timeout:g} s on {self.name}",
                        hint="raise the timeout or check the host",
                    ) from None
                except asyncssh.ChannelOpenError as exc:
                    if self._conn is conn and not conn.is_closed():
                        raise HostError(
                            f"cannot open a channel on {self.name}: {exc.reason}",
                            hint="check MaxSessions on the host",
                        ) from None
                    raise ConnectionResetError("link closed") from None
            code = done.returncode if done.returncode is not None else -1
            if done.exit_status is None and done.exit_signal is None and conn.is_closed():
                # the channel closed without an exit status: the link went away
                raise ConnectionResetError("link closed before the command finished")
            stdout = after_mark(as_bytes(done.stdout))
            return ExecResult(command, code, stdout, as_bytes(done.stderr))

        result = await self._run(f"`{short_cmd(argv)}`", op, idempotent=idempotent)
        if check and not result.ok:
            lines = result.stderr.decode("utf-8", "replace").strip().splitlines()
            last = lines[-1] if lines else "no error output"
            raise HostError(
                f"`{short_cmd(argv)}` failed on {self.name} (exit {result.exit_code}): {last}"
            )
        return result

    async def stream_exec(
        self, argv: list[str], *, stdin: bytes | None = None
    ) -> AsyncIterator[bytes]:
        """Yield stdout chunks as they arrive (not retried: a stream is not idempotent)."""
        command = framed_command(argv)
        conn = await self._link()
        async with self._channels:
            try:
                proc = await conn.create_process(command, encoding=None)
            except LINK_ERRORS as exc:
                self._mark_dead(conn, str(exc))
                raise TransientHostError(f"the link to {self.name} dropped") from None
            try:
                if stdin:
                    proc.stdin.write(stdin)
                proc.stdin.write_eof()
                with contextlib.suppress(asyncio.IncompleteReadError):
                    await proc.stdout.readuntil(STDOUT_MARK)  # what the login shell printed
                while True:
                    chunk = await proc.stdout.read(65536)
                    if not chunk:
                        break
                    yield chunk
                await proc.wait()
            except LINK_ERRORS as exc:
                self._mark_dead(conn, str(exc))
                raise TransientHostError(
                    f"the link to {self.name} dropped while streaming",
                    hint="resume from the last offset",
                ) from None
            finally:
                proc.close()

    async def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        async def op() -> bytes:
            sftp = await self._sftp_client()
            try:
                async with sftp.open(path, "rb") as fh:
                    return await fh.read(max_bytes, offset)
            except asyncssh.SFTPNoSuchFile:
                raise FileNotFoundError(path) from None

        return await self._run(f"read {path}", op, idempotent=True)

    async def put(self, local: str, remote: str, *, progress: ProgressFn | None = None) -> None:
        reporter = _Progress(progress)

        async def op() -> None:
            sftp = await self._sftp_client()
            try:
                await sftp.put(
                    local,
                    remote,
                    block_size=SFTP_BLOCK_SIZE,
                    max_requests=SFTP_MAX_REQUESTS,
                    progress_handler=reporter,
                )
            except asyncssh.SFTPError as exc:
                if isinstance(exc, LINK_ERRORS):
                    raise
                full = await self._disk_full(sftp, remote, os.path.getsize(local))
                if full is not None:
                    raise full from None
                raise HostError(
                    f"cannot upload to {self.name}:{remote}: {exc.reason}",
                    hint="check the remote directory exists and is writable",
                ) from None

        await self._run(f"upload {remote}", op, idempotent=True)

    async def _disk_full(
        self, sftp: asyncssh.SFTPClient, remote: str, size: int
    ) -> HostDiskFull | None:
        """Why an SFTP write failed, when it is space: SFTP v3 has no "disk full" status
        (OpenSSH's sftp-server answers ENOSPC with a bare ``Failure``), so the file
        system's free space is asked (``statvfs@openssh.com``) and compared with what
        was to be written."""
        where = posixpath.dirname(remote) or "."
        try:
            vfs = await sftp.statvfs(where)
        except (asyncssh.Error, OSError):
            return None
        free = vfs.bavail * vfs.frsize
        if free >= max(size, 1) + vfs.frsize:
            return None
        return HostDiskFull(
            f"{self.name}: the disk holding {where} is full "
            f"({free:,} bytes free, {size:,} to write)"
        )

    async def get(self, remote: str, local: str, *, progress: ProgressFn | None = None) -> None:
        reporter = _Progress(progress)

        async def op() -> None:
            sftp = await self._sftp_client()
            try:
                await sftp.get(
                    remote,
                    local,
                    block_size=SFTP_BLOCK_SIZE,
                    max_requests=SFTP_MAX_REQUESTS,
                    progress_handler=reporter,
                )
            except asyncssh.SFTPNoSuchFile:
                raise FileNotFoundError(remote) from None

        await self._run(f"download {remote}", op, idempotent=True)

    async def write_bytes(self, remote: str, data: bytes, *, mode: int = 0o600) -> None:
        async def op() -> None:
            sftp = await self._sftp_client()
            tmp = f"{remote}.rm-tmp-{secrets.token_hex(4)}"
            attrs = asyncssh.SFTPAttrs(permissions=mode)
            try:
                async with sftp.open(tmp, "wb", attrs) as fh:
                    await fh.write(data)
                await sftp.chmod(tmp, mode)
                await sftp.posix_rename(tmp, remote)
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await sftp.remove(tmp)
                if isinstance(exc, asyncssh.SFTPError) and not isinstance(exc, LINK_ERRORS):
                    full = await self._disk_full(sftp, remote, len(data))
                    if full is not None:
                        raise full from None
                raise

        await self._run(f"write {remote}", op, idempotent=True)

    async def stat(self, remote: str) -> RemoteStat | None:
        async def op() -> RemoteStat | None:
            sftp = await self._sftp_client()
            try:
                attrs = await sftp.lstat(remote)
            except asyncssh.SFTPNoSuchFile:
                return None
            return _remote_stat(remote, attrs)

        return await self._run(f"stat {remote}", op, idempotent=True)

    async def listdir(self, remote: str) -> list[RemoteStat]:
        async def op() -> list[RemoteStat]:
            sftp = await self._sftp_client()
            try:
                names = await sftp.readdir(remote)
            except asyncssh.SFTPNoSuchFile:
                raise FileNotFoundError(remote) from None
            return sorted(
                (
                    _remote_stat(posixpath.join(remote, str(n.filename)), n.attrs)
                    for n in names
                    if n.filename not in (".", "..")
                ),
                key=lambda s: s.path,
            )

        return await self._run(f"list {remote}", op, idempotent=True)

    async def makedirs(self, remote: str, mode: int = 0o700) -> None:
        async def op() -> None:
            sftp = await self._sftp_client()
            await sftp.makedirs(remote, asyncssh.SFTPAttrs(permissions=mode), exist_ok=True)

        await self._run(f"mkdir {remote}", op, idempotent=True)

    async def open_process(
        self,
        argv: list[str],
        *,
        reconnect_within: float | None = None,
        window: int | None = None,
    ) -> RemoteProcess:
        """Start ``argv`` with streamed stdin/stdout on one channel (never re-run)."""
        command = framed_command(argv)
        conn = await self._link(reconnect_within)
        await self._channels.acquire()
        try:
            sizes = {} if window is None else {"window": window, "max_pktsize": PULL_PACKET}
            proc = await refused_session_retried(
                conn, lambda: conn.create_process(command, encoding=None, **sizes)
            )
        except asyncssh.ChannelOpenError as exc:
            self._channels.release()
            if self._conn is conn and not conn.is_closed():
                raise HostError(
                    f"cannot open a channel on {self.name}: {exc.reason}",
                    hint="check MaxSessions on the host",
                ) from None
            raise TransientHostError(f"the link to {self.name} dropped") from None
        except LINK_ERRORS as exc:
            self._channels.release()
            self._mark_dead(conn, f"{type(exc).__name__}: {exc}".strip())
            raise TransientHostError(f"the link to {self.name} dropped") from None
        except BaseException:  # cancelled while it opened: its slot is not kept
            self._channels.release()
            raise
        flush_channel_directly(conn, proc.channel)  # (see fastdata.py)
        return SSHProcess(
            self.name,
            conn,
            proc,
            short_cmd(argv),
            mark_dead=self._mark_dead,
            release=self._channels.release,
        )

    async def download_to(
        self,
        remote: str,
        dst: DownloadSink,
        offset: int = 0,
        *,
        progress: ProgressFn | None = None,
        limit: int | None = None,
    ) -> int:
        """Pipelined SFTP reads from ``offset``; after a reconnect it goes on from where it was.

        Blocks are written in order as they arrive, so ``dst`` always holds a clean
        prefix of the file (what a later resume continues from, and what lets a
        caller hash the bytes as they are written). Every download of this transport
        draws its requests from one pool (``SFTP_READS_IN_FLIGHT``): many files at
        once keep a long link busy, and memory holds at most that many blocks. The
        handle is closed in the background: a small file does not wait a round trip
        for it.
        """
        pos = offset

        async def op() -> None:
            nonlocal pos
            sftp = await self._sftp_client()
            # block_size=0: one request per read; the pipelining is done here
            block = min(SFTP_BLOCK_SIZE, sftp.limits.max_read_len or SFTP_BLOCK_SIZE)
            try:
                fh = await sftp.open(remote, "rb", block_size=0)
            except asyncssh.SFTPNoSuchFile:
                raise FileNotFoundError(remote) from None
            pending: collections.deque[asyncio.Future] = collections.deque()
            slots = self._read_slots

            def drop_pending() -> None:
                for task in pending:
                    task.cancel()
                    slots.release()
                pending.clear()

            try:
                dst.seek(pos)
                dst.truncate()
                ahead = pos
                while True:
                    while len(pending) < SFTP_MAX_REQUESTS and (limit is None or ahead < limit):
                        if pending and slots.locked():
                            break  # write what we have; other files hold the pool
                        await slots.acquire()
                        size = block if limit is None else min(block, limit - ahead)
                        pending.append(asyncio.ensure_future(fh.read(size, ahead)))
                        ahead += size
                    if not pending:
                        return  # ``limit`` reached: the rest of the file is not ours
                    try:
                        data = await pending.popleft()
                    finally:
                        slots.release()
                    if limit is not None:
                        data = data[: max(0, limit - pos)]  # a server that sends more
                    if not data:
                        return
                    dst.write(data)
                    pos += len(data)
                    if progress is not None:
                        progress(len(data))
                    if len(data) < block and (limit is None or pos < limit):
                        # short read: re-aim what is in flight
                        tasks = list(pending)
                        drop_pending()
                        await asyncio.gather(*tasks, return_exceptions=True)
                        ahead = pos
            finally:
                tasks = list(pending)
                drop_pending()
                await asyncio.gather(*tasks, return_exceptions=True)
                self._close_later(fh)

        await self._run(f"download {remote}", op, idempotent=True, progress=lambda: pos)
        return pos - offset

    def _close_later(self, fh: asyncssh.SFTPClientFile) -> None:
        """Close an SFTP handle without waiting for the answer (a dead link just drops it)."""
        task = asyncio.ensure_future(fh.close())
        self._closing.add(task)

        def done(task: asyncio.Task) -> None:
            self._closing.discard(task)
            if not task.cancelled():
                task.exception()  # retrieved: a close on a dead link is not news

        task.add_done_callback(done)


class _Progress:
    """Turns asyncssh's cumulative progress into deltas, never counting a restart twice."""

    def __init__(self, fn: ProgressFn | None) -> None:
        self.fn = fn
        self.reported = 0

    def __call__(self, _src: bytes, _dst: bytes, done: int, _total: int) -> None:
        if self.fn is not None and done > self.reported:
            self.fn(done - self.reported)
            self.reported = done


def _remote_stat(path: str, attrs: asyncssh.SFTPAttrs) -> RemoteStat:
    perms = attrs.permissions or 0
    if statmod.S_ISLNK(perms):
        kind = "link"
    elif statmod.S_ISDIR(perms):
        kind = "dir"
    elif statmod.S_ISREG(perms):
        kind = "file"
    else:
        kind = "other"
    return RemoteStat(
        path=path,
        size=attrs.size or 0,
        mtime=float(attrs.mtime or 0),
        kind=kind,
        extra={"mode": perms & 0o7777, "uid": attrs.uid, "gid": attrs.gid},
    )
