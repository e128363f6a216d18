"""Where the things remotemac brings come from: (url, sha256) for a host's platform.

* CPython: python-build-standalone's ``install_only`` archives, the builds uv
  installs. The list is uv's own: ``$UV_PYTHON_DOWNLOADS_JSON_URL`` (uv's variable,
  the same ``download-metadata.json`` format that ``--python-downloads-json-url``
  reads, a path, ``file://`` or ``http(s)://`` URL) when set; else ``uv python list --all-arches
  --all-platforms --only-downloads --output-format json`` run on this laptop (uv is
  a dependency), whose entries carry no sha256, so it is read from the release's
  ``SHA256SUMS`` beside the archive. ``$UV_PYTHON_INSTALL_MIRROR`` replaces the
  download site's prefix, as it does for uv.
* uv: its wheel for the host's platform (``py3-none-<platform>``), from PyPI's JSON
  API, at the version this laptop's uv dependency pins (:data:`UV_VERSION`).

Answers are cached in ``<home>/sources`` for a day.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remotemac.agent.shared import Clause, matches, parse_wheel_name, platform_tags, supported
from remotemac.engine.bring import Artifact
from remotemac.errors import HostEnvironmentError

ENV_JSON = "UV_PYTHON_DOWNLOADS_JSON_URL"
ENV_MIRROR = "UV_PYTHON_INSTALL_MIRROR"
ENV_PYPI = "REMOTEMAC_PYPI_JSON"
PYPI_JSON = "https://pypi.org/pypi"
#: uv on the host: the version this project depends on (pyproject's ``uv`` pin)
UV_VERSION = "0.13.9"
SITES = (
    "https://github.com/astral-sh/python-build-standalone/releases/download",
    "https://releases.astral.sh/github/python-build-standalone/releases/download",
)
CACHE_S = 24 * 3600.0
TIMEOUT_S = 20.0


@dataclass(frozen=True)
class PythonDownload:
    """One CPython build for one platform."""

    key: str
    version: tuple[int, int, int]
    os: str
    arch: str
    libc: str
    url: str
    sha256: str | None

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def _read(url: str, timeout: float = TIMEOUT_S) -> bytes:
    if "://" not in url:
        return Path(url).read_bytes()
    if url.startswith("file://"):
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)).read_bytes()
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310
        return resp.read()


def _cached(home: Path | None, name: str, produce: Any) -> Any:
    """JSON ``produce()`` cached in ``<home>/sources/<name>`` for :data:`CACHE_S`."""
    path = home / "sources" / name if home else None
    if path is not None and path.is_file() and time.time() - path.stat().st_mtime < CACHE_S:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            pass
    value = produce()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(value), encoding="utf-8")
        os.replace(tmp, path)
    return value


def mirrored(url: str) -> str:
    mirror = os.environ.get(ENV_MIRROR, "").rstrip("/")
    if mirror:
        for site in SITES:
            if url.startswith(site + "/"):
                return mirror + url[len(site) :]
    return url


def parse_downloads_json(data: dict[str, Any]) -> list[PythonDownload]:
    """uv's ``download-metadata.json``: CPython, default variant, final releases."""
    out = []
    for key, entry in data.items():
        if not isinstance(entry, dict) or entry.get("name") != "cpython":
            continue
        if entry.get("prerelease") or entry.get("variant") not in (None, "", "default"):
            continue
        arch = entry.get("arch")
        arch = arch.get("family") if isinstance(arch, dict) else arch
        if isinstance(entry.get("arch"), dict) and entry["arch"].get("variant"):
            continue
        out.append(
            PythonDownload(
                key=key,
                version=(int(entry["major"]), int(entry["minor"]), int(entry["patch"])),
                os={"macos": "darwin"}.get(str(entry.get("os")), str(entry.get("os"))),
                arch=str(arch),
                libc=str(entry.get("libc") or "none"),
                url=mirrored(str(entry["url"])),
                sha256=entry.get("sha256"),
            )
        )
    return out


def _uv_list() -> list[dict[str, Any]]:
    uv = shutil.which("uv")
    if not uv:
        raise HostEnvironmentError(
            "this laptop has no uv to list the Python builds remotemac can bring",
            hint=f"pip install uv=={UV_VERSION}, or set {ENV_JSON}",
        )
    res = subprocess.run(
        [uv, "python", "list", "--all-platforms", "--all-arches", "--only-downloads"]
        + ["--output-format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    if res.returncode != 0:
        raise HostEnvironmentError(f"uv python list failed: {res.stderr.strip()[-200:]}")
    return json.loads(res.stdout)


def python_downloads(home: Path | None) -> list[PythonDownload]:
    """Every CPython build the source offers."""
    source = os.environ.get(ENV_JSON)
    if source:
        return parse_downloads_json(json.loads(_read(source)))
    out = []
    for entry in _cached(home, "uv-python-list.json", _uv_list):
        if entry.get("implementation") != "cpython" or entry.get("variant") != "default":
            continue
        parts = entry.get("version_parts") or {}
        if not entry.get("url") or "prerelease" in str(entry.get("version", "")).lower():
            continue
        out.append(
            PythonDownload(
                key=str(entry["key"]),
                version=(int(parts["major"]), int(parts["minor"]), int(parts["patch"])),
                os={"macos": "darwin"}.get(str(entry["os"]), str(entry["os"])),
                arch=str(entry["arch"]),
                libc=str(entry.get("libc") or "none"),
                url=str(entry["url"]),
                sha256=None,
            )
        )
    return out


def choose(
    downloads: list[PythonDownload], spec: list[Clause], platform: dict[str, str]
) -> PythonDownload | None:
    """The newest build for the host's os/arch/libc that satisfies ``spec``."""
    fitting = [
        d
        for d in downloads
        if d.os == platform.get("os")
        and d.arch == platform.get("arch")
        and d.libc == platform.get("libc")
        and matches(spec, d.version)
    ]
    return max(fitting, key=lambda d: d.version) if fitting else None


def sha256_of(home: Path | None, dl: PythonDownload) -> str:
    """The archive's sha256: from the metadata, else the release's ``SHA256SUMS``."""
    if dl.sha256:
        return dl.sha256.lower()
    base, _, name = dl.url.rpartition("/")
    name = urllib.parse.unquote(name)

    def sums() -> dict[str, str]:
        text = _read(base + "/SHA256SUMS").decode("utf-8", "replace")
        return {
            parts[1].lstrip("*"): parts[0]
            for parts in (ln.split() for ln in text.splitlines())
            if len(parts) == 2
        }

    try:
        found = _cached(home, f"sums-{re.sub(r'[^A-Za-z0-9]+', '-', base)[-80:]}.json", sums)
    except OSError as exc:
        raise HostEnvironmentError(
            f"cannot read the sha256 of {name} ({base}/SHA256SUMS: {exc})",
            hint=f"set {ENV_JSON} to a downloads JSON that carries sha256, or {ENV_MIRROR}",
        ) from None
    if name not in found:
        raise HostEnvironmentError(f"{base}/SHA256SUMS does not list {name}")
    return str(found[name]).lower()


def python_artifact(home: Path | None, dl: PythonDownload) -> Artifact:
    sha = sha256_of(home, dl)
    return Artifact(
        what="python",
        name=f"python-{dl.key}-{sha[:12]}",
        url=dl.url,
        sha256=sha,
        format="tar.gz",
        label=f"CPython {dl.version_text} ({dl.os} {dl.arch})",
    )


def pypi_json(home: Path | None, name: str) -> dict[str, Any]:
    """PyPI's JSON for project ``name`` (its releases and their files), cached."""
    base = os.environ.get(ENV_PYPI, PYPI_JSON).rstrip("/")
    url = f"{base}/{name}/json"

    def get() -> dict[str, Any]:
        data = json.loads(_read(url))
        releases = {}
        for version, files in (data.get("releases") or {}).items():
            releases[version] = [
                {
                    "filename": f["filename"],
                    "url": urllib.parse.urljoin(url, f["url"]),
                    "sha256": (f.get("digests") or {}).get("sha256"),
                    "size": f.get("size"),
                }
                for f in files
            ]
        return {"name": name, "releases": releases}

    return dict(_cached(home, f"pypi-{re.sub(r'[^a-z0-9]+', '-', name.lower())}.json", get))


def host_wheel_tags(tags: dict[str, Any]) -> set[tuple[str, str, str]]:
    """The (python, abi, platform) triples an interpreter of ``tags`` accepts."""
    return supported(tags)


def retag(tags: dict[str, Any], version: str) -> dict[str, Any]:
    """``tags`` (the agent's interpreter, agentruntime.host_tags) for another CPython."""
    major, minor = version.split(".")[:2]
    glibc = tuple(int(x) for x in (tags.get("glibc") or "0.0").split(".")[:2])
    plats = platform_tags(
        str(tags.get("system")),
        str(tags.get("machine")),
        str(tags.get("mac_release") or ""),
        (glibc[0], glibc[1]) if len(glibc) == 2 else (0, 0),
    )
    return dict(
        tags,
        python=version,
        python_tag=f"cp{major}{minor}",
        implementation="cp",
        abi=f"cp{major}{minor}",
        platforms=plats,
    )


def uv_artifact(home: Path | None, tags: dict[str, Any]) -> Artifact | None:
    """uv's wheel for the host (``py3-none-<platform>``), or None when PyPI has none."""
    files = pypi_json(home, "uv")["releases"].get(UV_VERSION) or []
    accepted = supported(tags)
    fitting = []
    for f in files:
        if not f["filename"].endswith(".whl") or not f.get("sha256"):
            continue
        triples = parse_wheel_name(f["filename"])[2]
        if triples & accepted:
            rank = min(
                (tags["platforms"].index(p) for _py, _abi, p in triples if p in tags["platforms"]),
                default=99,
            )
            fitting.append((rank, f))
    if not fitting:
        return None
    best = min(fitting, key=lambda x: x[0])[1]
    return Artifact(
        what="uv",
        name=f"uv-{UV_VERSION}-{best['sha256'][:12]}",
        url=best["url"],
        sha256=best["sha256"],
        format="zip",
        label=f"uv {UV_VERSION}",
    )
