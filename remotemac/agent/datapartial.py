"""Cut transfers on the host: large files kept as ciphertext when the link drops.

Why its own module: which kept transfers are worth resuming (whole chunks that still
authenticate, the entry unchanged, the longest per file) and claiming one for a new
session are a job of their own, mixed into :class:`receiver.Receiver`.
Python 3.9, stdlib only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from typing import Any, Dict, List, Optional, Tuple

from .datafiles import HashSink, open_new, own_file, read_note, unlink_quietly
from .datarecords import PARTIAL, DataError, check_rel, other_alive, regular_lstat
from .datasplit import split_sid


class PartialTransfers:
    """The cut-transfer steps of :class:`receiver.Receiver` (see its attributes)."""

    def _partial_dir(self) -> str:
        path = os.path.join(self.src, PARTIAL)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise DataError("%s is in the way (not a directory)" % path, "unsafe-path")
        return path

    def _partial_metas(self) -> List[Tuple[str, Dict[str, Any]]]:
        """(base path without extension, meta) of every kept cut transfer.

        Metas are written whole (temp name, then rename), so one that does not parse
        is damage, not another stream's file being written: it goes.
        """
        out = []
        directory = os.path.join(self.src, PARTIAL)
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(directory)):
                if not name.endswith(".json"):
                    continue
                base = os.path.join(directory, name[: -len(".json")])
                try:
                    raw = read_note(base + ".json")
                except DataError:  # not a note of ours (a FIFO, a device): left alone
                    continue
                except OSError:
                    raw = b""
                try:
                    meta = json.loads(raw.decode("utf-8"))
                    check_rel(meta["path"])
                    if meta.get("split") and not (
                        isinstance(meta.get("header"), str) and isinstance(meta["pieces"], list)
                    ):
                        raise ValueError("not a split's meta")
                except (OSError, ValueError, KeyError, TypeError, AttributeError, DataError):
                    unlink_quietly(base + ".json", base + ".rmenc", base + ".lock")
                    continue
                out.append((base, meta))
        return out

    def partials(self, known: List[Tuple[int, str]]) -> List[Tuple[int, Dict[str, Any]]]:
        """Cut transfers worth resuming: [index, {partial, chunks, offset, prefix_sha256,
        header, size, mtime_ns}], the verified prefix being whole chunks that authenticate,
        or for a split file [index, {split, header, pieces, size, mtime_ns}] (the pieces
        whose ciphertext and plaintext are in; its plaintext part must still be in RAM).

        Stale ones (the entry left the slice, is already verified, or its size or the
        laptop's mtime changed) are deleted; so is all but the longest per file. The
        laptop resumes only when its own prefix (or each piece) hashes the same.
        """
        if not self.encrypted:
            return []
        metas = self._partial_metas()
        if not metas:  # the usual case: no cut transfer, nothing to import or index
            return []
        from . import streamcrypt

        index_of = {e["path"]: i for i, e in enumerate(self.entries)}
        done = {i for i, _ in known}
        #: index -> (base, meta, chunks kept, what the start answer says)
        best: Dict[int, Tuple[str, Dict[str, Any], int, Dict[str, Any]]] = {}
        for base, meta in metas:
            if other_alive(meta.get("pid"), wait=3.0):
                continue  # an earlier session still writes it (it dies of the cut soon)
            index = index_of.get(meta["path"])
            entry = self.entries[index] if index is not None else None
            if (
                entry is None
                or index in done
                or (entry.get("size"), entry.get("mtime_ns"))
                != (meta.get("size"), meta.get("mtime_ns"))
            ):
                self._drop_meta(base, meta)
                continue
            assert index is not None
            if meta.get("split"):
                chunks, info = self._split_kept(base, meta)
            else:
                sink = HashSink(None)
                self.cipher()
                try:
                    with os.fdopen(own_file(base + ".rmenc", os.O_RDONLY), "rb") as fh:
                        header, chunks = streamcrypt.verified_prefix(
                            self.key, meta["path"], fh, sink
                        )
                except (OSError, DataError):
                    header, chunks = b"", 0
                info = {
                    "partial": os.path.basename(base),
                    "chunks": chunks,
                    "offset": sink.size,
                    "prefix_sha256": sink.digest.hexdigest(),
                    "header": header.hex(),
                }
            old = best.get(index)
            if not chunks or (old is not None and old[2] >= chunks):
                self._drop_meta(base, meta)
                continue
            if old is not None:
                self._drop_meta(old[0], old[1])
            info.update(size=meta["size"], mtime_ns=meta["mtime_ns"])
            best[index] = (base, meta, chunks, info)
        return [(i, kept[3]) for i, kept in best.items()]

    def _split_kept(self, base: str, meta: Dict[str, Any]) -> Tuple[int, Dict[str, Any]]:
        """(chunks held, start answer entry) of a kept split; 0 chunks when its
        ciphertext or its plaintext part is gone (a reboot empties RAM)."""
        pieces = meta["pieces"]
        try:
            chunks = sum(int(p[1]) for p in pieces)
        except (ValueError, TypeError, IndexError):
            chunks = 0
        part = self._split_part(meta["path"], split_sid(base))
        if regular_lstat(base + ".rmenc") is None or regular_lstat(part) is None:
            chunks = 0
        return chunks, {"split": True, "header": meta["header"], "pieces": pieces}

    def _drop_meta(self, base: str, meta: Dict[str, Any]) -> None:
        """Delete a kept cut transfer (a split's: its ciphertext, lock and RAM part too)."""
        if not meta.get("split"):
            unlink_quietly(base + ".json", base + ".rmenc")
            return
        sid = split_sid(base)
        unlink_quietly(base + ".json", base + ".rmenc", base + ".lock")
        unlink_quietly(self._split_part(meta["path"], sid))
        self._splits_open.discard(sid)

    def _drop_partials(self, rel: str) -> None:
        """Forget every cut transfer of ``rel`` no live session is writing."""
        for base, meta in self._partial_metas():
            if meta["path"] == rel and not other_alive(meta.get("pid")):
                self._drop_meta(base, meta)

    def _claim_partial(self, rel: str, entry: Dict[str, Any], resume: Optional[Dict[str, Any]]):
        """The path this session stores ``rel``'s ciphertext under while it arrives.

        ``resume`` names a cut transfer to continue: it is renamed to this session's
        name first (so two sessions never write one file); otherwise older ones go.
        """
        directory = self._partial_dir()
        base = os.path.join(
            directory, "%s-%d" % (hashlib.sha256(rel.encode("utf-8")).hexdigest()[:32], os.getpid())
        )
        if resume is None:
            self._drop_partials(rel)
        else:
            old = os.path.join(directory, os.path.basename(str(resume["partial"])))
            try:
                os.replace(old + ".rmenc", base + ".rmenc")
            except OSError:
                raise DataError("the cut transfer of %s to resume is gone" % rel) from None
            unlink_quietly(old + ".json")
        meta = {
            "path": rel,
            "size": entry.get("size"),
            "mtime_ns": entry.get("mtime_ns"),
            "pid": os.getpid(),
        }
        tmp = "%s.tmp-%d" % (base, os.getpid())
        with open_new(tmp) as fh:
            fh.write(json.dumps(meta).encode("utf-8"))
        os.replace(tmp, base + ".json")
        return base
