"""A second thread on the host for the slow half of receiving a file.

Why: one thread used to read the stream, store the ciphertext, decrypt, write the
plaintext and hash it, in turn. Creating a file on the host's disk (0.1-1 ms each on a
busy filesystem), writing it and SHA-256 then stalled the reading of the stream, and
the laptop, sshd and this process waited on each other. hashlib, file writes, creates
and renames release the GIL, so this thread does them while the reader goes on with
the next bytes (pipe reads and AES-GCM, which is fast).

Tasks run in the order given. The first one that fails is kept: later tasks are
skipped (they must create nothing before they run), and the reader gets the error
at its next :meth:`WriteBehind.submit` or :meth:`WriteBehind.drain`. Memory is
bounded: ``submit`` waits while more than ``limit`` bytes are queued.

``idle`` (e.g. sending the acknowledgements gathered so far) runs on this thread when
it has had nothing to do for ``idle_after`` seconds or that long has passed since it
last ran, so many small files cost one line back to the laptop, not one each.

Standard library only, Python 3.9.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Deque, Optional, Tuple


class WriteBehind:
    """Runs callables in order on one background thread (see the module doc)."""

    def __init__(
        self, limit: int, idle: Callable[[], None] = lambda: None, idle_after: float = 0.02
    ) -> None:
        self._cond = threading.Condition()
        self._tasks: Deque[Tuple[Callable[[], None], int]] = collections.deque()
        self._queued = 0
        self._limit = limit
        self._idle = idle
        self._idle_after = idle_after
        self._running = False
        self._closed = False
        self.error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name="write-behind", daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None], nbytes: int = 0) -> None:
        """Queue ``task`` (holding ``nbytes`` of data); raises an earlier task's error."""
        with self._cond:
            while self._queued and self._queued + nbytes > self._limit and self.error is None:
                self._cond.wait()
            if self.error is not None:
                raise self.error
            self._tasks.append((task, nbytes))
            self._queued += nbytes
            self._cond.notify_all()

    def wait_idle(self) -> None:
        """Wait until every queued task has run (or been skipped after an error)."""
        with self._cond:
            while self._tasks or self._running:
                self._cond.wait()

    def drain(self) -> None:
        """Wait for every task, run ``idle`` once more, and raise the first failure."""
        self.wait_idle()
        self._idle()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Let the queued tasks finish, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def _loop(self) -> None:
        last_idle = time.monotonic()
        while True:
            with self._cond:
                while not self._tasks and not self._closed:
                    if self._cond.wait(self._idle_after):
                        continue
                    break  # nothing came for a while: a good moment for idle()
                if not self._tasks:
                    if self._closed:
                        return
                    task = None
                else:
                    task, nbytes = self._tasks.popleft()
                    self._running = True
            if task is not None:
                try:
                    if self.error is None:
                        task()
                except BaseException as exc:  # kept for the reader, who raises it
                    self.error = exc
            now = time.monotonic()
            if task is None or now - last_idle >= self._idle_after:
                last_idle = now
                try:
                    self._idle()
                except BaseException as exc:
                    if self.error is None:
                        self.error = exc
            if task is not None:
                with self._cond:
                    self._queued -= nbytes
                    self._running = False
                    self._cond.notify_all()
