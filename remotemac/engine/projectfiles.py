"""Which project files are uploaded, with the dataset kept out of the project archive.

Why: the project archive travels and lands on the host's disk in the clear; the
dataset must only travel through the encrypted data path (sync). The README's own
layout (``project: {path: .}``, ``data: {path: ./data}``) puts the dataset inside
the project, so the upload leaves out, automatically and whatever the user's
``project.exclude`` says:

* everything below ``data.path`` when it lies inside the project directory;
* when the project lies inside (or is) the data directory: every file that
  matches ``data.include`` (or ``data.files``) relative to the data directory;
* any project file that is the same file as a dataset file (a hard link).

For ``classification: sensitive`` it also refuses (exit 2) a project file that is a
byte-for-byte copy of a dataset file: that copy would leave the encrypted path.
The plan (``run --dry-run``) lists what was left out and why.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from remotemac.data.manifest import sha256_file
from remotemac.errors import BadInput
from remotemac.ignore import walk_project
from remotemac.playbook import Playbook

#: a project file this big is not compared by content with the dataset (code is small)
MAX_COPY_CHECK = 256 * 1024**2


@dataclass
class ProjectUpload:
    """The files to upload (relative POSIX paths) and those left out, with why."""

    root: Path
    files: list[str] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)

    def archive(self) -> bytes:
        """An uncompressed tar of :attr:`files`, owners blanked."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for rel in self.files:
                info = tar.gettarinfo(str(self.root / rel), arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                with open(self.root / rel, "rb") as fh:
                    tar.addfile(info, fh)
        return buf.getvalue()

    def summary(self) -> list[dict[str, object]]:
        """Left-out files grouped by reason, for the plan: ``[{why, files, examples}]``."""
        groups: dict[str, list[str]] = {}
        for rel, why in self.left_out:
            groups.setdefault(why, []).append(rel)
        return [
            {"why": why, "files": len(rels), "examples": rels[:3]} for why, rels in groups.items()
        ]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _data_index(data_dir: Path) -> dict[tuple[int, int], tuple[str, int]]:
    """(st_dev, st_ino) → (path relative to the data dir, size) of every regular file."""
    index: dict[tuple[int, int], tuple[str, int]] = {}
    for dirpath, _dirs, names in os.walk(data_dir, followlinks=False):
        for name in names:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                index[(st.st_dev, st.st_ino)] = (os.path.relpath(full, data_dir), st.st_size)
    return index


def project_upload(pb: Playbook) -> ProjectUpload:
    """The project files to upload, the dataset left out; BadInput for a sensitive copy."""
    from remotemac.data.slice import glob_match

    root = pb.project_dir()
    upload = ProjectUpload(root)
    candidates = _without_own_records(
        root, list(walk_project(root, list(pb.project.exclude))), upload
    )
    data_dir = pb.data_dir()
    if pb.data is None or data_dir is None or not data_dir.is_dir():
        upload.files = candidates
        _refuse_collisions(upload.files)
        return upload
    data = pb.data
    data_inside = data_dir != root and _inside(data_dir, root)
    listed = (
        {f[2:] if f.startswith("./") else f for f in data.files} if data.files is not None else None
    )
    index = _data_index(data_dir)
    by_size: dict[int, list[str]] = {}
    if data.classification == "sensitive":
        for rel, size in index.values():
            by_size.setdefault(size, []).append(rel)
    for rel in candidates:
        full = root / rel
        why = None
        if data_inside and _inside(full, data_dir):
            why = "inside data.path (sent encrypted by sync)"
        elif _inside(full, data_dir):
            drel = full.relative_to(data_dir).as_posix()
            if (
                (drel in listed)
                if listed is not None
                else any(glob_match(drel, p) for p in data.include)
            ):
                why = "matches data.include (sent encrypted by sync)"
        if why is None and not _inside(full, data_dir):
            st = os.lstat(full)
            twin = index.get((st.st_dev, st.st_ino))
            if twin is not None:
                why = f"a hard link to dataset file {twin[0]} (sent encrypted by sync)"
            elif st.st_size in by_size and st.st_size <= MAX_COPY_CHECK:
                _refuse_copy(pb, data_dir, rel, full, by_size[st.st_size])
        if why is None:
            upload.files.append(rel)
        else:
            upload.left_out.append((rel, why))
    _refuse_collisions(upload.files)
    return upload


OWN_OUT = "remotemac's own default --out (./runs/: earlier runs' records)"
EARLIER_RUN = "an earlier remotemac run's record (its acceptance.json and ledger.jsonl)"


def _without_own_records(root: Path, candidates: list[str], upload: ProjectUpload) -> list[str]:
    """``candidates`` less what remotemac itself wrote into the project: the default
    ``--out`` (``./runs/`` of the dir remotemac runs from, when that lies inside the
    project: ``project: {path: .}`` run from the project) and any dir that holds a run's
    record (another ``--out``). Earlier results and checkpoints are not code; sending
    them made every upload grow with every run."""
    own = Path.cwd().resolve() / "runs"
    own_rel = own.relative_to(root).as_posix() + "/" if _inside(own, root) and own != root else None
    names = set(candidates)
    records = sorted(
        rel[: -len("acceptance.json")]
        for rel in candidates
        if rel.endswith("/acceptance.json")  # a record at the project's top: not skipped
        and rel[: -len("acceptance.json")] + "ledger.jsonl" in names
    )
    kept = []
    for rel in candidates:
        if own_rel is not None and rel.startswith(own_rel):
            upload.left_out.append((rel, OWN_OUT))
        elif any(rel.startswith(prefix) for prefix in records):
            upload.left_out.append((rel, EARLIER_RUN))
        else:
            kept.append(rel)
    return kept


def _refuse_collisions(files: list[str]) -> None:
    from remotemac.data.names import refuse_collisions

    refuse_collisions(
        files, "project upload", "rename one of them, or leave one out with project.exclude"
    )


def _refuse_copy(pb: Playbook, data_dir: Path, rel: str, full: Path, same_size: list[str]) -> None:
    """A project file with the content of a sensitive dataset file: refuse, say which."""
    mine = sha256_file(full)
    for drel in same_size:
        if sha256_file(data_dir / drel) == mine:
            raise BadInput(
                f"project file {rel} is a copy of sensitive dataset file {drel}: it would be "
                "uploaded in the clear with the code",
                hint="remove it from the project or add it to project.exclude",
            )
