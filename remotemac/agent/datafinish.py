"""The end of a sync session on the host: check the manifest, prune what left the slice.

Why its own module: the final check trusts what the session saw and wrote, decrypts
again what RAM lost, and walks the data dirs for debris only after a cut session;
that is a job of its own, mixed into :class:`receiver.Receiver`. Python 3.9, stdlib only.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional

from .datafiles import HashSink, unlink_quietly
from .datarecords import (
    PACKS,
    PARTIAL,
    READ,
    RECORD,
    SPLIT_PART,
    WRITING,
    backdate,
    check_rel,
    compact_records,
    inside,
    make_parents,
    name_key,
    other_alive,
    plain_ok,
    read_records,
    regular_lstat,
    stamp,
    stored_ok,
    stored_span,
)
from .datasplit import split_sid

#: the end frame can come while the other streams still store their last files (the
#: laptop sends it with their end frames, not after their answers): the first channel
#: looks for their record lines this often, and gives up waiting (its check then says
#: which are missing) when none has come for this long
OTHERS_POLL_S = 0.003
OTHERS_IDLE_S = 30.0


class Finish:
    """The final steps of :class:`receiver.Receiver` (see its attributes)."""

    def final_manifest(self, final: Any) -> List[Dict[str, Any]]:
        """The manifest the E frame describes: the hello's entries with ``changed``
        ([index, size, sha256] the laptop learnt while sending) applied; a list is a
        whole manifest."""
        if isinstance(final, list):
            return final
        changed = {int(i): (size, sha) for i, size, sha in final.get("changed") or []}
        out = []
        for index, entry in enumerate(self.entries):
            size, sha = changed.get(index, (entry["size"], entry["sha256"]))
            out.append({"path": entry["path"], "size": size, "sha256": sha})
        return out

    def finish(
        self,
        manifest: List[Dict[str, Any]],
        pending: Optional[Iterable[int]] = None,
        gone: Callable[[], bool] = lambda: False,
    ) -> Dict[str, Any]:
        """Check every manifest entry before launch; prune what left the slice.

        Per unchanged file this costs no syscall: its plaintext (the job reads it: it
        must have the size and mtime it had when it was verified) was seen by
        :meth:`check_ram` and its stored ciphertext by :meth:`known` moments ago, at the
        start of this session, or this session wrote them; the record is read once per session
        (plus what the other streams appended) and rewritten only when it shrinks or
        has grown to twice its live lines. Both trees are walked for debris only when
        another session's WRITING marker says it did not end cleanly (a clean session
        leaves nothing its record does not list).

        ``pending``: entries (indexes) the laptop sent whose acknowledgement had not
        come when it sent the end frame: the other streams may still be storing them
        (:meth:`_await_others`; ``gone`` says the laptop closed the channel meanwhile).
        A line the other streams appended to the record during this session is a file
        one of them verified, stored and put in place moments ago: it is trusted as
        this session's own writes are (no second look at either copy), unless the
        record was rewritten under this session (:meth:`_record_replaced`).
        """
        if self._ram_check is not None:
            self._ram_check.join()
        mismatches: List[Dict[str, str]] = []
        redecrypted = 0
        wanted = {}
        if self.recorder is not None:  # this session's last lines (kept for a block)
            self.recorder.flush()
        # with what the other streams verified
        fresh = self._await_others(manifest, pending or (), gone)
        if not self._record_replaced():
            for rel in fresh:
                rec = self.records[rel]
                self._stored_seen.add(rel)
                if self.encrypted and "plain_mtime_ns" in rec:
                    self._ram_seen[rel] = rec["plain_mtime_ns"]
        records, seen, ram_seen = self.records, self._stored_seen, self._ram_seen
        encrypted, entries = self.encrypted, self.entries
        for i, entry in enumerate(manifest):
            path = entry["path"]
            # (the hello's own paths were checked when it was read)
            rel = path if i < len(entries) and path is entries[i]["path"] else check_rel(path)
            wanted[rel] = entry
            rec = records.get(rel)
            if (
                rec is not None
                and rel in seen
                and (not encrypted or ram_seen.get(rel, -1) == rec.get("plain_mtime_ns"))
            ):  # both copies seen or written this session: only the version to compare
                if rec["sha256"] != entry["sha256"] or rec["size"] != entry["size"]:
                    mismatches.append({"path": rel, "why": "the host holds another version"})
                continue
            was = rec and rec.get("recorded_ns")  # a hash below may settle it
            if rec is None or (
                rel not in self._stored_seen and not stored_ok(self.src, rec, self.encrypted)
            ):
                mismatches.append({"path": rel, "why": "missing on the host"})
                continue
            if rec["sha256"] != entry["sha256"] or rec["size"] != entry["size"]:
                mismatches.append({"path": rel, "why": "the host holds another version"})
                continue
            if (
                self.encrypted
                and self._ram_seen.get(rel, -1) != rec.get("plain_mtime_ns")
                and not plain_ok(self.dest, rec)
            ):
                why = self._redecrypt(rec)
                if why:
                    mismatches.append({"path": rel, "why": why})
                    continue
                redecrypted += 1
            self._resettled += rec.get("recorded_ns") != was
        others = self._other_writers()
        if others:  # a cut session may have left debris: walk both trees
            ended = [mark for mark, pid in others if not other_alive(pid)]
            pruned = self._prune(set(wanted))
            unlink_quietly(*ended)
        else:  # every session ended cleanly: only recorded files can be left over
            pruned = self._prune_recorded(wanted)
        for base, meta in self._partial_metas():  # every wanted file is whole: none resumes
            if not other_alive(meta.get("pid")) and split_sid(base) not in self._splits_open:
                self._drop_meta(base, meta)
        live = {p: r for p, r in self.records.items() if p in wanted}
        if self.encrypted:  # packs none of the slice's records names (receiver.py)
            self.drop_dead_packs(live)
        # Not after waiting for the other streams' lines: a receiver of a cut attempt
        # (the link blackholed, so no close reached it) can get here on lines the next
        # attempt's receivers wrote, while they go on appending to the record; a rewrite
        # now would drop their later lines. The next session without pending files does it.
        if not pending and (
            redecrypted
            or self._resettled
            or len(live) < len(self.records)
            or self._record_lines > 2 * len(live) + 64
        ):
            compact_records(self.src, live)
        self.records = live
        self.done_writing()
        return {
            "data_dir": self.dest,
            "mismatches": mismatches,
            "ram": self.ram,
            "received": self.received,
            "redecrypted": redecrypted,
            "pruned": pruned,
        }

    def _read_fresh(self, fresh: set) -> int:
        """Add the record lines appended since the last read to ``records`` and their
        paths to ``fresh``; how many lines there were."""
        new: Dict[str, Dict[str, Any]] = {}
        self._record_end, lines = read_records(self.src, self._record_end, new)
        self._record_lines += lines
        self.records.update(new)
        fresh.update(new)
        return lines

    def _await_others(
        self, manifest: List[Dict[str, Any]], pending: Iterable[int], gone: Callable[[], bool]
    ) -> set:
        """Read what the other streams recorded during this session (the paths), first
        waiting until each ``pending`` entry has a line of this session's as the
        manifest describes it.

        Why wait here: the laptop sends the end frame together with the other streams'
        end frames once it has written its last file (engine/synctalk.py), instead of
        after their answers: a round trip less, and this check overlaps their last
        groups. A line only from before this session (the host held another copy, or
        this one until a look at it failed) does not count. The laptop closing the
        channel meanwhile (a stream failed, or a cut) ends the session here as a cut
        does (EOFError); when no line has come for OTHERS_IDLE_S, the check below says
        what is missing.
        """
        fresh: set = set()
        waiting = {}
        for index in pending:
            if isinstance(index, int) and 0 <= index < len(manifest):
                entry = manifest[index]
                waiting[check_rel(entry["path"])] = entry
        last = time.monotonic()
        while True:
            if self._read_fresh(fresh):
                last = time.monotonic()
            for rel in [rel for rel in waiting if rel in fresh]:
                rec, entry = self.records[rel], waiting[rel]
                if (rec.get("sha256"), rec.get("size")) == (entry["sha256"], entry["size"]):
                    del waiting[rel]
            if not waiting or self._record_replaced():
                return fresh
            if gone():
                raise EOFError("the laptop left while the other streams stored their last files")
            if time.monotonic() - last > OTHERS_IDLE_S:
                return fresh
            time.sleep(OTHERS_POLL_S)

    def _record_replaced(self) -> bool:
        """Whether the record this session appends to is no longer the one at its path
        (another session's compaction rewrote it): the lines read past this session's
        offset are then not all new, and none is trusted as such."""
        fd = getattr(self.recorder, "_fd", None)
        try:
            mine = os.fstat(fd) if isinstance(fd, int) else None
            now = os.lstat(os.path.join(self.src, RECORD))
        except OSError:
            return True
        return mine is None or (mine.st_dev, mine.st_ino) != (now.st_dev, now.st_ino)

    def _redecrypt(self, rec: Dict[str, Any]) -> Optional[str]:
        """RAM lost the plaintext (reboot, workload edit): decrypt the stored copy again."""
        self.cipher()
        from . import streamcrypt

        rel = rec["path"]
        plain = inside(self.dest, rel)
        self.writing()
        make_parents(self.dest, rel)
        try:
            path, off, length = stored_span(self.src, self.records.get(rel) or rec, True)
            streamcrypt.decrypt_file(self.key, rel, path, plain, off, length)
        except streamcrypt.DecryptError as exc:
            return "stored ciphertext failed authentication (tampered or damaged): %s" % exc
        except OSError as exc:
            return "cannot decrypt the stored ciphertext: %s" % exc
        recorded = backdate(plain)  # before hashing: see datarecords.SETTLE_NS
        sink = HashSink(None)
        with open(plain, "rb") as fh:
            for block in iter(lambda: fh.read(READ), b""):
                sink.write(block)
        if sink.digest.hexdigest() != rec["sha256"]:
            unlink_quietly(plain)
            return "sha256 differs after decrypting the stored ciphertext"
        stamp(rec, "plain_mtime_ns", plain, recorded)
        return None

    def _prune_recorded(self, wanted: Dict[str, Any]) -> int:
        """Remove the stored and decrypted copies of recorded files that left the slice.

        Enough when no session was cut since the last walk: a clean session leaves
        nothing in the data dirs that its record does not list.
        """
        pruned = 0
        left = [rel for rel in self.records if rel not in wanted]
        if not left:  # (a cold push: every record is wanted)
            return 0
        keys = {name_key(rel) for rel in wanted}
        for rel in left:
            if name_key(rel) in keys:
                continue
            paths = [inside(self.src, rel) + (".rmenc" if self.encrypted else "")]
            if self.encrypted:
                paths.append(inside(self.dest, rel))
            for path in paths:
                if regular_lstat(path) is not None:
                    unlink_quietly(path)
                    pruned += 1
        return pruned

    def _prune(self, wanted: set) -> int:
        """Remove stored and decrypted files that are no longer in the slice (names
        compared by :func:`name_key`: a Mac lists what it stores in its own form)."""
        pruned = 0
        wanted = {name_key(rel) for rel in wanted}
        # (root, its copies' extension, whether it holds decrypted copies)
        roots = [(self.src, ".rmenc" if self.encrypted else "", False)]
        if self.encrypted:
            roots.append((self.dest, "", True))
        for base, ext, plain in roots:
            prefix_len = len(base.rstrip(os.sep)) + 1
            for dirpath, dirs, files in os.walk(base):
                below = dirpath[prefix_len:]  # os.walk joins below base with "/"
                prefix = below + "/" if below else ""
                top_of_src = not prefix and base == self.src
                if top_of_src:
                    dirs[:] = [d for d in dirs if not d.startswith((PARTIAL, PACKS))]
                for name in files:
                    # a wanted file is never debris, whatever its name looks like
                    kept = name_key(prefix + _drop(name, ext)) in wanted
                    pid = _in_flight_pid(name, ext, plain)
                    if pid is not None and not kept:
                        if not other_alive(pid):  # debris of a session killed mid-file
                            unlink_quietly(dirpath + "/" + name)
                        continue  # else a live session's file in flight
                    if SPLIT_PART.match(name) and name_key(prefix + name) not in wanted:
                        # a split file's plaintext part (see receive_piece): debris of a
                        # cut split, unless this session is writing it
                        if name.rpartition(".split-")[2] not in self._splits_open:
                            unlink_quietly(dirpath + "/" + name)
                        continue
                    if top_of_src and name.startswith((RECORD, PARTIAL, WRITING)):
                        continue
                    if not kept:
                        unlink_quietly(dirpath + "/" + name)
                        pruned += 1
        return pruned


def _drop(name: str, ext: str) -> str:
    """The path part of a stored copy's name (``<name><ext>``); "" for any other name
    under a root whose copies carry ``ext`` (nothing else belongs there)."""
    if not ext:
        return name
    return name[: -len(ext)] if name.endswith(ext) else ""


def _in_flight_pid(name: str, ext: str, plain: bool) -> Optional[int]:
    """The pid in ``name`` if it has the form a receiver writes a file in flight under
    (receiver.py ``receive``): ``.<name>.part-<pid>`` for a decrypted copy (``plain``,
    the RAM store), ``<name><ext>.part-<pid>`` for a stored one; else None.

    Why this exact form: any name holding ``.part-<digits>`` with a dead pid was
    unlinked after a cut session, so a slice file literally named ``weights.part-12``
    or ``.cache.part-7`` went (the caller also keeps a name the slice wants).
    """
    head, sep, pid = name.rpartition(".part-")
    if not sep or not pid.isdigit() or not pid.isascii():
        return None
    if plain:
        ok = head.startswith(".") and len(head) > 1
    else:
        ok = head.endswith(ext) and len(head) > len(ext)
    return int(pid) if ok else None
