"""One sync session on the host: what it holds, and each file as it arrives.

The protocol is described in dataops.py (which serves it); this is the state of one
session: the hello's entries, the record, the RAM store, and receiving whole files.
Cut transfers (datapartial.py), split files (datasplit.py) and the final check
(datafinish.py) are its other steps. Python 3.9, stdlib only.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import stat
import threading
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

from .datafiles import (
    HashSink,
    Lines,
    Pack,
    Pieces,
    Tee,
    create_new,
    open_new,
    read_exact,
    unlink_quietly,
    write_all,
)
from .datafinish import Finish
from .datapartial import PartialTransfers
from .datarecords import (
    NOFOLLOW,
    READ,
    RESUMABLE,
    WRITING,
    DataError,
    Recorder,
    backdate,
    backdate_fd,
    check_rel,
    inside,
    make_parents,
    open_packs_dir,
    other_alive,
    pack_path,
    pack_writer,
    packed_as,
    read_records,
    rehash_ok,
    same_as,
    settled,
    stamp,
    stored_as,
)
from .datasplit import SplitPieces
from .protocol import reserved_data_path
from .writebehind import WriteBehind

#: small files read and decrypted, handed to the write-behind thread together once they
#: hold this many bytes (or before any other frame, or the end): one handoff per group
SMALL_BATCH_BYTES = 1 << 20


def use_runtime(path: Optional[str]) -> None:
    """Decrypt with the agent runtime's cryptography only (see agentruntime.py)."""
    from . import agentruntime

    if not path:
        raise DataError("no agent runtime was named for decryption", "host-env")
    try:
        agentruntime.activate(path)
    except agentruntime.RuntimeInstallError as exc:
        raise DataError(str(exc), "host-env") from None


def hello_entries(req: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The hello's entries (see :func:`_hello_entries`); DataError unsafe-path for a path
    under a name the host keeps for its own files (protocol.RESERVED_DATA_NAMES): stored
    there, a dataset file would be taken for the host's own, or removed as one."""
    entries = _hello_entries(req)
    for entry in entries:
        if reserved_data_path(entry.get("path")):
            raise DataError(
                "dataset path %r: remotemac keeps names starting with .remotemac- or "
                ".verified.jsonl for its own files on the host" % (entry.get("path"),),
                "unsafe-path",
            )
    return entries


def _hello_entries(req: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The hello's entries as sent: ``columns`` (one list per field, as the laptop sends them:
    much cheaper to encode and parse) or ``entries`` (a list of dicts)."""
    cols = req.get("columns")
    if not cols:
        return list(req.get("entries") or [])
    fields = ("path", "size", "sha256", "mtime_ns")
    lists = [cols[k] for k in fields]
    if len({len(x) for x in lists}) != 1:
        raise DataError("the hello's columns differ in length")
    return [dict(zip(fields, row)) for row in zip(*lists)]


class Receiver(PartialTransfers, SplitPieces, Finish):
    """One sync session on the host: holds the key in memory only."""

    def __init__(self, req: Dict[str, Any]) -> None:
        self.src = req["src"]
        self.encrypted = bool(req.get("encrypted"))
        self.key = bytes.fromhex(req["key_hex"]) if self.encrypted else b""
        #: where the job reads the slice: the RAM store, made on first use (see dest)
        self._dest: Optional[str] = None if self.encrypted else self.src
        self._req = req
        self.ram: Optional[Dict[str, Any]] = None
        #: the runtime to decrypt with: activated (tens of ms of imports) when the first
        #: byte needs decrypting, or while nothing else waits (see serve)
        self.runtime_dir = req.get("runtime_dir")
        if self.encrypted and not self.runtime_dir:
            raise DataError("no agent runtime was named for decryption", "host-env")
        os.makedirs(self.src, mode=0o700, exist_ok=True)
        self.records: Dict[str, Dict[str, Any]] = {}
        self._record_end, self._record_lines = read_records(self.src, 0, self.records)
        #: paths whose stored copy this session saw (known) or wrote: finish trusts it
        self._stored_seen: set = set()
        #: path -> the RAM copy's mtime this session saw matching its record (see check_ram)
        self._ram_seen: Dict[str, int] = {}
        self._ram_check: Optional[threading.Thread] = None
        #: records a hash made settled this session (see datarecords.rehash_ok): finish
        #: rewrites the record so the next session trusts their (size, mtime)
        self._resettled = 0
        self._cipher_ready = False  # the runtime was activated (see cipher)
        self._writing_mark = ""  # this session's WRITING marker, once it writes
        self._pid = os.getpid()  # (in every part file's name)
        self.entries: List[Dict[str, Any]] = hello_entries(req)
        for entry in self.entries:
            check_rel(entry["path"])
        self.received = 0
        self.recorder: Optional[Recorder] = None
        self.lines: Optional[Lines] = None
        self._made: set = set()
        #: small files read whole, not yet handed to the write-behind thread (hand_over)
        self._small: List[Callable[[Pack], None]] = []
        #: the packs this session writes small files' ciphertext into, one per group:
        #: named by pid, a token no one can guess and a count (see datarecords.PACKS)
        self._pack_token = os.urandom(6).hex()
        self._packs = 0
        self._small_bytes = 0
        #: sids of the splits this process wrote pieces of and has not assembled or
        #: dropped: their files are in flight (finish and its prune leave them)
        self._splits_open: set = set()

    def writing(self) -> None:
        """Mark the data dirs as being written by this process (before its first write)."""
        if not self._writing_mark:
            path = os.path.join(self.src, WRITING + str(os.getpid()))
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | NOFOLLOW, 0o600))
            self._writing_mark = path

    def done_writing(self) -> None:
        """This session ended cleanly: whatever it wrote is in place and recorded."""
        if self._writing_mark:
            unlink_quietly(self._writing_mark)
            self._writing_mark = ""

    def _other_writers(self) -> List[Tuple[str, int]]:
        """(marker, pid) of every other session that wrote here and did not end cleanly."""
        out = []
        with contextlib.suppress(OSError):
            for name in os.listdir(self.src):
                pid = name[len(WRITING) :]
                if name.startswith(WRITING) and pid.isdigit() and int(pid) != os.getpid():
                    out.append((os.path.join(self.src, name), int(pid)))
        return out

    def todo(self, known: List[Tuple[int, str]]) -> List[Tuple[int, Optional[str]]]:
        """The entries the host does not hold as the hello describes them: [index, the
        SHA-256 of the verified copy of that path it holds (same size), or None].

        The start answer carries only these (a re-sync of thousands of unchanged files
        answers a few lines, not one per file); every other entry is held, verified,
        with the hello's size and hash.
        """
        have = dict(known)
        out = []
        for index, entry in enumerate(self.entries):
            sha = have.get(index)
            if sha is None or sha != entry.get("sha256"):
                out.append((index, sha))
        return out

    def known(self) -> List[Tuple[int, str]]:
        """Entries stored complete and verified (whether or not still in RAM)."""
        out = []
        records, seen, encrypted = self.records, self._stored_seen, self.encrypted
        base = self.src if self.src.endswith("/") else self.src + "/"
        suffix = ".rmenc" if encrypted else ""
        packs: Dict[str, Optional[os.stat_result]] = {}
        for index, entry in enumerate(self.entries):
            path = entry["path"]  # checked when the hello was read
            rec = records.get(path)
            if rec is None or (entry.get("size") is not None and rec.get("size") != entry["size"]):
                continue
            if rec.get("pack"):  # one lstat per pack, not per file
                if self._pack_ok(rec, packs):
                    out.append((index, str(rec["sha256"])))
                    seen.add(path)
                continue
            # stored_ok, inlined: this loop runs for every file of the slice
            try:
                st = os.lstat(base + path + suffix)
            except OSError:
                continue
            if stored_as(st, rec, encrypted) or (
                # public, recorded racily (see datarecords.SETTLE_NS): its hash decides
                not encrypted and same_as(st, rec, "mtime_ns") and self._rehash(base + path, rec)
            ):
                out.append((index, str(rec["sha256"])))
                seen.add(path)
        return out

    def _pack_ok(self, rec: Dict[str, Any], packs: Dict[str, Optional[os.stat_result]]) -> bool:
        """datarecords.stored_ok of a packed record, its pack's lstat kept in ``packs``."""
        name = rec["pack"]
        if name not in packs:
            try:
                st = os.lstat(pack_path(self.src, name))
            except (OSError, DataError):
                st = None
            packs[name] = st
        return packed_as(packs[name], rec)

    def drop_dead_packs(self, live: Dict[str, Dict[str, Any]]) -> int:
        """Remove the packs no record in ``live`` names (every file in them was
        rewritten or left the slice, or was never recorded: its session was cut),
        unless another receiver that may still record into it runs. Called by
        :meth:`finish` once every stream is done; a pack's space is freed with its
        last file (re-syncs that change a few files leave the rest of a pack in use).

        Only regular files named as packs are removed, through the folder's own fd
        (never a link's target). The writers are judged gone first and the record read
        again after: a writer that recorded a group and ended meanwhile keeps its pack."""
        try:
            folder = open_packs_dir(self.src, create=False)
        except (OSError, DataError):
            return 0
        try:
            used = {rec.get("pack") for rec in live.values()}
            dead = []
            for name in os.listdir(folder):
                pid = pack_writer(name)
                if pid is None or name in used or other_alive(pid):
                    continue  # not a pack (left as it is), in use, or its writer runs
                dead.append(name)
            if not dead:
                return 0
            self._record_end, lines = read_records(self.src, self._record_end, self.records)
            self._record_lines += lines
            named = {rec.get("pack") for rec in self.records.values()}
            dropped = 0
            for name in dead:
                try:
                    st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                    if name not in named and stat.S_ISREG(st.st_mode):
                        os.unlink(name, dir_fd=folder)
                        dropped += 1
                except OSError:
                    continue
            return dropped
        finally:
            os.close(folder)

    def _rehash(self, path: str, rec: Dict[str, Any]) -> bool:
        """datarecords.rehash_ok of a public stored copy, counting what it settles."""
        was = rec.get("recorded_ns")
        ok = rehash_ok(path, rec, "mtime_ns")
        self._resettled += rec.get("recorded_ns") != was
        return ok

    @property
    def dest(self) -> str:
        """The RAM store of an encrypted slice (made here on first use, so the start
        answer does not wait for it), or the data dir itself for public data."""
        if self._dest is None:
            from . import ramstore

            req = self._req
            try:
                self.ram = ramstore.create_ram_store(
                    req["run_dir"], int(req.get("ram_bytes") or (64 << 20)), req["run_id"]
                )
            except ramstore.RamStoreError as exc:
                raise DataError(
                    "no RAM-backed storage for the decrypted slice: %s" % exc, "ram"
                ) from None
            except OSError as exc:
                raise DataError("cannot make the RAM store: %s" % exc, "ram") from None
            self._dest = str(self.ram["path"])
        return self._dest

    def cipher(self) -> None:
        """Make the runtime's cryptography importable (once; DataError host-env if not).

        Called before every file is decrypted: activating the runtime resolves its
        path and reads its marker, ~0.2 ms that 76 changed files paid one after
        another on the reading thread; once it has worked, it holds for the session.
        """
        if self.encrypted and not self._cipher_ready:
            use_runtime(self.runtime_dir)
            self._cipher_ready = True

    def check_ram(self) -> None:
        """Look at the RAM copy of every file held (size and mtime as recorded).

        Run once the start answer is out, on its own thread (:meth:`start_check_ram`)
        while this one reads the laptop's first files, rather than in :meth:`finish`,
        which then trusts these sightings (and its own writes) as it trusts
        :meth:`known`'s of the stored copies. A sighting is the mtime seen, and
        :meth:`finish` compares it with the record it holds then: a file this session
        rewrites meanwhile (its record changes) is looked at again there.
        """
        if not self.encrypted:
            return
        dest = self.dest
        base = dest if dest.endswith("/") else dest + "/"
        records, sightings = self.records, self._ram_seen
        for rel in list(self._stored_seen):  # (the write-behind thread adds to it)
            rec = records[rel]
            # plain_ok, inlined: this loop runs for every file of the slice
            try:
                st = os.lstat(base + rel)  # checked when the hello was read
            except OSError:
                continue
            mtime = rec.get("plain_mtime_ns")
            if (
                stat.S_ISREG(st.st_mode)
                and (st.st_size, st.st_mtime_ns) == (rec.get("size"), mtime)
                and settled(rec, "plain_mtime_ns")  # else finish hashes it (plain_ok)
            ):
                sightings.setdefault(rel, mtime)

    def start_check_ram(self) -> None:
        """:meth:`check_ram` on a thread (os.lstat lets the GIL go): with 7,681 files
        it took 60 ms, which the first file's frame used to wait for; :meth:`finish`
        waits for it. A failure there only costs :meth:`finish` its own looks."""
        if not self.encrypted:
            return
        self.dest  # noqa: B018 (the RAM store is made here, on this thread, once)

        def run() -> None:
            with contextlib.suppress(Exception):
                self.check_ram()

        self._ram_check = threading.Thread(target=run, name="check-ram", daemon=True)
        self._ram_check.start()

    # -------------------------------------------------------------- receiving

    def receive(
        self,
        stdin: BinaryIO,
        index: int,
        length: int,
        behind: WriteBehind,
        resume: Optional[Dict[str, Any]] = None,
    ) -> None:
        """Read one framed file; store, decrypt and verify it (partly on ``behind``).

        The job never sees a partial file. An encrypted file below RESUMABLE bytes is
        read and decrypted in memory here, then stored and renamed into place on the
        write-behind thread, in groups (:meth:`hand_over`), while the next ones are
        read. A larger one streams (its plaintext written on that thread) and arrives
        under ``.remotemac-partial/``, where it stays when the link is cut (see
        :meth:`partials`); ``resume`` continues such a one (the frame carries chunks
        ``resume["chunks"]`` on). A file received whole is verified by its
        decryption; a resumed one and public data are hashed on that thread and
        compared (see :meth:`_store_streamed`). Plaintext only ever goes to a hidden
        part file in RAM, renamed into place once verified.
        """
        if not 0 <= index < len(self.entries):
            raise DataError("frame for unknown entry %d" % index)
        self.writing()
        entry = self.entries[index]
        rel = entry["path"]
        stored = inside(self.src, rel) + (".rmenc" if self.encrypted else "")
        self._make_parents(self.src, rel)
        plain = inside(self.dest, rel) if self.encrypted else None
        plain_part = None
        meta = None
        if plain is not None:
            self._make_parents(self.dest, rel)
            plain_part = os.path.join(
                os.path.dirname(plain), ".%s.part-%d" % (os.path.basename(plain), self._pid)
            )
            if resume is None and length < RESUMABLE:
                self._receive_small(stdin, index, rel, length, stored, plain, plain_part, behind)
                return
        self.hand_over(behind)  # the small files before this one go first
        if plain is not None and (resume is not None or length >= RESUMABLE):
            base = self._claim_partial(rel, entry, resume)
            part, meta = base + ".rmenc", base + ".json"
        else:  # public: a cut resends it whole
            part = "%s.part-%d" % (stored, self._pid)
        keep_partial = False
        out = open_new(plain_part if plain_part is not None else part)
        # an encrypted file received whole from its first byte is checked by its
        # authenticated decryption (see _store_streamed); a resumed one and public data
        # are hashed here
        sink = HashSink(out, behind, hashing=not (self.encrypted and resume is None))
        try:
            if self.encrypted:
                self._receive_sealed(stdin, rel, length, part, sink, resume)
            else:
                _copy_exact(stdin, sink, length)
            keep_partial = True  # the ciphertext is whole; a cut from here resumes at its end
            claimed = read_exact(stdin, 32).hex()
            keep_partial = False
        except (EOFError, OSError) as exc:
            # a cut link: the stored ciphertext stays for the next session to resume
            behind.wait_idle()  # it may still be writing the plaintext
            out.close()
            keep_partial = bool(meta) and (keep_partial or isinstance(exc, EOFError))
            unlink_quietly(plain_part or "", *(() if keep_partial else (part, meta or "")))
            raise
        except BaseException:
            behind.wait_idle()
            out.close()
            unlink_quietly(part, plain_part or "", meta or "")
            raise

        behind.submit(
            functools.partial(
                self._store_streamed,
                index,
                rel,
                (out, sink, claimed),
                (part, stored, meta),
                (plain_part, plain),
            )
        )

    def _store_streamed(
        self,
        index: int,
        rel: str,
        got: Tuple[BinaryIO, HashSink, str],
        cipher: Tuple[str, str, Optional[str]],
        plaintext: Tuple[Optional[str], Optional[str]],
    ) -> None:
        """On the write-behind thread, once a streamed file is read whole: check its
        hash, rename its stored copy (and its plaintext in RAM) into place, record it.

        An encrypted file received whole in this stream is not hashed here (its sink
        does not hash): every chunk to the final one opened under this path, a fresh
        salt and the run's key, so it is what the laptop sealed, and the laptop's
        SHA-256 is of the very bytes it sealed (engine/syncpieces.py HashingReader).
        Its record carries that SHA-256. A resumed transfer's kept prefix comes from
        this host's disk, and public data has no AEAD: those are hashed and compared
        (docs/contract.md, "Promises").

        ``got``: the plaintext's file, its sink and the laptop's SHA-256; ``cipher``:
        the part it arrived in, where it goes, its cut-transfer note (or None);
        ``plaintext``: the RAM part and its place (None, None for public data)."""
        (out, sink, claimed), (part, stored, meta), (plain_part, plain) = got, cipher, plaintext
        try:
            out.close()
            digest = claimed
            if sink.hashing:
                digest = sink.digest.hexdigest()
                self._check_digest(rel, digest, claimed)
            rec: Dict[str, Any] = {"path": rel, "sha256": digest, "size": sink.size}
            if plain is not None and plain_part is not None:
                recorded = backdate(plain_part)  # see datarecords.SETTLE_NS
                os.replace(part, stored)
                os.replace(plain_part, plain)
                rec["enc_size"] = os.lstat(stored).st_size
                stamp(rec, "plain_mtime_ns", plain, recorded)
            else:
                recorded = backdate(part)
                os.replace(part, stored)
                stamp(rec, "mtime_ns", stored, recorded)
        except BaseException:
            unlink_quietly(part, plain_part or "", meta or "")
            raise
        if meta:
            unlink_quietly(meta)
        self._verified(index, rec)

    def _receive_small(
        self,
        stdin: BinaryIO,
        index: int,
        rel: str,
        length: int,
        stored: str,
        plain: str,
        plain_part: str,
        behind: WriteBehind,
    ) -> None:
        """An encrypted file below RESUMABLE bytes: read and decrypt it here (in memory),
        and leave storing (its ciphertext into its group's pack) and renaming to the
        write-behind thread.

        Not hashed on the host: it decrypted whole (every chunk to the final one, under
        this path, a fresh salt and the run's key), so its plaintext is what the laptop
        sealed, and the laptop's SHA-256 is of those very bytes; its record carries
        that SHA-256 (see :meth:`_store_streamed`, docs/contract.md). A cut link leaves
        nothing of it (it is resent whole)."""
        self.cipher()
        from . import streamcrypt

        sealed = read_exact(stdin, length)
        claimed = read_exact(stdin, 32).hex()
        pieces: List[bytes] = []
        try:
            streamcrypt.decrypt_stream(self.key, rel, io.BytesIO(sealed), Pieces(pieces))
        except streamcrypt.DecryptError as exc:
            raise DataError(
                "dataset file %s failed decryption on the host: %s" % (rel, exc), "integrity"
            ) from None

        def store(pack: Pack) -> None:
            try:
                name, off = pack.append(sealed)
                fd = create_new(plain_part)
                try:
                    size = write_all(fd, pieces)
                    recorded, mtime = backdate_fd(fd)  # see datarecords.SETTLE_NS
                finally:
                    os.close(fd)
                os.replace(plain_part, plain)
            except BaseException:
                unlink_quietly(plain_part)
                raise
            old = self.records.get(rel)
            if old is None or not old.get("pack"):  # an earlier copy stored on its own
                unlink_quietly(stored)
            # the stored copy is its span of the pack, written whole (the pack's size
            # is checked, see datarecords.packed_as); the RAM copy the fd's, renamed
            # with its inode
            rec: Dict[str, Any] = {
                "path": rel,
                "sha256": claimed,
                "size": size,
                "enc_size": len(sealed),
                "pack": name,
                "off": off,
                "plain_mtime_ns": mtime,
            }
            if recorded is not None:
                rec["recorded_ns"] = recorded
            self._verified(index, rec, flush=False)  # (the group writes its lines: hand_over)

        self._small.append(store)  # (run by hand_over's group with its pack)
        self._small_bytes += 2 * length
        if self._small_bytes >= SMALL_BATCH_BYTES:
            self.hand_over(behind)

    def hand_over(self, behind: WriteBehind) -> None:
        """Queue the small files read since the last call on ``behind`` as one task.

        Why groups: a task per file woke the write-behind thread once per file, and
        each wake-up and GIL handoff between the two threads cost system time (shape A:
        9,000 context switches for 1,916 files). Called before any other frame is
        handled and when the session ends (also when it is cut: what was read whole is
        still stored), so the order of files, records and acks stays the order read.
        The group's ciphertext goes into one pack (datafiles.Pack, see
        datarecords.PACKS: a file at rest per small file cost the host more CPU than the
        rest of storing it), each file sealed on its own, its record naming its span.
        The group's record lines are written in one block once it is stored (before
        its acks: datafiles.Lines), so a SIGKILL can leave unrecorded only files of the
        group being stored, none acknowledged: the next session stores them again (a
        pack no record names goes at the next final check: drop_dead_packs). A
        file in a group that fails: the group's later files create nothing (its error
        ends the session, as a task's did), the earlier ones are recorded."""
        if not self._small:
            return
        tasks, self._small = self._small, []
        nbytes, self._small_bytes = self._small_bytes, 0
        self._packs += 1
        pack = Pack(self.src, "%d-%s-%d" % (self._pid, self._pack_token, self._packs))

        def run() -> None:
            try:
                for task in tasks:
                    task(pack)
            finally:  # the group's record lines in one write (those stored before a failure too)
                pack.close()  # (before: a record never names a pack still being written)
                assert self.recorder is not None
                self.recorder.flush()

        behind.submit(run, nbytes)

    @staticmethod
    def _check_digest(rel: str, digest: str, claimed: str) -> None:
        if digest != claimed:
            raise DataError(
                "dataset file %s: sha256 on the host %s… differs from the "
                "laptop's %s…" % (rel, digest[:12], claimed[:12]),
                "integrity",
            )

    def _verified(self, index: int, rec: Dict[str, Any], flush: bool = True) -> None:
        """On the write-behind thread: record a verified file and acknowledge it.

        ``flush``: write its record line now (a small file's waits for the end of its
        group, see :meth:`hand_over`); the ack goes later, after it, in any case."""
        assert self.recorder is not None and self.lines is not None
        self.recorder.add(rec)
        if flush:
            self.recorder.flush()
        self.records[rec["path"]] = rec
        self._stored_seen.add(rec["path"])
        if self.encrypted:
            self._ram_seen[rec["path"]] = rec["plain_mtime_ns"]
        self.received += 1
        self.lines.ack(index)

    def _make_parents(self, base: str, rel: str) -> None:
        """:func:`make_parents`, once per directory per session (thousands of files
        share a few directories)."""
        parent = rel.rpartition("/")[0]
        if (base, parent) not in self._made:
            make_parents(base, rel)
            self._made.add((base, parent))

    def _receive_sealed(
        self,
        stdin: BinaryIO,
        rel: str,
        length: int,
        part: str,
        sink: HashSink,
        resume: Optional[Dict[str, Any]],
    ) -> None:
        """Tee the ciphertext into ``part`` while decrypting it into ``sink``.

        Resuming, the kept prefix is authenticated and decrypted into ``sink`` again
        first (it must hash as it did when reported), then cut to exactly the chunks
        the laptop continues after.
        """
        self.cipher()
        from . import streamcrypt

        mode = "r+b" if resume is not None else "wb"
        fd = os.open(part, os.O_RDWR | os.O_CREAT | NOFOLLOW | (0 if resume else os.O_TRUNC), 0o600)
        with os.fdopen(fd, mode) as copy:
            where = None
            if resume is not None:
                chunks = int(resume["chunks"])
                header, got = streamcrypt.verified_prefix(self.key, rel, copy, sink, chunks)
                if got != chunks or sink.hexdigest() != resume["prefix_sha256"]:
                    raise DataError(
                        "the kept part of %s changed on the host since it was reported" % rel,
                        "integrity",
                    )
                cs = streamcrypt.header_chunk_size(header)
                copy.truncate(streamcrypt.HEADER_LEN + chunks * (cs + streamcrypt.TAG_LEN))
                copy.seek(0, os.SEEK_END)
                where = (header, chunks)
            tee = Tee(stdin, copy)
            try:
                streamcrypt.decrypt_stream(self.key, rel, tee, sink, limit=length, resume=where)
            except streamcrypt.DecryptError as exc:
                if tee.eof:
                    raise EOFError("stream ended inside a frame") from None
                raise DataError(
                    "dataset file %s failed decryption on the host: %s" % (rel, exc),
                    "integrity",
                ) from None
            if tee.count != length:
                raise EOFError("stream ended inside a frame")


def _copy_exact(stdin: BinaryIO, sink: HashSink, length: int) -> None:
    """Public data: ``length`` bytes of the frame into ``sink`` as they come."""
    left = length
    while left:
        block = stdin.read(min(READ, left))
        if not block:
            raise EOFError("stream ended inside a frame")
        sink.write(block)
        left -= len(block)
