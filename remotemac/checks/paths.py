"""``remotemac check``: the paths a playbook names exist on this machine.

Validation of the keys alone said ``ok`` for a playbook whose ``project.path``
did not exist, and ``run --dry-run`` then failed on it; ``check`` now looks at
the same paths the run will read, and names the line each is written on.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from remotemac.errors import RemotemacError
from remotemac.playbook import Playbook, PlaybookLoader, mark_for, parse_yaml
from remotemac.userfiles import read_user_file


def playbook_path_problems(pb: Playbook, filename: str | Path) -> list[str]:
    """One ``file:line:col: key: problem`` line per missing path, sorted by line."""
    try:
        root = yaml.compose(Path(filename).read_text(encoding="utf-8"), Loader=PlaybookLoader)
    except (OSError, yaml.YAMLError):
        root = None
    wanted: list[tuple[list[str], Path | None, bool]] = [
        (["project", "path"], pb.project_dir(), True)
    ]
    if pb.data is not None:
        wanted.append((["data", "path"], pb.data_dir(), True))
    requirements = getattr(pb.environment, "requirements", None)
    if requirements:
        wanted.append((["environment", "requirements"], pb.project_dir() / requirements, False))
    return _missing(filename, root, wanted)


def raw_path_problems(filename: str | Path) -> list[str]:
    """The same checks on the file's raw YAML, for a playbook whose values do not
    validate yet: ``check`` then reports its path problems in the same pass as its
    value errors (a user fixed the values, ran check again, and only then learnt that
    ``project.path`` did not exist). A key whose value is not a string is left to the
    value errors."""
    try:  # bounded and parsed as load_playbook does (/dev/zero, 5,000 digits: its errors)
        text = read_user_file(Path(filename), "playbook")
        root, data = parse_yaml(text)
    except (OSError, yaml.YAMLError, RecursionError, ValueError, RemotemacError):
        return []
    if not isinstance(data, dict):
        return []
    base = Path(filename).resolve().parent

    def value(section: str, key: str, default: str | None = None) -> str | None:
        part = data.get(section)
        found = part.get(key, default) if isinstance(part, dict) else default
        return found if isinstance(found, str) else None

    project = value("project", "path", ".")
    wanted: list[tuple[list[str], Path | None, bool]] = []
    if project is not None:
        wanted.append((["project", "path"], (base / project).resolve(), True))
    data_path = value("data", "path")
    if data_path is not None:
        wanted.append((["data", "path"], (base / data_path).resolve(), True))
    requirements = value("environment", "requirements")
    if requirements and project is not None:
        wanted.append(
            (["environment", "requirements"], (base / project).resolve() / requirements, False)
        )
    return _missing(filename, root, wanted)


def _missing(
    filename: str | Path, root: object, wanted: list[tuple[list[str], Path | None, bool]]
) -> list[str]:
    found: list[tuple[tuple[int, int], str]] = []
    for loc, path, is_dir in wanted:
        if path is None or path.exists():
            continue
        mark = mark_for(root, loc, key_node=False) or (1, 1)
        kind = "directory" if is_dir else "file"
        found.append(
            (
                mark,
                f"{filename}:{mark[0]}:{mark[1]}: {'.'.join(loc)}: {kind} {path} "
                "does not exist (paths are relative to the playbook's folder)",
            )
        )
    return [line for _, line in sorted(found)]
