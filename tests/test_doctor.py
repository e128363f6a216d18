"""`remotemac doctor`: judging host facts, gathering them through a real transport, output.

The macOS fact sets come from the collector run against shims that replay
recorded macOS outputs ("Simulation:" in the docstring); each check's warn/fail
path is then driven by changing one fact.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path

import pytest

from remotemac.agent import hostfacts as hf
from remotemac.checks import doctor as dr
from remotemac.engine import doctorgather
from remotemac.frontend import doctor as doctor_cli
from remotemac.transport.local import LocalTransport

SHIMS = Path(__file__).parent / "fixtures" / "macos" / "shims"
FIXTURES = SHIMS.parent


def simulate(tmp_path: Path, scenario: str) -> dict:
    """Collect facts on a simulated Mac (shims replaying recorded outputs)."""
    spec = SHIMS / "scenarios" / f"{scenario}.json"
    bindir = tmp_path / f"bin-{scenario}"
    bindir.mkdir()
    for name in json.loads(spec.read_text())["commands"]:
        (bindir / name).symlink_to(SHIMS / name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REMOTEMAC_SHIM_DIR", str(SHIMS))
        mp.setenv("REMOTEMAC_SHIM_PYTHON", sys.executable)
        mp.setenv("REMOTEMAC_SHIM_SCENARIO", str(spec))
        return hf.collect_facts(remote_root=str(tmp_path / "rm"), search_path=str(bindir))


@pytest.fixture(scope="module")
def m1_facts(tmp_path_factory) -> dict:
    return simulate(tmp_path_factory.mktemp("m1"), "m1_sonoma14")


@pytest.fixture
def facts(m1_facts) -> dict:
    return copy.deepcopy(m1_facts)


def statuses(report: dr.DoctorReport) -> dict[str, str]:
    return {c.name: c.status for c in report.checks}


# --------------------------------------------------------------------------- whole hosts


def test_m1_sonoma_is_fit(m1_facts) -> None:
    """Simulation: an M1 on macOS 14.0, bare metal, with CLT, tmux and brew is fit."""
    report = dr.evaluate(m1_facts, local_time=m1_facts["clock"] + 1.0)
    st = statuses(report)
    assert report.fit
    assert st == {
        "macos": "ok",
        "arch": "ok",
        "hardware": "ok",
        "vm": "ok",
        "python": "ok",
        "runtime": "n/a",
        "clt": "ok",
        "tmux": "ok",
        "brew": "ok",
        "disk": "ok",
        "sleep": "ok",
        "dead-man": "ok",
        "clock": "ok",
        "mps": "n/a",
    }
    assert report.check("macos").value == "macOS 14.0 (23A344)"
    assert report.check("hardware").value.startswith("Apple M1, 10 CPUs, 32.0 GiB")
    assert "sleep disabled" in report.check("sleep").value  # SleepDisabled 1 in the capture


def test_intel_high_sierra_is_unfit_for_the_right_reasons(tmp_path) -> None:
    """Simulation: Intel 10.13.3: fails on macOS version, arch and python; warns on the rest."""
    report = dr.evaluate(simulate(tmp_path, "intel_high_sierra"))
    st = statuses(report)
    assert not report.fit
    assert {n for n, s in st.items() if s == "fail"} == {"macos", "arch", "python"}
    assert {n for n, s in st.items() if s == "warn"} == {"clt", "tmux", "brew"}
    assert "10.13.3" in report.check("macos").value
    assert "Intel" in report.check("arch").why


def test_vm_warns_but_stays_fit(tmp_path) -> None:
    """Simulation: hv_vmm_present = 1 gives a VM warning; MPS itself is judged separately."""
    report = dr.evaluate(simulate(tmp_path, "vm_m1_sonoma14"))
    assert report.check("vm").status == "warn"
    assert "VM" in report.check("vm").why
    assert report.fit


def test_rosetta_warns_with_fix(tmp_path) -> None:
    """Simulation: a Rosetta shell on an M3 Max: warn, and point at a native python3."""
    check = dr.evaluate(simulate(tmp_path, "rosetta_m3max")).check("arch")
    assert check.status == "warn" and "Rosetta" in check.value and "arm64" in check.fix


# --------------------------------------------------------------------------- each check


def test_macos_below_14_fails(facts) -> None:
    """Simulation: the recorded RSR sw_vers (13.3.1 (a)) is below the MPS minimum."""
    rsr = (FIXTURES / "sw_vers__rsr_macos13.3.1a.txt").read_text()
    facts["macos"] = hf.parse_sw_vers(rsr)
    check = dr.evaluate(facts).check("macos")
    assert check.status == "fail" and check.value == "macOS 13.3.1 (a) (22E772610a)"
    assert "14" in check.fix


def test_linux_is_not_fit(facts) -> None:
    facts.update(os="Linux", macos=hf.NA, vm=hf.NA, clt=hf.NA, pmset=hf.NA)
    report = dr.evaluate(facts)
    assert report.check("macos").status == "fail" and not report.fit
    assert {report.check(n).status for n in ("vm", "clt", "sleep")} == {"n/a"}


def test_intel_arch_fails(facts) -> None:
    facts["arch"] = {"machine": "x86_64", "translated": False, "arm64_hardware": False}
    assert dr.evaluate(facts).check("arch").status == "fail"


def test_vm_unknown_is_not_applicable(facts) -> None:
    facts["vm"] = {"hv_vmm_present": None}
    assert dr.evaluate(facts).check("vm").status == "n/a"


@pytest.mark.parametrize(
    ("versions", "status"),
    [
        ([], "fail"),
        (["2.7.18"], "fail"),
        (["3.8.18"], "fail"),
        (["3.8.18", "3.9.6"], "ok"),
    ],
)
def test_python_floor(facts, versions, status) -> None:
    facts["pythons"] = [{"path": f"/x/python{v}", "version": v} for v in versions]
    check = dr.evaluate(facts).check("python")
    assert check.status == status
    if status == "fail":
        assert "xcode-select --install" in check.fix


def test_clt_missing_warns(facts) -> None:
    facts["clt"] = {"path": None}
    check = dr.evaluate(facts).check("clt")
    assert check.status == "warn" and check.fix == "xcode-select --install"


def test_tmux_missing_warns_with_fallback(facts) -> None:
    facts["tmux"] = None
    report = dr.evaluate(facts)
    check = report.check("tmux")
    assert check.status == "warn" and check.fix == "brew install tmux"
    assert "daemonised runner" in check.why
    assert report.fit


def test_brew_missing_warns(facts) -> None:
    facts["brew"] = None
    assert dr.evaluate(facts).check("brew").status == "warn"


def test_disk_against_needs(facts) -> None:
    free = facts["disk"]["free_bytes"]
    short = dr.evaluate(facts, needs_disk_bytes=free + (1 << 30))
    assert short.check("disk").status == "fail" and not short.fit
    assert "data.max_bytes" in short.check("disk").fix
    assert dr.evaluate(facts, needs_disk_bytes=free // 2).check("disk").status == "ok"
    facts["disk"]["free_bytes"] = 1 << 30
    assert dr.evaluate(facts).check("disk").status == "warn"
    facts["disk"] = {"path": "/x", "error": "statvfs: boom"}
    assert dr.evaluate(facts).check("disk").status == "fail"


def test_sleep_settings(facts) -> None:
    """Simulation: sleep timer on and sleep not disabled -> warn naming caffeinate -i."""
    facts["pmset"]["SleepDisabled"] = 0
    check = dr.evaluate(facts).check("sleep")
    assert check.status == "warn" and "caffeinate -i" in check.why
    assert check.value.startswith("sleep 1, disksleep 10, displaysleep 10, standby 1")
    facts["pmset"]["sleep"] = 0
    assert dr.evaluate(facts).check("sleep").status == "ok"


def test_clock_skew(facts) -> None:
    assert dr.evaluate(facts, local_time=facts["clock"] - 120).check("clock").status == "warn"
    assert dr.evaluate(facts, local_time=facts["clock"] + 5).check("clock").status == "ok"
    assert dr.evaluate(facts).check("clock").status == "n/a"
    facts["received_at"] = facts["clock"] + 61  # host clock 61 s behind
    check = dr.evaluate(facts).check("clock")
    assert check.status == "warn" and "behind" in check.value


def test_mps_paths(facts) -> None:
    cases = [
        ({"torch": "2.13.0", "built": True, "available": True}, "ok"),
        ({"torch": "2.13.0", "built": True, "available": False}, "fail"),
        ({"torch": "2.13.0", "built": False, "available": False}, "fail"),
        ({"torch": None, "error": "ModuleNotFoundError"}, "warn"),
        ({"torch": None}, "n/a"),
        (None, "n/a"),
    ]
    for mps, status in cases:
        facts["mps"] = mps
        assert dr.evaluate(facts).check("mps").status == status, mps
    facts["mps"] = {"torch": "2.13.0", "built": True, "available": False}
    facts["vm"] = {"hv_vmm_present": True}
    check = dr.evaluate(facts).check("mps")
    assert "VM" in check.why and "bare-metal" in check.fix


def test_collector_error_is_one_failed_check() -> None:
    report = dr.evaluate({"collector_error": "python3 on mac exited 127: command not found"})
    assert not report.fit and [c.name for c in report.checks] == ["collector"]


# --------------------------------------------------------------------------- gathering


class NoPython3(LocalTransport):
    """A host whose PATH has no python3: `env` fails with 127, as an SSH shell would."""

    def __init__(self, empty_dir: str) -> None:
        self.empty_dir = empty_dir

    async def exec(self, argv, **kwargs):
        return await super().exec(["env", f"PATH={self.empty_dir}", *argv], **kwargs)


@pytest.mark.slow
@pytest.mark.asyncio
async def test_gather_facts_local_transport(tmp_path) -> None:
    """The real path: hostfacts source on stdin of `python3 -`, request as argv JSON."""
    facts = await doctorgather.gather_facts(LocalTransport(), str(tmp_path / "rm"))
    assert facts["os"] == "Linux" and facts["disk"]["path"] == str(tmp_path)
    report = dr.evaluate(facts, host="local")
    assert report.check("clock").status == "ok"
    assert abs(facts["clock"] - facts["received_at"]) < 5


@pytest.mark.asyncio
async def test_gather_facts_without_python3(tmp_path) -> None:
    facts = await doctorgather.gather_facts(NoPython3(str(tmp_path)), "~/remotemac")
    assert "exited 127" in facts["collector_error"]
    assert not dr.evaluate(facts).fit


@pytest.mark.slow
def test_main_doctor_json_on_this_linux_host(tmp_path, capsys) -> None:
    """`doctor local --json` here: one JSON object, not fit (Linux has no MPS), exit 1."""
    rc = doctor_cli.main_doctor("local", True, LocalTransport(), remote_root=str(tmp_path))
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["fit"] is False and out["host"] == "local"
    assert {c["name"] for c in out["checks"]} >= {"macos", "arch", "disk", "tmux", "mps"}


def test_render_and_exit_code(m1_facts) -> None:
    """Simulation: the fit M1 renders as a table with exit 0; a failing disk gives exit 1."""
    from rich.console import Console

    console = Console(record=True, width=160)
    report = dr.evaluate(m1_facts, host="mac-rental")
    assert doctor_cli.emit(report, False, console) == 0
    text = console.export_text()
    assert "remotemac doctor mac-rental: fit" in text and "macOS 14.0 (23A344)" in text
    short = dr.evaluate(m1_facts, needs_disk_bytes=m1_facts["disk"]["free_bytes"] * 2)
    console = Console(record=True, width=160)
    assert doctor_cli.emit(short, False, console) == 1
    assert "not fit" in console.export_text()
    console = Console(record=True, width=160)
    assert doctor_cli.emit(short, True, console) == 1
    assert json.loads(console.export_text())["fit"] is False


@pytest.mark.slow
def test_doctor_coroutine_wires_gather_and_evaluate(tmp_path) -> None:
    """gather_facts is a coroutine; doctor() wires gather + evaluate."""
    report = asyncio.run(doctorgather.doctor(LocalTransport(), "local", str(tmp_path)))
    assert report.host == "local" and report.facts["os"] == "Linux"


def test_doctor_says_which_dead_man_guard_a_run_would_get(facts) -> None:
    """The dead-man row names launchd's domain and its check, or the sleeper and why."""
    facts["deadman"] = {
        "method": "launchd",
        "domain": "user/501",
        "verified": "launchctl print user/501",
        "refused": [{"domain": "gui/501", "why": "exit 113: Could not find domain"}],
    }
    row = dr.evaluate(facts).check("dead-man")
    assert row.value == "launchd, domain user/501"
    assert "checked with launchctl print user/501" in row.why and "gui/501 refused" in row.why
    facts["deadman"] = {"method": "sleeper", "why": "not macOS: no launchd"}
    row = dr.evaluate(facts).check("dead-man")
    assert row.value == "host-side sleeper" and row.why.startswith("not macOS: no launchd")
