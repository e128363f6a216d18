"""Link faults through the fault proxy: keepalive, reconnect, resume, no retry on auth."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import socket
import threading
import time

import pytest

from remotemac.errors import AuthError, HostKeyError, TransientHostError
from remotemac.transport.options import SSHOptions
from remotemac.transport.reconnect import is_transient, reconnect
from remotemac.transport.ssh import SSHTransport
from tests.harness.faultproxy import FaultProxy, ProxyProcess

pytestmark = pytest.mark.timeout(60)


def _later(seconds: float, fn) -> threading.Timer:
    timer = threading.Timer(seconds, fn)
    timer.start()
    return timer


def _transport(env: tuple, events: list, **kw: object) -> SSHTransport:
    home, cfg, alias = env
    kw.setdefault("keepalive_interval", 1)
    kw.setdefault("keepalive_count_max", 3)
    kw.setdefault("connect_timeout", 2)
    return SSHTransport(
        alias, home_dir=home, options=SSHOptions(ssh_config=cfg, **kw), emit=events.append
    )  # type: ignore[arg-type]


async def _wait_for_state(events: list, state: str, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if any(e.state == state for e in events):
            return time.monotonic() - start
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {state!r} event within {timeout} s: {[e.state for e in events]}")


@pytest.mark.asyncio
async def test_blackhole_detected_within_keepalive_bound(sshd, fault_proxy, ssh_env):
    """1 s x 3 keepalive: a silent link is declared dead after ~3-4 s, not never."""
    proxy = fault_proxy(sshd)
    events: list = []
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=1) as t:
        assert (await t.exec(["true"])).ok
        proxy.blackhole()
        pending = asyncio.ensure_future(t.exec(["sh", "-c", "echo never"]))
        elapsed = await _wait_for_state(events, "disconnected", timeout=10)
        assert 2.0 <= elapsed <= 1 * 3 + 2.0
        with pytest.raises(TransientHostError, match="dropped during"):
            await asyncio.wait_for(pending, 5)
        assert "keepalive" in [e for e in events if e.state == "disconnected"][0].detail


@pytest.mark.asyncio
async def test_put_resumes_after_a_cut(sshd, fault_proxy, ssh_env, tmp_path, caplog):
    proxy = fault_proxy(sshd)
    proxy.throttle(2 << 20)
    data = os.urandom(3 << 20)
    src, dst = tmp_path / "src.bin", sshd.home / "dst.bin"
    src.write_bytes(data)
    events: list = []
    moved: list[int] = []
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=20) as t:
        await t.home()
        cutter = _later(0.6, proxy.cut)
        await t.put(str(src), str(dst), progress=moved.append)
        cutter.join()
        assert t.disconnects == 1 and t.reconnects == 1
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert sum(moved) == len(data)  # a restart is not counted twice
    states = [e.state for e in events]
    assert states[:2] == ["connected", "disconnected"]
    assert states[-1] == "reconnected" and "reconnecting" in states
    assert proxy.accepted == 2
    gc.collect()  # asyncssh's abandoned SFTP workers are reported when collected
    await asyncio.sleep(0)
    noise = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not [m for m in noise if "never retrieved" in m], noise


@pytest.mark.asyncio
async def test_idempotent_exec_reruns_after_reset_non_idempotent_does_not(
    sshd, fault_proxy, ssh_env, tmp_path
):
    proxy = fault_proxy(sshd)
    events: list = []
    marker = sshd.home / "runs"
    script = f"echo run >> {marker}; sleep 1; echo done"
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=20) as t:
        await t.exec(["true"])
        _later(0.4, proxy.reset)
        res = await t.exec(["sh", "-c", script], idempotent=True)
        assert res.stdout == b"done\n"
        assert marker.read_text().count("run") == 2

        _later(0.4, proxy.cut)
        with pytest.raises(TransientHostError, match="may or may not have completed"):
            await t.exec(["sh", "-c", script])
        assert (await t.exec(["echo", "back"])).stdout == b"back\n"  # reconnects on demand
    assert [e.state for e in events].count("reconnected") == 2


@pytest.mark.asyncio
async def test_log_follow_by_offset_survives_cut(sshd, fault_proxy, ssh_env, tmp_path):
    """read_from at the caller's offset after a reconnect: nothing lost, nothing repeated."""
    proxy = fault_proxy(sshd)
    log = sshd.home / "job.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(2000)))
    events: list = []
    got = b""
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=20) as t:
        while True:
            chunk = await t.read_from(str(log), len(got), 1024)
            if not chunk:
                break
            got += chunk
            if len(got) == 4096:
                proxy.cut()
    assert got == log.read_bytes()
    assert t.reconnects == 1


@pytest.mark.asyncio
async def test_gives_up_at_the_deadline_with_backoff_events(sshd, fault_proxy, ssh_env):
    proxy = fault_proxy(sshd)
    events: list = []
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=2.5) as t:
        await t.exec(["true"])
        proxy.refuse(True)
        proxy.cut()
        start = time.monotonic()
        with pytest.raises(TransientHostError, match="gave up after") as err:
            await t.stat("/")
        spent = time.monotonic() - start
    assert spent <= 2.5 + 2.5  # the deadline plus one connect attempt at most
    assert err.value.exit_code == 3
    tries = [e for e in events if e.state == "reconnecting"]
    assert len(tries) >= 2 and [e.attempt for e in tries] == list(range(1, len(tries) + 1))
    assert all(e.next_in_s is not None and e.next_in_s >= 0 for e in tries)
    assert events[-1].state == "lost"


@pytest.mark.asyncio
async def test_auth_failure_after_reconnect_is_not_retried(sshd, fault_proxy, ssh_env):
    proxy = fault_proxy(sshd)
    events: list = []
    async with _transport(ssh_env(sshd, proxy), events, reconnect_deadline=30) as t:
        await t.exec(["true"])
        sshd.authorized_keys.write_text("")  # key revoked on the host
        proxy.cut()
        start = time.monotonic()
        with pytest.raises(AuthError):
            await t.exec(["true"], idempotent=True)
        assert time.monotonic() - start < 3
    assert proxy.accepted == 2  # the first connect and exactly one reconnect attempt
    assert [e.state for e in events][-2:] == ["reconnecting", "lost"]


@pytest.mark.asyncio
async def test_reconnect_never_swallows_cancellation():
    attempts = 0

    async def connect() -> None:
        nonlocal attempts
        attempts += 1
        raise ConnectionRefusedError()

    task = asyncio.ensure_future(
        reconnect(connect, host="h", deadline=30, initial_wait=0.02, max_wait=0.05)
    )
    while attempts < 3:  # it is retrying
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    seen = attempts
    await asyncio.sleep(0.25)  # five of the longest waits
    assert attempts == seen  # nothing keeps retrying in the background


def test_transient_classification():
    assert is_transient(TransientHostError("x"))
    assert is_transient(ConnectionResetError())
    assert is_transient(TimeoutError())
    assert not is_transient(AuthError("x"))
    assert not is_transient(HostKeyError("x"))
    assert not is_transient(asyncio.CancelledError())


@pytest.mark.slow
def test_fault_proxy_throttle_latency_and_reset():
    """The harness itself, in front of a plain echo server."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def echo() -> None:
        listener.settimeout(0.02)  # how long the test's end waits for this thread
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn, contextlib.suppress(OSError):
                while data := conn.recv(65536):
                    conn.sendall(data)

    server = threading.Thread(target=echo, daemon=True)
    server.start()
    proxy = FaultProxy("127.0.0.1", listener.getsockname()[1]).start()
    try:
        proxy.latency(0.15)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            start = time.monotonic()
            sock.sendall(b"ping")
            assert sock.recv(4) == b"ping"
            assert 0.3 <= time.monotonic() - start < 1.5  # 0.15 s each way
        proxy.restore()
        proxy.throttle(40_000)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            start = time.monotonic()
            sock.sendall(b"x" * 20_000)  # 0.5 s each way, paced by one clock per direction
            got = 0
            while got < 20_000:
                got += len(sock.recv(65536))
            assert 0.45 <= time.monotonic() - start < 4
        proxy.restore()
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            sock.sendall(b"a")
            assert sock.recv(1) == b"a"
            assert proxy.reset() >= 1  # the throttled connection may still be closing
            with pytest.raises(ConnectionResetError):
                sock.recv(1)
    finally:
        proxy.stop()
        stop.set()
        server.join()
        listener.close()


@pytest.mark.slow
def test_fault_proxy_throttle_delivers_the_nominal_rate():
    """The throttled link carries what it says (20 MB/s), not less and not more.

    Regression: sleeping len/rate after each write delivered ~78 % of the rate, which
    made every "throttled" figure in the README look worse than the link allowed.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[int] = []

    def sink() -> None:
        conn, _ = listener.accept()
        with conn:
            total = 0
            while data := conn.recv(1 << 20):
                total += len(data)
            received.append(total)

    server = threading.Thread(target=sink, daemon=True)
    server.start()
    proxy = FaultProxy("127.0.0.1", listener.getsockname()[1]).start()
    rate, size = 20e6, 16 << 20  # 0.8 s
    try:
        proxy.throttle(rate)
        block = b"x" * (1 << 20)
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
            start = time.monotonic()
            for _ in range(size // len(block)):
                sock.sendall(block)
            sock.shutdown(socket.SHUT_WR)
            server.join(30)
            elapsed = time.monotonic() - start
        assert received == [size]
        assert 0.85 <= size / elapsed / rate <= 1.05, f"{size / elapsed / 1e6:.1f} MB/s"
    finally:
        proxy.stop()
        listener.close()


def _blast(port: int, size: int, block: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        for _ in range(size // len(block)):
            sock.sendall(block)
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the sink closes once it has everything


def _sink(
    listener: socket.socket, received: list[int], count: int, done_at: list[float] | None = None
) -> None:
    """Accept ``count`` connections and drain each; ``done_at`` gets when each one's EOF came."""
    conns = [listener.accept()[0] for _ in range(count)]

    def drain(conn: socket.socket) -> None:
        with conn:
            total = 0
            while data := conn.recv(1 << 20):
                total += len(data)
            if done_at is not None:
                done_at.append(time.monotonic())
            received.append(total)

    threads = [threading.Thread(target=drain, args=(c,), daemon=True) for c in conns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


@pytest.mark.slow
def test_fault_proxy_far_link_is_not_capped_by_the_relay():
    """At 400 ms RTT and 40 MB/s one connection still gets the rate (8 MB in flight).

    Regression: the relay held at most 64 chunks of 64 KiB per direction, so a far,
    fast link (80 ms at 100 MB/s needs 4 MB in flight) was capped by the relay itself.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[int] = []
    done_at: list[float] = []
    server = threading.Thread(target=_sink, args=(listener, received, 1, done_at), daemon=True)
    server.start()
    proxy = FaultProxy("127.0.0.1", listener.getsockname()[1]).start()
    rate, size = 40e6, 40 << 20  # 1 s; a relay capped at 4 MB in flight takes 2 s
    try:
        proxy.throttle(rate)
        proxy.rtt(0.4)
        start = time.monotonic()
        _blast(proxy.port, size, b"x" * (1 << 20))
        server.join(30)
        # until the last byte arrived, less the first byte's one-way delay (the sink's
        # FIN coming back through the link is not transfer time)
        elapsed = done_at[0] - start - 0.2
        assert received == [size]
        assert 0.85 <= size / elapsed / rate <= 1.05, f"{size / elapsed / 1e6:.1f} MB/s"
    finally:
        proxy.stop()
        listener.close()


def test_fault_proxy_bandwidth_is_shared_by_all_connections():
    """Two connections through a 20 MB/s link share it: a second connection is no bonus.

    Regression: each connection was paced on its own, so N connections got N times
    the link, flattering any multi-stream transfer measured through the proxy.
    """
    listener = socket.create_server(("127.0.0.1", 0))
    received: list[int] = []
    server = threading.Thread(target=_sink, args=(listener, received, 2), daemon=True)
    server.start()
    proxy = FaultProxy("127.0.0.1", listener.getsockname()[1]).start()
    rate, size = 20e6, 8 << 20  # 0.8 s for both; paced apart they would take 0.4 s
    try:
        proxy.throttle(rate)
        start = time.monotonic()
        senders = [
            threading.Thread(target=_blast, args=(proxy.port, size, b"y" * (1 << 20)))
            for _ in range(2)
        ]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join(60)
        server.join(30)
        elapsed = time.monotonic() - start
        assert sorted(received) == [size, size]
        assert 2 * size / elapsed / rate <= 1.05, f"{2 * size / elapsed / 1e6:.1f} MB/s"
    finally:
        proxy.stop()
        listener.close()


def test_fault_proxy_process_mode_cuts_after_a_byte_count():
    """The bench's out-of-process proxy relays, cuts once past N bytes, and reports them."""
    listener = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def sink() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                got.extend(data)

    server = threading.Thread(target=sink, daemon=True)
    server.start()
    proxy = ProxyProcess("127.0.0.1", listener.getsockname()[1], cut_after=1 << 20).start()
    try:
        with (
            socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock,
            contextlib.suppress(OSError),
        ):
            for _ in range(64):
                sock.sendall(b"z" * (256 << 10))
                time.sleep(0.01)
        server.join(10)
    finally:
        proxy.stop()
        listener.close()
    assert (1 << 20) <= len(got) < (16 << 20), len(got)
    assert proxy.bytes_forwarded == len(got)
