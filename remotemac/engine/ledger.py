"""The command ledger: every command remotemac runs on a host, in order.

Written as JSON lines to ``<out>/ledger.jsonl`` (a run) or into a cleanup
record's directory. One entry per command: time, host, operation, the command
line with secrets redacted, exit code, whether it ran privileged (sudo/doas),
duration, and ``via``: ``ssh`` for what the laptop ran, ``agent`` for what the
host agent ran on its behalf (tmux, hdiutil, launchctl, kill…), reported back in
the agent's answer.

Why redaction is belt and braces: secrets (the data key) only ever travel in the
agent's stdin JSON, which is never logged. The ledger still scrubs anything that
looks like one (``key=…``, ``--password …``, long hex or base64 runs) and any
value registered with :meth:`Ledger.add_secret`, in case a future caller slips.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from remotemac.vocab import clock

_ASSIGN = re.compile(
    r"(?i)\b([\w-]*(?:key|token|password|passwd|passphrase|secret|auth)[\w-]*)(=|:\s*)\S+"
)
_FLAG = re.compile(r"(?i)(--?[\w-]*(?:key|token|password|passphrase|secret)[\w-]*)\s+(?!-)\S+")
_HEX = re.compile(r"\b[0-9a-fA-F]{40,}\b")
_B64 = re.compile(r"(?<![\w/+])[A-Za-z0-9+/]{40,}={0,2}(?![\w/+=])")
_PRIVILEGED = ("sudo", "doas", "su")
REDACTED = "<redacted>"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Hide secret-looking parts of a command line."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    text = _ASSIGN.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _FLAG.sub(lambda m: m.group(1) + " " + REDACTED, text)
    text = _HEX.sub(REDACTED, text)
    return _B64.sub(lambda m: m.group(0) if "/" in m.group(0) else REDACTED, text)


def is_privileged(argv_or_command: list[str] | str) -> bool:
    """True when the command runs through sudo/doas/su (also behind ``env`` or a path)."""
    words = (argv_or_command.split() if isinstance(argv_or_command, str)
             else [str(a) for a in argv_or_command])
    for word in words[:3]:
        if os.path.basename(word) in _PRIVILEGED:
            return True
        if os.path.basename(word) != "env" and "=" not in word:
            return False
    return False


class Ledger:
    """Append-only JSON lines; ``path=None`` keeps nothing (plans, dry runs)."""

    def __init__(self, path: Path | None, *, hold: bool = False) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._secrets: set[str] = set()
        self._held: list[str] | None = [] if hold else None

    def flush(self, path: Path | None = None) -> None:
        """Write held entries (``hold=True``: nothing lands until the caller decides)."""
        held, self._held = self._held or [], None
        self.path = path or self.path
        if self.path is not None and held:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.writelines(held)

    def add_secret(self, value: str) -> None:
        """Scrub this exact value from every later entry (e.g. a key's hex)."""
        if value and len(value) >= 6:
            self._secrets.add(value)

    def append(self, host: str, command: str | list[str], exit_code: int | None, *,
               op: str = "", privileged: bool = False, seconds: float = 0.0,
               via: str = "ssh", when: float | None = None) -> None:
        if self.path is None and self._held is None:
            return
        text = command if isinstance(command, str) else " ".join(str(a) for a in command)
        entry = {"time": when if when is not None else time.time(), "host": host, "op": op,
                 "command": redact(text, self._secrets), "exit_code": exit_code,
                 "privileged": bool(privileged or is_privileged(command)),
                 "seconds": round(seconds, 3), "via": via}
        line = json.dumps(entry) + "\n"
        with self._lock:
            if self._held is not None:
                self._held.append(line)
                return
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line)

    def append_steps(self, host: str, op: str, steps: Iterable[dict[str, Any]] | None) -> None:
        """Commands the host agent ran for one operation (``{"argv", "code", "time"}``)."""
        for step in steps or ():
            argv = step.get("argv") or []
            self.append(host, [str(a) for a in argv], step.get("code"), op=op, via="agent",
                        when=step.get("time"))


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """The entries of a ledger file (missing file: none)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def format_entry(entry: dict[str, Any]) -> str:
    """One human line: time, host, exit code, a privileged mark, the command."""
    stamp = clock(entry["time"])  # UTC, as every time remotemac shows
    mark = " [sudo]" if entry.get("privileged") else ""
    via = "  (agent)" if entry.get("via") == "agent" else ""
    return f"{stamp}  {entry['host']}  exit={entry['exit_code']}{mark}  {entry['command']}{via}"
