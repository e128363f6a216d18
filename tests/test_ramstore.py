"""RAM-backed plaintext storage: macOS on replayed real outputs, Linux for real on /dev/shm."""

from __future__ import annotations

import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from remotemac.agent import ramstore
from remotemac.agent.ramstore import RamStoreError, create_ram_store, destroy_ram_store

FIXTURES = Path(__file__).parent / "fixtures" / "macos"
GIB2 = 2 << 30  # the recorded attach and erasevolume runs both used ram://4194304 (2 GiB)


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


ATTACH = fixture("hdiutil_attach_-nomount_ram__hdid_highsierra.txt")
ERASE = fixture("diskutil_erasevolume_HFS+_ramdisk__m1air_macos12.4.txt")
# The recorded stderr carries AutoPkg's own "unmounting [...].dmg failed: " prefix on its
# first line (see the .source row); hdiutil's output starts at "hdiutil:".
BUSY = re.sub(
    r"^unmounting \[\.\.\.\]\.dmg failed: ",
    "",
    fixture("hdiutil_detach__busy_deprecated_macos27.txt"),
)
EJECTED = fixture("hdiutil_eject__ejected.txt")
UNMOUNT_DISK = fixture("diskutil_unmountDisk__ramdisk_m1air.txt")


class ReplayMac:
    """Simulation: answers each command with a recorded real macOS output.

    The recordings come from different machines (disk3, disk4, disk7, disk18), so the
    disk number is rewritten to the one the recorded ``hdiutil attach`` printed
    (disk3), as one real session would show. Commands with no recorded output
    (``chmod``, ``mdutil -i off``, ``tmutil addexclusion``: silent on success) answer
    empty with exit 0 unless a test scripts a failure.
    """

    def __init__(self, script: dict[str, list[tuple[int, str, str]]] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.script = script or {}

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        key = " ".join(argv[:2]) if argv[0] in ("hdiutil", "diskutil") else argv[0]
        if key in self.script and self.script[key]:
            code, out, err = self.script[key].pop(0)
        elif key == "hdiutil attach":
            code, out, err = 0, ATTACH, ""
        elif key == "diskutil erasevolume":
            code, out, err = 0, ERASE, ""
        elif key == "hdiutil detach":
            code, out, err = 0, EJECTED, ""
        else:
            code, out, err = 0, "", ""
        return code, _as_disk3(out), _as_disk3(err)


def STILL_OURS(mount: str, device: str | None) -> str | None:  # noqa: N802 - a constant
    """Simulation: our volume is still mounted on ``device`` (see test_item10 for the
    case where it is not)."""
    return None


def _as_disk3(text: str) -> str:
    return re.sub(r"\bdisk\d+\b", "disk3", text)


def test_parse_recorded_outputs() -> None:
    """Simulation: the parsers read the exact recorded bytes (padding, TABs, quotes)."""
    assert ramstore.parse_attach(ATTACH) == "/dev/disk3"
    assert ramstore.erase_finished(ERASE, "/dev/disk7")
    assert not ramstore.erase_finished(ERASE, "/dev/disk70")
    assert ramstore.ejected(EJECTED, "/dev/disk4")
    assert ramstore.is_busy(fixture("hdiutil_detach__busy_deprecated_macos27.txt"))
    assert not ramstore.is_busy(EJECTED)
    with pytest.raises(RamStoreError, match="no device"):
        ramstore.parse_attach("hdiutil: attach failed - Device not configured\n")


def test_macos_create_runs_and_records_each_step() -> None:
    """Simulation: RAM disk creation against replayed hdiutil/diskutil outputs."""
    mac = ReplayMac()
    info = create_ram_store(
        "/unused", GIB2, "tiny-20260101-000000-ab12", run=mac, platform="darwin"
    )
    mount = "/Volumes/remotemac-tiny-20260101-000000-ab12"
    assert mac.calls == [
        ["hdiutil", "attach", "-nobrowse", "-nomount", "ram://4194304"],
        ["diskutil", "erasevolume", "HFS+", "remotemac-tiny-20260101-000000-ab12", "/dev/disk3"],
        ["chmod", "700", mount],
        ["mdutil", "-i", "off", mount],
        ["tmutil", "addexclusion", mount],
    ]
    assert info["path"] == mount and info["kind"] == "ramdisk"
    assert info["device"] == "/dev/disk3" and info["warning"] is None
    assert [s["argv"] for s in info["steps"]] == mac.calls
    assert info["steps"][1]["stdout"].startswith("Started erase on disk3")


def test_macos_sector_count_rounds_up() -> None:
    """Simulation: sizes are whole 512-byte sectors, rounded up."""
    mac = ReplayMac()
    create_ram_store("/unused", 1000, "r1", run=mac, platform="darwin")
    assert mac.calls[0][-1] == "ram://2"


def test_macos_spotlight_or_time_machine_failure_is_a_warning() -> None:
    """Simulation: the disk is still usable, but the record must say what failed."""
    mac = ReplayMac({"tmutil": [(1, "", "tmutil: addexclusion requires Full Disk Access\n")]})
    info = create_ram_store("/unused", GIB2, "r1", run=mac, platform="darwin")
    assert info["kind"] == "ramdisk"
    assert "Time Machine" in info["warning"] and "Full Disk Access" in info["warning"]


def test_macos_erase_failure_detaches_and_raises() -> None:
    """Simulation: a failed erase must not leave an attached RAM disk behind."""
    mac = ReplayMac({"diskutil erasevolume": [(1, "Started erase on disk3\n", "Error: -69888\n")]})
    with pytest.raises(RamStoreError, match="cannot format RAM disk /dev/disk3"):
        create_ram_store("/unused", GIB2, "r1", run=mac, platform="darwin")
    assert mac.calls[-1] == ["hdiutil", "detach", "-force", "/dev/disk3"]


def test_macos_attach_failure_raises_without_disk_fallback() -> None:
    """Simulation: no silent fallback to disk where a RAM disk was expected."""
    mac = ReplayMac({"hdiutil attach": [(1, "", "hdiutil: attach failed - no space\n")]})
    with pytest.raises(RamStoreError, match="attach failed"):
        create_ram_store("/unused", GIB2, "r1", run=mac, platform="darwin")
    assert len(mac.calls) == 1


def test_macos_destroy_retries_busy_with_force() -> None:
    """Simulation: recorded "Resource busy" answer, then the recorded "ejected." line."""
    mac = ReplayMac({"hdiutil detach": [(16, "", BUSY), (0, EJECTED, "")]})
    result = destroy_ram_store(
        {"kind": "ramdisk", "device": "/dev/disk3", "path": "/V"}, run=mac, probe=STILL_OURS
    )
    assert mac.calls == [
        ["hdiutil", "detach", "/dev/disk3"],
        ["hdiutil", "detach", "-force", "/dev/disk3"],
    ]
    assert result["removed"] is True and result["error"] is None
    assert "deprecated" in result["steps"][0]["stderr"]


def test_macos_destroy_falls_back_to_unmount_disk_then_reports() -> None:
    """Simulation: busy twice, then ``diskutil unmountDisk force`` frees it."""
    mac = ReplayMac(
        {
            "hdiutil detach": [(16, "", BUSY), (16, "", BUSY), (0, EJECTED, "")],
            "diskutil unmountDisk": [(0, UNMOUNT_DISK, "")],
        }
    )
    result = destroy_ram_store(
        {"kind": "ramdisk", "device": "/dev/disk3"}, run=mac, probe=STILL_OURS
    )
    assert mac.calls[2] == ["diskutil", "unmountDisk", "force", "/dev/disk3"]
    assert result["removed"] is True
    stuck = ReplayMac({"hdiutil detach": [(16, "", BUSY)] * 3})
    result = destroy_ram_store(
        {"kind": "ramdisk", "device": "/dev/disk3"}, run=stuck, probe=STILL_OURS
    )
    assert result["removed"] is False
    assert result["error"] == '/dev/disk3: hdiutil: couldn\'t unmount "disk3" - Resource busy'


@pytest.fixture
def run_id() -> Iterator[str]:
    rid = f"test-{uuid.uuid4().hex[:12]}"
    yield rid
    leftover = Path("/dev/shm") / f"remotemac-{rid}"
    if leftover.is_symlink():
        leftover.unlink()
    elif leftover.exists():
        shutil.rmtree(leftover)


def _is_tmpfs(path: str) -> bool:
    mounts = Path("/proc/mounts").read_text().splitlines()
    best = max(
        (m.split() for m in mounts if path.startswith(m.split()[1])), key=lambda m: len(m[1])
    )
    return best[2] == "tmpfs"


def test_linux_shm_store_for_real(tmp_path: Path, run_id: str) -> None:
    info = create_ram_store(str(tmp_path), 1 << 20, run_id, platform="linux")
    path = Path(info["path"])
    try:
        assert path == Path("/dev/shm") / f"remotemac-{run_id}"
        assert info["kind"] == "shm" and info["warning"] is None and info["device"] is None
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert _is_tmpfs(str(path))
        (path / "sub").mkdir()
        (path / "sub" / "x.npy").write_bytes(b"plain")
        again = create_ram_store(str(tmp_path), 1 << 20, run_id, platform="linux")
        assert again["reused"] is True and (path / "sub" / "x.npy").exists()
    finally:
        result = destroy_ram_store(info)
    assert result["removed"] is True and not path.exists()
    assert destroy_ram_store(info)["removed"] is False


def test_linux_refuses_planted_symlink(tmp_path: Path, run_id: str) -> None:
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    mode = stat.S_IMODE(decoy.stat().st_mode)
    os.symlink(decoy, f"/dev/shm/remotemac-{run_id}")
    with pytest.raises(RamStoreError, match="not our own directory"):
        create_ram_store(str(tmp_path), 1 << 20, run_id, platform="linux")
    assert stat.S_IMODE(decoy.stat().st_mode) == mode  # not chmod-ed through the link


def test_linux_too_small_is_an_error(tmp_path: Path, run_id: str) -> None:
    with pytest.raises(RamStoreError, match="max_bytes"):
        create_ram_store(str(tmp_path), 1 << 60, run_id, platform="linux")
    assert not os.path.lexists(f"/dev/shm/remotemac-{run_id}")


@pytest.mark.parametrize("platform,shm_root", [("freebsd13", "/dev/shm"), ("linux", "no-such-dir")])
def test_elsewhere_falls_back_to_run_tmp_with_warning(
    tmp_path: Path, platform: str, shm_root: str
) -> None:
    if not shm_root.startswith("/"):  # a missing shm root of this test's own, never a shared path
        shm_root = str(tmp_path / shm_root)
    info = create_ram_store(str(tmp_path), 1 << 20, "r1", platform=platform, shm_root=shm_root)
    path = Path(info["path"])
    assert info["kind"] == "tmp" and path.parent == tmp_path / "tmp"
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert "on disk" in info["warning"] and str(path) in info["warning"]
    secret = path / "x.bin"
    secret.write_bytes(b"secret" * 100)
    handle = open(secret, "rb")  # noqa: SIM115 - keep the inode to read it after unlink
    try:
        assert destroy_ram_store(info)["removed"] is True
        assert handle.read() == b"\0" * 600  # overwritten before it was deleted
    finally:
        handle.close()
    assert not path.exists()


def test_bad_run_id_and_size() -> None:
    with pytest.raises(RamStoreError, match="run id"):
        create_ram_store("/tmp", 1, "../x", platform="linux")
    with pytest.raises(RamStoreError, match="positive"):
        create_ram_store("/tmp", 0, "r", platform="linux")


def test_default_runner_runs_without_shell() -> None:
    assert ramstore.default_run(["sh", "-c", "echo out; echo err >&2; exit 3"]) == (
        3,
        "out\n",
        "err\n",
    )
    assert ramstore.default_run(["no-such-command-remotemac"])[0] == 127


def test_macos_two_receivers_making_the_store_at_once_attach_one_ram_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulation (replayed outputs; the volume counts as mounted once ``diskutil
    erasevolume`` finished, as on a Mac): a push's streams are separate receivers that
    each make the store on their hello, and its workers' hellos come together (issue 36).
    Under the run dir's lock the second finds the first's volume and reuses it; without
    it both attached a RAM disk (the second mounting as "remotemac-ID 1")."""
    import threading
    import time

    mounted: set[str] = set()
    monkeypatch.setattr(ramstore.os.path, "ismount", lambda p: p in mounted)
    mac = ReplayMac()

    def slow_mac(argv: list[str]) -> tuple[int, str, str]:
        if argv[:2] == ["hdiutil", "attach"]:
            time.sleep(0.3)  # both receivers past the check before either attached
        out = mac(argv)
        if argv[:2] == ["diskutil", "erasevolume"]:
            mounted.add(f"/Volumes/{argv[3]}")
        return out

    infos: list[dict[str, object]] = []
    threads = [
        threading.Thread(
            target=lambda: infos.append(
                create_ram_store(str(tmp_path), GIB2, "r1", run=slow_mac, platform="darwin")
            )
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    attaches = [c for c in mac.calls if c[:2] == ["hdiutil", "attach"]]
    assert len(attaches) == 1, mac.calls
    assert len(infos) == 2 and {i["path"] for i in infos} == {"/Volumes/remotemac-r1"}
    assert sorted(bool(i.get("reused")) for i in infos) == [False, True]
