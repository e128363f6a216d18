"""The command ledger: every command remotemac runs on a host, in order.

Written as JSON lines to ``<out>/ledger.jsonl``. Request bodies are never logged
(they may carry the data key); only the operation, its argv and exit code.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

_SECRET = re.compile(r"(?i)(key|token|password|secret)=\S+")


def redact(text: str) -> str:
    return _SECRET.sub(lambda m: m.group(1) + "=<redacted>", text)


class Ledger:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def append(self, host: str, command: str, exit_code: int | None, *, op: str = "",
               privileged: bool = False, seconds: float = 0.0) -> None:
        if self.path is None:
            return
        entry = {"time": time.time(), "host": host, "op": op, "command": redact(command),
                 "exit_code": exit_code, "privileged": privileged or command.startswith("sudo "),
                 "seconds": round(seconds, 3)}
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
