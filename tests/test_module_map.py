"""The module map (scripts/module_map.py) names every module once, and docs/design.md
holds the markers ``--write`` refreshes it between.

The map's freshness is not checked here: the sweep's splits leave it stale until
``python scripts/module_map.py --write`` runs; ``--check`` says when it is.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _module_map():
    spec = importlib.util.spec_from_file_location("module_map", REPO / "scripts" / "module_map.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # parses every module of remotemac (over a second on a loaded machine)
def test_every_module_is_on_the_map_once_with_its_lines_and_docstring() -> None:
    mm = _module_map()
    text = mm.render(mm.entries())
    modules = [p for p in (REPO / "remotemac").rglob("*.py") if "__pycache__" not in p.parts]
    for path in modules:
        if path.name == "__init__.py":
            heading = f"**`{path.parent.relative_to(REPO).as_posix()}/`**"
            assert text.count(heading) == 1, heading
        else:
            lines = len(path.read_text(encoding="utf-8").splitlines())
            assert f"`{path.name}` ({lines}): " in text, path
    assert "`cli.py`" in text or "**`remotemac/cli/`**" in text


def test_the_design_doc_holds_the_markers_the_map_goes_between() -> None:
    mm = _module_map()
    design = (REPO / "docs" / "design.md").read_text(encoding="utf-8")
    assert design.count(mm.BEGIN) == 1 and design.count(mm.END) == 1
    assert design.index(mm.BEGIN) < design.index(mm.END)
    block = "- **`remotemac/`** (1 modules, 1 lines): a stand-in map\n"
    fresh = mm.spliced(design, block)
    assert fresh.count(block) == 1 and mm.spliced(fresh, block) == fresh
