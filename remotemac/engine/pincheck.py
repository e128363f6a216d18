"""Does the pinned torch exist for the Python the workload will get? Asked before renting time.

Why: torch dropped Python 3.9 at 2.9 (the newest cp39 wheel for macOS arm64 is
2.8.0), so ``torch==2.13.0`` on a Mac's own ``/usr/bin/python3`` fails only after
the upload, deep in pip's resolver (``ResolutionImpossible``). PyPI's JSON API
(``https://pypi.org/pypi/<name>/json``) lists every release's wheel files; their
tags say which Pythons and platforms each pin can install on. Only pins of the
packages that ship per-Python binary wheels and decide the workload are asked
(:data:`CHECKED`); the answers are cached in ``<home>/sources``. Without network
the answer is "could not check", never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from remotemac.agent.shared import parse_wheel_name
from remotemac.engine.pythonsource import HostTags, WheelFile, pypi_json, retag

CHECKED = ("torch", "torchvision", "torchaudio")
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;#,]+)")


@dataclass(frozen=True)
class PinVerdict:
    """One pin against one Python and platform."""

    name: str
    version: str
    ok: bool | None  # None: could not check
    line: str  # what to tell the user, one line
    pythons: tuple[str, ...] = ()  # the CPython versions the pin has wheels for (here)


def pins(requirements: bytes) -> list[tuple[str, str]]:
    """(name, version) of each ``name==version`` line for the packages in :data:`CHECKED`."""
    out = []
    for line in requirements.decode("utf-8", "replace").splitlines():
        found = _PIN.match(line)
        if found and re.sub(r"[-_.]+", "-", found.group(1).lower()) in CHECKED:
            out.append((found.group(1).lower(), found.group(2).split("+")[0]))
    return out


def _cp_versions(files: list[WheelFile], platforms: list[str] | None) -> list[str]:
    """``["3.10", "3.11", …]``: the CPythons with a wheel (on ``platforms``, if given)."""
    found = set()
    for f in files:
        if not f.filename.endswith(".whl"):
            continue
        for py, abi, plat in parse_wheel_name(f.filename)[2]:
            hit = re.fullmatch(r"cp3(\d+)", py)
            if hit and abi != f"{py}t" and (platforms is None or plat in platforms):
                found.add(int(hit.group(1)))
    return [f"3.{m}" for m in sorted(found)]


def check_pin(
    home: Path | None,
    name: str,
    version: str,
    python: str | None,
    tags: HostTags | None,
) -> PinVerdict:
    """Is there a wheel of ``name==version`` for CPython ``python`` (``major.minor[.patch]``)
    on the host ``tags`` describe (agentruntime.host_tags)? ``tags=None``: any platform."""
    pin = f"{name}=={version}"
    try:
        files = pypi_json(home, name).releases.get(version)
    except (OSError, ValueError, KeyError) as exc:
        return PinVerdict(name, version, None, f"{pin}: could not check on PyPI ({exc})")
    if files is None:
        return PinVerdict(name, version, False, f"{pin}: PyPI has no such release")
    platforms = list(tags.platforms) if tags else None
    have = tuple(_cp_versions(files, platforms))
    where = f"{tags.system} {tags.machine}" if tags else "any platform"
    if python is None:
        return PinVerdict(
            name, version, None, f"{pin} has wheels for CPython {_span(have)} on {where}", have
        )
    short = ".".join(python.split(".")[:2])
    if tags:
        accepted = retag(tags, python).accepted()
        ok = any(
            parse_wheel_name(f.filename)[2] & accepted for f in files if f.filename.endswith(".whl")
        )
    else:
        ok = short in have
    if ok:
        return PinVerdict(
            name, version, True, f"{pin} has a wheel for CPython {short} on {where}", have
        )
    return PinVerdict(
        name,
        version,
        False,
        f"{pin} has no wheel for CPython {short} on {where} (it has CPython {_span(have)})",
        have,
    )


def _span(versions: tuple[str, ...]) -> str:
    if not versions:
        return "none"
    return versions[0] if len(versions) == 1 else f"{versions[0]}–{versions[-1]}"
