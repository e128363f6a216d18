"""Where remotemac keeps its own state on the laptop (``--home`` / REMOTEMAC_HOME)."""

from __future__ import annotations

import os
from pathlib import Path


def resolve_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``--home`` wins, then REMOTEMAC_HOME, then the platform's user state dir."""
    if explicit:
        home = Path(explicit).expanduser()
    elif os.environ.get("REMOTEMAC_HOME"):
        home = Path(os.environ["REMOTEMAC_HOME"]).expanduser()
    else:
        from platformdirs import user_state_dir

        home = Path(user_state_dir("remotemac", appauthor=False))
    try:
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not home.is_dir():
            raise NotADirectoryError(f"{home} is not a directory")
        if not os.access(home, os.W_OK | os.X_OK):
            raise PermissionError(f"{home} is not writable")
        return home.resolve()
    except (OSError, RuntimeError) as exc:
        from remotemac.errors import BadInput

        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise BadInput(
            f"cannot use {str(home)[:200]!r} as remotemac's home: {why}",
            hint="give --home (or REMOTEMAC_HOME) a directory you can write",
        ) from None
