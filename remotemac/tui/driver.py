"""Start, attach and stop runs from the TUI: the CLI's engine calls, in Textual workers.

The engine is asyncio-native, so each run is an async worker on the app's own
loop: events arrive on the loop that draws, are folded into a
:class:`~remotemac.tui.model.RunLive` at once, and only state changes (not log
lines) become messages. Cancelling a worker (quitting the TUI) cancels the local
follow only: the job lives in tmux on the host, the journal says
``interrupted``, and the next TUI (or ``remotemac attach``) picks it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remotemac.engine.session import AlreadyDone, RunSession
from remotemac.errors import BadInput, RemotemacError
from remotemac.events import Event, LogLine, PhaseProgress
from remotemac.journal import Journal
from remotemac.settings import LocalSettings
from remotemac.tui.messages import RunEnded, RunUpdated
from remotemac.tui.model import LIVE_STATES, RunLive

PROGRESS_EVERY_S = 0.1  # transfer progress repaints at most this often per phase
REATTACH_WINDOW_S = 7 * 86400  # older in-flight runs are listed, not re-attached
LOG_TAIL_BYTES = 4 << 20


def error_line(exc: BaseException) -> str:
    """The one line the UI shows for any failure (never a traceback)."""
    if isinstance(exc, RemotemacError):
        return exc.line()
    return f"internal error: {type(exc).__name__}: {exc}"


def read_local_logs(
    out_dir: str | Path, upto: Callable[[str], int | None], max_lines: int
) -> list[tuple[str, str]]:
    """(device, line) already on disk in ``<out>/logs/<device>.log`` (blocking: use a thread).

    ``upto(device)`` caps each file at the byte offset the journal saved: the engine's
    follow resumes exactly there, so preloaded and streamed lines never overlap.
    """
    log_dir = Path(out_dir) / "logs"
    files = (
        sorted(log_dir.glob("*.log"), key=lambda p: p.stat().st_mtime) if log_dir.is_dir() else []
    )
    out: list[tuple[str, str]] = []
    for path in files:
        limit = upto(path.stem)
        size = path.stat().st_size if limit is None else min(limit, path.stat().st_size)
        start = max(0, size - LOG_TAIL_BYTES)
        with path.open("rb") as fh:
            fh.seek(start)
            data = fh.read(size - start)
        lines = data.decode("utf-8", "replace").splitlines()
        if start > 0 and lines:
            lines = lines[1:]  # a cut first line
        out += [(path.stem, line) for line in lines[-max_lines:]]
    return out


class RunDriver:
    """The runs this TUI drives, their live state, and the workers behind them."""

    def __init__(
        self,
        app: Any,
        settings: LocalSettings,
        journal: Journal,
        out_root: Path,
        keep_lines: int = 20_000,
    ) -> None:
        self.app = app
        self.settings = settings
        self.journal = journal
        self.out_root = Path(out_root)
        self.keep_lines = keep_lines
        self.lives: dict[str, RunLive] = {}
        self.contexts: dict[str, Any] = {}
        self.workers: dict[str, Any] = {}

    # ------------------------------------------------------------ queries

    def attached(self, run_id: str) -> bool:
        worker = self.workers.get(run_id)
        return worker is not None and not worker.is_finished

    def in_flight(self, now: float) -> list[str]:
        """Runs to re-attach on opening: in flight per the journal, recent, not ours yet."""
        return [
            r.run_id
            for r in self.journal.list_runs()
            if r.state in LIVE_STATES
            and now - r.created_at < REATTACH_WINDOW_S
            and not self.attached(r.run_id)
        ]

    # ------------------------------------------------------------ runs

    def start(self, playbook_path: str, *, keep_data: bool = False, host: str | None = None) -> str:
        """Create the journal row (as ``remotemac run`` does) and drive the run in a worker."""
        from remotemac.engine.session import RunOptions
        from remotemac.journal import new_run_id
        from remotemac.playbook import load_playbook

        pb = load_playbook(playbook_path, overrides={"host": host} if host else None)
        run_id = new_run_id(pb.name)
        session = RunSession.start(
            self.journal,
            pb,
            (self.out_root / run_id).resolve(),
            home=self.settings.home,
            options=RunOptions(keep_data=keep_data),
            ssh=self.settings.ssh_options(),
            stored={"keep_data": keep_data, "drill": None},
            run_id=run_id,
        )
        self._spawn(session, preload=False)
        return run_id

    def attach(self, run_id: str) -> None:
        """Re-attach to a run of the journal (after a quit, a crash, another terminal)."""
        if self.attached(run_id):
            raise BadInput(f"run {run_id} is already attached here")
        session = RunSession.resume(
            self.journal,
            run_id,
            home=self.settings.home,
            ssh=self.settings.ssh_options(),
            show_secrets=False,
        )
        self._spawn(session, preload=True)

    def _spawn(self, session: RunSession, *, preload: bool) -> None:
        run_id, pb = session.run_id, session.playbook
        live = RunLive(run_id, host=pb.host, name=pb.name, keep_lines=self.keep_lines)
        live.out_dir = str(session.out_dir)
        live.active = True
        self.lives[run_id] = live
        self.workers[run_id] = self.app.run_worker(
            self._drive(live, session, preload),
            name=f"run {run_id}",
            group="runs",
            exit_on_error=False,
        )
        self.app.post_message(RunUpdated(run_id))

    async def _drive(self, live: RunLive, session: RunSession, preload: bool) -> None:
        run_id = live.run_id
        code: int | None = None
        error: str | None = None
        try:
            if preload:

                def upto(device: str) -> int:
                    return self.journal.log_offset(run_id, device)[0]

                lines = await asyncio.to_thread(
                    read_local_logs, session.out_dir, upto, self.keep_lines
                )
                for device, line in lines:
                    live.add_line(device, line)
            session.subscribe(self.sink(live))
            # link drops are counted by the engine (ctx.link_tally), for every front end
            self.contexts[run_id] = session.open()
            code = await session.run()
        except asyncio.CancelledError:
            raise  # quitting: the job goes on on the host; the journal says "interrupted"
        except Exception as exc:  # every failure becomes a line in the UI, never a crash
            error = error_line(exc)
        finally:
            live.active = False
            self.contexts.pop(run_id, None)
        live.error = error
        self.app.post_message(RunEnded(run_id, code, error))

    def sink(self, live: RunLive) -> Callable[[Event], None]:
        """Fold each event into ``live``; tell the UI about state changes, not lines."""
        last: dict[str, float] = {}

        def emit(event: Event) -> None:
            live.apply(event)
            if isinstance(event, LogLine):
                return  # the log view takes lines in batches from live.lines
            if isinstance(event, PhaseProgress):
                now = time.monotonic()
                if now - last.get(event.phase, 0.0) < PROGRESS_EVERY_S:
                    return
                last[event.phase] = now
            self.app.post_message(RunUpdated(live.run_id, event))

        return emit

    # ------------------------------------------------------------ one phase by hand

    async def one_phase(self, run_id: str, phase: str) -> int:
        """``remotemac pull`` / ``wipe`` for one run, events into its live state."""
        from remotemac.engine.session import RunOptions

        if self.attached(run_id):
            raise BadInput(f"run {run_id} is still attached: {phase} it when it ends")
        session = RunSession.resume(
            self.journal,
            run_id,
            home=self.settings.home,
            ssh=self.settings.ssh_options(),
            options=RunOptions(),
        )
        done = session.phase_done(phase)
        if done:
            raise AlreadyDone(done)
        live = self.lives.get(run_id)
        if live is None:
            row = session.journal_row()
            live = self.lives[run_id] = RunLive(
                run_id, host=row.host, name=row.name, keep_lines=self.keep_lines
            )
            live.out_dir = row.out_dir
        session.subscribe(self.sink(live))
        return await session.run_phase(phase)

    # ------------------------------------------------------------ drill, cleanup

    async def drill_disconnect(self, run_id: str) -> int:
        """Cut the live SSH link(s) of an attached run on purpose; returns links cut.

        Each host's link goes through the transport's public ``drop_connection``, so the
        transport emits ``disconnected``, counts the drop and reconnects on the next
        operation, exactly as after a real drop; the run context keeps the drill so the
        record says the link was cut on purpose.
        """
        ctx = self.contexts.get(run_id)
        if ctx is None:
            raise BadInput(
                f"drill: run {run_id} is not attached in this TUI", hint="attach it first (t)"
            )
        cut = 0
        links = 0
        for binding in ctx.hosts.values():
            owner = binding.transport.link_owner()  # a pool lease: its shared transport
            if not owner.has_link():  # local has no link to cut
                continue
            links += 1
            dropped = bool(await owner.drop_connection("dropped on purpose (TUI drill)"))
            ctx.note_cut(owner.name, dropped)
            cut += dropped
        if not links:
            raise BadInput(
                f"drill: run {run_id} has no SSH link to cut",
                hint="the drill needs a remote host, not local",
            )
        return cut

    async def cleanup(self, host: str, *, dry_run: bool, remote_root: str) -> tuple[int, str]:
        """``remotemac cleanup HOST`` with its JSON output captured for a dialog."""
        try:
            from remotemac.engine.session import main_cleanup
        except ImportError as exc:
            raise BadInput(f"cleanup is not available in this build: {exc}") from None
        lines: list[str] = []  # main_cleanup's output, passed in: stdout stays the terminal's
        code = await main_cleanup(
            host,
            journal=self.settings.journal(),
            home=self.settings.home,
            ssh=self.settings.ssh_options(),
            dry_run=dry_run,
            yes=not dry_run,
            as_json=True,
            remote_root=remote_root,
            echo=lines.append,
        )
        return int(code or 0), "".join(line + "\n" for line in lines)

    # ------------------------------------------------------------ quitting

    async def stop_all(self, timeout: float = 10.0) -> None:
        """Cancel every run worker (the local follow only) and wait for the journal write."""
        workers = [w for w in self.workers.values() if not w.is_finished]
        for worker in workers:
            worker.cancel()
        if workers:
            with contextlib.suppress(Exception, asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(_quiet_wait(w) for w in workers)), timeout)

    async def stop_jobs(self, run_ids: list[str]) -> dict[str, str]:
        """Stop these runs' jobs on their hosts (after :meth:`stop_all`): the quit
        dialog's "stop & quit". Returns why, for each run whose stop failed."""
        failed: dict[str, str] = {}
        for run_id in run_ids:
            try:
                session = RunSession.resume(
                    self.journal,
                    run_id,
                    home=self.settings.home,
                    ssh=self.settings.ssh_options(),
                    show_secrets=False,
                )
                left = await session.stop_jobs("stopped on the host from the TUI (quit)")
            except Exception as exc:  # the host unreachable: the job goes on; say so
                failed[run_id] = error_line(exc)
                continue
            if left:
                failed[run_id] = "left alone: " + "; ".join(left)
        return failed


async def _quiet_wait(worker: Any) -> None:
    with contextlib.suppress(Exception, asyncio.CancelledError):
        await worker.wait()
