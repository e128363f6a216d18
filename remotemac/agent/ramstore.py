"""RAM-backed storage on the host for the decrypted dataset.

Why: the SPEC promises that plaintext of the dataset never reaches the host's disk
when RAM-backed storage exists. On macOS that is a RAM disk (``hdiutil attach
-nomount ram://<sectors>`` then ``diskutil erasevolume HFS+``), kept out of Spotlight
(``mdutil -i off``) and Time Machine (``tmutil addexclusion``) so no index or backup
copies it to disk; on Linux it is a 0700 directory in ``/dev/shm`` (tmpfs). Anywhere
else the run's own tmp directory is used and the returned ``warning`` says so, for
the record.

Every external command goes through an injectable ``run(argv) -> (code, stdout,
stderr)`` so the macOS path can be exercised against replayed real outputs; each
step is recorded in the returned ``steps`` list for the ledger.

Python 3.9, standard library only (this module runs on the host).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

from . import safefs

Runner = Callable[[list[str]], tuple[int, str, str]]
#: why a recorded RAM disk is no longer ours (None: it still is); injectable for simulations
Probe = Callable[[str, "str | None"], "str | None"]

SECTOR = 512
_OUTPUT_KEEP = 2000
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
_ATTACH_DEVICE = re.compile(r"^(/dev/disk\d+)\s", re.MULTILINE)
_DEVICE = re.compile(r"^/dev/disk\d+$")
#: the host-side record of how the run's RAM disk was made (in its run dir, until the wipe)
RECORD = "ramstore.json"


class RamStoreError(Exception):
    """RAM-backed storage could not be made or removed; the message is one line."""


def default_run(argv: list[str]) -> tuple[int, str, str]:
    """Run a command without a shell and capture its output as text."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out after 120 s"
    return proc.returncode, proc.stdout, proc.stderr


def create_ram_store(
    run_dir: str,
    size_bytes: int,
    run_id: str,
    run: Runner | None = None,
    platform: str | None = None,
    shm_root: str = "/dev/shm",
) -> dict[str, object]:
    """Make the plaintext store for ``run_id``; return what was made and how.

    Returns ``{"path", "kind": "ramdisk"|"shm"|"tmp", "device", "warning", "steps"}``.
    macOS failures raise :class:`RamStoreError` rather than falling back to disk:
    a RAM disk was expected there, so silently writing plaintext to disk would break
    the promise. A RAM disk left by an earlier attempt of the same run is reused.
    """
    if not _RUN_ID.match(run_id):
        raise RamStoreError(f"run id {run_id!r} is not valid for a volume name")
    if size_bytes <= 0:
        raise RamStoreError(f"RAM store size must be positive, got {size_bytes}")
    run = run or default_run
    platform = platform or sys.platform
    if platform == "darwin":
        with _run_dir_locked(run_dir):
            return _create_ramdisk(size_bytes, run_id, run, run_dir)
    if platform.startswith("linux") and os.path.isdir(shm_root):
        return _create_shm(shm_root, size_bytes, run_id)
    return _create_tmp(run_dir, run_id, platform)


#: the lock file in the run dir that makes a RAM disk's check and creation one step
CREATE_LOCK = ".ramstore.lock"


@contextlib.contextmanager
def _run_dir_locked(run_dir: str) -> Iterator[None]:
    """Hold the run dir's RAM store lock. Why: a push's streams are separate receiver
    processes, and each makes the store on its hello; since the workers open with the
    first channel (issue 36) their hellos come together. Without it two could each
    find no volume mounted and attach a RAM disk: the second ``erasevolume`` mounts as
    "remotemac-ID 1", and the record names the wrong device. Where the run dir cannot
    hold the lock (a test's bare dir) it goes on without one, as before."""
    try:
        fd = os.open(
            os.path.join(run_dir, CREATE_LOCK),
            os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
            0o600,
        )
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def volume_refusal(mount: str, device: str | None) -> str | None:
    """Why the RAM disk recorded as ``mount`` on ``device`` is no longer ours, or None.

    After a reboot the RAM disk is gone and ``/dev/diskN`` may name another disk (a
    USB stick, a disk image): it is ours only while our volume (the mount point
    named after the run, recorded at creation) is mounted and backed by ``device``
    (the mount's st_dev is the device node's st_rdev, or one of its slices').
    """
    if not mount or not os.path.ismount(mount):
        return (
            f"no volume is mounted at {mount or '(no mount point recorded)'} any more "
            f"(the host restarted?): {device or 'its device'} left alone"
        )
    if device:
        try:
            dev = os.stat(mount).st_dev
        except OSError as exc:
            return f"cannot look at {mount}: {exc}"
        nodes = [device] + [f"{device}s{i}" for i in range(1, 5)]
        for node in nodes:
            try:
                if os.stat(node).st_rdev == dev:
                    return None
            except OSError:
                continue
        return f"{device} no longer holds {mount}: left alone"
    return None


def destroy_ram_store(
    info: dict[str, object], run: Runner | None = None, probe: Probe | None = None
) -> dict[str, object]:
    """Remove the store described by ``info``; return ``{"removed", "steps", "error"}``.

    macOS: only while the volume is still ours (:func:`volume_refusal`; else
    ``"why"`` says what was left alone), ``hdiutil detach``, then ``-force`` when the
    volume is busy, then ``diskutil unmountDisk force`` and a last detach.
    Linux/tmp: delete the directory without following links (tmp files, which
    were on disk, are zeroed first when they have a single link).
    """
    run = run or default_run
    steps: list[dict[str, object]] = []
    kind = info.get("kind")
    path = str(info.get("path") or "")
    if kind == "ramdisk":
        device = str(info["device"]) if info.get("device") else None
        why = (probe or volume_refusal)(path, device)
        if why:
            return {"removed": False, "steps": steps, "error": None, "why": why}
        target = str(device or path)
        code, out, err = _step(run, steps, ["hdiutil", "detach", target])
        if code != 0 and is_busy(out + err):
            code, out, err = _step(run, steps, ["hdiutil", "detach", "-force", target])
        if code != 0 and target.startswith("/dev/disk"):
            _step(run, steps, ["diskutil", "unmountDisk", "force", target])
            code, out, err = _step(run, steps, ["hdiutil", "detach", "-force", target])
        if code != 0:
            return {"removed": False, "steps": steps, "error": _one_line(err or out, target)}
        return {"removed": True, "steps": steps, "error": None}
    if kind in ("shm", "tmp"):
        if not os.path.lexists(path):
            return {"removed": False, "steps": steps, "error": None}
        steps.append({"argv": ["rm", "-rf", path], "code": 0, "stdout": "", "stderr": ""})
        parent, name = os.path.split(os.path.normpath(path))
        try:
            fd = safefs.open_path(parent)
        except (safefs.NotOurs, OSError) as exc:
            return {"removed": False, "steps": steps, "error": f"cannot remove {path}: {exc}"}
        try:
            done = safefs.remove_at(fd, name, overwrite=(kind == "tmp"))
        finally:
            os.close(fd)
        if done["failed"]:
            return {
                "removed": False,
                "steps": steps,
                "error": f"cannot remove {path}: {'; '.join(done['failed'][:3])}",
            }
        return {"removed": True, "steps": steps, "error": None, "notes": done["notes"]}
    return {"removed": False, "steps": steps, "error": f"unknown RAM store kind {kind!r}"}


def parse_attach(stdout: str) -> str:
    """``/dev/diskN`` from ``hdiutil attach -nomount ram://…`` (device, padding, TABs)."""
    match = _ATTACH_DEVICE.search(stdout + "\n")
    if not match:
        raise RamStoreError(f"hdiutil attach printed no device: {stdout.strip()[:80]!r}")
    return match.group(1)


def erase_finished(stdout: str, device: str) -> bool:
    """True when ``diskutil erasevolume`` reports "Finished erase on diskN" for ``device``."""
    disk = device.rsplit("/", 1)[-1]
    return re.search(r"^Finished erase on " + re.escape(disk) + r"\b", stdout, re.M) is not None


def is_busy(output: str) -> bool:
    """``hdiutil detach`` refused because something still has files open."""
    return "Resource busy" in output


def ejected(stdout: str, device: str) -> bool:
    """``"diskN" ejected.``: what a successful ``hdiutil detach``/``eject`` prints."""
    disk = device.rsplit("/", 1)[-1]
    return f'"{disk}" ejected.' in stdout


def _create_ramdisk(size_bytes: int, run_id: str, run: Runner, run_dir: str) -> dict[str, object]:
    name = f"remotemac-{run_id}"
    mount = f"/Volumes/{name}"
    steps: list[dict[str, object]] = []
    if os.path.ismount(mount):
        device, made = made_earlier(run_dir, mount)
        return _info(mount, "ramdisk", device, None, made, reused=True)
    sectors = -(-size_bytes // SECTOR)
    code, out, err = _step(
        run, steps, ["hdiutil", "attach", "-nobrowse", "-nomount", f"ram://{sectors}"]
    )
    if code != 0:
        raise RamStoreError(f"cannot create a {size_bytes}-byte RAM disk: {_one_line(err or out)}")
    device = parse_attach(out)
    code, out, err = _step(run, steps, ["diskutil", "erasevolume", "HFS+", name, device])
    if code != 0 or not erase_finished(out, device):
        _step(run, steps, ["hdiutil", "detach", "-force", device])
        raise RamStoreError(f"cannot format RAM disk {device}: {_one_line(err or out)}")
    warnings = []
    for argv, what in (
        (["chmod", "700", mount], "restrict permissions"),
        (["mdutil", "-i", "off", mount], "turn Spotlight indexing off"),
        (["tmutil", "addexclusion", mount], "exclude it from Time Machine"),
    ):
        code, out, err = _step(run, steps, argv)
        if code != 0:
            warnings.append(f"could not {what} on {mount}: {_one_line(err or out)}")
    _keep_record(run_dir, mount, device, steps)
    return _info(mount, "ramdisk", device, "; ".join(warnings) or None, steps)


def _keep_record(run_dir: str, mount: str, device: str, steps: list[dict[str, object]]) -> None:
    """Write how the RAM disk was made to the run dir (``RECORD``), on the host.

    Why: the session that attached it may be cut before its answer reaches the laptop;
    the next one reuses the volume and, without this record, no ledger would ever show
    the ``hdiutil attach``/``diskutil erasevolume`` that made it. Best effort: the wipe
    does not need it (it finds the volume by name).
    """
    with contextlib.suppress(OSError):
        safefs.write_json_atomic(
            os.path.join(run_dir, RECORD),
            {
                "path": mount,
                "device": device,
                "steps": [{k: s[k] for k in ("argv", "code", "time")} for s in steps],
            },
        )


def made_earlier(run_dir: str, mount: str) -> tuple[str | None, list[dict[str, object]]]:
    """The device and steps of the RAM disk at ``mount`` as its maker recorded them
    (:func:`_keep_record`), each step marked ``earlier``; ``(None, [])`` without one."""
    rec = safefs.read_json_file(os.path.join(run_dir, RECORD))
    if not isinstance(rec, dict) or rec.get("path") != mount:
        return None, []
    device = rec.get("device")
    device = device if isinstance(device, str) and _DEVICE.match(device) else None
    steps: list[dict[str, object]] = []
    for step in rec.get("steps") or []:
        argv = step.get("argv") if isinstance(step, dict) else None
        if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
            steps.append(
                {"argv": argv, "code": step.get("code"), "time": step.get("time"), "earlier": True}
            )
    return device, steps


def _create_shm(shm_root: str, size_bytes: int, run_id: str) -> dict[str, object]:
    path = os.path.join(shm_root, f"remotemac-{run_id}")
    steps: list[dict[str, object]] = [
        {"argv": ["mkdir", "-m", "700", path], "code": 0, "stdout": "", "stderr": ""}
    ]
    reused = False
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        reused = True
    _check_own_dir(path)
    os.chmod(path, 0o700)
    free = shutil.disk_usage(path).free
    if not reused and free < size_bytes:
        os.rmdir(path)
        raise RamStoreError(
            f"{shm_root} has {free} bytes free but the slice needs {size_bytes}; "
            "lower data.max_bytes or use a host with more RAM"
        )
    return _info(path, "shm", None, None, steps, reused=reused)


def _create_tmp(run_dir: str, run_id: str, platform: str) -> dict[str, object]:
    path = os.path.join(run_dir, "tmp", f"data-{run_id}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    _check_own_dir(path)
    os.chmod(path, 0o700)
    warning = (
        f"no RAM-backed storage on {platform}: decrypted data is on disk in {path} "
        "until the run is wiped"
    )
    steps = [{"argv": ["mkdir", "-p", "-m", "700", path], "code": 0, "stdout": "", "stderr": ""}]
    return _info(path, "tmp", None, warning, steps)


def _check_own_dir(path: str) -> None:
    """Refuse a pre-planted symlink or someone else's directory (``/dev/shm`` is shared)."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RamStoreError(f"{path} exists and is not our own directory; remove it and retry")


def _info(
    path: str,
    kind: str,
    device: str | None,
    warning: str | None,
    steps: list[dict[str, object]],
    reused: bool = False,
) -> dict[str, object]:
    return {
        "path": path,
        "kind": kind,
        "device": device,
        "warning": warning,
        "steps": steps,
        "reused": reused,
    }


def _step(run: Runner, steps: list[dict[str, object]], argv: list[str]) -> tuple[int, str, str]:
    code, out, err = run(argv)
    steps.append(
        {
            "argv": list(argv),
            "code": code,
            "time": time.time(),
            "stdout": out[-_OUTPUT_KEEP:],
            "stderr": err[-_OUTPUT_KEEP:],
        }
    )
    return code, out, err


def _one_line(text: str, where: str = "") -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else "no output"
    return f"{where}: {line}" if where else line
