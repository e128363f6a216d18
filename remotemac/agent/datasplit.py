"""Split push on the host: one large file arriving as pieces over several streams.

Why its own module: a split's pieces are written by separate receiver processes (one
per stream) into one ciphertext and one plaintext part, noted under a lock and
assembled only when they tile the file; that bookkeeping is a job of its own, mixed
into :class:`receiver.Receiver`. Python 3.9, stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, BinaryIO, Dict, Tuple

from .datafiles import (
    flocked,
    own_file,
    pwrite_all,
    read_exact,
    read_note,
    unlink_quietly,
    write_meta,
)
from .datarecords import (
    READ,
    DataError,
    backdate,
    inside,
    make_parents,
    regular_lstat,
    stamp,
)


class Split:
    """One split file as a frame names it (see :meth:`Receiver._split`)."""

    def __init__(self, **fields: Any) -> None:
        self.index: int = fields["index"]
        self.rel: str = fields["rel"]
        self.size: int = fields["size"]
        self.mtime_ns: Any = fields["mtime_ns"]
        self.header: bytes = fields["header"]
        self.opener: Any = fields["opener"]
        self.chunk_size: int = fields["chunk_size"]
        self.total: int = fields["total"]
        #: ``.remotemac-partial/<sha256(path)[:32]>-s<sid>`` (+ .rmenc, .json, .lock)
        self.base: str = fields["base"]
        self.sid: str = fields["sid"]
        #: the plaintext part in RAM (see Receiver._split_part)
        self.part: str = fields["part"]


def split_sid(base: str) -> str:
    """The sid of a split's base path ("" for a single stream's cut transfer)."""
    name = os.path.basename(base)
    return name.rpartition("-s")[2] if "-s" in name else ""


class SplitPieces:
    """The split-file steps of :class:`receiver.Receiver` (see its attributes)."""

    def _split_part(self, rel: str, sid: str) -> str:
        """The plaintext part of ``rel``'s split ``sid``: hidden, beside the file in RAM."""
        plain = inside(self.dest, rel)
        return os.path.join(os.path.dirname(plain), ".%s.split-%s" % (os.path.basename(plain), sid))

    def _split(self, index: int, header_hex: Any) -> "Split":
        """The split of entry ``index`` under a header that authenticates under the key
        and the entry's path (DataError integrity otherwise)."""
        if not self.encrypted:
            raise DataError("a split frame in a session that is not encrypted", "integrity")
        if not 0 <= index < len(self.entries):
            raise DataError("split frame for unknown entry %d" % index, "integrity")
        rel = self.entries[index]["path"]
        size = self.entries[index].get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise DataError("split of %s: the hello gave it no size" % rel, "integrity")
        self.cipher()
        from . import streamcrypt

        try:
            header = bytes.fromhex(header_hex)
        except (TypeError, ValueError):
            header = b""
        if len(header) != streamcrypt.HEADER_LEN:
            raise DataError("split of %s: not a remotemac-enc/v1 header" % rel, "integrity")
        try:
            opener, chunk_size = streamcrypt.chunk_opener(self.key, rel, header)
        except streamcrypt.DecryptError as exc:
            raise DataError("split of %s refused: %s" % (rel, exc), "integrity") from None
        sid = hashlib.sha256(header).hexdigest()[:16]
        name = "%s-s%s" % (hashlib.sha256(rel.encode("utf-8")).hexdigest()[:32], sid)
        return Split(
            index=index,
            rel=rel,
            size=size,
            mtime_ns=self.entries[index].get("mtime_ns"),
            header=header,
            opener=opener,
            chunk_size=chunk_size,
            total=streamcrypt.chunk_count(size, chunk_size),
            base=os.path.join(self._partial_dir(), name),
            sid=sid,
            part=self._split_part(rel, sid),
        )

    def _split_meta(self, sp: "Split") -> Dict[str, Any]:
        """The split's meta as written (under its lock), or a new one with no piece;
        DataError integrity when it names another file or another version of it."""
        try:
            meta = json.loads(read_note(sp.base + ".json").decode("utf-8"))
        except FileNotFoundError:
            return {
                "path": sp.rel,
                "size": sp.size,
                "mtime_ns": sp.mtime_ns,
                "split": True,
                "header": sp.header.hex(),
                "pieces": [],
            }
        except (OSError, ValueError) as exc:
            raise DataError(
                "split of %s: its notes are damaged (%s)" % (sp.rel, exc), "integrity"
            ) from None
        if not isinstance(meta, dict) or (
            meta.get("path"),
            meta.get("header"),
            meta.get("size"),
            meta.get("mtime_ns"),
        ) != (sp.rel, sp.header.hex(), sp.size, sp.mtime_ns):
            raise DataError(
                "split of %s: begun for another version of the file" % sp.rel, "integrity"
            )
        return meta

    def receive_piece(self, stdin: BinaryIO, index: int, length: int, desc: Dict[str, Any]) -> None:
        """One piece of a split file (an ``S`` frame): chunks ``first`` .. ``first +
        count - 1``, written where the whole stream would hold them.

        Why here, on the reading thread: a file is split only on a far link, where
        this process waits on the network, not on its CPU. Each chunk is stored, opened
        (authenticated) and its plaintext written at its place in the RAM part; the
        piece is noted in the split's meta (under its lock: the other streams'
        processes note theirs) only once it is all in, so a cut inside it notes
        nothing, and the laptop hears of it at once (``{"piece": [index, first]}``).
        """
        sp = self._split(index, desc.get("header"))
        first, count = _piece_range(sp, desc, length)
        self.writing()
        self._make_parents(self.src, sp.rel)
        self._make_parents(self.dest, sp.rel)
        with flocked(sp.base + ".lock"):
            meta = self._split_meta(sp)
            if _overlaps(meta.get("pieces"), first, count) and not meta.get("rewritten"):
                meta["rewritten"] = True  # what was hashed ahead may no longer hold
                write_meta(sp.base, meta)
            elif not os.path.exists(sp.base + ".json"):  # found by partials/finish if cut
                write_meta(sp.base, meta)
        self._splits_open.add(sp.sid)
        try:
            cipher_fd = own_file(sp.base + ".rmenc", os.O_RDWR | os.O_CREAT)
            try:
                plain_fd = own_file(sp.part, os.O_RDWR | os.O_CREAT)
            except BaseException:
                os.close(cipher_fd)
                raise
        except DataError:  # a link in the way: the split starts afresh next time
            self._drop_meta(sp.base, {"path": sp.rel, "split": True})
            raise
        try:
            try:
                sha = self._store_chunks(stdin, sp, first, count, cipher_fd, plain_fd)
            finally:
                os.close(plain_fd)
        finally:
            os.close(cipher_fd)
        self._note_piece(sp, first, count, sha)
        assert self.lines is not None
        self.lines.say({"piece": [index, first]})

    def _store_chunks(
        self, stdin: BinaryIO, sp: Split, first: int, count: int, cipher_fd: int, plain_fd: int
    ) -> str:
        """Read a piece's sealed chunks: each stored at its place in the ciphertext,
        opened (authenticated) and its plaintext written at its place in the RAM part;
        the plaintext's SHA-256. A cut inside the piece notes the chunks that came whole
        as a shorter piece, so the next attempt sends only the rest of it."""
        from . import streamcrypt

        digest = hashlib.sha256()
        cs, tag = sp.chunk_size, streamcrypt.TAG_LEN
        done = 0  # whole chunks of this piece stored and opened
        try:
            pwrite_all(cipher_fd, sp.header, 0)
            for counter in range(first, first + count):
                sealed = read_exact(stdin, min(cs, sp.size - counter * cs) + tag)
                pwrite_all(cipher_fd, sealed, streamcrypt.HEADER_LEN + counter * (cs + tag))
                try:
                    plain = sp.opener(counter, counter == sp.total - 1, sealed)
                except streamcrypt.DecryptError as exc:
                    raise DataError(
                        "dataset file %s failed decryption on the host: %s" % (sp.rel, exc),
                        "integrity",
                    ) from None
                pwrite_all(plain_fd, plain, counter * cs)
                digest.update(plain)
                done += 1
        except EOFError:
            if done:
                self._note_piece(sp, first, done, digest.hexdigest())
            raise
        return digest.hexdigest()

    def _note_piece(self, sp: "Split", first: int, count: int, sha: str) -> None:
        """Add a piece whose chunks are all stored and opened to the split's meta.

        The receiver of a cut session may note the piece it was inside only once sshd
        gives up on its link, after the next session stored that piece whole or even
        assembled the split: a shorter note never replaces a longer one, and a split
        whose notes are gone (assembled, dropped) gets none back."""
        if not os.path.exists(sp.base + ".json"):
            return
        with flocked(sp.base + ".lock"):
            if not os.path.exists(sp.base + ".json"):
                return
            meta = self._split_meta(sp)
            if any(p[0] == first and p[1] >= count for p in meta["pieces"]):
                if not meta.get("rewritten"):  # chunks written twice: see _overlaps
                    meta["rewritten"] = True
                    write_meta(sp.base, meta)
                return
            pieces = [p for p in meta["pieces"] if p[0] != first]
            meta["pieces"] = sorted(pieces + [[first, count, sha]])
            write_meta(sp.base, meta)

    def _hashed_ahead(self) -> Dict[str, "Prefix"]:
        """The plaintext prefixes :meth:`hash_ahead` hashed, by split sid (this process's)."""
        try:
            return self._prefixes  # type: ignore[has-type,no-any-return]
        except AttributeError:
            self._prefixes: Dict[str, Prefix] = {}
            return self._prefixes

    def hash_ahead(self, index: int, req: Dict[str, Any]) -> None:
        """An ``H`` frame, on the write-behind thread: hash the plaintext of the pieces
        noted so far that tile from chunk 0 (beyond what was hashed before), so the
        join (:meth:`_assemble`) hashes only the rest.

        Why: the join hashes the whole file before it answers; for a 1 GiB file that
        was ~0.5 s of the push's end, with the link idle. The pieces noted are stored
        and opened (authenticated) whole, and nothing writes there again but a piece
        sealed under the same header and nonces, which holds the same plaintext
        (engine/syncsplit.SealLog), so hashing them now hashes what the join would.
        A hint that cannot be followed (no notes, a header that is not the split's)
        is dropped with what was hashed: the join then hashes the file from its start
        and says what is wrong."""
        prefixes = self._hashed_ahead()
        sid = ""
        try:
            sp = self._split(index, req.get("header"))
            sid = sp.sid
            if not os.path.exists(sp.base + ".json"):  # (no lock file made for nothing)
                prefixes.pop(sid, None)
                return
            with flocked(sp.base + ".lock"):
                if not os.path.exists(sp.base + ".json"):
                    prefixes.pop(sid, None)
                    return
                meta = self._split_meta(sp)
                if meta.get("rewritten"):  # the join hashes it all
                    prefixes.pop(sid, None)
                    return
                upto, _ = _tiled(meta.get("pieces"))
            prefix = prefixes.setdefault(sid, Prefix())
            end = min(max(upto, 0) * sp.chunk_size, sp.size)
            if end > prefix.at:
                prefix.extend(sp.part, end)
        except (OSError, DataError):
            prefixes.pop(sid, None)

    def assemble(self, index: int, req: Dict[str, Any]) -> None:
        """A ``J`` frame, on the write-behind thread after the files before it: the
        split's pieces must tile the file and its plaintext hash as the laptop says;
        then both parts go into place and the file is recorded and acknowledged like
        a whole one. Any failure removes the split (DataError integrity)."""
        sp = self._split(index, req.get("header"))
        if not os.path.exists(sp.base + ".json"):
            raise DataError(
                "split of %s: no piece of it under this header was received" % sp.rel,
                "integrity",
            )
        try:
            rec = self._assemble(sp, str(req.get("sha256")))
        except OSError as exc:
            self._drop_meta(sp.base, {"path": sp.rel, "split": True})
            raise DataError(
                "split of %s: cannot assemble it: %s" % (sp.rel, exc), "integrity"
            ) from None
        except BaseException:
            self._drop_meta(sp.base, {"path": sp.rel, "split": True})
            raise
        self._splits_open.discard(sp.sid)
        self._verified(index, rec)

    def _assemble(self, sp: "Split", claimed: str) -> Dict[str, Any]:
        """:meth:`assemble`'s checks and renames, under the split's lock; the record."""
        from . import streamcrypt

        with flocked(sp.base + ".lock"):
            meta = self._split_meta(sp)
            if _tiled(meta["pieces"]) != (sp.total, True):
                raise DataError(
                    "split of %s: its pieces do not cover its %d chunks exactly once"
                    % (sp.rel, sp.total),
                    "integrity",
                )
            st = regular_lstat(sp.part)
            if st is None or st.st_size != sp.size:
                raise DataError(
                    "split of %s: its plaintext in RAM is not %d bytes" % (sp.rel, sp.size),
                    "integrity",
                )
            recorded = backdate(sp.part)  # before hashing: see datarecords.SETTLE_NS
            prefix = self._hashed_ahead().pop(sp.sid, None)
            if prefix is None or meta.get("rewritten"):
                prefix = Prefix()  # chunks written again since: hash it all
            prefix.extend(sp.part, sp.size)
            self._check_digest(sp.rel, prefix.digest.hexdigest(), claimed)
            enc_size = streamcrypt.ciphertext_size(sp.size, sp.chunk_size)
            with os.fdopen(own_file(sp.base + ".rmenc", os.O_RDWR), "r+b") as fh:
                if os.fstat(fh.fileno()).st_size > enc_size:
                    fh.truncate(enc_size)
                if os.fstat(fh.fileno()).st_size != enc_size:
                    raise DataError(
                        "split of %s: its ciphertext is not %d bytes" % (sp.rel, enc_size),
                        "integrity",
                    )
            stored, plain = inside(self.src, sp.rel) + ".rmenc", inside(self.dest, sp.rel)
            make_parents(self.src, sp.rel)
            make_parents(self.dest, sp.rel)
            os.replace(sp.base + ".rmenc", stored)
            os.replace(sp.part, plain)
            unlink_quietly(sp.base + ".json", sp.base + ".lock")
        rec: Dict[str, Any] = {
            "path": sp.rel,
            "sha256": claimed,
            "size": sp.size,
            "enc_size": os.lstat(stored).st_size,
        }
        stamp(rec, "plain_mtime_ns", plain, recorded)
        return rec


class Prefix:
    """The SHA-256 of a split's plaintext from its start to ``at`` (see hash_ahead)."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()
        self.at = 0

    def extend(self, part: str, end: int) -> None:
        """Hash the plaintext part's bytes from ``at`` to ``end`` (OSError if it is short)."""
        with os.fdopen(own_file(part, os.O_RDONLY), "rb") as fh:
            fh.seek(self.at)
            while self.at < end:
                block = fh.read(min(READ, end - self.at))
                if not block:
                    raise OSError("the plaintext ends at %d bytes" % self.at)
                self.digest.update(block)
                self.at += len(block)


def _tiled(pieces: Any) -> Tuple[int, bool]:
    """(the chunks the noted pieces cover from chunk 0 without a gap or an overlap,
    whether every piece is among them); (-1, False) when the notes are not a list of
    [first, count, sha256]."""
    at = 0
    try:
        ordered = sorted(pieces)
        for n, (first, count, _) in enumerate(ordered):
            if first != at or count < 1:
                return at, False
            at += count
            if n == len(ordered) - 1:
                return at, True
    except (TypeError, ValueError):
        return -1, False
    return at, True


def _overlaps(pieces: Any, first: int, count: int) -> bool:
    """Whether chunks ``first`` .. ``first + count - 1`` were noted before (by any
    stream): a piece written again.

    Why it matters: :meth:`SplitPieces.hash_ahead` hashes noted pieces before the join,
    trusting that nothing writes there again but the same plaintext (a laptop's piece
    sent twice under the same header and nonces). The laptop's seal log holds to that;
    the host does not take it on trust: a split with a chunk written twice is marked
    ``rewritten`` in its notes, and the join then hashes the whole file, as it did
    before hints (a resend after a cut, a straggler of a cut session: rare, and only
    slower). Malformed notes count as an overlap."""
    try:
        return any(
            p_first < first + count and first < p_first + p_count
            for p_first, p_count, _ in pieces or ()
        )
    except (TypeError, ValueError):
        return True


def _piece_range(sp: Split, desc: Dict[str, Any], length: int) -> Tuple[int, int]:
    """(first, count) of an ``S`` frame's piece; DataError integrity unless it lies
    within the split's chunks and its length is exactly theirs sealed."""
    from . import streamcrypt

    first, count = desc.get("first"), desc.get("count")
    if not (
        type(first) is int
        and type(count) is int
        and first >= 0
        and count >= 1
        and first + count <= sp.total
    ):
        raise DataError(
            "split of %s: piece %r+%r is not within its %d chunks"
            % (sp.rel, first, count, sp.total),
            "integrity",
        )
    span = streamcrypt.sealed_span(sp.size, sp.chunk_size, first, count)
    if length != span:
        raise DataError(
            "split of %s: piece %d+%d of %d bytes, not %d" % (sp.rel, first, count, length, span),
            "integrity",
        )
    return first, count
