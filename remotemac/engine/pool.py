"""One transport per host for the whole process, leased to every run on that host."""

from __future__ import annotations

import abc
import dataclasses
import inspect
from pathlib import Path
from typing import Any

from remotemac.transport.base import ExecResult, ProgressFn, RemoteStat, Transport
from remotemac.transport.options import SSHOptions


class TransportPool:
    """One transport per host for the whole process, shared by every run on that host.

    Why: a fleet run (or a matrix sweep with several variants on one Mac) would
    otherwise open one SSH connection per run and host, paying a handshake and an
    auth each time and running into the host's MaxStartups. Each run gets a
    :class:`PooledTransport` lease: its ``close()`` only releases the lease; the
    connection closes in :meth:`close_all`. Channels per connection are capped by
    the SSH transport's own semaphore (``max_channels``).
    """

    def __init__(
        self, home: Path, options: SSHOptions | None = None, max_channels: int | None = None
    ) -> None:
        self.home = home
        self.options = options or SSHOptions()
        if max_channels is not None:
            self.options = dataclasses.replace(self.options, max_channels=max_channels)
        self._shared: dict[str, Transport] = {}
        self._leases: dict[str, list[PooledTransport]] = {}
        self.opened = 0  # transports built (one per host): the figure the tests check

    def lease(self, host: str, *, emit=None, run_id: str = "") -> PooledTransport:
        """A handle on ``host``'s shared transport; events reach ``emit`` under ``run_id``."""
        shared = self._shared.get(host)
        if shared is None:
            shared = self._build(host)
            self._shared[host] = shared
            self.opened += 1
        lease = PooledTransport(self, host, shared, emit, run_id)
        self._leases.setdefault(host, []).append(lease)
        return lease

    def _build(self, host: str) -> Transport:
        if host == "local":
            from remotemac.transport.local import LocalTransport

            return LocalTransport()
        from remotemac.transport.ssh import SSHTransport

        return SSHTransport(
            host, home_dir=self.home, options=self.options, emit=lambda e: self._fan_out(host, e)
        )

    def _fan_out(self, host: str, event) -> None:
        """A link event of the shared connection concerns every run leasing it."""
        for lease in list(self._leases.get(host, ())):
            if lease.emit is not None:
                lease.emit(dataclasses.replace(event, run_id=lease.run_id))

    def _release(self, lease: PooledTransport) -> None:
        leases = self._leases.get(lease.host, [])
        if lease in leases:
            leases.remove(lease)

    def active(self, host: str) -> int:
        return len(self._leases.get(host, ()))

    async def close_all(self) -> None:
        from remotemac.engine.agentclient import close_link_agents

        for shared in self._shared.values():
            await close_link_agents(shared)
            await shared.close()
        self._shared.clear()
        self._leases.clear()


class PooledTransport(Transport):
    """A run's lease on a pooled transport: everything is delegated except ``close``."""

    def __init__(
        self, pool: TransportPool, host: str, shared: Transport, emit, run_id: str
    ) -> None:
        self.pool = pool
        self.host = host
        self.shared = shared
        self.emit = emit
        self.run_id = run_id
        self.name = shared.name
        self.released = False

    def link_owner(self) -> Transport:
        return self.shared

    @property
    def reconnect_deadline(self) -> float:  # type: ignore[override]
        return self.shared.reconnect_deadline

    async def connect(self) -> None:
        if self.released:  # a lease reused after close (attach-style reuse): take it again
            self.released = False
            self.pool._leases.setdefault(self.host, []).append(self)
        await self.shared.connect()

    async def close(self) -> None:
        """Release only: other runs on this host keep using the connection."""
        if not self.released:
            self.released = True
            self.pool._release(self)

    async def stream_exec(self, argv: list[str], *, stdin: bytes | None = None):
        async for chunk in self.shared.stream_exec(argv, stdin=stdin):
            yield chunk

    # the abstract operations, spelt out so a checker sees a concrete class; the
    # loop below delegates every other Transport method
    async def home(self) -> str:
        return await self.shared.home()

    async def exec(self, argv: list[str], **options: Any) -> ExecResult:
        return await self.shared.exec(argv, **options)

    async def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        return await self.shared.read_from(path, offset, max_bytes)

    async def put(self, local: str, remote: str, *, progress: ProgressFn | None = None) -> None:
        await self.shared.put(local, remote, progress=progress)

    async def get(self, remote: str, local: str, *, progress: ProgressFn | None = None) -> None:
        await self.shared.get(remote, local, progress=progress)

    async def write_bytes(self, remote: str, data: bytes, *, mode: int = 0o600) -> None:
        await self.shared.write_bytes(remote, data, mode=mode)

    async def stat(self, remote: str) -> RemoteStat | None:
        return await self.shared.stat(remote)

    async def listdir(self, remote: str) -> list[RemoteStat]:
        return await self.shared.listdir(remote)

    async def makedirs(self, remote: str, mode: int = 0o700) -> None:
        await self.shared.makedirs(remote, mode)


def _delegate(name: str, value: object):
    """A PooledTransport method that calls the shared transport's ``name``."""
    if inspect.iscoroutinefunction(value):

        async def method(self: PooledTransport, *args, **kwargs):
            return await getattr(self.shared, name)(*args, **kwargs)
    else:  # link_stats, has_link, reconnect_wait_capped …: plain calls

        def method(self: PooledTransport, *args, **kwargs):  # type: ignore[misc]
            return getattr(self.shared, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"Delegated to the pooled transport's ``{name}``."
    return method


# every other Transport operation (exec, put, get, read_from, open_process, …, and any
# added later) goes to the shared transport, so a lease never falls back to a default
for _name, _value in vars(Transport).items():
    if not _name.startswith("_") and callable(_value) and _name not in vars(PooledTransport):
        setattr(PooledTransport, _name, _delegate(_name, _value))
abc.update_abstractmethods(PooledTransport)
