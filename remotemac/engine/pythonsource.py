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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from remotemac.agent.protocol import JsonObject, Message
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


@dataclass
class DownloadEntry(Message):
    """One entry of uv's ``download-metadata.json`` (the key is the entry's name)."""

    name: str | None = None
    #: ``{"family", "variant"}`` in uv's file, a plain string in older ones
    arch: Any = None
    os: str | None = None
    libc: str | None = None
    major: int = 0
    minor: int = 0
    patch: int = 0
    url: str = ""
    sha256: str | None = None
    prerelease: Any = None
    variant: str | None = None

    def download(self, key: str) -> PythonDownload | None:
        """The build, None unless it is CPython's default variant of a final release."""
        if self.name != "cpython" or self.prerelease or self.variant not in (None, "", "default"):
            return None
        arch = self.arch
        if isinstance(arch, dict):
            if arch.get("variant"):
                return None
            arch = arch.get("family")
        return PythonDownload(
            key=key,
            version=(int(self.major), int(self.minor), int(self.patch)),
            os=_os_name(self.os),
            arch=str(arch),
            libc=str(self.libc or "none"),
            url=mirrored(str(self.url)),
            sha256=self.sha256,
        )


@dataclass
class UvListEntry(Message):
    """One line of ``uv python list --output-format json``: no sha256 in it."""

    key: str = ""
    implementation: str | None = None
    variant: str | None = None
    version: str = ""
    version_parts: dict[str, int] = field(default_factory=dict)
    os: str | None = None
    arch: str | None = None
    libc: str | None = None
    url: str | None = None

    def download(self) -> PythonDownload | None:
        """The build, None unless it is a downloadable final CPython of the default variant."""
        if self.implementation != "cpython" or self.variant != "default":
            return None
        if not self.url or "prerelease" in str(self.version).lower():
            return None
        parts = self.version_parts
        return PythonDownload(
            key=str(self.key),
            version=(int(parts["major"]), int(parts["minor"]), int(parts["patch"])),
            os=_os_name(self.os),
            arch=str(self.arch),
            libc=str(self.libc or "none"),
            url=str(self.url),
            sha256=None,
        )


def _os_name(os_: str | None) -> str:
    """uv says ``macos`` where the host's platform says ``darwin``."""
    return {"macos": "darwin"}.get(str(os_), str(os_))


@dataclass(frozen=True)
class HostPlatform:
    """The host's platform as ``find_python`` names it, the way uv's builds are keyed."""

    os: str | None = None
    arch: str | None = None
    libc: str | None = None

    @classmethod
    def from_json(cls, data: JsonObject) -> HostPlatform:
        return cls(**{k: data[k] for k in ("os", "arch", "libc") if k in data})

    def to_json(self) -> JsonObject:
        return {"os": self.os, "arch": self.arch, "libc": self.libc}


@dataclass
class HostTags(Message):
    """The wheel tags of an interpreter on the host (agentruntime.host_tags): which
    wheels it installs, for fetching them on this laptop."""

    python: str = ""
    python_tag: str = ""
    implementation: str = ""
    abi: str = ""
    system: str = ""
    machine: str = ""
    mac_release: str = ""
    glibc: str = ""
    platforms: list[str] = field(default_factory=list)
    executable: str | None = None

    def accepted(self) -> set[tuple[str, str, str]]:
        """The (python, abi, platform) triples a wheel may carry to install here."""
        return supported(self.to_json())


@dataclass(frozen=True)
class WheelFile:
    """One file of a release on PyPI, as cached in ``<home>/sources``."""

    filename: str
    url: str
    sha256: str | None = None
    size: int | None = None

    @classmethod
    def from_pypi(cls, data: JsonObject, page: str) -> WheelFile:
        """A file of PyPI's JSON API (its URL relative to ``page``)."""
        return cls(
            filename=data["filename"],
            url=urllib.parse.urljoin(page, data["url"]),
            sha256=(data.get("digests") or {}).get("sha256"),
            size=data.get("size"),
        )

    @classmethod
    def from_json(cls, data: JsonObject) -> WheelFile:
        return cls(data["filename"], data["url"], data["sha256"], data["size"])

    def to_json(self) -> JsonObject:
        return {
            "filename": self.filename,
            "url": self.url,
            "sha256": self.sha256,
            "size": self.size,
        }


@dataclass(frozen=True)
class PypiProject:
    """A project on PyPI: its releases and their files (the cached form)."""

    name: str
    releases: dict[str, list[WheelFile]]

    @classmethod
    def from_json(cls, data: JsonObject) -> PypiProject:
        return cls(
            name=data["name"],
            releases={
                version: [WheelFile.from_json(f) for f in files]
                for version, files in data["releases"].items()
            },
        )

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "releases": {v: [f.to_json() for f in files] for v, files in self.releases.items()},
        }


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


def parse_downloads_json(data: JsonObject) -> list[PythonDownload]:
    """uv's ``download-metadata.json``: CPython, default variant, final releases."""
    out = []
    for key, entry in data.items():
        dl = DownloadEntry.from_json(entry).download(key) if isinstance(entry, dict) else None
        if dl is not None:
            out.append(dl)
    return out


def _uv_list() -> list[JsonObject]:
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
    found = (
        UvListEntry.from_json(e).download() for e in _cached(home, "uv-python-list.json", _uv_list)
    )
    return [dl for dl in found if dl is not None]


def choose(
    downloads: list[PythonDownload], spec: list[Clause], platform: HostPlatform
) -> PythonDownload | None:
    """The newest build for the host's os/arch/libc that satisfies ``spec``."""
    fitting = [
        d
        for d in downloads
        if d.os == platform.os
        and d.arch == platform.arch
        and d.libc == platform.libc
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


def pypi_json(home: Path | None, name: str) -> PypiProject:
    """PyPI's JSON for project ``name`` (its releases and their files), cached."""
    base = os.environ.get(ENV_PYPI, PYPI_JSON).rstrip("/")
    url = f"{base}/{name}/json"

    def get() -> JsonObject:
        data = json.loads(_read(url))
        releases = {
            version: [WheelFile.from_pypi(f, url) for f in files]
            for version, files in (data.get("releases") or {}).items()
        }
        return PypiProject(name, releases).to_json()

    cached = _cached(home, f"pypi-{re.sub(r'[^a-z0-9]+', '-', name.lower())}.json", get)
    return PypiProject.from_json(cached)


def retag(tags: HostTags, version: str) -> HostTags:
    """``tags`` (the agent's interpreter, agentruntime.host_tags) for another CPython."""
    major, minor = version.split(".")[:2]
    glibc = tuple(int(x) for x in (tags.glibc or "0.0").split(".")[:2])
    plats = platform_tags(
        str(tags.system),
        str(tags.machine),
        str(tags.mac_release or ""),
        (glibc[0], glibc[1]) if len(glibc) == 2 else (0, 0),
    )
    return replace(
        tags,
        python=version,
        python_tag=f"cp{major}{minor}",
        implementation="cp",
        abi=f"cp{major}{minor}",
        platforms=plats,
    )


def uv_artifact(home: Path | None, tags: HostTags) -> Artifact | None:
    """uv's wheel for the host (``py3-none-<platform>``), or None when PyPI has none."""
    files = pypi_json(home, "uv").releases.get(UV_VERSION) or []
    accepted = tags.accepted()
    fitting = []
    for f in files:
        if not f.filename.endswith(".whl") or not f.sha256:
            continue
        triples = parse_wheel_name(f.filename)[2]
        if triples & accepted:
            rank = min(
                (tags.platforms.index(p) for _py, _abi, p in triples if p in tags.platforms),
                default=99,
            )
            fitting.append((rank, f, f.sha256))
    if not fitting:
        return None
    _rank, best, sha = min(fitting, key=lambda x: x[0])
    return Artifact(
        what="uv",
        name=f"uv-{UV_VERSION}-{sha[:12]}",
        url=best.url,
        sha256=sha,
        format="zip",
        label=f"uv {UV_VERSION}",
    )
