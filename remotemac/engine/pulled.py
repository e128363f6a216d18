"""What a pull reads from the host and what it keeps: the output listing's entries and
one side's result (the files verified, those skipped and why, the bytes moved).

Why apart from engine/pull.py: these are the records (the pull phase's result per side
is :meth:`PulledSide.to_json`, key for key what it always was); pull.py is the work of
checking names and moving bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remotemac.agent.protocol import JsonObject, Message


@dataclass
class ListingEntry(Message):
    """One entry of the host's output listing (``list_outputs``, agent/hostagent.py):
    ``name_hex`` (the name's bytes; an older agent gives only ``path``), ``kind``,
    ``size`` and, in the hashed listing, ``sha256``. The host is not trusted: the fields
    stay as it sent them and are checked before use (:func:`entry_name`,
    :func:`safe_relpath`, :func:`_refuse`)."""

    path: Any = None
    name_hex: Any = None
    kind: Any = None
    size: Any = None
    sha256: Any = None


@dataclass(frozen=True)
class NotAnEntry:
    """A listing item that is not an object at all (shown in the skip, never pulled)."""

    raw: Any


Listed = ListingEntry | NotAnEntry


@dataclass(frozen=True)
class PulledFile:
    """A result verified and in place below the side's results dir."""

    path: str
    size: int
    sha256: str

    def to_json(self) -> JsonObject:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: JsonObject) -> PulledFile:
        return cls(data["path"], data["size"], data["sha256"])


@dataclass(frozen=True)
class SkippedFile:
    """A listed entry not pulled, and why (its name as shown: the host's words, escaped)."""

    path: str
    why: str

    def to_json(self) -> JsonObject:
        return {"path": self.path, "why": self.why}

    @classmethod
    def from_json(cls, data: JsonObject) -> SkippedFile:
        return cls(data["path"], data["why"])


@dataclass(frozen=True)
class PullBytes:
    """The listed files' bytes: in all, moved over the link, already here (a complete
    file or a ``.rmpart``'s verified prefix)."""

    total: int = 0
    moved: int = 0
    reused: int = 0

    def to_json(self) -> JsonObject:
        return {"total": self.total, "moved": self.moved, "reused": self.reused}

    @classmethod
    def from_json(cls, data: JsonObject) -> PullBytes:
        return cls(data["total"], data["moved"], data["reused"])


@dataclass
class PulledSide:
    """What one side's pull brought: the local dir, the files verified, those skipped,
    the bytes that travelled (``downloaded``, as ``bytes.moved``), and (pull_side) the
    evidence files copied next to the log. Its JSON is the pull result's per side."""

    dir: str
    files: list[PulledFile] = field(default_factory=list)
    skipped: list[SkippedFile] = field(default_factory=list)
    downloaded: int = 0
    bytes: PullBytes = field(default_factory=PullBytes)
    evidence: list[str] | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "dir": self.dir,
            "files": [f.to_json() for f in self.files],
            "skipped": [s.to_json() for s in self.skipped],
            "downloaded": self.downloaded,
            "bytes": self.bytes.to_json(),
        }
        if self.evidence is not None:
            out["evidence"] = list(self.evidence)
        return out

    @classmethod
    def from_json(cls, data: JsonObject) -> PulledSide:
        return cls(
            dir=data["dir"],
            files=[PulledFile.from_json(f) for f in data["files"]],
            skipped=[SkippedFile.from_json(s) for s in data["skipped"]],
            downloaded=data["downloaded"],
            bytes=PullBytes.from_json(data["bytes"]),
            evidence=data.get("evidence"),
        )
