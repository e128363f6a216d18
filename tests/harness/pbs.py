"""A python-build-standalone stand-in: the lab's own relocatable CPython 3.11, packed as uv's
``install_only`` archive, listed in a uv-format downloads JSON, served from loopback.

Simulation. The tests cannot reach the standalone builds' download site, so the
archive remotemac brings is built here from the lab prefix's 3.11 (RUNPATH
``$ORIGIN/../lib``: relocatable like the real builds) in the real archives' layout
(``python/bin/python3.11``, ``python/bin/python3``, ``python/lib/libpython3.11.so``,
``python/lib/python3.11/…``; see an ``install_only`` tarball from
github.com/astral-sh/python-build-standalone/releases). It is the only version
with a torch wheel on this machine's disk. The JSON has the fields of uv's
``crates/uv-python/download-metadata.json`` that remotemac reads, and reaches
remotemac through uv's own variable, ``UV_PYTHON_DOWNLOADS_JSON_URL``: the code
path a user's laptop takes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.harness import lab

#: per user: root's CI run and a contributor's run on one machine never share a lock
CACHE = Path(f"/tmp/remotemac-pbs-{os.getuid()}")


def lab_version() -> str:
    """The exact version of the lab's 3.11, wherever it came from (pyenv, uv, the OS):
    a contributor without pyenv's 3.11 has one of the others."""
    source = lab.interpreter_source("3.11")
    python = source.prefix / "bin" / "python3.11"
    out = subprocess.run(
        [str(python), "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _own(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Leave out a link to an absolute path: the OS's 3.11 (Debian) links
    ``sitecustomize.py`` to ``/etc/python3.11``; a python-build-standalone archive, which
    this one stands in for, has no such link (and the host's bring refuses one)."""
    if member.issym() and member.linkname.startswith("/"):
        return None
    return member


def build_archive() -> tuple[Path, str]:
    """(archive, sha256) of the lab's 3.11 in the install_only layout, built once."""
    lab.ensure_lab()
    version = lab_version()
    key = hashlib.sha256(lab._stamp_text().encode()).hexdigest()[:10]
    dest = CACHE / f"cpython-{version}+lab{key}-x86_64-unknown-linux-gnu-install_only.tar.gz"
    with lab._locked(CACHE / ".lock"):
        if not dest.is_file():
            tmp = dest.with_name(dest.name + ".tmp")
            prefix = lab.LAB_PREFIX
            with tarfile.open(tmp, "w:gz", compresslevel=1) as tar:
                tar.add(prefix / "bin" / "python3.11", "python/bin/python3.11")
                link = tarfile.TarInfo("python/bin/python3")
                link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
                tar.addfile(link)
                for lib in sorted((prefix / "lib").glob("libpython3.11*")):
                    tar.add(lib, f"python/lib/{lib.name}")
                tar.add(prefix / "lib" / "python3.11", "python/lib/python3.11", filter=_own)
            tmp.rename(dest)
    return dest, hashlib.sha256(dest.read_bytes()).hexdigest()


def downloads_json(path: Path, url: str, sha256: str) -> Path:
    """A uv-format downloads JSON with one entry: the lab archive at ``url``."""
    major, minor, patch = (int(x) for x in lab_version().split("."))
    key = f"cpython-{major}.{minor}.{patch}-linux-x86_64-gnu"
    entry = {
        "name": "cpython",
        "arch": {"family": "x86_64", "variant": None},
        "os": "linux",
        "libc": "gnu",
        "major": major,
        "minor": minor,
        "patch": patch,
        "prerelease": "",
        "url": url,
        "sha256": sha256,
        "variant": None,
    }
    path.write_text(json.dumps({key: entry}))
    return path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """A loopback HTTP server for ``directory`` (a mirror the host can reach); its URL."""
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
