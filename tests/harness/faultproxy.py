"""A TCP relay in front of sshd that breaks the link on command.

Why its own thread and event loop: sync tests (and scripts) can drive it, and an
async test blocking on a proxy call never stalls the loop the transport runs on.

Faults:

- ``cut()``       close both sides of every open connection (FIN), like a dropped NAT entry
- ``reset()``     same but with RST (SO_LINGER 0)
- ``blackhole()`` stop forwarding in both directions, keep sockets open (a silently
                  dead link; new connections are accepted and hang too)
- ``throttle(bps)`` limit each direction to ``bps`` bytes per second
- ``latency(s)``  delay every chunk by ``s`` seconds (order kept)
- ``refuse(True)`` close new connections at once (the host is "down")
- ``restore()``   undo blackhole/throttle/latency/refuse
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from typing import Any

CHUNK = 64 * 1024


class _Link:
    """One accepted client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, client: tuple, upstream: tuple) -> None:
        self.proxy = proxy
        self.c_reader, self.c_writer = client
        self.u_reader, self.u_writer = upstream
        self.tasks: list[asyncio.Task] = []
        self.finished = 0

    def start(self) -> None:
        for reader, writer in ((self.c_reader, self.u_writer), (self.u_reader, self.c_writer)):
            queue: asyncio.Queue = asyncio.Queue(maxsize=64)
            self.tasks.append(asyncio.ensure_future(self._read(reader, queue)))
            self.tasks.append(asyncio.ensure_future(self._write(writer, queue)))

    async def _read(self, reader: asyncio.StreamReader, queue: asyncio.Queue) -> None:
        proxy = self.proxy
        try:
            while True:
                await proxy._flowing.wait()
                size = CHUNK
                if proxy.rate:
                    size = max(1, min(CHUNK, int(proxy.rate / 20)))
                data = await reader.read(size)
                await queue.put((time.monotonic() + proxy.delay, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await queue.put((0.0, b""))

    async def _write(self, writer: asyncio.StreamWriter, queue: asyncio.Queue) -> None:
        proxy = self.proxy
        # Pacing clock: each chunk is due len/rate after the previous one was due, so
        # sleep overshoot and the time spent writing count against the budget instead
        # of adding to it (sleeping len/rate after each write delivered ~75 % of the
        # rate at 20 MB/s). Up to 50 ms of lag is caught up; a longer idle gap is not.
        paced_until = 0.0
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                await proxy._flowing.wait()
                if not data:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    self.finished += 1
                    if self.finished == 2:
                        self.close(rst=False)
                    return
                if proxy.rate:
                    now = time.monotonic()
                    if now - paced_until > 0.05:  # idle for a while: no saved-up burst
                        paced_until = now
                    paced_until += len(data) / proxy.rate
                    if paced_until > now:
                        await asyncio.sleep(paced_until - now)
                else:
                    paced_until = 0.0
                writer.write(data)
                await writer.drain()
                proxy.bytes_forwarded += len(data)
        except (ConnectionError, OSError):
            self.close(rst=False)

    def close(self, *, rst: bool) -> None:
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()
        for writer in (self.c_writer, self.u_writer):
            if rst:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
            if rst:
                writer.transport.abort()
            else:
                writer.close()
        self.proxy._links.discard(self)


class FaultProxy:
    """Relay ``127.0.0.1:<port>`` → ``target``; start with :meth:`start`."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.port = 0
        self.rate = 0.0
        self.delay = 0.0
        self.refusing = False
        self.accepted = 0
        self.bytes_forwarded = 0
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="fault-proxy"
        )
        self._server: asyncio.AbstractServer | None = None
        self._flowing: asyncio.Event | None = None

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults ----------------------------------------------------------------------

    def cut(self) -> int:
        """Close every open connection (FIN both ways); returns how many were open."""
        return self._call(self._close_all(rst=False))

    def reset(self) -> int:
        """Abort every open connection with RST; returns how many were open."""
        return self._call(self._close_all(rst=True))

    def blackhole(self) -> None:
        self._call(self._set_flowing(False))

    def throttle(self, bytes_per_s: float) -> None:
        self.rate = float(bytes_per_s)

    def latency(self, seconds: float) -> None:
        self.delay = float(seconds)

    def refuse(self, on: bool = True) -> None:
        self.refusing = on

    def restore(self) -> None:
        self.rate = 0.0
        self.delay = 0.0
        self.refusing = False
        self._call(self._set_flowing(True))

    @property
    def open_links(self) -> int:
        return len(self._links)

    # -- internals ---------------------------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._close_all(rst=False)

    async def _set_flowing(self, on: bool) -> None:
        assert self._flowing is not None
        if on:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _close_all(self, *, rst: bool) -> int:
        links = list(self._links)
        for link in links:
            link.close(rst=rst)
        await asyncio.sleep(0)
        return len(links)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.refusing:
            writer.transport.abort()
            return
        try:
            upstream = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(self, (reader, writer), upstream)
        self._links.add(link)
        link.start()
