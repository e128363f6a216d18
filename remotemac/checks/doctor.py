"""``remotemac doctor HOST``: is this host fit to run a PyTorch job on MPS?

The facts are gathered on the host by :mod:`remotemac.agent.hostfacts` (its source
runs from memory, engine/agentship.py, so nothing is installed or left behind); this module
judges them locally, so the rules live in one place and can change without
re-shipping code. Each check says what it saw, why it matters and how to fix it.
``fit`` means no check failed; warnings are things remotemac works around.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from remotemac.agent.hostfacts import NA, version_tuple
from remotemac.agent.protocol import Op
from remotemac.checks.pythoncheck import check_pins, check_workload_python
from remotemac.transport.base import Transport

OK, WARN, FAIL, NOT_APPLICABLE = "ok", "warn", "fail", "n/a"
MIN_MACOS = (14,)  # torch >= 2.8 refuses MPS below macOS 14 ("supported on MacOS 14.0+")
MIN_PYTHON = (3, 9)  # the agent's floor, and what the CLT's python3 provides
LOW_DISK_BYTES = 5 << 30  # a torch venv is ~1.5 GiB and pip's cache as much again
MAX_SKEW_S = 60.0
GATHER_TIMEOUT_S = 300.0  # the MPS probe's first `import torch` can be slow on a cold disk


@dataclass
class Check:
    """One row of the report."""

    name: str
    status: str  # ok | warn | fail | n/a
    value: str
    why: str = ""
    fix: str = ""


@dataclass
class DoctorReport:
    """All checks for one host, plus the raw facts they were judged from."""

    host: str
    checks: list[Check]
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def fit(self) -> bool:
        return all(check.status != FAIL for check in self.checks)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "fit": self.fit,
            "checks": [asdict(c) for c in self.checks],
            "facts": self.facts,
        }


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"


# --------------------------------------------------------------------------- checks


def _check_macos(facts: dict[str, Any]) -> Check:
    macos = facts.get("macos")
    if facts.get("os") != "Darwin" or macos == NA:
        return Check(
            "macos",
            FAIL,
            str(facts.get("os") or "unknown OS"),
            "MPS exists only on macOS (14 or newer)",
            "use an Apple-Silicon Mac as HOST",
        )
    if not isinstance(macos, dict) or not macos.get("product_version"):
        return Check(
            "macos",
            FAIL,
            "unknown",
            "sw_vers gave no version",
            "check that /usr/bin/sw_vers runs on the host",
        )
    version = macos["product_version"]
    extra = f" {macos['product_version_extra']}" if macos.get("product_version_extra") else ""
    value = f"macOS {version}{extra} ({macos.get('build_version', '?')})"
    if version_tuple(version) < MIN_MACOS:
        return Check(
            "macos",
            FAIL,
            value,
            "PyTorch's MPS backend needs macOS 14.0 or newer",
            "upgrade the host to macOS 14 (Sonoma) or newer, or rent a newer Mac",
        )
    return Check("macos", OK, value)


def _check_arch(facts: dict[str, Any]) -> Check:
    arch = facts.get("arch") or {}
    machine = arch.get("machine") or "unknown"
    if facts.get("os") != "Darwin":
        return Check("arch", NOT_APPLICABLE, machine, "not macOS")
    if arch.get("translated") is True:
        return Check(
            "arch",
            WARN,
            f"{machine} under Rosetta 2 (arm64 hardware)",
            "a venv made from an x86_64 python gets an x86_64 torch, which has no MPS",
            "use a native arm64 python3 (/usr/bin/python3 or /opt/homebrew/bin/python3)",
        )
    if machine == "arm64":
        return Check("arch", OK, machine)
    return Check(
        "arch",
        FAIL,
        machine,
        "MPS needs Apple Silicon (arm64); this is an Intel Mac",
        "rent an Apple-Silicon Mac (M1 or newer)",
    )


def _check_hardware(facts: dict[str, Any]) -> Check:
    hw = facts.get("hardware") or {}
    if not any(hw.get(k) for k in ("chip", "ncpu", "memory_bytes")):
        return Check("hardware", NOT_APPLICABLE, "unknown", "sysctl gave no hardware facts")
    value = f"{hw.get('chip') or '?'}, {hw.get('ncpu') or '?'} CPUs, {_gib(hw.get('memory_bytes'))}"
    why = "MPS shares this memory with the CPU" if facts.get("os") == "Darwin" else ""
    return Check("hardware", OK, value, why)


def _check_vm(facts: dict[str, Any]) -> Check:
    vm = facts.get("vm")
    if vm == NA or facts.get("os") != "Darwin":
        return Check("vm", NOT_APPLICABLE, "n/a", "not macOS")
    present = (vm or {}).get("hv_vmm_present")
    if present is None:
        return Check("vm", NOT_APPLICABLE, "unknown", "sysctl kern.hv_vmm_present is missing")
    if present:
        return Check(
            "vm",
            WARN,
            "virtual machine (kern.hv_vmm_present = 1)",
            "MPS is unavailable in many macOS VMs (GitHub's arm64 runners among them)",
            "see the mps row once a venv exists; rent a bare-metal Mac if it fails",
        )
    return Check("vm", OK, "bare metal")


def _check_python(facts: dict[str, Any]) -> Check:
    pythons = facts.get("pythons") or []
    good = [p for p in pythons if version_tuple(p.get("version")) >= MIN_PYTHON]
    value = ", ".join(f"{p['version']} ({p['path']})" for p in pythons) or "none found"
    if good:
        return Check("python", OK, value)
    fix = (
        "xcode-select --install (brings python3 3.9), or brew install python@3.12"
        if facts.get("os") == "Darwin"
        else "install python3 >= 3.9"
    )
    return Check("python", FAIL, value, "remotemac's agent and the venv need Python >= 3.9", fix)


def _check_runtime(facts: dict[str, Any]) -> Check:
    """The agent's own runtime (cryptography, for decrypting the slice on the host)."""
    rt = facts.get("agent_runtime")
    if not isinstance(rt, dict):
        return Check("runtime", NOT_APPLICABLE, "not asked")
    if rt.get("error"):
        return Check("runtime", WARN, "unknown", f"the status check failed: {rt['error']}")
    tags = rt.get("tags") or {}
    pins = ", ".join(rt.get("pins") or [])
    if rt.get("present"):
        marker = rt.get("marker") or {}
        return Check(
            "runtime",
            OK,
            f"present: cryptography {marker.get('cryptography')} "
            f"({marker.get('method')}) in {rt.get('dir')}",
        )
    if not rt.get("python_ok"):
        return Check(
            "runtime",
            FAIL,
            f"absent; the agent's Python is {tags.get('python')}",
            "the agent runtime needs CPython 3.9 or newer",
            "point agent.python (or REMOTEMAC_AGENT_PYTHON) at a Python >= 3.9",
        )
    ways = (["online with the host's pip"] if rt.get("pip") else []) + (
        ["offline from wheels this laptop downloads"] if rt.get("wheels_known") else []
    )
    if not ways:
        return Check(
            "runtime",
            FAIL,
            "absent, and cannot be installed",
            f"the host's Python has no pip and no known wheel platform "
            f"({tags.get('system')} {tags.get('machine')})",
            "install pip for the host's python3, or use a glibc Linux or macOS host",
        )
    return Check(
        "runtime",
        OK,
        f"absent: will be installed on the first encrypted sync ({' or '.join(ways)})",
        f"{pins} into {rt.get('dir')} (~17 MB)",
    )


def _check_clt(facts: dict[str, Any]) -> Check:
    clt = facts.get("clt")
    if clt == NA or facts.get("os") != "Darwin":
        return Check("clt", NOT_APPLICABLE, "n/a", "not macOS")
    path = (clt or {}).get("path")
    if path:
        return Check("clt", OK, path)
    return Check(
        "clt",
        WARN,
        "not installed",
        "without the command line tools there is no git, no compiler for sdist wheels "
        "and /usr/bin/python3 is only an installer stub",
        "xcode-select --install",
    )


def _check_tmux(facts: dict[str, Any]) -> Check:
    tmux = facts.get("tmux")
    if tmux:
        return Check("tmux", OK, f"{tmux.get('version') or '?'} ({tmux.get('path')})")
    fix = "brew install tmux" if facts.get("os") == "Darwin" else "install tmux"
    return Check(
        "tmux",
        WARN,
        "not found",
        "remotemac falls back to its own daemonised runner; jobs still survive "
        "disconnects, but you cannot attach a terminal to them",
        fix,
    )


def _check_brew(facts: dict[str, Any]) -> Check:
    brew = facts.get("brew")
    if brew:
        return Check("brew", OK, str(brew.get("path")))
    if facts.get("os") != "Darwin":
        return Check("brew", NOT_APPLICABLE, "not found", "only used on macOS")
    return Check(
        "brew",
        WARN,
        "not found",
        "remotemac offers to install tmux through Homebrew",
        "install Homebrew (https://brew.sh), or go without tmux",
    )


def _check_disk(facts: dict[str, Any], needs: int | None) -> Check:
    disk = facts.get("disk") or {}
    free = disk.get("free_bytes")
    if free is None:
        return Check(
            "disk",
            FAIL,
            "unknown",
            disk.get("error") or "no disk facts",
            "check that remote_root's volume is mounted",
        )
    where = disk.get("path", "?")
    value = f"{_gib(free)} free of {_gib(disk.get('total_bytes'))} at {where}"
    if needs is not None:
        value += f" (needs {_gib(needs)})"
        if free < needs:
            return Check(
                "disk",
                FAIL,
                value,
                "the playbook needs more space than is free",
                f"free {_gib(needs - free)} on the volume of {where}, "
                "or lower data.max_bytes in the playbook",
            )
        return Check("disk", OK, value)
    if free < LOW_DISK_BYTES:
        return Check(
            "disk",
            WARN,
            value,
            "a torch venv and pip's cache alone take about 3 GiB",
            f"free space on the volume of {where}",
        )
    return Check("disk", OK, value)


def _check_sleep(facts: dict[str, Any]) -> Check:
    pmset = facts.get("pmset")
    if pmset == NA or facts.get("os") != "Darwin":
        return Check("sleep", NOT_APPLICABLE, "n/a", "not macOS")
    if not pmset:
        return Check("sleep", NOT_APPLICABLE, "unknown", "pmset -g gave nothing")
    value = ", ".join(
        f"{k} {pmset.get(k)}"
        for k in ("sleep", "disksleep", "displaysleep", "standby")
        if pmset.get(k) is not None
    )
    if pmset.get("SleepDisabled") == 1:
        return Check("sleep", OK, f"sleep disabled system-wide ({value})")
    if pmset.get("sleep") in (0, None):
        return Check("sleep", OK, value or "no sleep timer")
    return Check(
        "sleep",
        WARN,
        value,
        f"the Mac idle-sleeps after {pmset['sleep']} min; remotemac runs jobs under "
        "caffeinate -i, which only holds while a job runs",
        "optional: sudo pmset -a sleep 0",
    )


def _check_deadman(facts: dict[str, Any]) -> Check:
    """Which guard a run's ``wipe_deadline`` would get here (agent/deadman.py's choice)."""
    job = facts.get("deadman")
    if not isinstance(job, dict):
        return Check("dead-man", NOT_APPLICABLE, "unknown", "the host did not say")
    refused = "; ".join(
        f"{r.get('domain')} refused ({r.get('why')})" for r in job.get("refused") or []
    )
    if job.get("method") == "launchd":
        why = f"checked with {job.get('verified')}" + (f"; {refused}" if refused else "")
        return Check("dead-man", OK, f"launchd, domain {job.get('domain')}", why)
    why = str(job.get("why") or "")
    if refused:
        why = f"{why}: {refused}"
    return Check(
        "dead-man",
        OK,
        "host-side sleeper",
        f"{why}; a detached sleeper wipes at the deadline (a reboot of the host ends it)",
    )


def _check_clock(facts: dict[str, Any], local_time: float | None) -> Check:
    remote = facts.get("clock")
    if local_time is None or remote is None:
        return Check("clock", NOT_APPLICABLE, "not measured", "no local reference time")
    skew = float(remote) - float(local_time)
    value = f"host is {abs(skew):.1f} s {'ahead' if skew >= 0 else 'behind'}"
    if abs(skew) > MAX_SKEW_S:
        fix = (
            "sudo systemsetup -setusingnetworktime on"
            if facts.get("os") == "Darwin"
            else "enable NTP (timedatectl set-ntp true)"
        )
        return Check(
            "clock", WARN, value, "heartbeat ages and log times compare host and local clocks", fix
        )
    return Check("clock", OK, value)


def _mps_unavailable_reason(facts: dict[str, Any]) -> tuple[str, str]:
    macos = facts.get("macos")
    if facts.get("os") != "Darwin":
        return "there is no MPS outside macOS", "use an Apple-Silicon Mac as HOST"
    if isinstance(macos, dict) and version_tuple(macos.get("product_version")) < MIN_MACOS:
        return "torch needs macOS 14+ for MPS", "upgrade the host to macOS 14 or newer"
    if isinstance(facts.get("vm"), dict) and facts["vm"].get("hv_vmm_present"):
        return "this VM exposes no Metal GPU to torch", "rent a bare-metal Mac"
    return (
        "torch sees no Metal device",
        "run `python -c 'import torch; "
        "print(torch.backends.mps.is_available())'` in the venv to investigate",
    )


def _check_mps(facts: dict[str, Any]) -> Check:
    mps = facts.get("mps")
    if not mps:
        return Check(
            "mps",
            NOT_APPLICABLE,
            "no venv yet",
            "checked once remotemac has made a venv under remote_root/envs",
        )
    if mps.get("error"):
        return Check(
            "mps",
            WARN,
            f"venv python failed: {mps['error']}",
            "the venv under remote_root/envs looks broken",
            "remove it; remotemac recreates it on the next run",
        )
    if not mps.get("torch"):
        return Check(
            "mps",
            NOT_APPLICABLE,
            "torch not installed in the venv",
            "checked once the venv has torch",
        )
    torch = f"torch {mps['torch']}"
    if not mps.get("built"):
        return Check(
            "mps",
            FAIL,
            f"{torch}: built without MPS",
            "this torch wheel is an x86_64 or non-macOS build",
            "make the venv from a native arm64 python3 and reinstall torch",
        )
    if not mps.get("available"):
        why, fix = _mps_unavailable_reason(facts)
        return Check("mps", FAIL, f"{torch}: MPS built but not available", why, fix)
    return Check("mps", OK, f"{torch}: MPS available")


def evaluate(
    facts: dict[str, Any],
    needs_disk_bytes: int | None = None,
    local_time: float | None = None,
    *,
    host: str = "?",
) -> DoctorReport:
    """Judge the facts. ``local_time`` defaults to when the facts arrived (``received_at``)."""
    if facts.get("collector_error"):
        check = Check(
            "collector",
            FAIL,
            facts["collector_error"],
            "the facts could not be gathered on the host",
            "install python3 >= 3.9 on the host (macOS: xcode-select --install)",
        )
        return DoctorReport(host, [check], facts)
    if local_time is None:
        local_time = facts.get("received_at")
    checks = [
        _check_macos(facts),
        _check_arch(facts),
        _check_hardware(facts),
        _check_vm(facts),
        _check_python(facts),
        # asked by the CLI (its --playbook names the Python and the pins)
        *([check_workload_python(facts), check_pins(facts)] if "workload_python" in facts else []),
        _check_runtime(facts),
        _check_clt(facts),
        _check_tmux(facts),
        _check_brew(facts),
        _check_disk(facts, needs_disk_bytes),
        _check_sleep(facts),
        _check_deadman(facts),
        _check_clock(facts, local_time),
        _check_mps(facts),
    ]
    return DoctorReport(host, checks, facts)


# --------------------------------------------------------------------------- gathering


async def gather_facts(
    transport: Transport,
    remote_root: str,
    venv_python: str | None = None,
    timeout: float = GATHER_TIMEOUT_S,
    workload: WorkloadAsk | None = None,
) -> dict[str, Any]:
    """Run the collector on the host from memory (engine/agentship.py), request on stdin.

    Nothing is uploaded or left behind. A host without a working ``python3``
    gives ``{"collector_error": ...}`` (judged as a failed check), not an exception;
    link problems still raise :class:`remotemac.errors.HostError`.
    """
    from remotemac.engine.agentclient import agent_python

    python = agent_python()
    request = {"remote_root": remote_root, "venv_python": venv_python}
    facts, why = await _in_memory(
        transport, python, "hostfacts", Op.FACTS.function, request, timeout
    )
    received = time.time()
    if facts is None:
        return {"collector_error": f"{python} on {transport.name} {why}", "received_at": received}
    facts["received_at"] = received
    facts["agent_runtime"] = await gather_runtime(transport, python, remote_root, timeout)
    if workload is not None:
        from remotemac.checks import pythoncheck

        async def in_memory(module: str, fn: str, req: dict[str, Any]) -> Any:
            return await _in_memory(transport, python, module, fn, req, timeout)

        tags = facts["agent_runtime"].get("tags")
        facts["workload_python"] = await pythoncheck.gather(
            in_memory, remote_root, workload.python, workload.requirements, tags, workload.home
        )
    return facts


@dataclass(frozen=True)
class WorkloadAsk:
    """What doctor asks about the workload's Python (``--playbook``, or the default)."""

    python: str | None
    requirements: bytes | None = None
    home: Any = None


async def gather_runtime(
    transport: Transport, python: str, remote_root: str, timeout: float = GATHER_TIMEOUT_S
) -> dict[str, Any]:
    """The agent runtime's status on the host (agentruntime.py from memory)."""
    status, why = await _in_memory(
        transport,
        python,
        "agentruntime",
        Op.RUNTIME_STATUS.function,
        {"root": remote_root},
        timeout,
    )
    return status if status is not None else {"error": why}


async def _in_memory(
    transport: Transport,
    python: str,
    module: str,
    fn: str,
    request: dict[str, Any],
    timeout: float,
) -> tuple[dict[str, Any] | None, str]:
    """(``module.fn``'s answer, "") or (None, "exited N: why" / "printed no JSON: …")."""
    from remotemac.engine.agentship import exec_in_memory, read_answer

    result = await exec_in_memory(transport, python, module, fn, request, timeout=timeout)
    answer = read_answer(result)
    if answer is not None and answer.get("ok") and isinstance(answer.get("result"), dict):
        return answer["result"], ""
    if answer is not None:  # the host's code raised: "Type: message", as a traceback ends
        return None, f"exited {result.exit_code}: {str(answer.get('error'))[:200]}"
    printed = result.text().strip().splitlines()
    if result.ok and printed:
        return None, f"printed no JSON: {printed[-1][:200]}"
    err = result.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
    return None, f"exited {result.exit_code}: {err[-1][:200]}"


async def doctor(
    transport: Transport,
    host: str,
    remote_root: str = "~/remotemac",
    needs_disk_bytes: int | None = None,
    venv_python: str | None = None,
    workload: WorkloadAsk | None = None,
) -> DoctorReport:
    """Gather on an open transport and judge."""
    facts = await gather_facts(transport, remote_root, venv_python, workload=workload)
    return evaluate(facts, needs_disk_bytes, host=host)
