"""Slice selection: globs, seeded sample, byte cap, explicit lists, unsafe entries."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from remotemac.data.slice import glob_match, select_slice
from remotemac.errors import BadInput


def make_tree(root: Path, files: dict[str, int]) -> None:
    for rel, size in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    files = {f"train/{i:03d}.npy": 100 + i for i in range(40)}
    files.update({"train/notes.txt": 5, "val/0.npy": 50, "meta/a.csv": 10, "b.csv": 20})
    files["train/deep/x.npy"] = 7
    make_tree(root, files)
    return root


@pytest.mark.parametrize(
    "rel,pattern,expected",
    [
        ("train/a.npy", "train/*.npy", True),
        ("train/deep/a.npy", "train/*.npy", False),
        ("b.csv", "**/*.csv", True),
        ("meta/x/y.csv", "**/*.csv", True),
        ("meta/x/y.csv", "*.csv", True),  # no slash: matches the name at any depth
        ("meta/x/y.csv", "meta/*.csv", False),
        ("runs/1/out.bin", "runs/", True),
        ("a/runs/1/out.bin", "runs/", True),
        ("train/a7.npy", "train/a[0-9].npy", True),
        ("train/ab.npy", "train/a[!0-9].npy", True),
        ("train/a.npy", "train/?.npy", True),
        ("train/a.npyz", "train/*.npy", False),
        ("train/a.npy", "./train/*.npy", True),
        ("a+b(1).npy", "a+b(1).npy", True),
    ],
)
def test_glob_rules(rel: str, pattern: str, expected: bool) -> None:
    assert glob_match(rel, pattern) is expected


def test_include_and_exclude_with_reasons(tree: Path) -> None:
    sel = select_slice(tree, ["train/*.npy", "**/*.csv"], ["train/01*.npy"], None, None, 0)
    paths = [f.path for f in sel.files]
    assert paths == sorted(paths)
    assert "train/000.npy" in paths and "b.csv" in paths and "meta/a.csv" in paths
    assert "train/010.npy" not in paths and "val/0.npy" not in paths
    assert len(paths) == 40 - 10 + 2
    reasons = {f.path: f.reason for f in sel.files}
    assert reasons["train/000.npy"] == "matched train/*.npy"
    assert reasons["b.csv"] == "matched **/*.csv"
    skipped = dict(sel.skipped)
    assert skipped["train/015.npy"] == "skipped: excluded by train/01*.npy"
    assert skipped["val/0.npy"] == "skipped: matches no include pattern"
    assert (
        sel.total_bytes
        == sum(f.size for f in sel.files)
        == sum((tree / p).stat().st_size for p in paths)
    )


def test_no_include_means_all_files(tree: Path) -> None:
    sel = select_slice(tree, [], [], None, None, 0)
    assert len(sel.files) == 45
    assert sel.files[0].reason == "all files (no include patterns)"


def test_seeded_sample_is_reproducible_and_matches_random_sample(tree: Path) -> None:
    one = select_slice(tree, ["train/*.npy"], [], None, 10, seed=7)
    two = select_slice(tree, ["train/*.npy"], [], None, 10, seed=7)
    other = select_slice(tree, ["train/*.npy"], [], None, 10, seed=8)
    assert one.files == two.files
    assert [f.path for f in one.files] != [f.path for f in other.files]
    candidates = sorted(f"train/{i:03d}.npy" for i in range(40))
    expected = sorted(random.Random(7).sample(candidates, 10))
    assert [f.path for f in one.files] == expected
    assert one.files[0].reason == "matched train/*.npy; sampled 10 of 40 (seed 7)"
    assert sum(r == "skipped: not sampled (seed 7)" for _, r in one.skipped) == 30


def test_sample_larger_than_candidates_takes_all(tree: Path) -> None:
    sel = select_slice(tree, ["**/*.csv"], [], None, 100, seed=0)
    assert [f.path for f in sel.files] == ["b.csv", "meta/a.csv"]


def test_max_bytes_cap_is_greedy_in_path_order(tree: Path) -> None:
    # train/000..039 are 100..139 bytes: 100+101+102 = 303 fits 350, 103 does not;
    # nothing after it fits either because every later file is larger.
    sel = select_slice(tree, ["train/*.npy"], [], 350, None, 0)
    assert [f.path for f in sel.files] == ["train/000.npy", "train/001.npy", "train/002.npy"]
    assert dict(sel.skipped)["train/003.npy"] == "skipped: over max_bytes (350)"
    assert sel.total_bytes == 303
    # A smaller file later in order still fits after a big one was skipped.
    sel = select_slice(tree, ["train/039.npy", "b.csv", "val/*.npy"], [], 100, None, 0)
    assert [f.path for f in sel.files] == ["b.csv", "val/0.npy"]
    assert dict(sel.skipped)["train/039.npy"] == "skipped: over max_bytes (100)"


def test_max_bytes_applies_in_sample_order(tree: Path) -> None:
    sel = select_slice(tree, ["train/*.npy"], [], 500, 10, seed=3)
    order = random.Random(3).sample(sorted(f"train/{i:03d}.npy" for i in range(40)), 10)
    kept, total = [], 0
    for rel in order:
        size = (tree / rel).stat().st_size
        if total + size <= 500:
            kept.append(rel)
            total += size
    assert [f.path for f in sel.files] == sorted(kept)
    assert sel.total_bytes <= 500


def test_explicit_file_list(tree: Path) -> None:
    sel = select_slice(tree, [], ["*.csv"], None, None, 0, files=["val/0.npy", "./b.csv"])
    assert [(f.path, f.reason) for f in sel.files] == [("val/0.npy", "listed in data.files")]
    assert dict(sel.skipped)["b.csv"] == "skipped: excluded by *.csv"
    with pytest.raises(BadInput, match="missing"):
        select_slice(tree, [], [], None, None, 0, files=["nope.npy"])
    with pytest.raises(BadInput, match="not a plain relative path"):
        select_slice(tree, [], [], None, None, 0, files=["../outside"])


def test_symlinks_escaping_root_are_refused(tree: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.npy"
    secret.write_bytes(b"s" * 10)
    os.symlink(secret, tree / "train" / "leak.npy")
    os.symlink(tmp_path, tree / "train" / "updir")
    os.symlink("../val/0.npy", tree / "train" / "inside.npy")
    os.symlink(tree / "nowhere", tree / "train" / "dangling.npy")
    sel = select_slice(tree, ["train/*.npy"], [], None, None, 0)
    paths = {f.path: f.size for f in sel.files}
    assert "train/leak.npy" not in paths
    assert paths["train/inside.npy"] == 50
    skipped = dict(sel.skipped)
    assert skipped["train/leak.npy"] == "skipped: symlink escapes the data root"
    assert skipped["train/updir"] == "skipped: symlinked directory (not followed)"
    assert skipped["train/dangling.npy"] == "skipped: missing or broken symlink"
    with pytest.raises(BadInput, match="escapes"):
        select_slice(tree, [], [], None, None, 0, files=["train/leak.npy"])


def test_unsafe_names_and_special_files_are_skipped(tree: Path) -> None:
    (tree / "bad\nname.npy").write_bytes(b"1")
    os.mkfifo(tree / "pipe.npy")
    sel = select_slice(tree, ["*.npy"], [], None, None, 0)
    skipped = dict(sel.skipped)
    assert skipped["bad\nname.npy"].startswith("skipped: name has a control character")
    assert skipped["pipe.npy"] == "skipped: not a regular file"


def test_bad_arguments(tree: Path) -> None:
    with pytest.raises(BadInput, match="not a directory"):
        select_slice(tree / "b.csv", [], [], None, None, 0)
    with pytest.raises(BadInput, match="max_bytes"):
        select_slice(tree, [], [], -1, None, 0)
    with pytest.raises(BadInput, match="sample"):
        select_slice(tree, [], [], None, -1, 0)


def test_to_dict_lists_files_and_reasons(tree: Path) -> None:
    data = select_slice(tree, ["**/*.csv"], [], None, None, 0).to_dict()
    assert data["files"][0] == {"path": "b.csv", "size": 20, "reason": "matched **/*.csv"}
    assert data["total_bytes"] == 30


RESERVED = [".remotemac-notes/a.npy", ".Verified.jsonl", ".remotemac-x.npy"]


@pytest.mark.parametrize("include", [[], ["**"], ["**/*.npy", "*.jsonl"], [".remotemac-*/"]])
def test_a_reserved_name_only_a_pattern_picked_is_left_out_with_a_warning(tree, include):
    """A file under a name the host keeps for its own files (``.remotemac-*``,
    ``.verified.jsonl``) that only a pattern picked up failed the whole sync in
    stat_all (BadInput). It is left out of the slice now, and the sync phase warns
    with its name; the rest of the slice goes."""
    from remotemac.engine.sync import show_selection
    from remotemac.engine.syncplan import stat_all
    from remotemac.events import Warning

    make_tree(tree, {rel: 9 for rel in RESERVED})
    sel = select_slice(tree, include, [], None, None, 0)
    chosen = [f.path for f in sel.files]
    assert not set(RESERVED) & set(chosen)
    assert [f.path for f in stat_all(tree, chosen, None)] == sorted(chosen)  # no BadInput
    events: list = []
    show_selection(events.append, "r", sel)
    warned = [e for e in events if isinstance(e, Warning) and e.code == "data-reserved"]
    assert len(warned) == 1
    picked = [rel for rel in RESERVED if any(glob_match(rel, p) for p in include or ["**"])]
    assert picked and all(rel in warned[0].message for rel in picked)
    assert "rename" in warned[0].message


def test_a_reserved_name_the_user_excluded_is_excluded_without_a_warning(tree):
    """``exclude: [".remotemac-*", ...]`` (what the old error said to do)
    leaves those files out as excluded, and the sync does not warn about them on
    every run."""
    from remotemac.engine.sync import show_selection
    from remotemac.events import Warning

    make_tree(tree, {rel: 9 for rel in RESERVED})
    sel = select_slice(
        tree, [], [".remotemac-*", ".remotemac-*/**", ".Verified.jsonl"], None, None, 0
    )
    why = dict(sel.skipped)
    assert all(why[rel].startswith("skipped: excluded by") for rel in RESERVED), why
    events: list = []
    show_selection(events.append, "r", sel)
    assert not [e for e in events if isinstance(e, Warning) and e.code == "data-reserved"]


@pytest.mark.parametrize(
    "files,include", [([".remotemac-notes/a.npy"], []), (None, ["**", ".Verified.jsonl"])]
)
def test_a_reserved_name_written_out_still_fails_the_sync_in_one_line(tree, files, include):
    """Named outright (data.files, or an include that is the path itself, no glob):
    the user asked for that file, so the sync refuses it with the one-line why."""
    from remotemac.engine.sync import show_selection
    from remotemac.engine.syncplan import stat_all

    make_tree(tree, {rel: 9 for rel in RESERVED})
    sel = select_slice(tree, include, [], None, None, 0, files=files)
    named = (files or include[1:])[0]
    assert named in [f.path for f in sel.files]
    events: list = []
    show_selection(events.append, "r", sel)
    assert not any(named in getattr(e, "message", "") for e in events)
    with pytest.raises(BadInput, match="kept for remotemac's own files on the host") as err:
        stat_all(tree, [f.path for f in sel.files], None)
    assert named in str(err.value) and "\n" not in str(err.value)
