"""Two claims of one new root at once: the loser adopts the winner's marker."""

from __future__ import annotations

from pathlib import Path

import pytest

from remotemac.agent import safefs


def test_a_marker_written_by_a_concurrent_claim_is_adopted_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Regression (40 resident calls at once): claim A read no marker, claim B then
    marked the root, and A's listing counted B's marker as a file remotemac did not
    write, refusing its own root."""
    root = tmp_path / "root"
    root.mkdir()
    winner = safefs.mark_dir(str(root), {"kind": "root", "root_id": "b" * 16})
    real_read = safefs.read_marker
    looks: list[int] = []

    def read_marker(fd: int):
        looks.append(fd)
        return None if len(looks) == 1 else real_read(fd)  # A looked before B wrote

    monkeypatch.setattr(safefs, "read_marker", read_marker)
    marker, created = safefs.ensure_owned_dir(str(root), {"kind": "root", "root_id": "a" * 16})
    assert (marker["root_id"], created) == (winner["root_id"], False)


def test_a_user_file_next_to_the_marker_is_still_refused(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "thesis.tex").write_text("mine")
    with pytest.raises(safefs.NotOurs, match="thesis.tex"):
        safefs.ensure_owned_dir(str(root), {"kind": "root", "root_id": "a" * 16})
