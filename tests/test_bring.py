"""Bringing a binary thing to a host: a version request, the archive's checks, its two ways in.

The agent's side (agent/bring.py, agent/pythons.py) runs here directly on this
machine's Python; the sshd tests (test_bring_sshd.py) run it on the lab host.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from remotemac.agent import bring as agent_bring
from remotemac.agent import pythons
from remotemac.agent.agentruntime import host_tags
from remotemac.agent.venvops import uv_index_args
from remotemac.engine import pincheck, pythonsource
from remotemac.engine.hostpython import version_request
from remotemac.engine.pythonsource import HostPlatform, HostTags
from remotemac.errors import BadInput
from tests.harness import hostbuilt, pbs

FIXTURES = Path(__file__).parent / "fixtures" / "pypi"


def test_a_version_request_is_told_from_an_interpreter_name() -> None:
    assert pythons.parse_spec("3.11") == [("==", (3, 11))]
    assert pythons.parse_spec(">=3.10, <3.13") == [(">=", (3, 10)), ("<", (3, 13))]
    for name in ("python3", "python3.11", "/usr/bin/python3", "~/venv/bin/python"):
        assert pythons.parse_spec(name) is None and version_request(name) is None
    assert pythons.matches(pythons.parse_spec("3.11"), (3, 11, 7))
    assert not pythons.matches(pythons.parse_spec("3.11"), (3, 12, 0))
    assert pythons.matches(pythons.parse_spec(">=3.10"), (3, 11, 7))
    assert not pythons.matches(pythons.parse_spec(">=3.10"), (3, 9, 6))
    with pytest.raises(BadInput, match="a version is written like"):
        version_request(">=three")


def test_playbook_takes_a_quoted_version_and_refuses_a_yaml_number() -> None:
    from pydantic import ValidationError

    from remotemac.playbook import Environment

    assert Environment(python="3.11").python == "3.11"
    assert Environment(python="python3").python == "python3"  # old playbooks stay valid
    with pytest.raises(ValidationError, match='write the version quoted, python: "3.1"'):
        Environment(python=3.1)


def _bin(tmp_path: Path, **links: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for name, target in links.items():
        (d / name).symlink_to(target)
    return d


def test_find_python_matches_the_request_among_the_hosts_interpreters(tmp_path, monkeypatch):
    """Only what is in the search path counts; the newest match wins; no match is None.
    The interpreter is one of the host's own (hostbuilt.host_python), not the test's."""
    host = hostbuilt.host_python()
    full = subprocess.run(
        [host, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    major, minor = (int(x) for x in full.split(".")[:2])
    me = f"{major}.{minor}"
    monkeypatch.setenv(pythons.ENV_SEARCH, str(_bin(tmp_path, **{f"python{me}": host})))
    found = pythons.op_find_python({"spec": me, "root": str(tmp_path / "root")})
    assert found["python"] == str(tmp_path / "bin" / f"python{me}")
    assert found["brought"] is False and found["platform"]["os"] == "linux"
    none = pythons.op_find_python({"spec": f">={major}.{minor + 1}"})
    assert none["python"] is None and [p["version"] for p in none["pythons"]] == [full]


def _claimed_root(tmp_path: Path) -> Path:
    from remotemac.agent import cleanupops

    root = tmp_path / "root"
    assert cleanupops.op_claim_root({"root": str(root)})["created"]
    return root


def _fake_python_archive(path: Path, extra: list[tarfile.TarInfo] | None = None) -> str:
    """An install_only-shaped archive whose python3.11 is a script printing its version."""
    script = b"#!/bin/sh\necho 3.11.7\n"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("python/bin/python3.11")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
        link = tarfile.TarInfo("python/bin/python3")
        link.type, link.linkname = tarfile.SYMTYPE, "python3.11"
        tar.addfile(link)
        for member in extra or []:
            tar.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _upload(root: Path, archive: Path) -> str:
    up = root / "runtime" / "upload-test"
    up.mkdir(parents=True, exist_ok=True)
    dest = up / archive.name
    dest.write_bytes(archive.read_bytes())
    return str(dest)


def _req(root: Path, sha: str, **kw: object) -> dict:
    return {
        "root": str(root),
        "name": "python-test",
        "what": "python",
        "format": "tar.gz",
        "sha256": sha,
        **kw,
    }


def test_an_uploaded_python_is_checked_unpacked_marked_listed_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(pythons.ENV_SEARCH, str(_bin(tmp_path)))  # a host with none of its own
    root = _claimed_root(tmp_path)
    archive = tmp_path / "cpython.tar.gz"
    sha = _fake_python_archive(archive)
    got = agent_bring.op_bring(_req(root, sha, method="offline", upload=_upload(root, archive)))
    final = root / "runtime" / "python-test"
    assert got["dir"] == str(final) and got["version"] == "3.11.7" and not got["reused"]
    assert got["exe"] == str(final / "python" / "bin" / "python3.11")
    assert json.loads((final / ".remotemac-owned").read_text())["kind"] == "runtime"
    items = json.loads((root / "inventory.json").read_text())["items"]
    assert {"kind": "runtime", "path": str(final)} in [
        {"kind": i["kind"], "path": i["path"]} for i in items
    ]
    assert not (root / "runtime" / "upload-test").exists()  # upload and its dir removed
    again = agent_bring.op_bring(_req(root, sha, method="offline"))
    assert again["reused"] is True and again["exe"] == got["exe"]
    found = pythons.op_find_python({"spec": "3.11", "root": str(root)})
    assert found["python"] == got["exe"] and found["brought"] is True


def test_a_damaged_upload_is_refused_before_unpacking(tmp_path):
    root = _claimed_root(tmp_path)
    archive = tmp_path / "cpython.tar.gz"
    _fake_python_archive(archive)
    with pytest.raises(agent_bring.BringError, match="damaged") as err:
        agent_bring.op_bring(_req(root, "0" * 64, method="offline", upload=_upload(root, archive)))
    assert err.value.code == "integrity"
    assert list((root / "runtime").iterdir()) == []  # nothing unpacked, upload removed


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "member, why",
    [
        (_member("../escape"), "'..' in path"),
        (_member("/etc/evil"), "absolute path"),
        (_member("python/lib/evil", tarfile.SYMTYPE, "/etc/passwd"), "links outside"),
        (_member("python/lib/evil", tarfile.SYMTYPE, "../../../x"), "links outside"),
        (_member("python/dev", tarfile.CHRTYPE), "device or fifo"),
    ],
)
def test_an_archive_member_that_could_leave_the_tree_is_refused(tmp_path, member, why):
    root = _claimed_root(tmp_path)
    archive = tmp_path / "bad.tar.gz"
    sha = _fake_python_archive(archive, [member])
    with pytest.raises(agent_bring.BringError, match=why):
        agent_bring.op_bring(_req(root, sha, method="offline", upload=_upload(root, archive)))
    assert not (tmp_path / "escape").exists() and not (root / "runtime" / "python-test").exists()


def test_online_the_host_downloads_from_a_mirror_and_a_file_url_falls_to_the_laptop(tmp_path):
    """The host fetches http(s) itself (here a loopback mirror); a file:// URL names the
    laptop's disk, so the host answers 'failed' and the laptop brings it (engine/bring.py)."""
    root = _claimed_root(tmp_path)
    site = tmp_path / "mirror"
    site.mkdir()
    sha = _fake_python_archive(site / "cpython.tar.gz")
    failed = agent_bring.op_bring(
        _req(root, sha, method="online", url=(site / "cpython.tar.gz").as_uri())
    )
    assert "a file:// URL names the laptop's disk" in failed["failed"]
    with pbs.serve(site) as url:
        got = agent_bring.op_bring(_req(root, sha, method="online", url=f"{url}/cpython.tar.gz"))
    assert got["method"] == "online" and got["version"] == "3.11.7"
    assert sorted(p.name for p in (root / "runtime").iterdir()) == ["python-test"]


def test_the_downloads_json_is_uvs_and_the_mirror_replaces_the_site(tmp_path, monkeypatch):
    site = pythonsource.SITES[0]
    listing = pbs.downloads_json(tmp_path / "d.json", f"{site}/20240101/cpython.tar.gz", "ab" * 32)
    monkeypatch.setenv(pythonsource.ENV_JSON, listing.as_uri())
    monkeypatch.setenv(pythonsource.ENV_MIRROR, "http://127.0.0.1:9/pbs/")
    [dl] = pythonsource.python_downloads(None)
    assert dl.url == "http://127.0.0.1:9/pbs/20240101/cpython.tar.gz"
    plat = {"os": "linux", "arch": "x86_64", "libc": "gnu"}
    on = HostPlatform.from_json
    assert pythonsource.choose([dl], pythons.parse_spec(">=3.10"), on(plat)) == dl
    assert pythonsource.choose([dl], pythons.parse_spec("3.12"), on(plat)) is None
    assert (
        pythonsource.choose([dl], pythons.parse_spec("3.11"), on(dict(plat, os="darwin"))) is None
    )
    art = pythonsource.python_artifact(None, dl)
    assert art.sha256 == "ab" * 32 and art.format == "tar.gz" and art.what == "python"


MAC = {
    "system": "darwin",
    "machine": "arm64",
    "mac_release": "14.5",
    "glibc": "",
    "python": "3.9.6",
    "implementation": "cp",
}


def _mac_tags() -> HostTags:
    return pythonsource.retag(HostTags.from_json(dict(MAC, platforms=[])), "3.9.6")


def test_torch_2_13_has_no_wheel_for_a_macs_python_3_9_and_2_8_has(tmp_path, monkeypatch):
    """The pin check reads PyPI's JSON (a trimmed copy of the real answer, see .source)."""
    monkeypatch.setenv(pythonsource.ENV_PYPI, FIXTURES.as_uri())
    tags = _mac_tags()
    bad = pincheck.check_pin(tmp_path, "torch", "2.13.0", "3.9.6", tags)
    assert bad.ok is False
    assert bad.line == (
        "torch==2.13.0 has no wheel for CPython 3.9 on darwin arm64 (it has CPython 3.10–3.14)"
    )
    assert pincheck.check_pin(tmp_path, "torch", "2.13.0", "3.11.9", tags).ok is True
    assert pincheck.check_pin(tmp_path, "torch", "2.8.0", "3.9.6", tags).ok is True
    assert (tmp_path / "sources" / "pypi-torch.json").is_file()  # cached in --home


def test_without_network_the_pin_check_says_it_could_not_check(tmp_path, monkeypatch):
    monkeypatch.setenv(pythonsource.ENV_PYPI, "http://127.0.0.1:9")
    verdict = pincheck.check_pin(tmp_path, "torch", "2.13.0", "3.9.6", _mac_tags())
    assert verdict.ok is None and "could not check" in verdict.line


def test_pins_are_read_from_a_lock_file() -> None:
    text = b"# lock\ntorch==2.13.0+cpu ; sys_platform == 'linux'\nnumpy==2.1\nTorchVision==0.28.0\n"
    assert pincheck.pins(text) == [("torch", "2.13.0"), ("torchvision", "0.28.0")]


def test_uv_gets_the_hosts_pip_settings_as_options() -> None:
    env = {"PIP_FIND_LINKS": "/opt/wheels /more", "PIP_INDEX_URL": "http://idx/simple"}
    assert uv_index_args(env) == [
        "--find-links",
        "/opt/wheels",
        "--find-links",
        "/more",
        "--index-url",
        "http://idx/simple",
    ]


def test_uvs_wheel_for_the_host_is_picked_by_its_platform_tags(tmp_path, monkeypatch):
    files = [
        f"uv-{pythonsource.UV_VERSION}-py3-none-{p}.whl"
        for p in ("macosx_11_0_arm64", "manylinux_2_17_x86_64.manylinux2014_x86_64", "win_amd64")
    ]
    api = tmp_path / "api" / "uv"
    api.mkdir(parents=True)
    rel = [
        {"filename": f, "url": f"https://files.example/{f}", "digests": {"sha256": f"{i}" * 64}}
        for i, f in enumerate(files)
    ]
    (api / "json").write_text(json.dumps({"releases": {pythonsource.UV_VERSION: rel}}))
    monkeypatch.setenv(pythonsource.ENV_PYPI, (tmp_path / "api").as_uri())
    mac = pythonsource.uv_artifact(None, _mac_tags())
    assert mac is not None and mac.url.endswith("macosx_11_0_arm64.whl") and mac.format == "zip"
    here = pythonsource.uv_artifact(None, HostTags.from_json(host_tags()))
    assert here is not None and "manylinux_2_17_x86_64" in here.url
    assert os.path.basename(here.url) == files[1]


@pytest.mark.asyncio
async def test_building_the_environment_reports_what_is_installed_and_for_how_long(monkeypatch):
    """Provision was silent for a minute after the upload bar: now an event every TICK_S."""
    import asyncio
    from types import SimpleNamespace

    from remotemac.engine import provision

    monkeypatch.setattr(provision, "TICK_S", 0.05)
    events: list = []
    ctx = SimpleNamespace(run_id="r", emit=events.append)

    async def slow() -> str:
        await asyncio.sleep(0.3)
        return "built"

    got = await provision._with_ticker(ctx, "installing torch==2.13.0 with uv", slow())
    assert got == "built" and len(events) >= 4
    assert all(
        e.phase == "provision" and "installing torch==2.13.0 with uv: " in e.detail for e in events
    )
    assert events[0].detail.endswith(": 0 s")


def test_a_failed_uv_install_is_one_line_with_the_resolvers_last_lines(tmp_path, monkeypatch):
    import shutil

    from remotemac.agent.venvops import op_ensure_venv

    monkeypatch.setenv("UV_OFFLINE", "1")  # no index here: uv's resolver answers at once
    root = _claimed_root(tmp_path)
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("torch==2.13.0\n")
    request = {
        "root": str(root),
        "key": "k",
        "python": hostbuilt.host_python(),  # the host's own, not the test's
        "requirements": str(reqs),
        "uv": shutil.which("uv"),
    }
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    with pytest.raises(Exception) as err:  # noqa: PT011 (the agent's own AgentError)
        op_ensure_venv(request)
    assert type(err.value).__name__ == "AgentError" and err.value.code == "env-failed"
    message = str(err.value)
    assert message.startswith("uv pip install failed (exit 1): ") and "\n" not in message
    assert "torch" in message and "No solution found" in message, message


@pytest.mark.parametrize(
    "python, line",
    [
        (
            '"3.9"',
            "torch==2.13.0 has no wheel for CPython 3.9 on any platform (it has CPython 3.10–3.14)",
        ),
        ('"3.11"', "torch==2.13.0 has a wheel for CPython 3.11 on any platform"),
    ],
)
def test_the_dry_run_says_whether_the_pinned_torch_exists_for_the_python_asked(
    tmp_path, monkeypatch, python, line
):
    from remotemac.engine.plan import make_plan
    from remotemac.playbook import load_playbook

    monkeypatch.setenv(pythonsource.ENV_PYPI, FIXTURES.as_uri())
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "requirements.lock").write_text("torch==2.13.0\nnumpy\n")
    book = tmp_path / "pb.yaml"
    book.write_text(
        "name: t\nhost: mac\nproject: {path: .}\n"
        f"environment: {{python: {python}, requirements: requirements.lock}}\n"
        "workload:\n  command: python train.py\n  reference: {device: cpu, on: remote}\n"
        "  target: {device: mps}\n"
    )
    plan = make_plan(load_playbook(book), tmp_path / "home")
    assert plan["python"]["kind"] == "version" and plan["python"]["pins"] == [line]
