"""Manifest hashing, root digest, JSON round trip, hash cache; and the per-run data keys.

The data-key tests live here because keys and manifest are the two halves of what
the local side keeps about a slice.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from remotemac.data.keys import destroy_data_key, key_path, load_data_key, new_data_key
from remotemac.data.manifest import (
    READ_SIZE,
    Manifest,
    ManifestEntry,
    MemoryHashCache,
    build_manifest,
    root_digest,
)
from remotemac.errors import BadInput, IntegrityError


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    (root / "train" / "a.bin").write_bytes(os.urandom(READ_SIZE * 2 + 3))
    (root / "train" / "b.bin").write_bytes(b"hello")
    (root / "empty").write_bytes(b"")
    return root


PATHS = ["train/b.bin", "empty", "train/a.bin"]


def test_entries_match_sha256sum_and_are_sorted(data: Path) -> None:
    manifest = build_manifest(data, PATHS)
    assert [e.path for e in manifest.entries] == ["empty", "train/a.bin", "train/b.bin"]
    for entry in manifest.entries:
        raw = (data / entry.path).read_bytes()
        assert entry.size == len(raw)
        assert entry.sha256 == hashlib.sha256(raw).hexdigest()
    assert manifest.total_bytes == READ_SIZE * 2 + 3 + 5


def test_root_digest_is_sha256_of_documented_lines(data: Path) -> None:
    manifest = build_manifest(data, PATHS)
    text = "".join(f"{e.sha256}  {e.size}  {e.path}\n" for e in manifest.entries)
    assert manifest.root_digest == hashlib.sha256(text.encode()).hexdigest()
    b = hashlib.sha256(b"hello").hexdigest()
    assert f"{b}  5  train/b.bin\n" in text


def test_root_digest_changes_with_any_content_or_name(data: Path) -> None:
    before = build_manifest(data, PATHS).root_digest
    assert build_manifest(data, list(reversed(PATHS))).root_digest == before
    (data / "train" / "b.bin").write_bytes(b"hellO")
    assert build_manifest(data, PATHS).root_digest != before
    (data / "train" / "b.bin").write_bytes(b"hello")
    os.rename(data / "empty", data / "empty2")
    assert build_manifest(data, ["train/b.bin", "empty2", "train/a.bin"]).root_digest != before


def test_json_lists_every_entry_with_the_root_digest(data: Path) -> None:
    manifest = build_manifest(data, PATHS)
    doc = json.loads(manifest.to_json())
    assert doc["files"] == 3 and doc["bytes"] == manifest.total_bytes
    assert doc["root_digest"] == manifest.root_digest
    assert [e["path"] for e in doc["entries"]] == [e.path for e in manifest.entries]


def test_duplicate_and_unsafe_paths_refused() -> None:
    entry = ManifestEntry("a", 1, "0" * 64)
    with pytest.raises(IntegrityError, match="twice"):
        Manifest.from_entries([entry, entry])
    for bad in ["/abs", "a/../b", "a//b", "./a", "a\nb", "a\\b", ""]:
        with pytest.raises(IntegrityError):
            Manifest.from_entries([ManifestEntry(bad, 1, "0" * 64)])
    assert root_digest([]) == hashlib.sha256(b"").hexdigest()


def test_hash_cache_skips_unchanged_files(data: Path) -> None:
    cache = MemoryHashCache()
    first = build_manifest(data, PATHS, cache=cache)
    assert (cache.hits, cache.misses) == (0, 3)
    second = build_manifest(data, PATHS, cache=cache)
    assert second == first and (cache.hits, cache.misses) == (3, 3)
    # A changed file (new mtime and size) is hashed again; the others stay cached.
    target = data / "train" / "b.bin"
    target.write_bytes(b"hello!")
    third = build_manifest(data, PATHS, cache=cache)
    assert (cache.hits, cache.misses) == (5, 4)
    assert {e.path: e for e in third.entries}["train/b.bin"].sha256 == hashlib.sha256(
        b"hello!"
    ).hexdigest()


def test_cache_key_includes_mtime_and_inode(data: Path) -> None:
    """Same size, restored mtime but a new inode: must be re-hashed, not trusted."""
    cache = MemoryHashCache()
    build_manifest(data, ["train/b.bin"], cache=cache)
    target = data / "train" / "b.bin"
    old = target.stat()
    target.unlink()
    (data / "placeholder").write_bytes(b"keep the old inode busy")
    target.write_bytes(b"HELLO")
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
    again = build_manifest(data, ["train/b.bin"], cache=cache)
    assert again.entries[0].sha256 == hashlib.sha256(b"HELLO").hexdigest()


def test_progress_reports_bytes(data: Path) -> None:
    calls: list[tuple[int, int, str]] = []
    manifest = build_manifest(data, PATHS, progress=lambda d, t, p: calls.append((d, t, p)))
    total = manifest.total_bytes
    assert all(t == total for _, t, _ in calls)
    assert calls[-1][0] == total
    assert [d for d, _, _ in calls] == sorted(d for d, _, _ in calls)
    assert sum(1 for _, _, p in calls if p == "train/a.bin") == 3  # 1 MiB reads


def test_missing_file_is_bad_input(data: Path) -> None:
    with pytest.raises(BadInput, match="nope"):
        build_manifest(data, ["nope"])


# --- per-run data keys -------------------------------------------------------


def test_new_key_file_and_directory_permissions(tmp_path: Path) -> None:
    key = new_data_key(tmp_path, "run-1")
    path = key_path(tmp_path, "run-1")
    assert len(key) == 32 and path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_data_key(tmp_path, "run-1") == key
    assert new_data_key(tmp_path, "run-2") != key


def test_loose_directory_is_tightened_and_umask_ignored(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir(mode=0o755)
    old = os.umask(0)
    try:
        new_data_key(tmp_path, "r")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    assert stat.S_IMODE(key_path(tmp_path, "r").stat().st_mode) == 0o600


def test_existing_key_is_never_overwritten(tmp_path: Path) -> None:
    key = new_data_key(tmp_path, "r")
    with pytest.raises(BadInput, match="already exists"):
        new_data_key(tmp_path, "r")
    assert load_data_key(tmp_path, "r") == key


def test_loose_or_damaged_key_is_refused(tmp_path: Path) -> None:
    new_data_key(tmp_path, "r")
    path = key_path(tmp_path, "r")
    os.chmod(path, 0o644)
    with pytest.raises(IntegrityError, match="readable by others") as info:
        load_data_key(tmp_path, "r")
    assert "chmod 600" in info.value.line()
    os.chmod(path, 0o600)
    path.write_bytes(b"short")
    with pytest.raises(IntegrityError, match="damaged"):
        load_data_key(tmp_path, "r")


def test_destroy_overwrites_then_unlinks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = new_data_key(tmp_path, "r")
    path = key_path(tmp_path, "r")
    seen: list[bytes] = []
    real_unlink = os.unlink

    def spy_unlink(target, *args, **kwargs):
        if Path(target) == path:
            seen.append(path.read_bytes())  # what is on disk just before unlink
        return real_unlink(target, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", spy_unlink)
    assert destroy_data_key(tmp_path, "r") is True
    assert len(seen) == 1 and len(seen[0]) == 32 and seen[0] != key
    assert not path.exists()
    assert destroy_data_key(tmp_path, "r") is False
    with pytest.raises(IntegrityError, match="gone") as info:
        load_data_key(tmp_path, "r")
    assert "\n" not in info.value.line()
    assert info.value.exit_code == 5


@pytest.mark.parametrize("bad", ["../x", "a/b", "", ".hidden", "a..b", "x" * 200])
def test_run_id_cannot_name_a_path(tmp_path: Path, bad: str) -> None:
    with pytest.raises(BadInput, match="run id"):
        new_data_key(tmp_path, bad)


def test_symlink_out_of_root_is_refused(data: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"private")
    os.symlink(outside, data / "link.bin")
    os.symlink("train/b.bin", data / "inner.bin")
    with pytest.raises(BadInput, match="escapes the data root"):
        build_manifest(data, ["link.bin"])
    inner = build_manifest(data, ["inner.bin"]).entries[0]
    assert inner.sha256 == hashlib.sha256(b"hello").hexdigest()


@pytest.mark.parametrize("cache_kind", ["memory", "journal"])
def test_an_edit_with_its_mtime_put_back_is_hashed_again(data: Path, tmp_path, cache_kind) -> None:
    """Same size, same inode, the mtime put back after the edit (``cp -p``, ``rsync -t``
    and timestamp-restoring tools do it): only the ctime moved. The cache must not hand
    back the old hash (the manifest would record a dataset revision the job never saw,
    and a file sent in pieces would fail the host's check on every try). Before: the
    old hash came back."""
    from remotemac.journal import Journal

    cache = MemoryHashCache() if cache_kind == "memory" else Journal(tmp_path / "j.sqlite")
    build_manifest(data, ["train/b.bin"], cache=cache)
    target = data / "train" / "b.bin"
    old = target.stat()
    with open(target, "r+b") as fh:  # in place: same inode, same size
        fh.write(b"X" * old.st_size)
    os.utime(target, ns=(old.st_atime_ns, old.st_mtime_ns))
    now = target.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (old.st_ino, old.st_size, old.st_mtime_ns)
    again = build_manifest(data, ["train/b.bin"], cache=cache)
    assert again.entries[0].sha256 == hashlib.sha256(b"X" * old.st_size).hexdigest()


def test_a_journal_from_before_the_ctime_opens_and_hashes_again(tmp_path: Path) -> None:
    """A journal made before the hash cache had a ctime column gains it on open; its old
    rows (no ctime) never match, so each file is hashed once more, then cached."""
    import sqlite3

    from remotemac.journal import Journal

    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE hash_cache (path TEXT PRIMARY KEY, size INTEGER NOT NULL,"
        " mtime_ns INTEGER NOT NULL, inode INTEGER NOT NULL, sha256 TEXT NOT NULL)"
    )
    db.execute("INSERT INTO hash_cache VALUES ('a.bin', 3, 7, 9, ?)", ("0" * 64,))
    db.commit()
    db.close()
    journal = Journal(path)
    assert journal.get("a.bin", 3, 7, 9, 11) is None
    journal.put("a.bin", 3, 7, 9, 11, "1" * 64)
    assert journal.get("a.bin", 3, 7, 9, 11) == "1" * 64
    assert journal.get("a.bin", 3, 7, 9, 12) is None


@pytest.mark.parametrize("kind", ["journal", "memory"])
def test_put_many_keeps_every_row_as_put_would(tmp_path: Path, kind: str) -> None:
    """A sync's hashes go into the cache in one write (engine/sync.py): every row is
    there after it, the last row of a path wins, and a file of another identity
    misses, as one ``put`` per row would leave it."""
    from remotemac.journal import Journal

    cache = Journal(tmp_path / "j.sqlite") if kind == "journal" else MemoryHashCache()
    cache.put("old.bin", 1, 1, 1, 1, "0" * 64)
    rows = [(f"d/{i:04d}.bin", i, 10 + i, 20 + i, 30 + i, f"{i:064x}") for i in range(500)]
    cache.put_many(iter(rows + [("old.bin", 2, 2, 2, 2, "f" * 64)]))
    for path, *identity, sha in rows:
        assert cache.get(path, *identity) == sha
    assert cache.get("old.bin", 2, 2, 2, 2) == "f" * 64
    assert cache.get("old.bin", 1, 1, 1, 1) is None
    assert cache.get("d/0007.bin", 7, 17, 27, 38) is None
