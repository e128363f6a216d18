"""Reconnect after a dropped link: bounded, jittered, and only when it can help.

Why tenacity with full jitter: after a provider-side blip many clients (or 16
hosts of ours) come back at once; random exponential waits spread them out.
Why a deadline instead of a count: the user thinks in "how long do I wait for
the Mac to come back", and ``stop_before_delay`` never sleeps past it.
Host key and auth failures are never retried (retrying cannot fix them and
hammering auth can lock an account); cancellation always propagates.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    RetryError,
    retry_if_exception,
    stop_before_delay,
    wait_random_exponential,
)

from remotemac.errors import AuthError, BadInput, HostKeyError, TransientHostError
from remotemac.events import ConnectionState, Event

T = TypeVar("T")
Emit = Callable[[Event], None]


def is_transient(exc: BaseException) -> bool:
    """True for link trouble a later attempt may cure."""
    if isinstance(exc, (HostKeyError, AuthError, BadInput, asyncio.CancelledError)):
        return False
    if isinstance(exc, TransientHostError):
        return True
    # raw socket and timeout errors that escaped classification
    return isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError))


async def reconnect(
    connect: Callable[[], Awaitable[T]],
    *,
    host: str,
    deadline: float,
    emit: Emit | None = None,
    run_id: str = "",
    initial_wait: float = 0.5,
    max_wait: float = 30.0,
    total_deadline: float | None = None,
) -> T:
    """Call ``connect`` until it succeeds, a non-transient error occurs or ``deadline`` s pass.

    Emits ``reconnecting`` before every attempt (``next_in_s`` is the wait before
    it, ``deadline_left_s`` the time left before giving up: the CLI and the TUI
    count it down; ``deadline_s`` is the whole deadline, ``total_deadline`` when the
    caller already spent part of it), then ``reconnected`` or ``lost``. Raises the non-transient error as is, or
    :class:`TransientHostError` naming the last cause once the deadline is spent.
    """
    started = time.monotonic()
    attempt = 0

    def _emit(state: str, **kw: object) -> None:
        if emit is not None:
            if state == "reconnecting":
                kw["deadline_left_s"] = round(max(0.0, deadline - (time.monotonic() - started)), 1)
                kw["deadline_s"] = total_deadline if total_deadline is not None else deadline
            emit(ConnectionState(run_id, host=host, state=state, **kw))  # type: ignore[arg-type]

    def _before_sleep(rs: RetryCallState) -> None:
        wait = rs.next_action.sleep if rs.next_action else 0.0
        exc = rs.outcome.exception() if rs.outcome else None
        _emit(
            "reconnecting",
            attempt=rs.attempt_number + 1,
            next_in_s=round(wait, 3),
            detail=_short(exc),
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception(is_transient),
        wait=wait_random_exponential(multiplier=initial_wait, max=max_wait),
        stop=stop_before_delay(deadline),
        before_sleep=_before_sleep,
        reraise=False,
    )
    _emit("reconnecting", attempt=1, next_in_s=0.0)
    try:
        async for try_state in retrying:
            with try_state:
                attempt = try_state.retry_state.attempt_number
                result = await connect()
    except RetryError as err:
        last = err.last_attempt.exception()
        spent = time.monotonic() - started
        _emit("lost", attempt=attempt, detail=_short(last))
        raise TransientHostError(
            f"lost the connection to {host}: gave up after {attempt} attempts in {spent:.0f} s"
            f" ({_short(last)})",
            hint="check the host is up and reachable, then re-attach",
        ) from last
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        _emit("lost", attempt=attempt, detail=_short(exc))
        raise
    _emit("reconnected", attempt=attempt)
    return result


def _short(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return text.splitlines()[0] if text else type(exc).__name__
