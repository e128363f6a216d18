"""The resident agent: one long-lived process per host connection (started by the
boot of shared.py: ``<agent dir>/resident.py``).

Why: every one-shot ``hostagent OP`` costs a new SSH exec channel plus an
interpreter start (0.2-0.45 s each with a heavy Python, 17-20 of them per run).
This process is started once over one exec channel and serves the same
operations (``hostagent.OPS``) for as long as the channel lives.

Wire format, both ways: a 4-byte big-endian length, then that many bytes of
UTF-8 JSON. Requests ``{"id", "op", "req", "store"}``; answers ``{"id",
"answer", "cpu_s", "pid"}`` where ``answer`` is what the one-shot CLI prints.
The first frame out is a hello (``{"id": "", "hello": ..., "pid": ...}``).
Requests run in threads, so several may be in flight; answers come back in
completion order, matched by ``id``.

Exactly once: a request that names a ``store`` directory has its answer written
there (atomically, as ``<id>.json``) before it is sent. The same id asked again
(after the link dropped and the laptop started a new resident agent) is answered
from that record instead of running twice; if the first attempt is still
running in the old process, the new one waits on the id's lock until it is done.
Nothing depends on this process surviving: on end of input it finishes what is
in flight (recording the answers) and exits.

Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO, List, Optional

from . import hostagent, protocol, safefs
from .agentutil import cpu_seconds
from .protocol import JsonObject

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20
#: answers kept per store; older ones are pruned (oldest first by mtime)
STORE_KEEP = 512
STORE_MAX_AGE_S = 7 * 86400
WORKERS = 16


@dataclass(frozen=True)
class Call:
    """One request frame: its ``id`` (echoed in the answer), the ``op`` and its ``req``,
    and the ``store`` its answer is recorded in (exactly once) when there is one."""

    id: str = ""
    op: str = ""
    req: JsonObject = field(default_factory=dict)
    store: Optional[str] = None

    @classmethod
    def from_json(cls, frame: JsonObject) -> "Call":
        return cls(
            id=str(frame.get("id", "")),
            op=str(frame.get("op", "")),
            req=frame.get("req") or {},
            store=frame.get("store") or None,
        )


def read_frame(stream: BinaryIO) -> Optional[JsonObject]:
    """One request, or None at end of input (a half frame counts as the end)."""
    head = _read_exact(stream, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ValueError("frame of %d bytes is over the %d byte limit" % (size, MAX_FRAME))
    body = _read_exact(stream, size)
    if body is None:
        return None
    return json.loads(body.decode("utf-8"))


def _read_exact(stream: BinaryIO, size: int) -> Optional[bytes]:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def encode_frame(obj: JsonObject) -> bytes:
    body = json.dumps(obj).encode("utf-8")
    return HEADER.pack(len(body)) + body


def _safe_id(call_id: Any) -> str:
    text = str(call_id)
    if (
        not text
        or len(text) > 128
        or not all(c.isalnum() or c in "-_." for c in text)
        or text.startswith(".")
    ):
        raise hostagent.AgentError("bad call id %r" % text[:40], "usage")
    return text


def run_op(op: str, req: JsonObject) -> JsonObject:
    """What ``hostagent.py OP`` would print, as a dict: ``op`` looked up in the handler
    table (``hostagent.OPS``, keyed by ``protocol.Op``)."""
    fn = hostagent.OPS.get(op)
    if fn is None:
        return {"ok": False, "error": "unknown operation %r" % op, "code": protocol.ErrorCode.USAGE}
    try:
        return {"ok": True, "result": fn(req)}
    except Exception as exc:  # one answer back, never a dead server
        return hostagent.error_answer(exc)


_STORE_MADE = threading.Lock()


def answer_once(call_id: str, op: str, req: JsonObject, store: Optional[str]) -> JsonObject:
    """Run the call, or return its recorded answer if this id already completed."""
    if not store:
        return run_op(op, req)
    if not os.path.isdir(store):
        with _STORE_MADE:  # calls arrive on several threads at once
            os.makedirs(store, mode=0o700, exist_ok=True)
            # marked like the agent's other dirs: cleanup removes only what carries a marker
            if safefs.marker_of(store) is None:
                safefs.mark_dir(store, {"kind": "agent"})
    record = os.path.join(store, call_id + ".json")
    lock_path = os.path.join(store, call_id + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # an earlier attempt may still be running it
        recorded = safefs.read_json_file(record)
        if isinstance(recorded, dict) and "answer" in recorded:
            answer = dict(recorded["answer"])
            answer["replayed"] = True
            return answer
        answer = run_op(op, req)
        # an op that removed the store (cleanup of the whole root) is answered unrecorded
        with contextlib.suppress(OSError):
            safefs.write_json_atomic(record, {"op": op, "at": time.time(), "answer": answer})
        with contextlib.suppress(OSError):
            os.unlink(lock_path)
        return answer
    finally:
        os.close(fd)


def prune_store(store: str, keep: int = STORE_KEEP, max_age_s: float = STORE_MAX_AGE_S) -> int:
    """Drop the oldest records past ``keep`` and any older than ``max_age_s``."""
    try:
        names = [n for n in os.listdir(store) if n.endswith(".json")]
    except OSError:
        return 0
    if len(names) <= keep:
        return 0
    aged = []
    for name in names:
        with contextlib.suppress(OSError):
            aged.append((os.stat(os.path.join(store, name)).st_mtime, name))
    aged.sort()
    now = time.time()
    drop = [
        n for i, (mtime, n) in enumerate(aged) if i < len(aged) - keep or now - mtime > max_age_s
    ]
    for name in drop:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(store, name))
    return len(drop)


class Server:
    """Reads requests from ``inp``, runs them in threads, writes answers to ``out``."""

    def __init__(self, inp: BinaryIO, out: BinaryIO) -> None:
        self.inp = inp
        self.out = out
        self.write_lock = threading.Lock()
        self.out_ok = True
        self.served = 0

    def send(self, obj: JsonObject) -> None:
        data = encode_frame(obj)
        with self.write_lock:
            if not self.out_ok:
                return
            try:
                self.out.write(data)
                self.out.flush()
            except (OSError, ValueError):
                self.out_ok = False  # the laptop went away; the answer is recorded

    def handle(self, call: Call) -> None:
        try:
            safe = _safe_id(call.id)
            answer = answer_once(safe, call.op, call.req, call.store)
            if call.store and self.served % 32 == 0:
                prune_store(call.store)
        except Exception as exc:
            answer = hostagent.error_answer(exc)
        self.served += 1
        self.send({"id": call.id, "answer": answer, "cpu_s": cpu_seconds(), "pid": os.getpid()})

    def serve(self) -> int:
        self.send(
            {
                "id": "",
                "hello": 1,
                "protocol": protocol.PROTOCOL_VERSION,
                "pid": os.getpid(),
                "cpu_s": cpu_seconds(),
                "python": sys.version.split()[0],
            }
        )
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            while True:
                try:
                    frame = read_frame(self.inp)
                except (OSError, ValueError):
                    frame = None
                if frame is None:
                    break  # end of input: finish what is in flight, then exit
                call = Call.from_json(frame)
                if call.op == protocol.Op.USAGE:
                    self.send(
                        {
                            "id": call.id,
                            "pid": os.getpid(),
                            "cpu_s": cpu_seconds(),
                            "answer": {"ok": True, "result": {"cpu_s": cpu_seconds()}},
                        }
                    )
                    continue
                pool.submit(self.handle, call)
        return 0


def main(args: Optional[List[str]] = None) -> int:
    """Keep the frame streams on private descriptors; children see /dev/null on 0, 1, 2.

    A daemonised job or tmux server that inherited the channel's pipes would hold
    the SSH channel open (and write into the frame stream).
    """
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a dropped link is not our end
    inp = os.fdopen(os.dup(0), "rb", buffering=0)
    out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    return Server(inp, out).serve()
