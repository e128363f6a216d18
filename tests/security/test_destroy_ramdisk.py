"""Issue 15, item 10: after a reboot, wipe never detaches a /dev/diskN that is no
longer remotemac's RAM disk.

Simulation: there is no Mac here. ``hdiutil`` is a shim on PATH that logs its argv
and answers with the recorded output of a real ``hdiutil detach`` (tests/fixtures/
macos/hdiutil_eject__ejected.txt); the RAM store is the one sync recorded
(/Volumes/remotemac-<run>, /dev/disk3). On this machine no volume is mounted at
that mount point, exactly as on a Mac that restarted (RAM disks do not survive
it), and /dev/disk3 would name whatever disk the Mac attached since.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from remotemac.agent import ramstore, wipeops
from tests.hostlayout import make_run, mark_root

AGENT = str(Path(__file__).resolve().parents[2] / "remotemac" / "agent")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "macos"
RUN = "m-20260101-000000-dddd"


@pytest.fixture
def hdiutil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "hdiutil.log"
    shim = bin_dir / "hdiutil"
    shim.write_text(
        f'#!/bin/sh\necho "$@" >> {log}\ncat {FIXTURES / "hdiutil_eject__ejected.txt"}\n'
    )
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_item10_wipe_after_reboot_never_detaches_a_reused_disk(tmp_path: Path, hdiutil: Path):
    """Simulation: the recorded RAM disk is gone; /dev/disk3 is not detached."""
    root = mark_root(tmp_path / "root")
    make_run(root, RUN, ("data", "tmp", "logs", "status"))
    ram = {"kind": "ramdisk", "path": f"/Volumes/remotemac-{RUN}", "device": "/dev/disk3"}
    answer = wipeops.wipe_run_data({"root": str(root), "run_id": RUN, "ram": ram})
    assert not hdiutil.exists(), "hdiutil was run on a disk that is no longer ours: " + (
        hdiutil.read_text() if hdiutil.exists() else ""
    )
    expected = (
        f"no volume is mounted at /Volumes/remotemac-{RUN} any more (the host "
        "restarted?): /dev/disk3 left alone"
    )
    assert any(expected in n for n in answer["notes"]), answer["notes"]


def test_item10_a_mounted_volume_on_another_device_is_left_alone(hdiutil: Path):
    """Simulation: something is mounted at the recorded mount point, but the recorded
    device node is not what backs it (here "/" and /dev/null stand in for them)."""
    result = ramstore.destroy_ram_store({"kind": "ramdisk", "path": "/", "device": "/dev/null"})
    assert result["removed"] is False and result["why"] == "/dev/null no longer holds /: left alone"
    assert not hdiutil.exists()
