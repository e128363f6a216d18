"""What the laptop reads about a host's Python is parsed once and writes back unchanged.

Tier: fast (no marker). uv's two listings of CPython builds, PyPI's release files as
cached in ``<home>/sources``, the host's wheel tags (``runtime_status``), its platform
(``find_python``), the interpreter the workload gets, the venv the agent made and the
project's revision are dataclasses on the laptop (engine/pythonsource.py,
engine/hostpython.py, engine/provision.py). The JSON the agent sends, the cache files
and the journal's provision entry keep their keys: ``to_json(from_json(x)) == x``.
"""

from __future__ import annotations

import json
from pathlib import Path

from remotemac.agent.agentruntime import host_tags
from remotemac.agent.shared import runtime_key, supported
from remotemac.engine import pythonsource
from remotemac.engine.hostpython import HostPython
from remotemac.engine.provision import ProjectRevision, VenvAnswer
from remotemac.engine.pythonsource import (
    DownloadEntry,
    HostPlatform,
    HostTags,
    PypiProject,
    UvListEntry,
    WheelFile,
)


def test_the_hosts_wheel_tags_round_trip_and_give_the_agents_answers() -> None:
    raw = host_tags()
    tags = HostTags.from_json(raw)
    assert tags.to_json() == raw
    assert tags.platforms == raw["platforms"] and tags.python == raw["python"]
    assert tags.accepted() == supported(raw)
    assert runtime_key(tags.to_json()) == runtime_key(raw)  # the wheel cache's key


def test_retagged_tags_name_the_other_python_and_keep_the_platform() -> None:
    mac = HostTags.from_json(
        {"system": "darwin", "machine": "arm64", "mac_release": "14.5", "glibc": ""}
    )
    again = pythonsource.retag(mac, "3.11.9")
    assert (again.python, again.python_tag, again.abi, again.implementation) == (
        "3.11.9",
        "cp311",
        "cp311",
        "cp",
    )
    assert again.platforms[0] == "macosx_14_0_arm64"
    assert HostTags.from_json(again.to_json()) == again


def test_the_platform_round_trips() -> None:
    wire = {"os": "darwin", "arch": "aarch64", "libc": "none"}
    assert HostPlatform.from_json(wire).to_json() == wire
    assert HostPlatform.from_json({}) == HostPlatform(None, None, None)


def test_pypis_files_are_cached_in_the_same_shape(tmp_path: Path, monkeypatch) -> None:
    api = tmp_path / "api" / "torch"
    api.mkdir(parents=True)
    raw = {
        "releases": {
            "2.8.0": [
                {
                    "filename": "torch-2.8.0-cp39-none-macosx_11_0_arm64.whl",
                    "url": "/files/torch.whl",
                    "digests": {"sha256": "a" * 64},
                    "size": 7,
                },
                {"filename": "torch-2.8.0.tar.gz", "url": "https://x/t.tar.gz", "digests": {}},
            ]
        }
    }
    (api / "json").write_text(json.dumps(raw))
    monkeypatch.setenv(pythonsource.ENV_PYPI, (tmp_path / "api").as_uri())
    project = pythonsource.pypi_json(tmp_path / "home", "torch")
    wheel, sdist = project.releases["2.8.0"]
    assert wheel == WheelFile(
        "torch-2.8.0-cp39-none-macosx_11_0_arm64.whl", "file:///files/torch.whl", "a" * 64, 7
    )
    assert sdist.sha256 is None and sdist.size is None
    cached = json.loads((tmp_path / "home" / "sources" / "pypi-torch.json").read_text())
    assert cached == {
        "name": "torch",
        "releases": {"2.8.0": [wheel.to_json(), sdist.to_json()]},
    }
    assert PypiProject.from_json(cached) == project and project.to_json() == cached
    # read again from the cache: the same project
    assert pythonsource.pypi_json(tmp_path / "home", "torch") == project


def test_uvs_download_metadata_entry_round_trips_and_names_its_build() -> None:
    wire = {
        "name": "cpython",
        "arch": {"family": "aarch64", "variant": None},
        "os": "macos",
        "libc": "none",
        "major": 3,
        "minor": 11,
        "patch": 9,
        "prerelease": "",
        "url": "https://example/cpython.tar.gz",
        "sha256": "b" * 64,
        "variant": None,
        "build": "20240101",
    }
    entry = DownloadEntry.from_json(wire)
    assert entry.to_json() == wire and entry.extra == {"build": "20240101"}
    dl = entry.download("cpython-3.11.9-macos-aarch64-none")
    assert dl is not None and (dl.os, dl.arch, dl.libc, dl.version) == (
        "darwin",
        "aarch64",
        "none",
        (3, 11, 9),
    )
    freethreaded = dict(wire, arch={"family": "aarch64", "variant": "v2"})
    assert DownloadEntry.from_json(freethreaded).download("k") is None


def test_uvs_python_list_entry_round_trips_and_names_its_build() -> None:
    wire = {
        "key": "cpython-3.12.3-linux-x86_64-gnu",
        "version": "3.12.3",
        "version_parts": {"major": 3, "minor": 12, "patch": 3},
        "path": None,
        "symlink": None,
        "url": "https://example/cpython-3.12.3.tar.gz",
        "os": "linux",
        "variant": "default",
        "implementation": "cpython",
        "arch": "x86_64",
        "libc": "gnu",
    }
    entry = UvListEntry.from_json(wire)
    assert entry.to_json() == wire
    dl = entry.download()
    assert dl is not None and dl.version_text == "3.12.3" and dl.sha256 is None
    assert UvListEntry.from_json(dict(wire, url=None)).download() is None


def test_the_workloads_interpreter_keeps_its_two_shapes() -> None:
    own = {"python": "/usr/bin/python3.11", "version": "3.11.9", "brought": False}
    assert HostPython.from_json(own).to_json() == own
    brought = {
        "python": "/rr/runtime/python-x/python/bin/python3",
        "version": "3.11.9",
        "brought": True,
        "dir": "/rr/runtime/python-x",
        "reused": False,
        "label": "CPython 3.11.9 (linux x86_64)",
    }
    got = HostPython.from_json(brought)
    assert got.to_json() == brought
    assert got.as_brought() == {
        "dir": "/rr/runtime/python-x",
        "version": "3.11.9",
        "label": "CPython 3.11.9 (linux x86_64)",
        "reused": False,
    }


def test_the_venv_answer_round_trips_and_describes_its_interpreter() -> None:
    wire = {
        "interpreter": "/usr/bin/python3.11",
        "version": "3.11.9",
        "interpreter_is_venv": False,
        "installer": "uv",
        "venv_python": "/rr/envs/k/bin/python",
        "env_dir": "/rr/envs/k",
        "reused": False,
        "key": "k",
        "parent_site": [],
        "seconds": 3.5,
    }
    venv = VenvAnswer.from_json(wire)
    assert venv.to_json() == wire and venv.extra == {"key": "k", "seconds": 3.5}
    assert venv.described(None) == {
        "interpreter": "/usr/bin/python3.11",
        "version": "3.11.9",
        "interpreter_is_venv": False,
        "parent_site": [],
        "installer": "uv",
    }
    # no venv (environment.venv: false): every key there, None
    assert set(VenvAnswer().described(None).values()) == {None}


def test_the_project_revision_round_trips() -> None:
    for wire in ({"git_commit": "abc123", "dirty": False}, {"git_commit": None, "dirty": None}):
        assert ProjectRevision.from_json(wire).to_json() == wire
