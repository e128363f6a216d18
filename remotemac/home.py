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
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home.resolve()
