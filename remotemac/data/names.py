"""Names that are one file on a Mac: refuse them on the laptop before any byte moves.

Why: APFS (a Mac's default) and the HFS+ RAM disk remotemac formats match names
case-insensitively and normalization-insensitively (HFS+ stores them as NFD). Two
laptop files ``A.csv`` and ``a.csv``, or ``café.csv`` in NFC and in NFD, land on one
host file: the second overwrote the first (a project's tar member, a dataset file),
or the two transfers' temporary names collided, and a run could be accepted with the
bytes of one of them nowhere. So a dataset slice, a project upload and a pull whose
names collide in :func:`name_key` are refused with one line naming both paths.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from remotemac.errors import BadInput


def name_key(rel: str) -> str:
    """One key for every spelling of a name a Mac volume treats as the same file."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", rel).casefold())


def first_collision(paths: Iterable[str]) -> tuple[str, str] | None:
    """The first two paths (in the order given) that are one file on a Mac, or None."""
    seen: dict[str, str] = {}
    for rel in paths:
        key = name_key(rel)
        other = seen.get(key)
        if other is not None and other != rel:
            return other, rel
        seen.setdefault(key, rel)
    return None


def refuse_collisions(paths: Iterable[str], what: str, hint: str) -> None:
    """BadInput (exit 2) naming both paths when two of ``paths`` collide on a Mac."""
    clash = first_collision(paths)
    if clash is not None:
        a, b = clash
        raise BadInput(
            f"{what}: {a!r} and {b!r} are one file on a Mac "
            "(its disks ignore case and Unicode normalization)",
            hint=hint,
        )
