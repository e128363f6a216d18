"""Host side of the dataset: receive the streamed slice, verify it, decrypt it into RAM.

Why a stream and not file copies: the laptop hashes, encrypts and sends while this
process, on the other end of an SSH channel (one of several on a far link or for many
small files), stores the ciphertext (the slice rests encrypted in ``<run>/data``),
decrypts it into RAM-backed storage and checks each file's SHA-256, so every stage
overlaps and nothing is read twice. Within this process the reading thread reads and
decrypts, and a second one (writebehind.py) creates and writes the files, hashes the
plaintext, checks it and acknowledges it.

``dataops sync [--runtime DIR]`` (see :func:`main`, started by shared.py's boot) speaks this protocol on
stdin/stdout (the runtime named in argv, the same as the hello's, is imported while
the hello is on its way):

1. laptop → one JSON line: ``{"run_dir", "run_id", "src", "encrypted", "key_hex"
   (only when encrypted; the key never touches disk, argv or the environment),
   "runtime_dir" (only when encrypted: the agent runtime to decrypt with),
   "ram_bytes", "columns": {"path": [...], "size": [...], "sha256": [... or null],
   "mtime_ns": [...]} (or "entries": [{"path", "size", "sha256", "mtime_ns"}]),
   "worker" (true on the extra channels of a multi-stream sync)}``;
2. host → one JSON line: ``{"ok": true, "todo": [[index, sha256 or null], ...],
   "partial": [[index, {...}], ...]}`` (a worker answers ``{"ok": true, "ram"}``):
   ``todo`` are the entries it does not hold complete and verified with the hello's
   size and SHA-256, each with the hash of the verified copy of that path it holds
   (same size), if any; every other entry it holds (the record
   ``<src>/.verified.jsonl`` is keyed by relative path and plaintext SHA-256,
   because every encryption uses a fresh salt and so gives different ciphertext);
   ``partial`` the cut transfers it kept (``.remotemac-partial/``, ciphertext only,
   files of RESUMABLE bytes or more): ``{"partial", "chunks", "offset",
   "prefix_sha256", "header", "size", "mtime_ns"}``, ``chunks`` being the whole
   chunks that authenticate and ``offset`` their plaintext length;
3. laptop → ``b"P" 0 0`` (optional, any number): the host answers ``{"ok": true,
   "pong": true}`` (the laptop sizes its streams by this round trip where its link
   cannot measure one; a worker's frames follow its hello at once, before its answer);
4. laptop → frames ``b"F" index:u32 length:u64`` + ``length`` bytes (ciphertext,
   or plaintext for public data) + the 32-byte SHA-256 of the plaintext, or
   ``b"R" index:u32 length:u64`` + ``meta_len:u32`` + ``{"partial", "chunks",
   "prefix_sha256"}`` + the ciphertext from chunk ``chunks`` on + the SHA-256 (the
   host decrypts the kept prefix again, checks its hash, continues after it); the
   host answers ``{"acks": [index, ...]}`` once files are stored, decrypted and
   verified (one line for all that were verified within ~20 ms, see writebehind.py).
   The laptop may send F frames of files it knows changed right after the hello,
   before the start answer (engine/sync.py ``_Session._ahead``): they wait in the
   pipe and are read once the answer is out, like any other;
   A file too large for one channel's window comes as pieces over several streams
   (see ``S``/``J`` below and :meth:`Receiver.receive_piece`);
5. a worker gets ``b"D" 0 0`` right behind its last file and answers ``{"ok": true,
   "result": {"received"}}``; the first channel, once every stream has sent its last
   file (once every worker is done when a split file's pieces are still on their
   way), ``b"E" 0:u32 length:u64`` + the final manifest as JSON (``{"changed":
   [[index, size, sha256], ...]}``, the entries whose size or hash differ from the
   hello's, and ``"pending"``: the files sent whose acknowledgement the laptop did
   not have yet; or a whole list): the host first waits until the other streams have
   recorded the pending files (datafinish.py), then checks every entry against its
   record (re-decrypting from the stored ciphertext what is missing from RAM, e.g. after a
   reboot), removes files that left the slice (those its record lists; after a cut
   session, any file the manifest does not list) and kept cut transfers, and answers
   ``{"ok": true, "result": {...}}``.

Split push (one large file over several channels, each stream's receiver its own
process): ``b"S" index length`` + ``meta_len:u32`` + ``{"header", "first", "count"}``
+ the sealed chunks ``first`` .. ``first + count - 1`` (the bytes the whole stream
would hold there): the host writes them into one ciphertext under
``.remotemac-partial/<sha256(path)[:32]>-s<sid>.rmenc`` (``sid`` from the header) and
their plaintext into ``.<name>.split-<sid>`` beside the file in RAM, notes the piece
in ``…-s<sid>.json`` and answers ``{"piece": [index, first]}`` at once; meanwhile
``b"H" index length`` + ``{"header"}`` (a hint, any number, on the first channel) makes
the host hash the plaintext of the pieces noted so far that tile from the file's start
(:meth:`Receiver.hash_ahead`), so that the join has only the rest to hash; then
``b"J" index length`` + ``{"sha256", "header"}`` once every piece is in: the pieces
must tile the file, the plaintext must hash as said, and the file is renamed into
place, recorded and acknowledged like any other. A start answer lists kept splits as
``[index, {"split": true, "header", "pieces": [[first, count, plain_sha256], ...],
"size", "mtime_ns"}]``.

Any failure is one line ``{"ok": false, "error", "code"}`` (code ``integrity``
for checksum or decryption failures, ``ram`` when no RAM store could be made).
A cut link leaves ``.part-<pid>`` files (removed on the way out, or by the next
finish once that process is gone) and, for large files, the kept ciphertext; a
re-run skips every file already acknowledged and resumes the kept ones.

``op_prepare_data`` (an operation of hostagent.py) is the full check: it decrypts every
file from its stored ciphertext again and compares it to the manifest.

Standard library only; where the slice is encrypted, streamcrypt's ``cryptography``
comes from the agent runtime named in the first line (``runtime_dir``, see
agentruntime.py) and from nowhere else. Python 3.9.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import io
import json
import os
import select
import stat
import sys
from typing import Any, BinaryIO, Dict, List, Optional

from .datafiles import HashSink, Lines, read_exact
from .datarecords import (
    READ,
    DataError,
    Recorder,
    check_rel,
    compact_records,
    inside,
    regular_lstat,
)
from .protocol import FRAME, META_LEN, SyncFrame
from .receiver import Receiver, use_runtime
from .writebehind import WriteBehind

#: bytes queued for the write-behind thread at most (received, not yet stored)
BEHIND_BYTES = 32 << 20


# ------------------------------------------------------------------ entry points


#: Linux's F_SETPIPE_SZ (fcntl names it from Python 3.10 on), and the size asked for
_F_SETPIPE_SZ = 1031
PIPE_BYTES = 1 << 20


def _widen_pipe(stdin: BinaryIO) -> None:
    """Linux: grow the stdin pipe from sshd to 1 MiB (the unprivileged maximum).

    With the default 64 KiB, every 64 KiB of the stream costs a round of wake-ups
    between sshd and this process; on a busy host (or the loopback bench, where
    both ends share the cores) 10 MB took 60-170 ms through it, ~20 ms through
    1 MiB. macOS has no such call (its pipes size themselves); a refusal (the
    user's pipe quota) just keeps the default.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        fd = stdin.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)


def _waiting(stdin: BinaryIO) -> bool:
    """Whether input is already there to read (False when that cannot be told)."""
    try:
        return bool(select.select([stdin.fileno()], [], [], 0)[0])
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


def _preload(runtime_dir: Optional[str]) -> None:
    """Import the cipher from the runtime named in argv while nothing else waits.

    The laptop stats its slice before it sends the hello: when the hello is not
    there yet, this import (tens of ms) costs no time; when it is, the import
    waits until the start answer is out (the laptop then plans and reads its first
    files). A runtime that fails here fails again, with its message, when a byte
    needs decrypting (:meth:`Receiver.cipher`).
    """
    if not runtime_dir:
        return
    with contextlib.suppress(Exception):
        use_runtime(runtime_dir)
        from . import streamcrypt

        streamcrypt.new_aead(bytes(32))


def serve(stdin: BinaryIO, stdout: BinaryIO, runtime_dir: Optional[str] = None) -> int:
    """Run one sync session (see the module doc); returns the process exit code."""
    lines = Lines(stdout)
    try:
        _widen_pipe(stdin)
        if not _waiting(stdin):
            _preload(runtime_dir)
        line = stdin.readline()
        if not line:
            return 3
        req = json.loads(line.decode("utf-8"))
        receiver = Receiver(req)
        if req.get("worker"):
            lines.say({"ok": True, "ram": receiver.dest and receiver.ram})
            receiver.cipher()
        else:
            known = receiver.known()
            partial = receiver.partials(known)
            todo = receiver.todo(known)
            lines.say({"ok": True, "todo": todo, "partial": partial})
            # while the laptop plans and reads its first files: the RAM store, a look
            # at the RAM copies, the cipher
            receiver.start_check_ram()
            receiver.cipher()
        receiver.recorder, receiver.lines = Recorder(receiver.src), lines
        lines.before_acks = receiver.recorder.flush  # a file's record before its ack
        behind = WriteBehind(BEHIND_BYTES, idle=lines.flush_acks)
        try:
            return _frames(stdin, receiver, behind, lines)
        finally:
            with contextlib.suppress(BaseException):  # (an earlier file's failure: raised already)
                receiver.hand_over(behind)
            behind.close()  # what was read whole is still stored, verified and recorded
            lines.flush_acks()
            receiver.recorder.close()
    except DataError as exc:
        _answer_error(lines, str(exc), exc.code)
        return 1
    except (EOFError, BrokenPipeError):
        return 3  # the laptop went away; what was acknowledged is recorded
    except Exception as exc:  # one line back to the laptop, never a traceback
        _answer_error(
            lines,
            "%s: %s" % (type(exc).__name__, exc),
            "host-env" if isinstance(exc, ImportError) else "internal",
        )
        return 1


def _frames(stdin: BinaryIO, receiver: Receiver, behind: WriteBehind, lines: Lines) -> int:
    """Read frames until the session ends (the D or E frame); the exit code."""
    while True:
        kind, index, length = FRAME.unpack(read_exact(stdin, FRAME.size))
        if kind != SyncFrame.FILE:  # the small files read before it are stored first
            receiver.hand_over(behind)
        if kind == SyncFrame.FILE:
            receiver.receive(stdin, index, length, behind)
        elif kind == SyncFrame.PARTIAL:
            (size,) = META_LEN.unpack(read_exact(stdin, META_LEN.size))
            resume = json.loads(read_exact(stdin, size).decode("utf-8"))
            receiver.receive(stdin, index, length, behind, resume)
        elif kind == SyncFrame.PIECE:  # one piece of a split file, written here (see receive_piece)
            if behind.error is not None:  # a file before it failed: that ends the session
                raise behind.error
            (size,) = META_LEN.unpack(read_exact(stdin, META_LEN.size))
            receiver.receive_piece(stdin, index, length, _small_json(stdin, size))
        elif kind == SyncFrame.JOIN:  # after the files before it: records and acks stay in order
            req = _small_json(stdin, length)
            behind.submit(functools.partial(receiver.assemble, index, req))
        elif kind == SyncFrame.HASH:  # off the reading thread, before the join it shortens
            req = _small_json(stdin, length)
            behind.submit(functools.partial(receiver.hash_ahead, index, req))
        elif kind == SyncFrame.PING:
            lines.say({"ok": True, "pong": True})
        elif kind == SyncFrame.DONE:  # one of several streams is done: the first one finishes
            behind.drain()
            receiver.done_writing()
            lines.say({"ok": True, "result": {"received": receiver.received}})
            return 0
        elif kind == SyncFrame.END:
            final = json.loads(read_exact(stdin, length).decode("utf-8"))
            behind.drain()
            manifest = receiver.final_manifest(final)
            pending = final.get("pending") if isinstance(final, dict) else None
            # (nothing follows the end frame: input now means the laptop closed the channel)
            result = receiver.finish(manifest, pending, functools.partial(_waiting, stdin))
            lines.say({"ok": True, "result": result})
            return 0
        else:
            raise DataError("unknown frame %r" % kind)


#: a split frame's JSON is a header and a few numbers: anything longer is not ours
SPLIT_JSON_MAX = 1 << 16


def _small_json(stdin: BinaryIO, size: int) -> Dict[str, Any]:
    """A split frame's JSON object (DataError integrity when it is not one)."""
    if size > SPLIT_JSON_MAX:
        raise DataError("a split frame's description of %d bytes" % size, "integrity")
    try:
        obj = json.loads(read_exact(stdin, size).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict):
        raise DataError("a split frame's description is not a JSON object", "integrity")
    return obj


def _answer_error(lines: Lines, message: str, code: str) -> None:
    with contextlib.suppress(OSError):
        lines.flush_acks()
        lines.say({"ok": False, "error": message, "code": code})


def op_prepare_data(req: Dict[str, Any]) -> Dict[str, Any]:
    """Full check: decrypt (or hash) every manifest entry from what is stored on the host.

    Slower than the sync session's quick check: every stored copy is decrypted and
    hashed again, so a ciphertext edited on the host since it was received is caught
    here. Small files' copies are found through the record (their pack and span); a
    file of 8 MiB or more by its own ``.rmenc``.
    """
    try:
        receiver = Receiver(dict(req, entries=[]))
        receiver.cipher()
        receiver.dest  # noqa: B018 (makes the RAM store: its errors answer here)
    except DataError as exc:
        return {
            "data_dir": None,
            "mismatches": [],
            "ram": None,
            "error": {"message": str(exc), "code": exc.code},
        }
    mismatches: List[Dict[str, str]] = []
    for entry in req["manifest"]:
        rel = check_rel(entry["path"])
        rec = {"path": rel, "sha256": entry["sha256"], "size": entry["size"]}
        if receiver.encrypted:
            why = receiver._redecrypt(rec)
        else:
            why = _hash_check(inside(receiver.src, rel), entry["sha256"])
        if why:
            mismatches.append({"path": rel, "why": why})
        elif receiver.encrypted:
            old = receiver.records.get(rel)
            if old is not None and old.get("sha256") == rec["sha256"]:
                old["plain_mtime_ns"] = rec["plain_mtime_ns"]
                old.pop("recorded_ns", None)  # settled again only if _redecrypt's was
                if "recorded_ns" in rec:
                    old["recorded_ns"] = rec["recorded_ns"]
    if receiver.encrypted and receiver.records:
        compact_records(receiver.src, receiver.records)
    receiver.done_writing()
    return {"data_dir": receiver.dest, "mismatches": mismatches, "ram": receiver.ram}


def _hash_check(path: str, expected: str) -> Optional[str]:
    if regular_lstat(path) is None:
        return "missing"
    sink = HashSink(None)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(READ), b""):
            sink.write(block)
    return None if sink.digest.hexdigest() == expected else "sha256 differs"


def main(args: List[str]) -> None:
    """``dataops.py sync [--runtime DIR]``: one session on stdin/stdout, then exit.

    The laptop runs it as ``python -S -c BOOT <agent dir>/dataops.py sync …`` (see
    engine/sync.py ``_receiver_argv``): imported, this module loads from its cached
    bytecode, where run as a script it was compiled on every start (7 ms of the
    18 ms this file's start cost on top of the interpreter's, before the host
    could read the hello).
    """
    if args[:1] != ["sync"] or args[1:] not in ([], ["--runtime", args[-1]]):
        sys.stdout.write(
            json.dumps(
                {"ok": False, "error": "usage: dataops.py sync [--runtime DIR]", "code": "usage"}
            )
            + "\n"
        )
        sys.exit(2)
    code = serve(sys.stdin.buffer, sys.stdout.buffer, args[2] if len(args) == 3 else None)
    # every answer is flushed and every record line written (os.write): skip the
    # interpreter's teardown of the session's thousands of dicts, which the laptop waits for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
