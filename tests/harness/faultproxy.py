"""A TCP relay in front of sshd that breaks the link on command and emulates a far link.

Why its own thread and event loop: sync tests (and scripts) can drive it, and an
async test blocking on a proxy call never stalls the loop the transport runs on.
Why also a process mode (:class:`ProxyProcess`, ``python -m tests.harness.faultproxy``):
a benchmark that runs the orchestrator in-process would otherwise share one GIL with
the relay and measure the two together.

Faults:

- ``cut()``       close both sides of every open connection (FIN), like a dropped NAT entry
- ``reset()``     same but with RST (SO_LINGER 0)
- ``cut_after(n)`` one ``cut()`` once ``n`` more bytes have been forwarded
- ``blackhole()`` stop forwarding in both directions, keep sockets open (a silently
                  dead link; new connections are accepted and hang too)
- ``throttle(bps)`` limit each direction to ``bps`` bytes per second, shared by every
                  connection through the proxy (one link, as a real path is)
- ``latency(s)``  delay every chunk by ``s`` seconds one way (order kept); ``rtt(s)``
                  sets half of ``s`` each way
- ``refuse(True)`` close new connections at once (the host is "down")
- ``restore()``   undo blackhole/throttle/latency/refuse

Link model: a chunk read from one side is due at the far side ``latency`` later, and
leaves no earlier than the shared pacing clock of its direction allows. What may be
in flight per connection and direction is bounded in bytes by the link's
bandwidth-delay product plus a router-sized buffer, so the relay neither becomes the
bottleneck of a fast, far link nor hides a sender's own window limit on a slow one.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

CHUNK = 256 * 1024
#: in-flight bytes per connection and direction beyond the bandwidth-delay product
BUFFER = 4 << 20
#: assumed rate of an unthrottled link when sizing the in-flight bound for latency
UNTHROTTLED = 2e9
MAX_IN_FLIGHT = 256 << 20


class _Pacer:
    """The pacing clock of one direction of the emulated link, shared by all connections.

    Each chunk is due len/rate after the previous one was due, so sleep overshoot and
    the time spent writing count against the budget instead of adding to it (sleeping
    len/rate after each write delivered ~75 % of the rate at 20 MB/s). Up to 50 ms of
    lag is caught up; a longer idle gap is not saved up as a burst.
    """

    def __init__(self) -> None:
        self.until = 0.0

    async def take(self, count: int, rate: float) -> None:
        if not rate:
            self.until = 0.0
            return
        now = time.monotonic()
        if now - self.until > 0.05:
            self.until = now
        self.until += count / rate
        if self.until > now:
            await asyncio.sleep(self.until - now)


class _Pipe:
    """Chunks in flight in one direction of one connection, bounded in bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.size = 0
        self.ready = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()

    async def put(self, due: float, data: bytes) -> None:
        while self.size >= self.limit and data:
            self.room.clear()
            await self.room.wait()
        self.chunks.append((due, data))
        self.size += len(data)
        self.ready.set()

    async def get(self) -> tuple[float, bytes]:
        while not self.chunks:
            self.ready.clear()
            await self.ready.wait()
        due, data = self.chunks.popleft()
        self.size -= len(data)
        if self.size < self.limit:
            self.room.set()
        return due, data


class _Link:
    """One accepted client connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, client: tuple, upstream: tuple) -> None:
        self.proxy = proxy
        self.c_reader, self.c_writer = client
        self.u_reader, self.u_writer = upstream
        self.tasks: list[asyncio.Task] = []
        self.finished = 0

    def start(self) -> None:
        limit = self.proxy.in_flight_limit()
        directions = ((self.c_reader, self.u_writer, "up"), (self.u_reader, self.c_writer, "down"))
        for reader, writer, name in directions:
            pipe = _Pipe(limit)
            self.tasks.append(asyncio.ensure_future(self._read(reader, pipe)))
            pacer = self.proxy._pacers[name]
            self.tasks.append(asyncio.ensure_future(self._write(writer, pipe, pacer)))

    async def _read(self, reader: asyncio.StreamReader, pipe: _Pipe) -> None:
        proxy = self.proxy
        try:
            while True:
                await proxy._flowing.wait()
                size = CHUNK
                if proxy.rate:
                    size = max(1, min(CHUNK, int(proxy.rate / 20)))
                data = await reader.read(size)
                await pipe.put(time.monotonic() + proxy.delay, data)
                if not data:
                    return
        except (ConnectionError, OSError):
            await pipe.put(0.0, b"")

    async def _write(self, writer: asyncio.StreamWriter, pipe: _Pipe, pacer: _Pacer) -> None:
        proxy = self.proxy
        try:
            while True:
                due, data = await pipe.get()
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
                await pacer.take(len(data), proxy.rate)
                writer.write(data)
                await writer.drain()
                proxy._forwarded(len(data))
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
        self._pacers = {"up": _Pacer(), "down": _Pacer()}
        self._cut_at: int | None = None
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
        """One-way delay; connections opened from now on size their buffers for it."""
        self.delay = float(seconds)

    def rtt(self, seconds: float) -> None:
        self.latency(seconds / 2)

    def cut_after(self, count: int) -> None:
        """Cut every connection once, when ``count`` more bytes have been forwarded."""
        self._cut_at = self.bytes_forwarded + int(count)

    def in_flight_limit(self) -> int:
        """Bytes one direction of one connection may hold: bandwidth × delay + a buffer."""
        rate = self.rate or UNTHROTTLED
        return int(min(MAX_IN_FLIGHT, BUFFER + rate * self.delay * 1.25))

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

    def _forwarded(self, count: int) -> None:
        self.bytes_forwarded += count
        if self._cut_at is not None and self.bytes_forwarded >= self._cut_at:
            self._cut_at = None
            asyncio.ensure_future(self._close_all(rst=False))

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


class ProxyProcess:
    """A :class:`FaultProxy` in its own process, for benchmarks (no GIL shared with them).

    Faults by signal: SIGUSR1 cuts every connection, SIGUSR2 toggles a blackhole.
    ``bytes_forwarded`` is known after :meth:`stop`.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        rtt: float = 0.0,
        rate: float = 0.0,
        cut_after: int | None = None,
    ) -> None:
        entry = (
            "import sys; from tests.harness.faultproxy import main; sys.exit(main(sys.argv[1:]))"
        )
        self.argv = [sys.executable, "-c", entry]
        self.argv += ["--target", f"{target_host}:{target_port}", "--rtt", str(rtt)]
        self.argv += ["--rate", str(rate)]
        if cut_after is not None:
            self.argv += ["--cut-after", str(cut_after)]
        self.port = 0
        self.bytes_forwarded = 0
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> ProxyProcess:
        root = Path(__file__).resolve().parents[2]
        self._proc = subprocess.Popen(
            self.argv, cwd=root, stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"fault proxy did not start: {line!r}")
        self.port = int(line)
        return self

    def cut(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
        out, _ = proc.communicate(timeout=10)
        with contextlib.suppress(ValueError):
            self.bytes_forwarded = int(out.split()[-1])

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM; print the port first, the bytes forwarded last."""
    parser = argparse.ArgumentParser(description="fault proxy (see tests/harness/faultproxy.py)")
    parser.add_argument("--target", required=True, help="host:port to relay to")
    parser.add_argument("--rtt", type=float, default=0.0, help="round-trip delay, seconds")
    parser.add_argument("--rate", type=float, default=0.0, help="bytes/s each way, 0: unlimited")
    parser.add_argument("--cut-after", type=int, default=None, help="one cut after N bytes")
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    proxy = FaultProxy(host, int(port)).start()
    proxy.rtt(args.rtt)
    proxy.throttle(args.rate)
    if args.cut_after is not None:
        proxy.cut_after(args.cut_after)
    done = threading.Event()
    dark = [False]

    def toggle(*_: object) -> None:
        dark[0] = not dark[0]
        if dark[0]:
            proxy.blackhole()
        else:
            proxy._call(proxy._set_flowing(True))

    signal.signal(signal.SIGUSR1, lambda *_: proxy.cut())
    signal.signal(signal.SIGUSR2, toggle)
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(proxy.port, flush=True)
    while not done.wait(0.5):
        pass
    proxy.stop()
    print(proxy.bytes_forwarded, flush=True)
    os.close(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
