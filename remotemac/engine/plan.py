"""``run --dry-run``: what a run would do, computed locally; touches no host."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from remotemac.agent.protocol import JsonObject
from remotemac.engine.context import Side, make_sides, substitute
from remotemac.engine.projectfiles import project_upload
from remotemac.playbook import Playbook

AUTO_ORDER = ("mps", "cuda", "cpu")  # what ``device: auto`` becomes, first available


def python_plan(pb: Playbook, home: Path | None) -> JsonObject:
    """Which Python the workload asks for and whether its torch pin has a wheel for it
    (PyPI, from this laptop; the host's own interpreters and platform: doctor)."""
    from remotemac.agent.shared import parse_spec
    from remotemac.engine.pincheck import check_pin, pins

    env = pb.environment
    spec = parse_spec(env.python)
    lines = []
    if env.requirements:
        requirements = (pb.project_dir() / env.requirements).read_bytes()
        exact = None
        if spec and len(spec) == 1 and spec[0][0] == "==":
            exact = ".".join(map(str, spec[0][1]))
        for name, version in pins(requirements):
            lines.append(check_pin(home, name, version, exact, None).line)
    return {
        "request": env.python,
        "kind": "version" if spec else "interpreter",
        "pins": lines,
        "note": (
            "matched against the host's interpreters; when none matches, remotemac brings a "
            "CPython build under remote_root"
            if spec
            else "used as named; its version is known on the host (doctor --playbook says)"
        ),
    }


def make_plan(pb: Playbook, home: Path | None = None) -> JsonObject:
    """The plan as ``run --dry-run --json`` prints it (and the front ends render it)."""
    root = pb.remote_root
    run_dir = f"{root}/runs/<run-id>"
    sides = make_sides(pb)
    upload = project_upload(pb)
    archive, files = upload.archive(), upload.files
    data: JsonObject = {"files": [], "bytes": 0, "encrypted": None}
    if pb.data is not None:
        from remotemac.data.slice import select_slice

        sel = select_slice(
            pb.data_dir(),
            include=list(pb.data.include),
            exclude=list(pb.data.exclude),
            max_bytes=pb.data.max_bytes,
            sample_files=pb.data.sample.files if pb.data.sample else None,
            seed=pb.data.sample.seed if pb.data.sample else 0,
            files=list(pb.data.files) if pb.data.files is not None else None,
        )
        data = {
            "files": [{"path": f.path, "size": f.size, "reason": f.reason} for f in sel.files],
            "skipped": [{"path": p, "reason": r} for p, r in sel.skipped],
            "bytes": sel.total_bytes,
            "encrypted": pb.data.encrypt,
        }
    commands = {}
    for side in sides:
        device, label = side.device, side.label
        if device == "auto":  # resolved by the host's torch at run time: show what it may be
            others = {s.label for s in sides if s is not side}
            choices = [d if d not in others else f"{d}-{side.role}" for d in AUTO_ORDER]
            device, label = "|".join(AUTO_ORDER), "|".join(choices)
        values = {
            "device": f"<{device}>" if "|" in device else device,
            "data_dir": f"{run_dir}/data",
            "output_dir": f"{run_dir}/out/" + (f"<{label}>" if "|" in label else label),
        }
        commands[side.role] = {
            "host": "local" if side.host_key == "local" else pb.host,
            "session": side.session("<run-id>"),
            "device": values["device"],
            "label": f"<{label}>" if "|" in label else label,
            "command": substitute(pb.workload.command, values),
        }
    phases = ["provision", "sync"] + [f"{p}:{s.role}" for s in sides for p in ("launch", "follow")]
    phases += ["pull", "compare", "record", "wipe" if pb.wipe == "after_pull" else "wipe (manual)"]
    return {
        "playbook": pb.name,
        "host": pb.host,
        "phases": phases,
        "remote_paths": {
            "root": root,
            "run_dir": run_dir,
            "agent": f"{root}/agent/<version>",
            "venv": f"{root}/envs/<requirements-hash>",
        },
        "python": python_plan(pb, home) if pb.environment.venv else None,
        "project": {"files": len(files), "bytes": len(archive), "left_out": upload.summary()},
        "data": data,
        "commands": commands,
        "bytes_to_send": len(archive) + int(data["bytes"]),
        "cost": cost_bound(pb, sides),
    }


def cost_bound(pb: Playbook, sides: list[Side]) -> JsonObject:
    """The most the run can cost: every job on the rented host running to its
    ``workload.timeout`` (the target twice with ``reproduce``), at ``cost.hourly_rate``.
    A bound, not a forecast: ``preflight`` and an earlier run's record say how long the
    job really takes; the jobs run one after the other."""
    jobs = sum(1 for side in sides if side.host_key != "local")
    if getattr(pb, "reproduce", False):
        jobs += 1
    hours = jobs * pb.workload.timeout / 3600
    rate = pb.cost.hourly_rate
    return {
        "jobs": jobs,
        "max_hours": round(hours, 4),
        "hourly_rate": rate,
        "currency": pb.cost.currency,
        "max_amount": round(hours * rate, 2),
    }


VENV_ESTIMATE = 3 * 1024**3  # a torch venv; only counted when the playbook installs requirements


def disk_needed(pb: Playbook) -> int:
    """Bytes the run needs on remote_root's volume: ciphertext of the slice, the outputs
    (estimated as one slice), a venv when requirements are installed, and the margin
    ``stop_when.min_free_disk`` below which the job would be stopped."""
    plan = make_plan(pb)
    data = int(plan["data"]["bytes"])
    venv = VENV_ESTIMATE if pb.environment.venv and pb.environment.requirements else 0
    return plan["project"]["bytes"] + 2 * data + venv + pb.stop_when.min_free_disk


def make_fleet_plan(pb: Playbook, hosts: list[str] | None, inventory: Any) -> JsonObject:
    """``run --dry-run`` with ``--hosts``/``--inventory``/a matrix: one plan per fleet run."""
    from remotemac.engine.context import specialize
    from remotemac.engine.fleet import fleet_hosts, plan_runs, variant_label

    runs = plan_runs(pb, fleet_hosts(pb, hosts, inventory), inventory, Path("runs"))
    plans = []
    for run in runs:
        base = specialize(pb, remote_root=run.vars.remote_root, hourly_rate=run.vars.hourly_rate)
        plan = make_plan(specialize(base, host=run.host, matrix=run.variant))
        plans.append(
            {"host": run.host, "variant": variant_label(run.variant) or None, "plan": plan}
        )
    return {"playbook": pb.name, "fleet": True, "runs": plans}
