"""First-use slips on the command line that used to pass silently or end unclearly."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import remotemac_in_process


def test_a_missing_identity_file_is_refused_not_ignored(tmp_path: Path):
    """`remotemac -i ~/.ssh/id_rsa_typo doctor HOST`: the key file the user named does
    not exist; before, it was dropped silently and another key (or none) was tried."""
    missing = tmp_path / "id_typo"
    proc = remotemac_in_process("-i", str(missing), "--home", str(tmp_path / "h"), "status")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(missing) in proc.stderr and "does not exist" in proc.stderr
