"""Choose which dataset files travel to the host, and say why for each one.

Why: research data may be sensitive, so the user must see exactly which files will
leave the machine (and which were left out, and why) before a byte is sent, and the
same playbook must pick the same files every time. Selection is therefore a pure
function of the directory tree and the playbook: globs, then a seeded sample, then
a byte cap, all in deterministic orders.

Glob rules (matched against the POSIX path relative to the data root):

* ``*`` and ``?`` never cross ``/``; ``[abc]`` is a character class;
* ``**`` matches any number of whole directories, so ``**/*.csv`` also matches a
  top-level ``a.csv``;
* a pattern without ``/`` matches the file name at any depth (like ``.gitignore``);
* a pattern ending in ``/`` matches everything below that directory.
"""

from __future__ import annotations

import os
import random
import re
import stat
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from remotemac.agent.protocol import reserved_data_path
from remotemac.data.names import refuse_collisions
from remotemac.errors import BadInput

#: why a file a pattern picked up stays on the laptop: the host keeps these names for
#: its own files (the sync would refuse it); the sync phase warns with each one
RESERVED_SKIP = "skipped: a name the host keeps for remotemac's own files"
#: a candidate's reason while it waits for the excludes (see _candidates)
_PICKED_RESERVED = "\0picked by a pattern, reserved"


@dataclass(frozen=True)
class SliceFile:
    """One chosen file: POSIX path relative to the root, size in bytes, and why."""

    path: str
    size: int
    reason: str


@dataclass
class SliceSelection:
    """The chosen files (sorted by path) and every file left out with its reason."""

    root: str
    files: list[SliceFile] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_dict(self) -> dict:
        """Plain form for ``--dry-run --json`` and the record."""
        return {
            "root": self.root,
            "files": [{"path": f.path, "size": f.size, "reason": f.reason} for f in self.files],
            "skipped": [{"path": p, "reason": r} for p, r in self.skipped],
            "total_bytes": self.total_bytes,
        }


def _candidates(
    root: Path,
    real_root: Path,
    include: list[str],
    files: list[str] | None,
    selection: SliceSelection,
) -> list[tuple[str, int, str]]:
    """(path, size, reason) of every file the slice may take: the listed ``files``,
    else those under ``root`` matching ``include``; the rest go to ``selection.skipped``."""
    candidates: list[tuple[str, int, str]] = []
    if files is not None:
        for rel in files:
            size, problem = _inspect(real_root, _normalise_listed(rel))
            if problem:
                raise BadInput(f"data file {rel!r} in {root}: {problem}", hint="fix data.files")
            candidates.append((_normalise_listed(rel), size, "listed in data.files"))
    else:
        for rel, size, problem in _walk(real_root):
            if problem:
                selection.skipped.append((rel, f"skipped: {problem}"))
                continue
            matched = _first_match(rel, include) if include else "**"
            if matched is None:
                selection.skipped.append((rel, "skipped: matches no include pattern"))
                continue
            if reserved_data_path(rel) and not any(_names(p, rel) for p in include):
                # only a pattern picked it up: left out after the excludes (a warning
                # says so) rather than fail the sync; a path named outright still fails
                candidates.append((rel, size, _PICKED_RESERVED))
                continue
            reason = f"matched {matched}" if include else "all files (no include patterns)"
            candidates.append((rel, size, reason))
    return candidates


def select_slice(
    root: Path,
    include: list[str],
    exclude: list[str],
    max_bytes: int | None,
    sample_files: int | None,
    seed: int,
    files: list[str] | None = None,
) -> SliceSelection:
    """Pick the slice: candidates, then sample, then the ``max_bytes`` cap.

    Candidates are the files matching any ``include`` pattern (all files when
    ``include`` is empty) and no ``exclude`` pattern; with an explicit ``files``
    list, those files are the candidates (``include`` is not consulted, ``exclude``
    still applies, and a listed file that is missing or unsafe is an error).
    The sample is ``random.Random(seed).sample`` over the path-sorted candidates.
    The cap then walks the candidates in sample order (path order without a
    sample) and keeps each file that still fits, so one large file does not
    starve the rest. Symlinks are followed only when they stay inside ``root``.
    """
    root = Path(root)
    if not root.is_dir():
        raise BadInput(f"data path {root} is not a directory", hint="check data.path")
    if max_bytes is not None and max_bytes < 0:
        raise BadInput(f"data.max_bytes must be >= 0, got {max_bytes}")
    if sample_files is not None and sample_files < 0:
        raise BadInput(f"data.sample.files must be >= 0, got {sample_files}")
    real_root = root.resolve()
    selection = SliceSelection(root=str(root))

    candidates = _candidates(root, real_root, include, files, selection)

    kept: list[tuple[str, int, str]] = []
    for rel, size, reason in sorted(set(candidates)):
        excluded = _first_match(rel, exclude)
        if excluded is not None:
            selection.skipped.append((rel, f"skipped: excluded by {excluded}"))
        elif reason == _PICKED_RESERVED:  # (after the excludes: one excluded needs no warning)
            selection.skipped.append((rel, RESERVED_SKIP))
        else:
            kept.append((rel, size, reason))

    if sample_files is not None and sample_files < len(kept):
        picked = random.Random(seed).sample(kept, sample_files)
        picked_set = set(picked)
        note = f"sampled {sample_files} of {len(kept)} (seed {seed})"
        for rel, _size, _reason in kept:
            if (rel, _size, _reason) not in picked_set:
                selection.skipped.append((rel, f"skipped: not sampled (seed {seed})"))
        kept = [(rel, size, f"{reason}; {note}") for rel, size, reason in picked]

    total = 0
    for rel, size, reason in kept:
        if max_bytes is not None and total + size > max_bytes:
            selection.skipped.append((rel, f"skipped: over max_bytes ({max_bytes})"))
            continue
        total += size
        selection.files.append(SliceFile(rel, size, reason))
    selection.files.sort(key=lambda f: f.path)
    selection.skipped.sort()
    refuse_collisions(
        (f.path for f in selection.files),
        f"data slice of {root}",
        "rename one of them, or leave one out with data.exclude",
    )
    return selection


def glob_match(rel: str, pattern: str) -> bool:
    """True when the relative POSIX path ``rel`` matches ``pattern`` (rules in the module doc)."""
    return _compile(pattern).fullmatch(rel) is not None


def _first_match(rel: str, patterns: list[str]) -> str | None:
    for pattern in patterns:
        if glob_match(rel, pattern):
            return pattern
    return None


@lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    pat = pattern.strip()
    if pat.startswith("./"):
        pat = pat[2:]
    anchored = "/" in pat.rstrip("/")
    if pat.endswith("/"):
        pat += "**"
    if not anchored:
        pat = "**/" + pat
    out: list[str] = []
    i = 0
    while i < len(pat):
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pat.startswith("**", i):
            out.append(".*")
            i += 2
        elif pat[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pat[i] == "?":
            out.append("[^/]")
            i += 1
        elif pat[i] == "[" and "]" in pat[i + 2 :]:
            end = pat.index("]", i + 2)
            body = pat[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pat[i]))
            i += 1
    return re.compile("".join(out))


def _names(pattern: str, rel: str) -> bool:
    """Whether include ``pattern`` is ``rel`` itself, written out (no glob)."""
    return _normalise_listed(pattern.strip()) == rel


def _normalise_listed(rel: str) -> str:
    rel = rel.replace("\\", "/")
    while rel.startswith("./"):
        rel = rel[2:]
    return rel


def _walk(real_root: Path):
    """Yield ``(relpath, size, problem)`` for every entry that is not a plain directory."""
    for dirpath, dirnames, filenames in os.walk(real_root, followlinks=False):
        base = Path(dirpath)
        for name in sorted(dirnames):
            full = base / name
            if full.is_symlink():
                rel = full.relative_to(real_root).as_posix()
                yield rel, 0, "symlinked directory (not followed)"
        for name in filenames:
            rel = (base / name).relative_to(real_root).as_posix()
            size, problem = _inspect(real_root, rel)
            yield rel, size, problem


def _inspect(real_root: Path, rel: str) -> tuple[int, str | None]:
    """Size of ``rel`` under the root, or why it cannot be part of a slice."""
    if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in rel.split("/")):
        return 0, "not a plain relative path"
    if any(ord(c) < 32 or ord(c) == 127 for c in rel) or "\\" in rel:
        return 0, "name has a control character or backslash"
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return 0, "name is not valid UTF-8"
    full = real_root / rel
    try:
        resolved = full.resolve(strict=True)
    except (OSError, RuntimeError):
        return 0, "missing or broken symlink"
    if resolved != real_root and real_root not in resolved.parents:
        return 0, "symlink escapes the data root"
    try:
        info = resolved.stat()
    except OSError as exc:
        return 0, f"cannot stat ({exc.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return 0, "not a regular file"
    return info.st_size, None
