"""The agent brings its own runtime (a pinned cryptography) to a host with a bare Python.

The "bare host" here is pyenv's CPython 3.9 with nothing but pip and setuptools,
set as the agent's interpreter (``agent.python``), the way a rented Mac's
/usr/bin/python3 is: no third-party module importable. Before the runtime existed,
an encrypted sync under such an interpreter died with ``ModuleNotFoundError: No
module named 'cryptography'`` and exit 3.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from remotemac.agent import agentruntime as art
from remotemac.engine.agentclient import AgentClient
from remotemac.engine.pythonsource import HostTags
from remotemac.engine.runtime import ensure_runtime, fetch_wheels, pip_download_argv
from remotemac.engine.sync import sync_slice
from remotemac.errors import EXIT_HOST_ENV, HostEnvironmentError
from remotemac.transport.local import LocalTransport
from tests.conftest import remotemac
from tests.harness import lab, ramstores

BARE = (
    os.environ.get("REMOTEMAC_TEST_BARE_PYTHON") or lab.bare_python("3.9") or "/no/bare/python3.9"
)
needs_bare = pytest.mark.skipif(not os.access(BARE, os.X_OK), reason=f"no bare Python at {BARE}")
pytestmark = pytest.mark.timeout(300)


# ------------------------------------------------------------------ wheel tags


def test_mac_arm64_tags_take_abi3_and_universal2_never_x86():
    tags = art.platform_tags("Darwin", "arm64", "14.5")
    assert tags[0] == "macosx_14_0_arm64"
    assert {"macosx_11_0_arm64", "macosx_10_9_universal2", "macosx_14_0_universal2"} <= set(tags)
    assert not [t for t in tags if "x86_64" in t]
    # an old-SDK Python answers 10.16 on macOS 11+: still an arm64 Mac
    assert art.platform_tags("Darwin", "arm64", "10.16")[0] == "macosx_11_0_arm64"


def test_linux_tags_follow_glibc_down_to_manylinux2014():
    tags = art.platform_tags("Linux", "x86_64", glibc=(2, 36))
    assert tags[0] == "manylinux_2_36_x86_64" and tags[-1] == "manylinux2014_x86_64"
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_16_x86_64" not in tags
    assert art.platform_tags("Linux", "aarch64", glibc=(2, 28))[0] == "manylinux_2_28_aarch64"
    assert art.platform_tags("Linux", "x86_64", glibc=(0, 0)) == []  # musl: nothing to fetch


def _host(system: str, machine: str, python: str = "3.9.6", **kw) -> dict:
    major, minor = python.split(".")[:2]
    return {
        "python": python,
        "python_tag": f"cp{major}{minor}",
        "implementation": "cp",
        "abi": f"cp{major}{minor}",
        "system": system.lower(),
        "machine": machine,
        "platforms": art.platform_tags(system, machine, **kw),
    }


@pytest.mark.parametrize(
    "name,host,fits",
    [
        ("cryptography-50.0.2-cp39-abi3-macosx_11_0_arm64.whl", ("Darwin", "arm64"), True),
        ("cryptography-48.0.1-cp39-abi3-macosx_10_9_universal2.whl", ("Darwin", "arm64"), True),
        ("cryptography-50.0.2-cp311-abi3-macosx_11_0_arm64.whl", ("Darwin", "arm64"), False),
        ("cffi-2.0.0-cp39-cp39-macosx_11_0_arm64.whl", ("Darwin", "arm64"), True),
        ("cffi-2.0.0-cp310-cp310-macosx_11_0_arm64.whl", ("Darwin", "arm64"), False),
        (
            "cffi-2.0.0-cp39-cp39-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            ("Linux", "x86_64"),
            True,
        ),
        (
            "cffi-2.0.0-cp39-cp39-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            ("Linux", "aarch64"),
            False,
        ),
        ("cryptography-50.0.2-cp39-abi3-manylinux_2_34_x86_64.whl", ("Linux", "x86_64"), False),
        ("pycparser-2.23-py3-none-any.whl", ("Darwin", "arm64"), True),
    ],
)
def test_wheel_fits_only_its_host(name, host, fits):
    system, machine = host
    tags = (
        _host(system, machine, mac_release="14.5")
        if system == "Darwin"
        else _host(system, machine, glibc=(2, 31))
    )
    assert art.wheel_fits(name, tags) is fits


def test_pip_download_names_the_full_python_version_and_every_platform(tmp_path):
    tags = _host("Darwin", "arm64", mac_release="13.1")
    argv = pip_download_argv(HostTags.from_json(tags), tmp_path)
    # "3.9" would mean 3.9.0, which cryptography's Requires-Python excludes
    assert argv[argv.index("--python-version") + 1] == "3.9.6"
    plats = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert plats == tags["platforms"] and "--only-binary=:all:" in argv
    assert argv[-3:] == art.requirements()


def test_runtime_key_changes_with_python_and_platform():
    mac = _host("Darwin", "arm64", mac_release="14.5")
    assert art.runtime_key(mac) == art.runtime_key(dict(mac, python="3.9.18"))
    assert art.runtime_key(mac) != art.runtime_key(
        _host("Darwin", "arm64", "3.10.1", mac_release="14.5")
    )
    assert art.runtime_key(mac) != art.runtime_key(_host("Linux", "aarch64", glibc=(2, 31)))


# ------------------------------------------------------------------ the unzip installer


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(
    path: Path,
    members: dict[str, bytes],
    *,
    record_override: dict | None = None,
    symlink: str | None = None,
) -> Path:
    """A wheel with a correct RECORD unless told otherwise."""
    dist = "demo-1.0.dist-info"
    members = {**members, f"{dist}/METADATA": b"Name: demo\nVersion: 1.0\n"}
    rows = [f"{n},{_record_hash(d)},{len(d)}" for n, d in members.items()]
    for name, value in (record_override or {}).items():
        rows = [r for r in rows if not r.startswith(name + ",")] + [f"{name},{value},"]
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        if symlink:
            info = zipfile.ZipInfo(symlink)
            info.external_attr = 0o120777 << 16
            zf.writestr(info, b"/etc/passwd")
            rows.append(f"{symlink},,")
        zf.writestr(f"{dist}/RECORD", "\n".join(rows + [f"{dist}/RECORD,,"]) + "\n")
    return path


def test_unzip_installs_purelib_and_platlib_and_skips_scripts(tmp_path):
    wheel = make_wheel(
        tmp_path / "demo-1.0-py3-none-any.whl",
        {
            "demo/__init__.py": b"X = 1\n",
            "demo-1.0.data/platlib/demo_ext.py": b"Y = 2\n",
            "demo-1.0.data/scripts/demo": b"#!/bin/sh\n",
        },
    )
    target = tmp_path / "t"
    written = art.install_wheel(str(wheel), str(target))
    assert (target / "demo" / "__init__.py").read_bytes() == b"X = 1\n"
    assert (target / "demo_ext.py").read_bytes() == b"Y = 2\n"
    assert not (target / "demo").joinpath("..", "demo-1.0.data").exists()
    assert "demo_ext.py" in written and not (target / "bin").exists()


@pytest.mark.parametrize(
    "bad", ["../escape.py", "demo/../../escape.py", "/tmp/abs.py", "C:/win.py", "demo\\..\\x.py"]
)
def test_unzip_refuses_members_that_escape(tmp_path, bad):
    wheel = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {bad: b"evil\n"})
    with pytest.raises(art.RuntimeInstallError) as err:
        art.install_wheel(str(wheel), str(tmp_path / "t"))
    assert err.value.code == "bad-wheel"
    assert not (tmp_path / "escape.py").exists() and not Path("/tmp/abs.py").exists()


def test_unzip_refuses_symlinks_and_records_that_lie(tmp_path):
    (tmp_path / "a").mkdir()
    linked = make_wheel(
        tmp_path / "a" / "demo-1.0-py3-none-any.whl",
        {"demo/__init__.py": b""},
        symlink="demo/passwd",
    )
    with pytest.raises(art.RuntimeInstallError, match="symlink"):
        art.install_wheel(str(linked), str(tmp_path / "t1"))
    lying = make_wheel(
        tmp_path / "demo-1.0-py3-none-any.whl",
        {"demo/__init__.py": b"X = 1\n"},
        record_override={"demo/__init__.py": _record_hash(b"X = 2\n")},
    )
    with pytest.raises(art.RuntimeInstallError, match="RECORD hash"):
        art.install_wheel(str(lying), str(tmp_path / "t2"))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:  # a member the RECORD does not list
        zf.writestr("demo-1.0.dist-info/RECORD", "demo-1.0.dist-info/RECORD,,\n")
        zf.writestr("demo/extra.py", b"")
    (tmp_path / "x-1.0-py3-none-any.whl").write_bytes(buf.getvalue())
    with pytest.raises(art.RuntimeInstallError, match="not in its RECORD"):
        art.install_wheel(str(tmp_path / "x-1.0-py3-none-any.whl"), str(tmp_path / "t3"))


def test_uploaded_wheels_are_checked_before_unzipping(tmp_path):
    tags = dict(_host("Linux", "x86_64", glibc=(2, 31)))
    wheel = make_wheel(tmp_path / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": b""})
    item = {"name": wheel.name, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}
    with pytest.raises(art.RuntimeInstallError, match="not in the pinned set"):
        art.install_wheels(str(tmp_path), [item], tags, str(tmp_path / "t"))
    with pytest.raises(art.RuntimeInstallError, match="damaged") as err:
        art.install_wheels(str(tmp_path), [dict(item, sha256="0" * 64)], tags, str(tmp_path / "t"))
    assert err.value.code == "integrity"


# ------------------------------------------------------------------ end to end, bare 3.9


def make_data(root: Path, files: int = 6, size: int = 300_000) -> list[str]:
    for i in range(files):
        path = root / f"d{i % 2}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def _sync_on_bare_host(
    tmp_path: Path, method: str, home: Path | None, run_id: str
) -> tuple[dict, dict, list[dict]]:
    """Agent under the bare 3.9: prepare, bring the runtime, encrypted sync; (runtime, answer,
    ledger)."""
    root = tmp_path / "host-root"
    ledger_path = tmp_path / f"ledger-{run_id}.jsonl"
    from remotemac.engine.ledger import Ledger

    agent = AgentClient(LocalTransport(), str(root), Ledger(ledger_path), python=BARE)
    prepared = await agent.call("prepare_run", {"root": str(root), "run_id": run_id})
    runtime = await ensure_runtime(agent, home=home, method=method, run_id=run_id)
    data = tmp_path / "data"
    paths = (
        make_data(data)
        if not data.exists()
        else sorted(str(p.relative_to(data)) for p in data.rglob("*") if p.is_file())
    )
    try:
        manifest, answer, _ = await sync_slice(
            agent.transport,
            agent,
            root=data,
            paths=paths,
            run_dir=prepared["run_dir"],
            run_id=run_id,
            key=os.urandom(32),
            runtime_dir=runtime.dir,
        )
        for entry in manifest.entries:
            assert (
                Path(answer["data_dir"], entry.path).read_bytes()
                == (data / entry.path).read_bytes()
            )
    finally:
        shutil.rmtree(f"/dev/shm/remotemac-{run_id}", ignore_errors=True)
    ledger = [json.loads(x) for x in ledger_path.read_text().splitlines()]
    return runtime, answer, ledger


@needs_bare
def test_bare_host_python_has_no_cryptography():
    """The premise: the bare interpreter cannot import cryptography by itself."""
    res = subprocess.run([BARE, "-s", "-c", "import cryptography"], capture_output=True)
    assert res.returncode != 0 and b"ModuleNotFoundError" in res.stderr


@pytest.mark.e2e
@needs_bare
@pytest.mark.asyncio
async def test_encrypted_sync_on_bare_python_online_then_reused(tmp_path):
    started = time.monotonic()
    runtime, answer, ledger = await _sync_on_bare_host(tmp_path, "online", None, "rt-on-1")
    cold = time.monotonic() - started
    assert runtime.reused is False and runtime.method == "online"
    assert runtime.cryptography == dict(art.PINS)["cryptography"]
    rt_dir = Path(runtime.dir)
    assert rt_dir.parent == tmp_path / "host-root" / "runtime" and (rt_dir / ".complete").is_file()
    assert [e for e in ledger if e["op"] == "install-runtime"][0]["command"].startswith(
        f"installed cryptography=={runtime.cryptography}, cffi==2.0.0, pycparser==2.23 into "
        f"{rt_dir}"
    )
    # the data agent ran under the bare interpreter, not the workload's
    assert [e for e in ledger if e["op"] == "sync-data"][0]["command"].startswith(BARE + " ")
    inventory = json.loads((tmp_path / "host-root" / "inventory.json").read_text())
    assert {"runtime"} <= {i["kind"] for i in inventory["items"]}
    assert str(rt_dir) in {i["path"] for i in inventory["items"]}
    # nothing but the runtime dir and pip's cache: no half-installed leftovers, no lock file
    assert {p.name for p in rt_dir.parent.iterdir()} <= {rt_dir.name, art.PIP_CACHE}
    started = time.monotonic()
    again, _, ledger2 = await _sync_on_bare_host(tmp_path, "online", None, "rt-on-2")
    warm = time.monotonic() - started
    assert again.reused is True and again.dir == runtime.dir
    assert not [e for e in ledger2 if e["op"] == "install-runtime"]
    print(
        f"\nonline: cold sync with runtime install {cold:.2f} s "
        f"(install {runtime.seconds} s); second run {warm:.2f} s, 0 installs"
    )


@pytest.mark.e2e
@needs_bare
@pytest.mark.asyncio
async def test_two_runs_starting_together_install_once(tmp_path):
    """A fleet's runs on one host ask at the same moment: one installs, the other waits and
    reuses; the runtime is never half there."""
    root = tmp_path / "host-root"
    agents = [AgentClient(LocalTransport(), str(root), python=BARE) for _ in range(2)]
    for agent in agents:  # (uploading the agent itself is another matter)
        await agent.install()
    answers = await asyncio.gather(*(ensure_runtime(a, home=None, method="online") for a in agents))
    assert sorted(a.reused for a in answers) == [False, True]
    assert answers[0].dir == answers[1].dir
    assert {p.name for p in (root / "runtime").iterdir()} <= {
        Path(answers[0].dir).name,
        art.PIP_CACHE,
    }


@pytest.mark.e2e
@needs_bare
@pytest.mark.asyncio
async def test_encrypted_sync_on_bare_python_offline_from_laptop_wheels(tmp_path):
    home = tmp_path / "rmhome"
    started = time.monotonic()
    runtime, _, ledger = await _sync_on_bare_host(tmp_path, "offline", home, "rt-off-1")
    cold = time.monotonic() - started
    assert runtime.reused is False and runtime.method == "offline"
    cached = list((home / "wheels").iterdir())
    assert len(cached) == 1 and len(list(cached[0].glob("*.whl"))) == 3
    assert any(e["op"] == "upload-wheels" for e in ledger)
    assert not [
        p
        for p in (tmp_path / "host-root" / "runtime").iterdir()
        if "upload-" in p.name or ".tmp-" in p.name
    ]
    print(
        f"\noffline: cold sync with wheel download + upload + unzip {cold:.2f} s "
        f"(host-side unzip install {runtime.seconds} s)"
    )


@pytest.mark.e2e
@needs_bare
@pytest.mark.asyncio
async def test_auto_falls_back_to_laptop_wheels_when_host_pip_fails(tmp_path, monkeypatch):
    home = tmp_path / "rmhome"
    tags = json.loads(
        subprocess.run(
            [
                BARE,
                "-c",
                "import sys, json; sys.path.insert(0, sys.argv[1]); "
                "from remotemac.agent import agentruntime; "
                "print(json.dumps(agentruntime.host_tags()))",
                str(Path(art.__file__).parent.parent.parent),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    await asyncio.to_thread(
        fetch_wheels, home, HostTags.from_json(tags)
    )  # the laptop's cache, filled earlier
    # the host cannot reach any index (the agent inherits this environment locally)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    events: list = []
    root = tmp_path / "host-root"
    agent = AgentClient(LocalTransport(), str(root), python=BARE)
    runtime = await ensure_runtime(agent, home=home, method="auto", emit=events.append)
    assert runtime.method == "offline" and runtime.reused is False
    warning = [e for e in events if getattr(e, "code", "") == "runtime-offline"]
    assert warning and "cannot install the agent runtime online" in warning[0].message


@pytest.mark.e2e
@needs_bare
@pytest.mark.asyncio
async def test_failed_online_install_is_exit_6_with_pips_last_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    agent = AgentClient(LocalTransport(), str(tmp_path / "host-root"), python=BARE)
    with pytest.raises(HostEnvironmentError) as err:
        await ensure_runtime(agent, home=None, method="online", phase="sync")
    assert err.value.exit_code == EXIT_HOST_ENV == 6
    line = err.value.line()
    assert "\n" not in line and "during sync" in line and "pip install failed" in line
    assert "No matching distribution" in line or "from versions: none" in line
    assert not (tmp_path / "host-root" / "runtime" / "").joinpath("x").exists()
    assert not [
        p
        for p in (tmp_path / "host-root" / "runtime").iterdir()
        if p.is_dir() and p.name != art.PIP_CACHE
    ]


@needs_bare
@pytest.mark.asyncio
async def test_decrypting_without_the_runtime_is_exit_6_not_3(tmp_path):
    """What a user met before: the host's python has no cryptography. Now one line, exit 6."""
    root = tmp_path / "host-root"
    agent = AgentClient(LocalTransport(), str(root), python=BARE)
    # the id names the RAM store (/dev/shm/remotemac-<id>): one per user and test run, so
    # root's earlier run on this machine never holds it
    run_id = f"rt-missing-{os.getuid()}-{os.getpid()}"
    prepared = await agent.call("prepare_run", {"root": str(root), "run_id": run_id})
    data = tmp_path / "data"
    try:
        with pytest.raises(HostEnvironmentError) as err:
            await sync_slice(
                agent.transport,
                agent,
                root=data,
                paths=make_data(data, files=1),
                run_dir=prepared["run_dir"],
                run_id=run_id,
                key=os.urandom(32),
                runtime_dir=str(root / "runtime" / "0123456789abcdef"),
            )
    finally:  # the refused sync made the RAM store; no wipe follows it here
        ramstores.remove_stores({run_id}, {os.geteuid()})
    assert err.value.exit_code == 6
    assert "agent runtime" in err.value.line() and "phase sync" in err.value.line()


@pytest.mark.e2e
@needs_bare
def test_pipeline_on_bare_agent_python_then_cleanup_removes_runtime(
    make_preinstalled_playbook, rm_home, tmp_path
):
    """The whole run with the agent on the bare 3.9 (an encrypted slice); a second run
    reuses the runtime; cleanup removes it."""
    pb = make_preinstalled_playbook(agent={"python": BARE})
    out1, out2 = tmp_path / "out1", tmp_path / "out2"
    first = remotemac("run", str(pb), "--out", str(out1))
    assert first.returncode == 0, first.stdout + first.stderr
    ledger = [json.loads(x) for x in (out1 / "ledger.jsonl").read_text().splitlines()]
    installs = [e for e in ledger if e["op"] == "install-runtime"]
    assert len(installs) == 1 and "installed cryptography==" in installs[0]["command"]
    agent_calls = [
        e for e in ledger if "hostagent.py" in e["command"] or "dataops.py" in e["command"]
    ]
    assert agent_calls and all(e["command"].startswith(BARE + " ") for e in agent_calls)
    assert json.loads((out1 / "acceptance.json").read_text())["dataset"]["encrypted"] is True
    second = remotemac("run", str(pb), "--out", str(out2))
    assert second.returncode == 0, second.stdout + second.stderr
    ledger2 = [json.loads(x) for x in (out2 / "ledger.jsonl").read_text().splitlines()]
    assert not [e for e in ledger2 if e["op"] == "install-runtime"]
    runtime_root = tmp_path / "host-root" / "runtime"
    assert [p for p in runtime_root.iterdir() if (p / ".complete").is_file()]
    cleaned = remotemac(
        "cleanup",
        "local",
        "--remote-root",
        str(tmp_path / "host-root"),
        "--yes",
        "--json",
        "--out",
        str(tmp_path / "cleanup"),
        cwd=tmp_path,
        env={"REMOTEMAC_AGENT_PYTHON": BARE},
    )
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    assert not runtime_root.exists()


# ------------------------------------------------------------------ doctor


@pytest.mark.e2e
@needs_bare
@pytest.mark.asyncio
async def test_doctor_reports_runtime_absent_then_present(tmp_path, monkeypatch):
    from remotemac.engine import doctorgather as dr

    monkeypatch.setenv("REMOTEMAC_AGENT_PYTHON", BARE)
    root = tmp_path / "host-root"
    before = (await dr.doctor(LocalTransport(), "local", str(root))).check("runtime")
    assert before.status == "ok" and before.value.startswith("absent: will be installed")
    assert "online with the host's pip" in before.value and "cryptography==" in before.why
    await ensure_runtime(AgentClient(LocalTransport(), str(root)), home=None, method="online")
    after = (await dr.doctor(LocalTransport(), "local", str(root))).check("runtime")
    assert after.status == "ok" and after.value.startswith("present: cryptography ")
    assert str(root / "runtime") in after.value


def test_doctor_runtime_verdicts():
    from remotemac.checks.doctor import _check_runtime

    tags = {"python": "3.8.10", "system": "linux", "machine": "x86_64"}
    old = {"present": False, "python_ok": False, "tags": tags, "pip": True, "wheels_known": True}
    assert _check_runtime({"agent_runtime": old}).status == "fail"
    stuck = dict(old, python_ok=True, pip=False, wheels_known=False)
    check = _check_runtime({"agent_runtime": stuck})
    assert check.status == "fail" and "cannot be installed" in check.value
    offline_only = dict(stuck, wheels_known=True)
    assert "offline from wheels" in _check_runtime({"agent_runtime": offline_only}).value
    assert _check_runtime({}).status == "n/a"


@pytest.mark.e2e
@needs_bare
def test_run_whose_runtime_cannot_install_exits_6_naming_sync(
    make_preinstalled_playbook, rm_home, tmp_path
):
    """The CLI's answer to a host that can neither pip-install nor be forced offline."""
    pb = make_preinstalled_playbook(agent={"python": BARE, "runtime_install": "online"})
    proc = remotemac(
        "run",
        str(pb),
        "--out",
        str(tmp_path / "out"),
        env={"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": ""},
    )
    assert proc.returncode == EXIT_HOST_ENV, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert errors and "during sync" in errors[-1] and "pip install failed" in errors[-1]
    assert "Traceback" not in proc.stderr


def test_activate_refuses_a_cryptography_from_anywhere_else(tmp_path):
    """The decrypting process takes cryptography from the runtime only: here the runtime
    dir is empty and this interpreter has its own cryptography, which must be refused."""
    fake = tmp_path / "rt"
    fake.mkdir()
    (fake / ".complete").write_text("{}")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from remotemac.agent import agentruntime as a\n"
        "try:\n    a.activate(sys.argv[2]); print('accepted')\n"
        "except a.RuntimeInstallError as e:\n    print('refused:', e)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(art.__file__).parent.parent.parent), str(fake)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("refused:") and "not the agent runtime" in out
    missing = subprocess.run(
        [sys.executable, "-c", code, str(Path(art.__file__).parent), str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
    ).stdout
    assert "missing or incomplete" in missing


def test_settings_agent_python_and_install_method(monkeypatch):
    from remotemac.engine.agentclient import agent_python
    from remotemac.engine.runtime import install_method
    from remotemac.errors import BadInput
    from remotemac.playbook import PlaybookErrors, parse_playbook

    base = "name: t\nworkload: {command: 'python x.py --out {output_dir}'}\n"
    pb = parse_playbook(base)
    assert pb.agent.python is None and pb.agent.runtime_install is None
    monkeypatch.delenv("REMOTEMAC_AGENT_PYTHON", raising=False)
    monkeypatch.delenv("REMOTEMAC_RUNTIME_INSTALL", raising=False)
    assert agent_python(pb.agent.python) == "python3" and install_method(None) == "auto"
    pb = parse_playbook(base + "agent: {python: /usr/bin/python3, runtime_install: offline}\n")
    assert agent_python(pb.agent.python) == "/usr/bin/python3"
    assert install_method(pb.agent.runtime_install) == "offline"
    monkeypatch.setenv("REMOTEMAC_RUNTIME_INSTALL", "online")  # the environment wins
    assert install_method("offline") == "online"
    monkeypatch.setenv("REMOTEMAC_RUNTIME_INSTALL", "sometimes")
    with pytest.raises(BadInput):
        install_method(None)
    with pytest.raises(PlaybookErrors, match="runtime_install"):
        parse_playbook(base + "agent: {runtime_install: always}\n")


@pytest.mark.slow
@pytest.mark.parametrize(
    "system,machine,extra",
    [
        ("Darwin", "arm64", {"mac_release": "14.5"}),
        ("Linux", "x86_64", {"glibc": (2, 31)}),
        ("Linux", "aarch64", {"glibc": (2, 28)}),
    ],
)
def test_pins_have_wheels_for_every_supported_host(tmp_path, system, machine, extra):
    """Simulation (for the Mac): the laptop's real ``pip download`` for a macOS 14 arm64
    CPython 3.9.6 (/usr/bin/python3) and two glibc Linux hosts finds one fitting wheel per
    pin, so the offline path works there and the pins are still the right ones."""
    tags = _host(system, machine, **extra)
    cache, files, cached = fetch_wheels(tmp_path / "home", HostTags.from_json(tags))
    assert not cached and cache == tmp_path / "home" / "wheels" / art.runtime_key(tags)
    names = {art.parse_wheel_name(f["name"])[0]: f["name"] for f in files}
    assert set(names) == {n for n, _ in art.PINS}
    assert all(art.wheel_fits(name, tags) for name in names.values())
    assert f"cryptography-{dict(art.PINS)['cryptography']}-cp39-abi3-" in names["cryptography"]
    assert (
        fetch_wheels(tmp_path / "home", HostTags.from_json(tags))[2] is True
    )  # the second time: the cache


class _CorruptingTransport(LocalTransport):
    """Flips one byte of every wheel it uploads (a damaged transfer)."""

    async def put(self, local, remote, *, progress=None):
        await super().put(local, remote, progress=progress)
        if remote.endswith(".whl"):
            blob = bytearray(Path(remote).read_bytes())
            blob[len(blob) // 2] ^= 0x01
            Path(remote).write_bytes(bytes(blob))


@pytest.mark.e2e
@needs_bare
@pytest.mark.asyncio
async def test_a_damaged_wheel_upload_is_exit_5_and_leaves_nothing(tmp_path):
    from remotemac.errors import IntegrityError

    root = tmp_path / "host-root"
    agent = AgentClient(_CorruptingTransport(), str(root), python=BARE)
    with pytest.raises(IntegrityError) as err:
        await ensure_runtime(agent, home=tmp_path / "rmhome", method="offline")
    assert err.value.exit_code == 5 and "damaged" in err.value.line()
    assert list((root / "runtime").iterdir()) == []  # no runtime, no upload left behind
