"""Claiming remote_root: before provision writes anything, make the root or adopt it,
and mark it as remotemac's (moved out of cleanupops, issue 36).

Why a module of its own: the claim runs from memory (the agent is installed below
the root it claims), so its sources travel on stdin and are compiled on the host at
every run. Inside cleanupops it shipped sixteen modules, some 240 KB, to be compiled
by the host's Python before the first answer; here it needs protocol and safefs.

Standard library only, Python 3.9.
"""

from __future__ import annotations

import errno
import os
from typing import Optional, Tuple

from . import safefs
from .protocol import JsonObject

SYSTEM_DIRS = frozenset(
    [
        "/",
        "/bin",
        "/sbin",
        "/usr",
        "/usr/bin",
        "/usr/sbin",
        "/usr/lib",
        "/usr/local",
        "/usr/local/bin",
        "/usr/share",
        "/etc",
        "/var",
        "/var/tmp",
        "/tmp",
        "/private",
        "/private/tmp",
        "/private/var",
        "/private/etc",
        "/System",
        "/Library",
        "/Applications",
        "/Users",
        "/Users/Shared",
        "/home",
        "/opt",
        "/opt/homebrew",
        "/dev",
        "/dev/shm",
        "/proc",
        "/sys",
        "/root",
        "/Volumes",
        "/cores",
        "/boot",
        "/lib",
        "/lib64",
        "/lib32",
        "/srv",
        "/mnt",
        "/media",
        "/run",
        "/snap",
        "/nix",
        "/Network",
    ]
)


class UnsafeRoot(Exception):
    """The root is not a place remotemac may delete in."""


def check_root(root: str) -> Tuple[str, str]:
    """``(lexical, real)`` absolute forms of ``root``, or raise :class:`UnsafeRoot`."""
    text = (root or "").strip()
    if not text:
        raise UnsafeRoot("remote_root is empty")
    expanded = os.path.expanduser(text) if text.startswith("~") else text
    if not os.path.isabs(expanded):
        raise UnsafeRoot("remote_root %r is not absolute" % root)
    if ".." in expanded.split("/"):
        raise UnsafeRoot("remote_root %r contains '..'" % root)
    norm = os.path.normpath(expanded)
    real = os.path.realpath(norm)
    home = os.path.normpath(os.path.expanduser("~"))
    homes = {home, os.path.realpath(home)}
    for candidate in (norm, real):
        if candidate in SYSTEM_DIRS or len(candidate.strip("/").split("/")) < 2:
            raise UnsafeRoot("remote_root %r is a system dir" % root)
        for h in homes:
            if candidate == h or h.startswith(candidate.rstrip("/") + "/"):
                raise UnsafeRoot("remote_root %r is the home dir or holds it" % root)
    return norm, real


def op_claim_root(req: JsonObject) -> JsonObject:
    """Before provision writes anything: make remote_root, or adopt it, and mark it.

    Refused (``{"refused": why}``, nothing written): a root that is, holds or sits
    above the home or a system dir, or an existing directory holding entries
    remotemac did not write (a later cleanup would delete them). Run in memory
    (engine/cleanup.py), because the agent is installed below the root.
    """
    import secrets

    try:
        lexical, real_root = check_root(req["root"])
    except UnsafeRoot as exc:
        return {"refused": str(exc)}
    if os.path.islink(lexical):
        # writing through it would provision its target, which cleanup then refuses
        return {
            "refused": "it is a symlink (to %s); give the real path or a new directory"
            % os.readlink(lexical)
        }
    outer = _enclosing_root(real_root)
    if outer is not None:
        return {
            "refused": "%s is inside remotemac's remote_root %s (a cleanup of either would "
            "leave the other half-removed): use %s itself, or a directory outside it"
            % (lexical, outer, outer)
        }
    parent = os.path.dirname(real_root)
    try:
        if not os.path.isdir(parent):
            os.makedirs(parent, 0o700)
        marker, created = safefs.ensure_owned_dir(
            real_root,
            {"kind": "root", "root_id": secrets.token_hex(8), "run_id": req.get("run_id")},
        )
    except safefs.NotOurs as exc:
        return {"refused": "%s; choose a new or empty directory for remote_root" % exc}
    except OSError as exc:
        why = "cannot create %s: %s" % (lexical, exc.strerror or exc)
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            # not the root's fault: the disk's, which the user can free (exit 6, not 2)
            return {"refused": why, "code": "no-space"}
        return {"refused": why}
    answer = {
        "root": lexical,
        "real_root": real_root,
        "root_id": marker.get("root_id"),
        "created": created,
    }
    version = req.get("agent_version")
    if isinstance(version, str) and version.isalnum():
        # whether this agent is installed below the root already: the laptop's stat of
        # its marker (an SFTP session and a round trip) is then not needed (issue 36)
        answer["agent_ready"] = os.path.isfile(
            os.path.join(real_root, "agent", version, ".complete")
        )
    return answer


def _enclosing_root(real_root: str) -> Optional[str]:
    """The remotemac root (a directory whose own marker says ``root``) above
    ``real_root``, if any."""
    here = os.path.dirname(real_root)
    while True:
        marker = safefs.marker_of(here)
        if marker is not None and marker.get("kind") == "root":
            try:
                if safefs.marker_is_bound(marker, os.stat(here)):
                    return here
            except OSError:
                pass
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up
