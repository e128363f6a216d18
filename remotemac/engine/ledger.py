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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import JsonObject, Message
from remotemac.vocab import clock

# Every pattern starts only at a token boundary and bounds its backtracking, so a
# 300 KB command line is redacted in milliseconds (an unbounded ``[\w-]*key[\w-]*``
# took minutes on ``a-a-a-…``).
_SECRET_WORD = re.compile(
    r"(?i)key|token|password|passwd|passphrase|secret|auth|credential"
    r"|pwd|pass"
)
_VALUE = r"""(?!<redacted>)(?:'[^']{0,4096}'?|"[^"]{0,4096}"?|[^\s&;|]+)"""  # quoted or a word
_VALUE_AT = re.compile(_VALUE)
_ASSIGN = re.compile(r"(?<![\w-])([\w-]{1,64})(=|:[ \t]*)")
_FLAG = re.compile(r"(?<![\w-])(--?[\w-]{1,64})([ \t]+)(?!-)")
_FLAG_WORD = re.compile(r"(?i)key|token|password|passphrase|secret|passwd|pwd|^--?pass$")
_BEARER = re.compile(r"(?i)\b(bearer|basic|token)(\s+)(?!<redacted>)[A-Za-z0-9._~+/=-]{6,}")
_URL_CREDS = re.compile(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]{0,30}://)[^/\s@]{1,512}@")
_SHORT_PASS = re.compile(r"(?<!\S)-p(?!<redacted>)([^\s-][^\s]{3,})")
_HEX = re.compile(r"\b[0-9a-fA-F]{32,}\b")
_B64 = re.compile(r"(?<![\w/+-])[A-Za-z0-9+/_-]{32,}={0,2}(?![\w/+=-])")
_PRIVILEGED = ("sudo", "doas", "su")
REDACTED = "<redacted>"


def _classes(text: str) -> int:
    """How many of lower, upper, digit occur in ``text``."""
    return sum(
        (
            any(c.islower() for c in text),
            any(c.isupper() for c in text),
            any(c.isdigit() for c in text),
        )
    )


def _changes(text: str) -> float:
    """Share of neighbouring characters of different kinds: random tokens flip often
    (about 0.6), words and paths rarely (about 0.3)."""

    def kind(c: str) -> int:
        return 0 if c.islower() else 1 if c.isupper() else 2 if c.isdigit() else 3

    flips = sum(kind(a) != kind(b) for a, b in zip(text, text[1:], strict=False))
    return flips / max(1, len(text) - 1)


def _looks_random(token: str) -> bool:
    """A base64 / url-safe base64 run that is a key, not a path or an identifier.

    Why not "every long run": paths (``/Users/me/project/runs``), run ids
    (``tiny-mlp-20261130-160915-ab12``) and session names are long runs of the same
    alphabet. A run is kept when it reads like one of those: it has separators
    (``/``, ``-``, ``_``) and few flips between lower, upper and digits, or it
    holds no mix of them at all.
    """
    body = token.rstrip("=")
    seps = sum(body.count(c) for c in "/-_")
    if seps == 0:
        return True  # one unbroken 32+ run of the alphabet: a key whatever it holds
    if _classes(body) < 2:
        return False
    if body.startswith(("/", "~")) and seps * 16 >= len(body):
        return _changes(body) >= 0.5  # a path, unless it reads like noise
    return _changes(body) >= 0.4 or seps * 20 < len(body)


def _redact_values(name_at: re.Pattern[str], secret_name: re.Pattern[str], text: str) -> str:
    """Redact the value after each ``name=``/``--name `` whose name sounds secret.

    One left-to-right pass: a non-secret name's value is not consumed, so
    ``url=https://x?token=abc`` still loses its token.
    """
    out: list[str] = []
    pos = 0
    for m in name_at.finditer(text):
        if m.start() < pos or not secret_name.search(m.group(1)):
            continue
        value = _VALUE_AT.match(text, m.end())
        if value is None or not value.group(0):
            continue
        out += [text[pos : m.end()], REDACTED]
        pos = value.end()
    out.append(text[pos:])
    return "".join(out)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """Hide secret-looking parts of a command line (or any text bound for a record).

    Covers exact values registered as secrets, ``NAME=value``/``name: value`` for
    secret-sounding names, ``--password X``/``--pass X``/``--token X``, ``-pPASS``,
    ``Bearer``/``Basic`` credentials, ``scheme://user:pass@`` in URLs, long hex, and
    long base64 (standard or url-safe, with ``/``) that is not a path.
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _URL_CREDS.sub(lambda m: m.group(1) + REDACTED + "@", text)
    text = _BEARER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    text = _redact_values(_ASSIGN, _SECRET_WORD, text)
    text = _redact_values(_FLAG, _FLAG_WORD, text)
    text = _SHORT_PASS.sub("-p" + REDACTED, text)
    text = _HEX.sub(REDACTED, text)
    return _B64.sub(lambda m: m.group(0) if _public(m) else REDACTED, text)


def _public(match: re.Match[str]) -> bool:
    """A base64 run that is no secret: a path-like run, or an SSH host key fingerprint
    (``SHA256:…``, what the provider publishes and the user compares)."""
    if match.string[max(0, match.start() - 7) : match.start()] == "SHA256:":
        return True
    return not _looks_random(match.group(0))


def is_privileged(argv_or_command: list[str] | str) -> bool:
    """True when the command runs through sudo/doas/su (also behind ``env`` or a path)."""
    words = (
        argv_or_command.split()
        if isinstance(argv_or_command, str)
        else [str(a) for a in argv_or_command]
    )
    for word in words[:3]:
        if os.path.basename(word) in _PRIVILEGED:
            return True
        if os.path.basename(word) != "env" and "=" not in word:
            return False
    return False


@dataclass
class AgentStep(Message):
    """One command the host agent ran for an operation: an answer's ``steps`` item
    (``{"argv", "code", "time"}``)."""

    argv: list[Any] = field(default_factory=list)
    code: int | None = None
    time: float | None = None


@dataclass
class LedgerEntry(Message):
    """One line of ``ledger.jsonl``: a command run on a host, redacted."""

    time: float = 0.0
    host: str = ""
    op: str = ""
    command: str = ""
    exit_code: int | None = None
    privileged: bool = False
    seconds: float = 0.0
    via: str = "ssh"

    def to_json(self) -> JsonObject:
        # every key always (exit_code too when None): the line's shape does not vary
        out: JsonObject = {
            "time": self.time,
            "host": self.host,
            "op": self.op,
            "command": self.command,
            "exit_code": self.exit_code,
            "privileged": self.privileged,
            "seconds": self.seconds,
            "via": self.via,
        }
        out.update(self.extra)
        return out


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

    def append(
        self,
        host: str,
        command: str | list[str],
        exit_code: int | None,
        *,
        op: str = "",
        privileged: bool = False,
        seconds: float = 0.0,
        via: str = "ssh",
        when: float | None = None,
    ) -> None:
        if self.path is None and self._held is None:
            return
        text = command if isinstance(command, str) else " ".join(str(a) for a in command)
        entry = LedgerEntry(
            time=when if when is not None else time.time(),
            host=host,
            op=op,
            command=redact(text, self._secrets),
            exit_code=exit_code,
            privileged=bool(privileged or is_privileged(command)),
            seconds=round(seconds, 3),
            via=via,
        )
        line = json.dumps(entry.to_json()) + "\n"
        with self._lock:
            if self._held is not None:
                self._held.append(line)
                return
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line)

    def append_steps(
        self, host: str, op: str, steps: Iterable[AgentStep | JsonObject] | None
    ) -> None:
        """Commands the host agent ran for one operation (an answer's ``steps``, as
        :class:`AgentStep` or still as the JSON it came in)."""
        for item in steps or ():
            step = item if isinstance(item, AgentStep) else AgentStep.from_json(item)
            self.append(
                host,
                [str(a) for a in step.argv or []],
                step.code,
                op=op,
                via="agent",
                when=step.time,
            )


def format_entry(line: JsonObject) -> str:
    """One human line of a ledger line just read: time, host, exit code, a privileged
    mark, the command."""
    entry = LedgerEntry.from_json(line)
    stamp = clock(entry.time)  # UTC, as every time remotemac shows
    mark = " [sudo]" if entry.privileged else ""
    via = "  (agent)" if entry.via == "agent" else ""
    return f"{stamp}  {entry.host}  exit={entry.exit_code}{mark}  {entry.command}{via}"
