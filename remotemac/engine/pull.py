"""Pull results from the host: verified, resumable, and never outside ``--out``.

The agent lists the output directory with kinds and sizes. The host is not
trusted: every name is validated (no absolute paths, no ``..``, no NUL or
backslash), every local directory on the way is created by us and checked to be
a real directory (no link can lead out), and each file is written to
``.<name>.rmpart`` (opened without following links) and renamed into place only
when its SHA-256 matches. The bytes come down exec channels from the host's
``pullops.py`` (pullstream.py: it skips links, FIFOs and devices unopened and
hashes each file as it reads it); SFTP with a hashed listing is the fallback. An
interrupted pull leaves the ``.rmpart`` file, and the next pull continues from its
end once the host's digest of that prefix agrees; a checksum failure removes it and
ends with exit 5.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
import time
import unicodedata
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath

from remotemac.agent.protocol import JsonObject, Op, ProtocolError
from remotemac.data.manifest import sha256_file
from remotemac.engine.agentanswers import OutputListing
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.context import RunContext, Side
from remotemac.engine.hashsink import HashingSink
from remotemac.engine.pulled import (
    Listed,
    ListingEntry,
    NotAnEntry,
    PullBytes,
    PulledFile,
    PulledSide,
    SkippedFile,
)
from remotemac.engine.pullstream import (
    LOCAL_REFUSALS,
    PART,
    EarlyChannel,
    StreamFile,
    part_path,
    pull_streamed,
    run_all,
    sender_argv,
)
from remotemac.errors import IntegrityError, RemotemacError, UnsafePath
from remotemac.events import Event, PhaseProgress, Warning
from remotemac.transport.base import Transport

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_HEX = set("0123456789abcdef")


#: a result's path below the output dir, in bytes, and one component of it: longer
#: names are refused (a 5,000-character name would otherwise fail in mkdir/open)
MAX_NAME_BYTES = 1024
MAX_PART_BYTES = 255
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def shown_name(name: object) -> str:
    """A host-sent name for a message: its repr (controls escaped), cut at 80 characters."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."


def entry_name(entry: ListingEntry) -> bytes | str | None:
    """The entry's name as the host's bytes (``name_hex``), else its ``path`` string.

    Raises UnsafePath for a name too long to consider."""
    raw = entry.name_hex
    if isinstance(raw, str):
        if len(raw) > 2 * MAX_NAME_BYTES:  # refused without decoding all of it
            raise UnsafePath(
                f"refusing result name {shown_name(entry.path)} "
                f"({len(raw) // 2} bytes): too long (at most {MAX_NAME_BYTES} bytes)"
            )
        try:
            return bytes.fromhex(raw)
        except ValueError:
            return None
    if raw is not None:
        return None
    name = entry.path
    return name if isinstance(name, str) else None


def safe_relpath(name: bytes | str | None) -> PurePosixPath:
    """A host-sent name (bytes, or a str from an older agent) as a relative path, or UnsafePath.

    Refused: anything not valid UTF-8, longer than MAX_NAME_BYTES (or a component
    longer than MAX_PART_BYTES), empty, absolute, climbing with ``..``, with a NUL,
    a backslash, a control character or an empty or ``.`` component, or ending
    like remotemac's own partial files.
    """
    if isinstance(name, str):
        try:
            raw = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise UnsafePath(f"refusing result name {shown_name(name)}: not valid UTF-8") from None
    elif isinstance(name, bytes):
        raw = name
    else:
        raise UnsafePath(f"refusing result name {shown_name(name)}: not a name")
    if len(raw) > MAX_NAME_BYTES or any(len(p) > MAX_PART_BYTES for p in raw.split(b"/")):
        raise UnsafePath(
            f"refusing result name {shown_name(raw[:60])} ({len(raw)} bytes): "
            f"too long (at most {MAX_NAME_BYTES} bytes, {MAX_PART_BYTES} a part)"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UnsafePath(f"refusing result name {shown_name(raw)}: not valid UTF-8") from None
    if not text or "\x00" in text or "\\" in text:
        raise UnsafePath(f"refusing result name {shown_name(text)}: empty, NUL or backslash")
    path = PurePosixPath(text)
    if path.is_absolute() or ".." in path.parts or "//" in text or text.startswith("/"):
        raise UnsafePath(f"refusing result name {shown_name(text)}: absolute or climbs with '..'")
    if any(part in ("", ".") for part in text.split("/")) or _CONTROL.search(text):
        raise UnsafePath(
            f"refusing result name {shown_name(text)}: empty part, '.' or control character"
        )
    if text.endswith(PART):
        raise UnsafePath(
            f"refusing result name {shown_name(text)}: clashes with remotemac's partial files"
        )
    return path


class SharedBudget:
    """``outputs.max_bytes`` for every side of a run pulled at once, reserved at listing
    time: each side's listed total is noted, and once every side has listed, a side may
    take what the sides before it (in the run's order) left. The same limit, and the
    same side refused, as when the sides were pulled one after the other; the sides'
    round trips overlap instead of adding up (issue 36: the pull was a third of a
    trivial run at 80 ms)."""

    def __init__(self, limit: int | None, order: list[str]) -> None:
        self.limit = limit
        self.order = order
        self.totals: dict[str, int] = {}
        self._all = asyncio.Event()

    def note(self, label: str, total: int) -> None:
        """``label``'s listed total (0 for a side that ended before listing)."""
        self.totals.setdefault(label, total)
        if all(name in self.totals for name in self.order):
            self._all.set()

    async def left_for(self, label: str, total: int) -> int | None:
        """What ``label`` may pull (None: no limit), once every side has listed."""
        self.note(label, total)
        if self.limit is None:
            return None
        await self._all.wait()
        before = self.order[: self.order.index(label)] if label in self.order else []
        return self.limit - sum(self.totals[name] for name in before)


async def pull_side(
    ctx: RunContext,
    side: Side,
    run_dir: str,
    max_bytes: int | None = None,
    budget: SharedBudget | None = None,
) -> PulledSide:
    """Pull one side's outputs; ``max_bytes``: what is left of ``outputs.max_bytes``, or
    ``budget``: that limit shared with the sides pulled at the same time. The evidence
    files (observations, metrics, memory samples, trace) come down meanwhile."""
    binding = ctx.host_for(side)
    out_path = ctx.playbook.outputs.path.strip("/") or "."
    remote_dir = f"{run_dir}/out/{side.label}" + ("" if out_path == "." else f"/{out_path}")
    dest_root = ctx.out_dir / "results" / side.label
    pulled: list[PulledSide] = []
    evidence: list[list[str]] = []

    async def outputs() -> None:
        try:
            pulled.append(
                await pull_dir(
                    binding.transport,
                    binding.agent,
                    remote_dir,
                    dest_root,
                    emit=ctx.emit,
                    run_id=ctx.run_id,
                    label=side.label,
                    max_bytes=max_bytes,
                    budget=budget,
                )
            )
        finally:
            if budget is not None:  # a side that failed first never blocks the others
                budget.note(side.label, 0)

    async def logs() -> None:
        evidence.append(await fetch_evidence(ctx, side, run_dir))

    await run_all([outputs(), logs()])
    result = pulled[0]
    result.evidence = evidence[0]
    return result


async def pull_sides(
    ctx: RunContext, sides: list[tuple[Side, str]], max_bytes: int | None
) -> list[PulledSide]:
    """Pull every side at once (each ``(side, run_dir)``), ``max_bytes`` shared by all."""
    budget = SharedBudget(max_bytes, [side.label for side, _ in sides])
    results: list[PulledSide | None] = [None] * len(sides)

    async def one(index: int, side: Side, run_dir: str) -> None:
        results[index] = await pull_side(ctx, side, run_dir, budget=budget)

    await run_all([one(i, side, run_dir) for i, (side, run_dir) in enumerate(sides)])
    return [r for r in results if r is not None]


class OutputsTooLarge(IntegrityError):
    """The host lists more output than ``outputs.max_bytes`` allows: nothing is pulled."""


async def pull_dir(
    transport: Transport,
    agent: AgentClient,
    remote_dir: str,
    dest_root: Path,
    *,
    emit: Callable[[Event], None] | None = None,
    run_id: str = "",
    label: str = "",
    max_bytes: int | None = None,
    sftp: bool = False,
    budget: SharedBudget | None = None,
) -> PulledSide:
    """Bring every regular file below ``remote_dir`` into ``dest_root``, verified.

    Each file is read up to the size the listing gave, never more; ``max_bytes``
    caps the listed total (OutputsTooLarge, exit 5, before a byte moves).
    Returns the files verified, those skipped and why, the bytes moved (PulledSide).
    Raises IntegrityError (exit 5) on a checksum failure.

    The bytes come down exec channels from the host's ``pullops.py`` (pullstream.py),
    which hashes each file as it reads it; ``sftp=True``, a transport that cannot
    stream to a command, or a small pull (:func:`_small`) fetches them over SFTP with
    a hashed listing instead.
    """
    emit = emit or (lambda _e: None)
    started = time.monotonic()
    entries = await _listing(transport, agent, remote_dir, {"hash": False})
    listed_in = time.monotonic() - started  # a round trip and the host's listing
    sums: _Sums | None = None
    sender: list[str] | None = None
    early: EarlyChannel | None = None
    if not sftp and _can_stream(transport) and not _small(entries):
        sender = sender_argv(agent.python, agent.agent_dir)
        early = EarlyChannel(transport, sender)  # opens while the names are checked
    else:
        # the host hashes each file up to the size just listed (a file still growing is
        # verified as it was listed) while the bytes move
        upto = {
            e.name_hex: e.size
            for e in entries
            if isinstance(e, ListingEntry) and isinstance(e.name_hex, str) and e.kind == "file"
        }
        sums = _Sums(_listing(transport, agent, remote_dir, {"upto": upto}))
    try:
        return await _pull_listed(
            transport,
            entries,
            sums,
            remote_dir,
            dest_root,
            emit=emit,
            run_id=run_id,
            label=label,
            max_bytes=max_bytes,
            sender=sender,
            budget=budget,
            rtt_hint=listed_in,
            early=early,
        )
    finally:
        if sums is not None:
            await sums.close()
        if early is not None:
            await early.close()


#: a pull this small goes over SFTP (a hashed listing, then each file read on the SFTP
#: session the run opened at its start): the streamed path's sender is an exec channel
#: and a Python start on the host, then a second one once its round trip was measured,
#: some ten round trips for a few bytes (issue 36)
SMALL_PULL_BYTES = 256 * 1024
SMALL_PULL_FILES = 8


def _small(entries: list[Listed]) -> bool:
    """Whether the listed files are few and small enough for the SFTP path."""
    files = [e for e in entries if isinstance(e, ListingEntry) and e.kind == "file"]
    sizes = [e.size for e in files if isinstance(e.size, int) and not isinstance(e.size, bool)]
    return len(sizes) == len(files) <= SMALL_PULL_FILES and sum(sizes) <= SMALL_PULL_BYTES


def _can_stream(transport: Transport) -> bool:
    """Whether ``transport`` can run the host's sender with streamed output."""
    owner = type(transport.link_owner())
    return owner.open_process is not Transport.open_process


async def _listing(
    transport: Transport, agent: AgentClient, remote_dir: str, request: JsonObject
) -> list[Listed]:
    """The host's listing of ``remote_dir``, each item read once (IntegrityError when
    the answer is not a listing at all)."""
    try:
        entries = OutputListing.from_json(
            await agent.call(Op.LIST_OUTPUTS, {"dir": remote_dir, **request})
        ).entries
    except ProtocolError:
        entries = None
    if not isinstance(entries, list):
        raise IntegrityError(f"{transport.name}: the output listing of {remote_dir} is malformed")
    return [ListingEntry.from_json(e) if isinstance(e, dict) else NotAnEntry(e) for e in entries]


class _Sums:
    """The host's SHA-256 of every listed file, from a second listing made while bytes move.

    Why: hashing a GiB of results on the host takes seconds; the quick listing (names,
    kinds, sizes) starts the transfer at once and each file waits for its sum only
    when its last byte has landed (and been hashed here as it was written).
    """

    def __init__(self, listing: Awaitable[list[Listed]]) -> None:
        self._task = asyncio.ensure_future(listing)
        self._by_name: dict[bytes | str | None, ListingEntry] | None = None

    async def entry(self, name: bytes | str | None) -> ListingEntry | None:
        """The hashed listing's entry for ``name`` (None when it is not there)."""
        if self._by_name is None:
            # shielded: one file's fetch being cancelled must not cancel everyone's listing
            entries = await asyncio.shield(self._task)
            by_name: dict[bytes | str | None, ListingEntry] = {}
            for entry in entries:
                if isinstance(entry, ListingEntry):
                    with contextlib.suppress(UnsafePath):
                        by_name[entry_name(entry)] = entry
            self._by_name = by_name
        return self._by_name.get(name)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class _NotPulled(Exception):
    """The hashed listing says this file is not to be pulled after all (a skip, not an error)."""


async def _pull_listed(
    transport: Transport,
    entries: list[Listed],
    sums: _Sums | None,
    remote_dir: str,
    dest_root: Path,
    *,
    emit: Callable[[Event], None],
    run_id: str,
    label: str,
    max_bytes: int | None,
    sender: list[str] | None = None,
    budget: SharedBudget | None = None,
    rtt_hint: float | None = None,
    early: EarlyChannel | None = None,
) -> PulledSide:
    """Validate the listing, then fetch what it names: streamed (``sender``, the host's
    command) or over SFTP checked against ``sums``."""
    dest_root.mkdir(parents=True, exist_ok=True)
    root_st = os.lstat(dest_root)
    if not stat.S_ISDIR(root_st.st_mode):
        raise UnsafePath(f"{dest_root} is not a plain directory; refusing to pull into it")
    dest_root = dest_root.resolve()
    named = _named(entries)
    kinds = {
        str(rel): e.kind
        for e, rel in named
        if isinstance(rel, PurePosixPath) and isinstance(e, ListingEntry)
    }
    files: list[PulledFile] = []
    skipped: list[SkippedFile] = []
    wanted: list[tuple[PurePosixPath, ListingEntry]] = []

    def skip(name: str, why: str) -> None:
        skipped.append(SkippedFile(name, why))
        emit(Warning(run_id, message=f"pull {label}: skipped {name}: {why}", code="pull-skip"))

    for entry, rel in named:
        if isinstance(entry, NotAnEntry) or isinstance(rel, str):
            shown = entry.raw if isinstance(entry, NotAnEntry) else entry.path
            skip(shown_name(shown), str(rel))
            continue
        why = _refuse(entry, rel, kinds, hashed=False)
        if why is not None:
            skip(shown_name(entry.path), why)
            continue
        if entry.kind == "file":
            wanted.append((rel, entry))
    total = sum(int(e.size) for _, e in wanted)
    if budget is not None:
        max_bytes = await budget.left_for(label, total)
    if max_bytes is not None and total > max_bytes:
        raise OutputsTooLarge(
            f"{transport.name}: {remote_dir} lists {len(wanted)} files, {total} bytes: more "
            f"than the {max_bytes} bytes outputs.max_bytes allows; nothing was pulled",
            hint="raise outputs.max_bytes (for this run: --max-bytes of pull or attach) or "
            "narrow outputs.path if that is expected",
        )
    progress = _Progress(emit, run_id, total, label)
    outcome: list[PulledFile | str | None] = [None] * len(wanted)
    if sums is None:
        assert sender is not None
        await _streamed(
            transport, sender, remote_dir, dest_root, wanted, outcome, progress, rtt_hint, early
        )
    else:
        await _sftp(transport, sums, remote_dir, dest_root, wanted, kinds, outcome, progress)
    for (rel, _entry), got in zip(wanted, outcome, strict=True):
        if isinstance(got, PulledFile):
            files.append(got)
        else:
            skip(str(rel), got or "not pulled")
    progress.flush()
    return PulledSide(
        dir=str(dest_root),
        files=files,
        skipped=skipped,
        downloaded=progress.moved,
        bytes=PullBytes(total=total, moved=progress.moved, reused=progress.reused),
    )


def _named(entries: list[Listed]) -> list[tuple[Listed, PurePosixPath | str]]:
    """Each listed entry with its path below the output dir, or why it has none."""
    named: list[tuple[Listed, PurePosixPath | str]] = []
    for entry in entries:
        if isinstance(entry, NotAnEntry):
            named.append((entry, "malformed listing entry"))
            continue
        try:
            named.append((entry, safe_relpath(entry_name(entry))))
        except UnsafePath as exc:
            named.append((entry, exc.message))
    return named


def _same_file(rel: PurePosixPath) -> str:
    """One key for names that are one local file on a case-insensitive disk (macOS)."""
    return unicodedata.normalize("NFD", str(rel)).casefold()


async def _streamed(
    transport: Transport,
    sender: list[str],
    remote_dir: str,
    dest_root: Path,
    wanted: list[tuple[PurePosixPath, ListingEntry]],
    outcome: list[PulledFile | str | None],
    progress: _Progress,
    rtt_hint: float | None = None,
    early: EarlyChannel | None = None,
) -> None:
    """Every wanted file down the host's sender; ``outcome`` gets each result or why not."""
    files = []
    made: set[Path] = set()
    for index, (rel, entry) in enumerate(wanted):
        why = _local_parents(dest_root, rel, made)
        if why is not None:
            outcome[index] = why
            continue
        name = entry_name(entry)
        files.append(
            StreamFile(
                index,
                name if isinstance(name, bytes) else str(name).encode("utf-8", "surrogateescape"),
                f"{remote_dir}/{rel}",
                dest_root.joinpath(*rel.parts),
                int(entry.size),
                key=_same_file(rel),
            )
        )
    await pull_streamed(
        transport, sender, remote_dir, files, progress, rtt_hint=rtt_hint, early=early
    )
    for f in files:
        rel = wanted[f.index][0]
        outcome[f.index] = f.why or PulledFile(str(rel), f.size, str(f.sha256))


async def _sftp(
    transport: Transport,
    sums: _Sums,
    remote_dir: str,
    dest_root: Path,
    wanted: list[tuple[PurePosixPath, ListingEntry]],
    kinds: dict[str, object],
    outcome: list[PulledFile | str | None],
    progress: _Progress,
) -> None:
    """Every wanted file over SFTP, checked against the host's hashed listing."""
    remote_kinds = _RemoteKinds(transport, remote_dir, by_entry=len(wanted) <= SMALL_PULL_FILES)
    # a name listed twice, or two names one local file on a case-insensitive disk
    # (``A.bin``, ``a.bin`` on macOS): those are fetched one after the other
    same_file: dict[str, asyncio.Lock] = {}

    async def one(index: int) -> None:
        rel, _entry = wanted[index]
        async with same_file.setdefault(_same_file(rel), asyncio.Lock()):
            await fetch_one(index)

    async def fetch_one(index: int) -> None:
        rel, entry = wanted[index]
        remote, size = f"{remote_dir}/{rel}", int(entry.size)

        async def expected() -> str:
            """The host's sum for this file, from the hashed listing, or why not to pull it."""
            hashed = await sums.entry(entry_name(entry))
            if hashed is None:
                raise IntegrityError(
                    f"{transport.name}: result {remote} is missing from the host's hashed listing",
                    hint="the outputs changed on the host while they were pulled; pull again",
                )
            why = _refuse(hashed, rel, kinds)
            if why is not None:
                raise _NotPulled(why)
            if hashed.size != size:
                raise IntegrityError(
                    f"{transport.name}: result {remote} changed size on the host while it was "
                    f"pulled ({size} then {hashed.size} bytes)",
                    hint="let the job finish writing its outputs, then pull again",
                )
            return str(hashed.sha256)

        why = await remote_kinds.why_not(rel)
        if why is None:
            why = _local_parents(dest_root, rel)
        digest = ""
        if why is None:
            try:
                digest = await _fetch(
                    transport, remote, dest_root.joinpath(*rel.parts), size, expected, progress
                )
            except _NotPulled as exc:
                why = str(exc)
            except FileNotFoundError:  # listed, then gone (the job or the host removed it)
                why = "gone from the host after it was listed"
            except OSError as exc:
                if exc.errno not in LOCAL_REFUSALS:
                    raise
                why = f"cannot be written here: {exc.strerror}"
        outcome[index] = why or PulledFile(str(rel), size, digest)

    await _bounded(one, len(wanted), files_in_flight())


#: files fetched at once: each costs two round trips (open, read) that wait behind the
#: data already in the pipe, so one at a time would spend a pull of many files waiting
#: (2,000 files at 80 ms: 48 at once gave 48 MB/s, 128 gave 64-67 MB/s of 100); the
#: transport's pool of read requests bounds the memory they hold together
FILES_IN_FLIGHT = 128


def files_in_flight() -> int:
    """FILES_IN_FLIGHT, fewer when open files are scarce (each holds its ``.rmpart``).

    macOS gives a terminal 256 open files by default, and a fleet pulls from several
    hosts at once: the soft limit is raised toward the hard one (as Go programs do),
    and a quarter of what remains is the most one pull takes."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
        if soft != resource.RLIM_INFINITY and soft < want:
            with contextlib.suppress(OSError, ValueError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
    except (ImportError, OSError, ValueError):
        return 16
    if soft == resource.RLIM_INFINITY:
        return FILES_IN_FLIGHT
    return max(4, min(FILES_IN_FLIGHT, (soft - 64) // 4))


async def _bounded(job: Callable[[int], Awaitable[None]], count: int, limit: int) -> None:
    """Run ``job(0..count-1)`` with at most ``limit`` at once; the first error cancels the rest."""
    indexes = iter(range(count))

    async def worker() -> None:
        for index in indexes:
            await job(index)

    await run_all([worker() for _ in range(min(limit, count))])


def _refuse(
    entry: ListingEntry, rel: PurePosixPath, kinds: dict[str, object], *, hashed: bool = True
) -> str | None:
    """Why a listing entry with a valid name is not pulled (None: pull it, or a directory).

    ``hashed=False``: the quick listing, whose files carry no sha256 yet."""
    kind = entry.kind
    if kind == "dir":
        return None
    if kind != "file":
        return f"{shown_name(kind)} not pulled (only regular files are)"
    size, sha = entry.size, entry.sha256
    if (
        not isinstance(size, int)
        or isinstance(size, bool)
        or size < 0
        or (hashed and (not isinstance(sha, str) or len(sha) != 64 or not set(sha) <= _HEX))
    ):
        return "listing gives no valid size and sha256"
    for i in range(1, len(rel.parts)):
        parent = "/".join(rel.parts[:i])
        if kinds.get(parent, "dir") != "dir":
            return f"its parent {parent} is a {shown_name(kinds[parent])} on the host"
    return None


#: a directory listing that could not be read as a whole: ask about each entry instead
_ONE_BY_ONE: dict[str, str] = {}


class _RemoteKinds:
    """The host's own ``lstat`` of each entry, read one directory listing at a time.

    Why listings: SFTP's readdir answers with each entry's lstat, so a link, FIFO or
    device (never to be opened: a FIFO would hang the host's sftp-server) is seen
    for a whole directory in a round trip or two, instead of one lstat per file.
    """

    def __init__(self, transport: Transport, remote_dir: str, by_entry: bool = False) -> None:
        self.transport, self.remote_dir = transport, remote_dir
        self._dirs: dict[str, asyncio.Future[dict[str, str]]] = {}
        #: a few files: one lstat each, all in flight at once (a directory listing is an
        #: open, two reads and a close: four round trips for one file)
        self.by_entry = by_entry

    async def _kinds(self, parent: str) -> dict[str, str]:
        """name -> kind in ``parent`` (relative; "" is the output dir), or _ONE_BY_ONE."""
        if parent not in self._dirs:
            self._dirs[parent] = asyncio.ensure_future(self._list(parent))
        return await asyncio.shield(self._dirs[parent])

    async def _list(self, parent: str) -> dict[str, str]:
        path = f"{self.remote_dir}/{parent}" if parent else self.remote_dir
        try:
            found = await self.transport.listdir(path)
        except RemotemacError:
            raise
        except Exception:  # noqa: BLE001 - a name the SFTP client cannot decode, an
            # entry gone mid-listing, the directory itself gone: ask entry by entry
            return _ONE_BY_ONE
        return {PurePosixPath(st.path).name: st.kind for st in found}

    async def _kind(self, parent: str, name: str) -> str | None:
        kinds = _ONE_BY_ONE if self.by_entry else await self._kinds(parent)
        if kinds is _ONE_BY_ONE:
            where = "/".join(p for p in (self.remote_dir, parent, name) if p)
            st = await self.transport.stat(where)
            return None if st is None else st.kind
        return kinds.get(name)

    async def why_not(self, rel: PurePosixPath) -> str | None:
        """Why ``rel`` is not read (a parent not a directory, the entry not a file)."""
        for i in range(1, len(rel.parts) + 1):
            parent, name = "/".join(rel.parts[: i - 1]), rel.parts[i - 1]
            kind = await self._kind(parent, name)
            if i < len(rel.parts):
                if kind != "dir":
                    where = "/".join(rel.parts[:i])
                    return f"its parent {where} is {'missing' if kind is None else 'a ' + kind} on the host"
            elif kind is None:
                return "gone from the host"
            elif kind != "file":
                return f"it is a {kind} on the host, not a regular file"
        return None


def _local_parents(
    dest_root: Path, rel: PurePosixPath, made: set[Path] | None = None
) -> str | None:
    """Create the local directories of ``rel`` ourselves; refuse anything else in the way.

    ``made``: the directories this pull made or found plain already (one ``mkdir`` a
    directory, not one for each of its files: 2,000 files in 20 directories)."""
    current = dest_root
    for part in rel.parts[:-1]:
        current = current / part
        if made is not None and current in made:
            continue
        try:
            os.mkdir(current, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return f"local {current} is in the way (not a plain directory)"
        except OSError as exc:
            if exc.errno not in LOCAL_REFUSALS:
                raise
            return f"cannot be written here: {exc.strerror}"
        if made is not None:
            made.add(current)
    final = current / rel.parts[-1]
    with_part = part_path(final)
    for path in (final, with_part):
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:  # a name this disk cannot hold: this file, not the pull
            if exc.errno not in LOCAL_REFUSALS:
                raise
            return f"cannot be written here: {exc.strerror}"
        if not stat.S_ISREG(mode):
            return f"local {path} is in the way (not a regular file)"
    return None


async def _fetch(
    transport: Transport,
    remote: str,
    dest: Path,
    size: int,
    expected: Callable[[], Awaitable[str]],
    progress: _Progress,
) -> str:
    """One file into ``.<name>.rmpart``, hashed as it is written, renamed when it matches.

    A ``.rmpart`` left by an earlier attempt is hashed once and continued from its
    end; if the result then fails its checksum the prefix came from another version
    of the file, and the file is fetched once more from the start. Returns the sum.
    """
    if dest.is_file() and not dest.is_symlink() and dest.stat().st_size == size:
        want = await expected()
        if sha256_file(dest) == want:
            progress.skip(size)  # pulled completely by an earlier attempt
            return want
    part = part_path(dest)
    fd = os.open(part, os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o600)
    with os.fdopen(fd, "r+b") as fh:
        have = os.fstat(fh.fileno()).st_size
        offset = have if have <= size else 0
        sink = HashingSink(fh, offset)
        progress.skip(offset)
        for attempt in (1, 2):
            # never more than the listed size: a file that grows or a host that lies
            # ends in a checksum failure, not a full disk
            await transport.download_to(remote, sink, offset, progress=progress.add, limit=size)
            digest = sink.hexdigest()
            try:
                want = await expected()
            except _NotPulled:
                fh.close()
                part.unlink(missing_ok=True)
                raise
            if digest == want:
                break
            if attempt == 1 and offset > 0:
                progress.unskip(offset)  # the resumed prefix came from another version
                offset = 0
                continue
            fh.close()
            part.unlink(missing_ok=True)
            raise IntegrityError(
                f"{transport.name}: result {remote} failed its checksum after "
                f"transfer (expected {want[:12]}…, got {digest[:12]}…)",
                hint="the file changed on the host or was damaged; pull again",
            )
    os.replace(part, dest)
    return want


class _Progress:
    def __init__(self, emit: Callable[[Event], None], run_id: str, total: int, label: str) -> None:
        self.emit, self.run_id, self.total, self.label = emit, run_id, total, label
        self.done = 0
        self.moved = 0  # bytes that travelled over the link
        self.reused = 0  # bytes already here: a complete file or a .rmpart's prefix
        self._last = -1

    def add(self, count: int) -> None:
        self.moved += count
        self._advance(count)

    def skip(self, count: int) -> None:
        self.reused += count
        self._advance(count)

    def unskip(self, count: int) -> None:
        """A reused prefix turned out stale: its bytes travel again."""
        self.reused -= count
        self.done -= count

    def _advance(self, count: int) -> None:
        self.done += count
        if self.done - self._last >= (4 << 20) or self.done >= self.total:
            self.flush()

    def flush(self) -> None:
        if self.done != self._last:
            self._last = self.done
            self.emit(
                PhaseProgress(
                    self.run_id, phase="pull", done=self.done, total=self.total, detail=self.label
                )
            )


#: the harness's observations and memory samples are small; a bigger one is not read
MAX_EVIDENCE_BYTES = 256 * 1024**2


async def fetch_evidence(ctx: RunContext, side: Side, run_dir: str) -> list[str]:
    """Copy the harness's observations and the memory samples next to the local log.

    Only regular files are read (a FIFO or device there is skipped with a warning:
    opening one would hang), each up to the size its ``lstat`` gave.
    """
    from remotemac.engine.jobs import trace_path

    binding = ctx.host_for(side)
    wanted = (
        (f"{run_dir}/status/{side.label}.obs.json", f"{side.label}.obs.json"),
        (f"{run_dir}/logs/{side.label}.metrics.jsonl", f"{side.label}.metrics.jsonl"),
        (f"{run_dir}/logs/{side.label}.rss.jsonl", f"{side.label}.rss.jsonl"),
        (trace_path(run_dir, side), f"{side.label}.trace.jsonl"),
    )
    # the four lstats, then the downloads, each set in flight at once: one after another
    # they waited for some ten round trips a side, a second of a trivial run at 80 ms
    stats = await asyncio.gather(*(binding.transport.stat(remote) for remote, _ in wanted))
    readable = []
    for (remote, name), st in zip(wanted, stats, strict=True):
        if st is None:
            continue
        if st.kind != "file" or st.size > MAX_EVIDENCE_BYTES:
            why = f"a {st.kind}" if st.kind != "file" else f"{st.size} bytes, over the cap"
            ctx.emit(
                Warning(
                    ctx.run_id,
                    message=f"pull {side.label}: {name} not read: it is {why} on the host",
                    code="pull-skip",
                )
            )
            continue
        readable.append((remote, name, st.size))

    async def fetch(remote: str, name: str, size: int) -> None:
        dest = ctx.out_dir / "logs" / name
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            await binding.transport.download_to(remote, fh, 0, limit=size)

    await asyncio.gather(*(fetch(*item) for item in readable))
    return [name for _, name, _ in readable]
