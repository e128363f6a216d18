"""Reading a YAML file the user named (a playbook, an inventory): one line when it fails.

Why one place: the playbook and the inventory each read their file, turned a
missing or unreadable one into an error, and located a YAML syntax error, in
copies that had begun to differ.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from remotemac.errors import BadInput


def read_user_file(path: Path, what: str) -> str:
    """The file's text; BadInput (exit 2) naming it when missing, unreadable or not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read {what}: {exc}") from None


def yaml_error_where(exc: yaml.YAMLError, source: str) -> str:
    """``source:line:column`` of a YAML syntax error (``source`` when there is no mark)."""
    mark = getattr(exc, "problem_mark", None)
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
