"""Reading a YAML file the user named (a playbook, an inventory): one line when it fails.

Why one place: the playbook and the inventory each read their file, turned a
missing or unreadable one into an error, and located a YAML syntax error, in
copies that had begun to differ.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from remotemac.errors import BadInput

#: a playbook or an inventory is written by hand: far below this (checked before reading)
MAX_USER_FILE_BYTES = 1 << 20
#: digits of one integer in a YAML file: Python refuses above 4300 (an internal error)
MAX_INT_DIGITS = 100


def read_user_file(path: Path, what: str, max_bytes: int = MAX_USER_FILE_BYTES) -> str:
    """The file's text; BadInput (exit 2) naming it when missing, unreadable, not UTF-8,
    not a regular file (``/dev/zero``, a FIFO: read until OOM, or blocked for ever) or
    larger than ``max_bytes``. The error never quotes the file's content."""
    try:
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such {what}") from None
    except OSError as exc:
        raise BadInput(f"{path}: cannot read {what}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BadInput(
                f"{path}: not a regular file (a device, FIFO or directory): give a {what} file"
            )
        limit = f"a {what} is at most {max_bytes >> 20} MiB"
        if info.st_size > max_bytes:
            raise BadInput(f"{path}: {info.st_size >> 20} MiB is too large ({limit})")
        try:
            data = fh.read(max_bytes + 1)  # a file growing while read stays bounded
        except OSError as exc:
            raise BadInput(f"{path}: cannot read {what}: {exc.strerror}") from None
    if len(data) > max_bytes:
        raise BadInput(f"{path}: too large ({limit})")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: cannot read {what}: not UTF-8 text (byte {exc.start})") from None


def bounded_int(loader: Any, node: yaml.ScalarNode) -> Any:
    """YAML's int constructor, refusing an integer of more than ``MAX_INT_DIGITS`` digits
    as a YAML error at its line (Python's own limit is a ValueError with no line)."""
    digits = sum(c.isdigit() for c in str(node.value))
    if digits > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"a number of {digits} digits (at most {MAX_INT_DIGITS})", node.start_mark
        )
    return yaml.SafeLoader.construct_yaml_int(loader, node)


class BoundedLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """yaml.safe_load's loader with :func:`bounded_int` (inventory files)."""


BoundedLoader.add_constructor("tag:yaml.org,2002:int", bounded_int)


def yaml_error_where(exc: yaml.YAMLError, source: str) -> str:
    """``source:line:column`` of a YAML syntax error (``source`` when there is no mark)."""
    mark = getattr(exc, "problem_mark", None)
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
