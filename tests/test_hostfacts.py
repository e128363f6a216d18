"""The host-facts collector: parsers on recorded macOS outputs, end-to-end runs on shims,
and a real run on this machine.

Tests whose docstring starts with "Simulation:" use recorded real macOS outputs
(tests/fixtures/macos/, sources in README.md there) or shims that replay them.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remotemac.agent import hostfacts as hf

FIXTURES = Path(__file__).parent / "fixtures" / "macos"
SHIMS = FIXTURES / "shims"
HOSTFACTS = Path(hf.__file__)


def sample(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def make_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: str) -> str:
    """A bin dir holding only the shims the scenario's host has; returns it as search path."""
    spec_path = SHIMS / "scenarios" / f"{scenario}.json"
    commands = json.loads(spec_path.read_text())["commands"]
    bindir = tmp_path / f"bin-{scenario}"
    bindir.mkdir()
    for name in commands:
        (bindir / name).symlink_to(SHIMS / name)
    monkeypatch.setenv("REMOTEMAC_SHIM_DIR", str(SHIMS))
    monkeypatch.setenv("REMOTEMAC_SHIM_PYTHON", sys.executable)
    monkeypatch.setenv("REMOTEMAC_SHIM_SCENARIO", str(spec_path))
    return str(bindir)


# --------------------------------------------------------------------------- sw_vers


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "sw_vers__m1_macos14.0.txt",
            {"product_name": "macOS", "product_version": "14.0", "build_version": "23A344"},
        ),
        (
            "sw_vers__rsr_macos13.3.1a.txt",
            {
                "product_name": "macOS",
                "product_version": "13.3.1",
                "product_version_extra": "(a)",
                "build_version": "22E772610a",
            },
        ),
        (
            "sw_vers__intel_macos10.13.3_single_tab.txt",
            {"product_name": "Mac OS X", "product_version": "10.13.3", "build_version": "17D47"},
        ),
    ],
)
def test_parse_sw_vers_recorded(name: str, expected: dict) -> None:
    """Simulation: two-TAB (13+), one-TAB (10.x) and RSR (ProductVersionExtra) forms."""
    assert hf.parse_sw_vers(sample(name)) == expected


def test_version_tuple() -> None:
    assert hf.version_tuple("13.3.1") == (13, 3, 1)
    assert hf.version_tuple("14.0") >= (14,)
    assert hf.version_tuple("10.13.3") < (14,)
    assert hf.version_tuple("3.12.0rc1") == (3, 12, 0)
    assert hf.version_tuple(None) == ()


# --------------------------------------------------------------------------- sysctl


def test_parse_sysctl_value_recorded() -> None:
    """Simulation: `sysctl -n machdep.cpu.brand_string` on an M1; integers become ints."""
    assert hf.parse_sysctl_value(sample("sysctl_-n_machdep.cpu.brand_string__m1.txt")) == "Apple M1"
    assert hf.parse_sysctl_value("17179869184\n") == 17179869184
    assert hf.parse_sysctl_value("\n") is None


# --------------------------------------------------------------------------- uname


# --------------------------------------------------------------------------- pmset


def test_parse_pmset_g_recorded() -> None:
    """Simulation: `pmset -g` of an Apple-Silicon MBP (reporter's ** markup stripped)."""
    parsed = hf.parse_pmset_g(sample("pmset_-g__apple_silicon_mbp_2022.txt").replace("**", ""))
    assert parsed.settings["SleepDisabled"] == 1
    assert (
        parsed.settings["sleep"],
        parsed.settings["disksleep"],
        parsed.settings["displaysleep"],
        parsed.settings["standby"],
    ) == (
        1,
        10,
        10,
        1,
    )
    assert parsed.settings["Sleep On Power Button"] == 1
    assert parsed.settings["hibernatefile"] == "/var/vm/sleepimage"
    assert parsed.settings["lowpowermode"] == 0
    assert parsed.notes["sleep"].startswith("(sleep prevented by bluetoothd")
    assert "System-wide power settings" not in parsed.settings


def test_parse_pmset_g_tolerates_markup() -> None:
    """Simulation: the raw paste (with ** around one line) still yields the sleep settings."""
    parsed = hf.parse_pmset_g(sample("pmset_-g__apple_silicon_mbp_2022.txt"))
    assert parsed.settings["sleep"] == 1 and parsed.settings["disksleep"] == 10


# --------------------------------------------------------------------------- df


def test_parse_df_h_comma_locale() -> None:
    """Simulation: `df -h` on an EC2 Mac whose locale writes 9,9Gi; `map auto_home` row."""
    rows = hf.parse_df(sample("df_-h__apple_silicon_ec2_comma_locale.txt"))
    assert len(rows) == 10
    root = rows[0]
    assert root.filesystem == "/dev/disk5s2s1" and root.mounted_on == "/"
    assert root.size_bytes == 100 << 30
    assert root.used_bytes == int(9.9 * (1 << 30))
    assert root.avail_bytes == 78 << 30
    assert root.capacity == "12%"
    auto_home = next(r for r in rows if r.filesystem == "map auto_home")
    assert auto_home.mounted_on == "/System/Volumes/Data/home"
    assert auto_home.avail_bytes == 0
    assert hf.df_volume_for(rows, "/private/tmp/tmp-mount-dXCsHT/x").filesystem == "/dev/disk2s4"
    assert hf.df_volume_for(rows, "/Users/ec2-user/remotemac") is root


def test_parse_df_h_mount_with_space() -> None:
    """Simulation: `df -h` in a Parallels guest: "/Volumes/Parallels Tools" keeps its space."""
    rows = hf.parse_df(sample("df_-h__apple_silicon_parallels_vm.txt"))
    tools = rows[-1]
    assert tools.mounted_on == "/Volumes/Parallels Tools"
    assert tools.size_bytes == int(1.1 * (1 << 20))
    assert rows[0].avail_bytes == 32 << 30


def test_parse_df_512_blocks() -> None:
    """Simulation: BSD `df` in 512-byte blocks (Intel 10.14.6), long names, spaces in mounts."""
    rows = hf.parse_df(sample("df__intel_macos10.14.6_jc.txt"))
    root = rows[0]
    assert root.size_bytes == 976490576 * 512
    assert root.avail_bytes == 660310352 * 512
    snap = next(r for r in rows if r.filesystem.startswith("com.apple.TimeMachine"))
    assert snap.mounted_on.endswith("/2019-11-29-075900/Macintosh HD")
    assert any(r.filesystem == "map -hosts" and r.mounted_on == "/net" for r in rows)


def test_parse_df_real_posix_output(tmp_path: Path) -> None:
    """`df -P -k` on this machine (GNU or BSD) agrees with os.statvfs within 1 %."""
    out = subprocess.run(
        ["df", "-P", "-k", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout
    row = hf.df_volume_for(hf.parse_df(out), str(tmp_path))
    st = os.statvfs(tmp_path)
    assert row is not None
    assert abs(row.size_bytes - st.f_blocks * st.f_frsize) <= 0.01 * row.size_bytes


# --------------------------------------------------------------------------- small parsers


def test_parse_versions_and_probe() -> None:
    """Version lines of python/tmux (recorded tmux -V), and the MPS probe's JSON line."""
    assert hf.parse_tmux_version(sample("tmux_-V__linux_debian_tmux3.3a.txt")) == "3.3a"
    assert hf.parse_tmux_version("tmux next-3.5\n") == "next-3.5"
    assert hf.parse_python_version("Python 3.9.6\n") == "3.9.6"
    assert hf.parse_python_version("\nPython 2.7.18\n") == "2.7.18"  # Python 2 prints on stderr
    assert hf.parse_python_version("bash: python3: command not found") is None
    probe = 'UserWarning: something\n{"torch": "2.5.1", "built": true, "available": true}\n'
    assert hf.parse_mps_probe(probe) == {"torch": "2.5.1", "built": True, "available": True}
    assert hf.parse_mps_probe("Traceback ...\n") is None
    assert hf.parse_mps_probe("{not json\n") is None


# --------------------------------------------------------------------------- shims


@pytest.mark.slow
def test_shims_replay_and_fail_like_the_tool(tmp_path, monkeypatch) -> None:
    """Simulation: shims replay recordings for known argv and fail for the rest."""
    bindir = Path(make_host(tmp_path, monkeypatch, "m1_sonoma14"))

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bindir / argv[0]), *argv[1:]], capture_output=True, text=True)

    assert run("sw_vers").stdout == sample("sw_vers__m1_macos14.0.txt")
    assert run("sw_vers", "-productVersion").stdout == "14.0\n"
    assert run("sysctl", "-n", "machdep.cpu.brand_string").stdout == "Apple M1\n"
    assert run("sysctl", "kern.hv_vmm_present").stdout == "kern.hv_vmm_present: 0\n"
    assert run("sysctl", "-n", "kern.hv_support").stdout == "1\n"  # bare metal has it
    unknown = run("sysctl", "-n", "kern.hv_support", "hw.optional.arm64")
    assert unknown.returncode == 0  # both known on this host
    assert run("uname", "-m").stdout == "arm64\n"
    assert run("uname", "-a").stdout == sample("uname_-a__m1_ec2_mac2metal_darwin23.6.txt")
    assert run("brew", "config").stdout == sample("brew_config__m1_bigsur.txt")
    assert "HOMEBREW_PREFIX: /opt/homebrew" in run("brew", "config").stdout
    assert run("df", "-h").stdout == sample("df_-h__apple_silicon_ec2_comma_locale.txt")
    for argv in (("brew", "--prefix"), ("uname", "-p"), ("pmset", "-g", "batt"), ("df", "-k")):
        result = run(*argv)
        assert result.returncode == 64 and "no recording" in result.stderr, argv


def test_sysctl_shim_unknown_oid_like_the_runner(tmp_path, monkeypatch) -> None:
    """Simulation: a key the host lacks fails with the recorded GitHub-runner error text."""
    bindir = Path(make_host(tmp_path, monkeypatch, "intel_high_sierra"))
    result = subprocess.run(
        [str(bindir / "sysctl"), "kern.hv_support"], capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == sample("sysctl_kern.hv_support__gha_macos14_arm64_runner.txt")


# --------------------------------------------------------------------------- collect_facts


@pytest.mark.slow
def test_collect_facts_m1_sonoma(tmp_path, monkeypatch) -> None:
    """Simulation: an M1 on macOS 14.0 (shims on PATH): every fact is read from the replays."""
    path = make_host(tmp_path, monkeypatch, "m1_sonoma14")
    facts = hf.collect_facts(remote_root=str(tmp_path / "rm"), search_path=path)
    assert facts["os"] == "Darwin"
    assert facts["macos"]["product_version"] == "14.0"
    assert facts["arch"] == {"machine": "arm64", "translated": False, "arm64_hardware": True}
    assert facts["hardware"] == {"chip": "Apple M1", "ncpu": 10, "memory_bytes": 34359738368}
    assert facts["vm"] == {"hv_vmm_present": False}
    assert facts["clt"] == {"path": "/Applications/Xcode.app/Contents/Developer"}
    assert facts["tmux"]["version"] == "3.3a"
    assert facts["brew"]["path"].endswith("/brew")
    assert [p["version"] for p in facts["pythons"]] == ["3.9.6"]
    assert facts["pmset"]["sleep"] == 1 and facts["pmset"]["SleepDisabled"] == 1
    assert facts["disk"]["path"] == str(tmp_path) and facts["disk"]["free_bytes"] > 0
    assert facts["mps"] is None
    assert facts["errors"] == []
    json.dumps(facts)  # it must travel as JSON


@pytest.mark.slow
def test_collect_facts_intel_high_sierra(tmp_path, monkeypatch) -> None:
    """Simulation: a stock Intel Mac on 10.13.3: x86_64, no python3/CLT/tmux/brew/pmset."""
    path = make_host(tmp_path, monkeypatch, "intel_high_sierra")
    facts = hf.collect_facts(remote_root=str(tmp_path / "rm"), search_path=path)
    assert facts["macos"]["product_name"] == "Mac OS X"
    assert facts["arch"] == {"machine": "x86_64", "translated": False, "arm64_hardware": None}
    assert facts["hardware"] == {"chip": None, "ncpu": None, "memory_bytes": None}
    assert facts["vm"] == {"hv_vmm_present": None}
    assert facts["pythons"] == [] and facts["tmux"] is None and facts["brew"] is None
    assert facts["clt"] == {"path": None} and facts["pmset"] is None


@pytest.mark.slow
def test_collect_facts_vm(tmp_path, monkeypatch) -> None:
    """Simulation: the M1 scenario with kern.hv_vmm_present = 1 (synthesized value)."""
    path = make_host(tmp_path, monkeypatch, "vm_m1_sonoma14")
    facts = hf.collect_facts(remote_root=str(tmp_path / "rm"), search_path=path)
    assert facts["vm"] == {"hv_vmm_present": True}


@pytest.mark.slow
def test_collect_facts_rosetta(tmp_path, monkeypatch) -> None:
    """Simulation: an M3 Max shell under Rosetta: uname says x86_64, hardware is arm64."""
    path = make_host(tmp_path, monkeypatch, "rosetta_m3max")
    facts = hf.collect_facts(remote_root=str(tmp_path / "rm"), search_path=path)
    assert facts["arch"] == {"machine": "x86_64", "translated": True, "arm64_hardware": True}
    assert facts["hardware"]["chip"] == "Apple M3 Max"
    assert facts["pmset"] is None  # no pmset recording in this scenario, nothing invented


@pytest.mark.slow
def test_collect_facts_injected_run_sees_absolute_argv(tmp_path, monkeypatch) -> None:
    """The injectable runner gets resolved paths; a tool that is absent is never run."""
    path = make_host(tmp_path, monkeypatch, "intel_high_sierra")
    calls: list[list[str]] = []

    def run(argv):
        calls.append(list(argv))
        return hf.subprocess_run(argv)

    hf.collect_facts(run=run, remote_root=str(tmp_path), search_path=path)
    assert calls and all(os.path.isabs(argv[0]) for argv in calls)
    assert {os.path.basename(argv[0]) for argv in calls} <= {"uname", "sw_vers", "sysctl"}


def test_system_python_stub_not_run_without_clt(tmp_path, monkeypatch) -> None:
    """Simulation: without the CLT, /usr/bin/python3 is an installer stub and is not run."""
    path = make_host(tmp_path, monkeypatch, "m1_sonoma14")
    monkeypatch.setattr(hf, "SYSTEM_PYTHON", os.path.join(path, "python3"))
    host = hf.Host(None, path)
    assert hf._pythons(host, clt_present=False) == []
    assert [p["version"] for p in hf._pythons(host, clt_present=True)] == ["3.9.6"]


@pytest.mark.slow
def test_collect_facts_real_linux(tmp_path) -> None:
    """This machine, for real: Linux, macOS-only facts n/a, disk numbers, tmux when installed."""
    facts = hf.collect_facts(remote_root=str(tmp_path / "not" / "yet" / "remotemac"))
    assert facts["os"] == os.uname().sysname == "Linux"
    for key in ("macos", "vm", "clt", "pmset"):
        assert facts[key] == hf.NA
    assert facts["disk"]["path"] == str(tmp_path)
    assert 0 < facts["disk"]["free_bytes"] <= facts["disk"]["total_bytes"]
    assert (facts["tmux"] is not None) == (shutil.which("tmux") is not None)
    assert facts["hardware"]["ncpu"] == os.cpu_count() and facts["hardware"]["memory_bytes"] > 0
    assert any(p["version"].startswith("3.") for p in facts["pythons"])
    assert facts["arch"]["machine"] == os.uname().machine


def test_disk_falls_back_to_df(tmp_path, monkeypatch) -> None:
    """When statvfs fails, the real `df -P -k` of this machine gives the numbers."""
    real = os.statvfs(tmp_path)

    def broken(_path):
        raise OSError("statvfs unavailable")

    monkeypatch.setattr(hf.os, "statvfs", broken)
    disk = hf._disk(hf.Host(None, None), str(tmp_path))
    assert disk["source"] == "df"
    assert abs(disk["total_bytes"] - real.f_blocks * real.f_frsize) <= 0.01 * disk["total_bytes"]


@pytest.mark.slow
def test_mps_probe_real_torch_in_a_preinstalled_python(tmp_path) -> None:
    """The MPS probe run for real with this interpreter, a preinstalled environment
    with torch (a Linux torch has no MPS); the probe of a venv the host built under
    remote_root/envs is test_venv_found_under_remote_root's."""
    facts = hf.collect_facts(
        remote_root=str(tmp_path), venv_python=sys.executable, search_path=str(tmp_path)
    )
    mps = facts["mps"]
    assert mps["python"] == sys.executable
    if importlib.util.find_spec("torch") is None:
        assert mps["torch"] is None
    else:
        assert mps["torch"] == importlib.metadata.version("torch")
        assert mps["built"] is False and mps["available"] is False  # not macOS


def test_venv_found_under_remote_root(tmp_path) -> None:
    """A venv under remote_root/envs/<hash>/ is found and probed (it has no torch)."""
    env = tmp_path / "envs" / "abc123"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    assert hf.find_venv_python(str(tmp_path)) == str(env / "bin" / "python")
    facts = hf.collect_facts(remote_root=str(tmp_path), search_path=str(tmp_path / "none"))
    assert facts["mps"]["torch"] is None
    assert "torch" in facts["mps"]["error"]
    missing = hf.collect_facts(
        remote_root=str(tmp_path),
        venv_python=str(tmp_path / "nope"),
        search_path=str(tmp_path / "none"),
    )
    assert "error" in missing["mps"]


# --------------------------------------------------------------------------- shipping


def _oldest_python() -> str:
    """A Python 3.9 when this machine has one (pyenv or PATH), else this interpreter."""
    for candidate in [
        shutil.which("python3.9"),
        *glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9")),
    ]:
        if (
            candidate
            and subprocess.run([candidate, "--version"], capture_output=True).returncode == 0
        ):
            return candidate
    return sys.executable


def test_facts_from_memory_as_doctor_ships_them(tmp_path) -> None:
    """The in-memory bootstrap with hostfacts' source on stdin (how doctor runs it), on
    Python 3.9 if present: one JSON line of facts, nothing written."""
    from remotemac.engine.agentship import BOOTSTRAP, in_memory_payload

    python = _oldest_python()
    request = {"remote_root": str(tmp_path / "rm"), "venv_python": None}
    proc = subprocess.run(
        [python, "-c", BOOTSTRAP],
        input=in_memory_payload("hostfacts", "op_facts", request),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    facts = answer["result"]
    assert answer["ok"] and facts["schema"] == hf.SCHEMA and facts["disk"]["path"] == str(tmp_path)
    assert facts["python_running"]["executable"] == python
    assert not (tmp_path / "rm").exists()


def test_vermin_python39() -> None:
    """The collector is shipped to Macs whose python3 is 3.9: vermin must agree."""
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    proc = subprocess.run(
        [vermin, "-t=3.9-", "--violations", "--no-tips", str(HOSTFACTS)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_stdlib_only() -> None:
    """Nothing outside the standard library is imported by the shipped file."""
    import ast

    tree = ast.parse(HOSTFACTS.read_text())
    names = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    names |= {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert names <= set(sys.stdlib_module_names)


def test_every_sample_used_keeps_its_source() -> None:
    """Each recorded sample the scenarios and these tests read has its .source row and a README line."""
    used = set()
    for spec in (SHIMS / "scenarios").glob("*.json"):
        text = spec.read_text()
        used |= {name for name in os.listdir(FIXTURES) if f'"{name}"' in text}
    used |= {
        name
        for name in os.listdir(FIXTURES)
        if name.endswith(".txt") and f'"{name}"' in Path(__file__).read_text()
    }
    readme = (FIXTURES / "README.md").read_text()
    assert len(used) >= 17  # the sysctl-dump and uname parsers left with their tests (issue 21)
    for name in used:
        source = (FIXTURES / f"{name}.source").read_text()
        assert name in source and f"`{name}`" in readme, name


# --------------------------------------------------------------------------- dead-man guard


def _launchctl_shim(tmp_path: Path, shown: tuple[str, ...]) -> str:
    """A ``launchctl`` whose ``print DOMAIN`` exits 0 only for the domains in ``shown``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "launchctl"
    cases = "".join(f'  "print {d}") echo "{d} = {{"; exit 0;;\n' for d in shown)
    shim.write_text(
        '#!/bin/sh\ncase "$*" in\n'
        f"{cases}"
        '  *) echo "Bad request." >&2; echo "Could not find domain for $2" >&2; exit 113;;\n'
        "esac\n"
    )
    shim.chmod(0o755)
    return str(bindir)


def test_deadman_guard_is_launchd_in_the_first_domain_launchctl_print_shows(tmp_path) -> None:
    """Simulation (a launchctl shim): an SSH-only login has no gui/ domain; user/ holds."""
    uid = os.getuid()
    host = hf.Host(None, _launchctl_shim(tmp_path, (f"user/{uid}",)))
    got = hf._deadman(host, True)
    assert got["method"] == "launchd" and got["domain"] == f"user/{uid}"
    assert got["verified"] == f"launchctl print user/{uid}"
    assert [r["domain"] for r in got["refused"]] == [f"gui/{uid}"]
    assert "exit 113: Could not find domain" in got["refused"][0]["why"]


def test_deadman_guard_is_the_sleeper_when_launchctl_print_shows_no_domain(tmp_path) -> None:
    """Simulation: neither domain shown (legacy ``load`` exiting 0 would not count): the
    run would get the host-side sleeper, and the facts say why."""
    host = hf.Host(None, _launchctl_shim(tmp_path, ()))
    got = hf._deadman(host, True)
    assert got["method"] == "sleeper" and "neither launchd domain" in got["why"]
    assert len(got["refused"]) == 2


def test_deadman_guard_off_macos_is_the_sleeper(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv(hf.LAB_DARWIN_ENV, raising=False)
    got = hf._deadman(hf.Host(None, _launchctl_shim(tmp_path, ("user/0",))), False)
    assert got == {"method": "sleeper", "why": "not macOS: no launchd"}
