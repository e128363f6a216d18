"""Names that are one file on a Mac are refused on the laptop (remotemac.data.names)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from remotemac.data.names import first_collision
from remotemac.data.slice import select_slice
from remotemac.errors import BadInput

NFC = unicodedata.normalize("NFC", "café.csv")
NFD = unicodedata.normalize("NFD", "café.csv")


def test_case_and_normalization_twins_collide_and_distinct_names_do_not():
    assert first_collision(["A.csv", "b.csv", "a.csv"]) == ("A.csv", "a.csv")
    assert first_collision([NFC, NFD]) == (NFC, NFD)
    assert first_collision(["naïve/ü.npy", "NAÏVE/Ü.npy"]) is not None
    assert first_collision(["a.csv", "b.csv", NFC, "naïve/ü.npy"]) is None


def test_a_slice_holding_A_csv_and_a_csv_is_refused_naming_both(tmp_path: Path):
    (tmp_path / "A.csv").write_text("upper")
    (tmp_path / "a.csv").write_text("lower")
    with pytest.raises(BadInput, match=r"'A.csv' and 'a.csv' are one file on a Mac"):
        select_slice(tmp_path, [], [], None, None, 0)
    sel = select_slice(tmp_path, [], ["A.csv"], None, None, 0)  # excluding one is the way out
    assert [f.path for f in sel.files] == ["a.csv"]
