"""The ``local`` host: this machine, no SSH.

It exists so the whole pipeline runs with nothing rented (the quickstart, the
tests of phases) and so a reference run can happen on the laptop (``on: local``).
Commands run without a shell; files move with plain copies.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat as stat_mod
from pathlib import Path

from remotemac.errors import HostError, UnsafePath
from remotemac.transport.base import (
    DownloadSink,
    ExecResult,
    ProgressFn,
    RemoteProcess,
    RemoteStat,
    Transport,
)

_COPY_BLOCK = 1 << 20


class LocalTransport(Transport):
    name = "local"

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def home(self) -> str:
        return str(Path.home())

    async def exec(
        self,
        argv: list[str],
        *,
        stdin: bytes | None = None,
        timeout: float | None = None,
        check: bool = False,
        idempotent: bool = False,
    ) -> ExecResult:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise HostError(f"local: command timed out after {timeout:.0f}s: {argv[0]}") from None
        result = ExecResult(" ".join(argv), proc.returncode or 0, out, err)
        if check and not result.ok:
            last = (err.decode("utf-8", "replace").strip().splitlines() or ["(no output)"])[-1]
            raise HostError(f"local: {argv[0]} failed with exit {result.exit_code}: {last}")
        return result

    async def read_from(self, path: str, offset: int, max_bytes: int = 1 << 20) -> bytes:
        def read() -> bytes:
            with open(path, "rb") as fh:
                fh.seek(offset)
                return fh.read(max_bytes)

        return await asyncio.to_thread(read)

    async def put(self, local: str, remote: str, *, progress: ProgressFn | None = None) -> None:
        await asyncio.to_thread(_copy, local, remote, progress)

    async def get(self, remote: str, local: str, *, progress: ProgressFn | None = None) -> None:
        await asyncio.to_thread(_copy, remote, local, progress)

    async def write_bytes(self, remote: str, data: bytes, *, mode: int = 0o600) -> None:
        def write() -> None:
            tmp = f"{remote}.tmp-{os.getpid()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, remote)

        await asyncio.to_thread(write)

    async def stat(self, remote: str) -> RemoteStat | None:
        try:
            st = os.lstat(remote)
        except FileNotFoundError:
            return None
        return _to_stat(remote, st)

    async def listdir(self, remote: str) -> list[RemoteStat]:
        out = []
        for name in sorted(os.listdir(remote)):
            full = os.path.join(remote, name)
            out.append(_to_stat(full, os.lstat(full)))
        return out

    async def makedirs(self, remote: str, mode: int = 0o700) -> None:
        os.makedirs(remote, mode=mode, exist_ok=True)

    async def open_process(
        self,
        argv: list[str],
        *,
        reconnect_within: float | None = None,
        window: int | None = None,
    ) -> RemoteProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=_LINE_LIMIT,
        )
        return _LocalProcess(proc)

    async def download_to(
        self,
        remote: str,
        dst: DownloadSink,
        offset: int = 0,
        *,
        progress: ProgressFn | None = None,
        limit: int | None = None,
    ) -> int:
        def copy() -> int:
            written = 0
            # O_NONBLOCK: opening a FIFO for reading would wait for a writer forever
            fd = os.open(remote, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as src:
                if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                    raise UnsafePath(f"local: {remote} is not a regular file; not pulled")
                os.set_blocking(fd, True)
                src.seek(offset)
                dst.seek(offset)
                dst.truncate()
                left = None if limit is None else max(0, limit - offset)
                while left != 0 and (
                    block := src.read(_COPY_BLOCK if left is None else min(_COPY_BLOCK, left))
                ):
                    if left is not None:
                        left -= len(block)
                    dst.write(block)
                    written += len(block)
                    if progress is not None:
                        progress(len(block))
            return written

        return await asyncio.to_thread(copy)


_LINE_LIMIT = 64 << 20


class _LocalProcess(RemoteProcess):
    """A child process with pipes; stderr is drained in the background so it never blocks."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self._err = b""
        self._err_task = asyncio.ensure_future(self._drain_stderr())

    async def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        while chunk := await self._proc.stderr.read(65536):
            self._err = (self._err + chunk)[-4096:]

    async def write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)
        await self._proc.stdin.drain()

    async def write_eof(self) -> None:
        assert self._proc.stdin is not None
        if not self._proc.stdin.is_closing():
            self._proc.stdin.close()

    async def readline(self) -> bytes:
        assert self._proc.stdout is not None
        return await self._proc.stdout.readline()

    async def readexactly(self, size: int) -> bytes:
        assert self._proc.stdout is not None
        try:
            return await self._proc.stdout.readexactly(size)
        except asyncio.IncompleteReadError as exc:
            return exc.partial

    async def wait(self, timeout: float | None = None) -> int:
        code = await asyncio.wait_for(self._proc.wait(), timeout)
        await self._err_task
        return code

    def stderr_tail(self) -> str:
        lines = self._err.decode("utf-8", "replace").strip().splitlines()
        return lines[-1] if lines else ""

    async def close(self) -> None:
        if self._proc.returncode is None:
            if self._proc.stdin is not None and not self._proc.stdin.is_closing():
                self._proc.stdin.close()
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except asyncio.TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        self._err_task.cancel()


def _to_stat(path: str, st: os.stat_result) -> RemoteStat:
    if stat_mod.S_ISLNK(st.st_mode):
        kind = "link"
    elif stat_mod.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat_mod.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    return RemoteStat(path=path, size=st.st_size, mtime=st.st_mtime, kind=kind)


def _copy(src: str, dst: str, progress: ProgressFn | None) -> None:
    if progress is None:
        shutil.copyfile(src, dst)
        return
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while block := fin.read(_COPY_BLOCK):
            fout.write(block)
            progress(len(block))
