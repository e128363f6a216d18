"""The first hour of the CLI (issue 20): ids, --json, 80 columns, labelled logs, errors.

Every test runs the real ``remotemac`` in a subprocess (tests/conftest.py's
``remotemac()``), as a user would; the runs are real pipelines of the stdlib
``lines`` workload on host ``local``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from remotemac.journal import Journal
from tests.conftest import LINES_PROJECT, remotemac
from tests.harness import hostbuilt, ramstores

pytestmark = pytest.mark.timeout(300)
COLS = {"COLUMNS": "80"}


def lines_playbook(folder: Path, name: str = "lines", **overrides) -> Path:
    """The ``lines`` workload, torch-free, on the host ``local``: ``environment`` asks
    for Python 3.11 and names no requirements, so the host matches a 3.11 of its own
    (``hostbuilt.host_env``: never the test venv) and builds an empty venv in the run's
    root, the way it builds one with torch (tests/harness/hostbuilt.py), in a fraction
    of a second. The CLI's output is what these tests are about."""
    data = {
        "name": name,
        "host": "local",
        "remote_root": str(folder / "host-root"),
        "project": {"path": str(LINES_PROJECT), "exclude": ["data/"]},
        "environment": {"python": hostbuilt.PYTHON_VERSION},
        "data": {"path": str(LINES_PROJECT / "data"), "classification": "public"},
        "workload": {
            "command": "python3 emit.py --device {device} --data {data_dir} "
            "--out {output_dir} --lines 12 --seconds 0.2",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        },
        "outputs": {"path": ".", "compare": [{"file": "result.json", "rtol": 1e-6, "atol": 1e-9}]},
        "stop_when": {"memory_growth": False},
    }
    data.update(overrides)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One real finished run (wipe after_pull) and one with ``wipe: manual``; at the end
    of the module the manual one is wiped (its RAM store in /dev/shm would outlive the
    tests), by the product's ``wipe``, and by hand if that failed."""
    folder = tmp_path_factory.mktemp("cli-ux")
    env = {"REMOTEMAC_HOME": str(folder / "home"), **hostbuilt.host_env()}
    ids = {}
    try:
        for name, extra in (("auto", {}), ("manual", {"wipe": "manual"})):
            pb = lines_playbook(folder, name=f"lines-{name}", **extra)
            proc = remotemac("run", str(pb), cwd=folder, env=env)
            assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # 1: no torch
            ids[name] = proc.stdout.split()[1]  # "run <id> → <out>"
        yield {"env": env, "folder": folder, **ids}
    finally:
        if "manual" in ids:
            remotemac("wipe", ids["manual"], "--yes", cwd=folder, env=env)
        ramstores.remove_stores(ramstores.run_ids_under(folder), {os.geteuid()})


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_the_runs_ran_in_a_venv_the_host_built(finished):
    """What the CLI's runs here stand on: the host matched a 3.11 and built the venv."""
    for name in ("auto", "manual"):
        (path,) = finished["folder"].rglob(f"{finished[name]}/acceptance.json")
        record = json.loads(path.read_text())
        hostbuilt.assert_host_built(record, finished["folder"] / "host-root", torch=False)


def cli(ctx, *args: str, env: dict | None = None):
    return remotemac(*args, cwd=ctx["folder"], env={**ctx["env"], **COLS, **(env or {})})


def status_json(ctx, run_id: str) -> dict:
    proc = cli(ctx, "status", run_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---------------------------------------------------------------- run ids


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_any_unique_part_of_an_id_and_latest(finished):
    full = finished["manual"]
    suffix = full.rsplit("-", 1)[1]
    assert status_json(finished, suffix)["run_id"] == full
    assert status_json(finished, "lines-man")["run_id"] == full  # a unique prefix
    assert status_json(finished, "latest")["run_id"] == full  # the newest run
    logs = cli(finished, "logs", suffix)
    assert logs.returncode == 0 and "line 000012 of 12" in logs.stdout
    ambiguous = cli(finished, "status", "lines-")
    assert ambiguous.returncode == 2
    assert "ambiguous" in ambiguous.stderr and finished["auto"] in ambiguous.stderr


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_status_at_80_columns_never_cuts_an_id(finished, tmp_path):
    home = tmp_path / "home"
    journal = Journal(home / "journal.sqlite3")
    ids = [f"a-rather-long-experiment-name-{i}-20261130-152103-{i:04x}" for i in range(3)]
    for run_id in ids:
        journal.create_run(
            run_id,
            name=run_id[:30],
            host="mac-rental-with-a-long-alias",
            playbook_path=None,
            playbook={},
            out_dir=str(tmp_path / run_id),
            options={},
        )
        journal.set_run_state(run_id, "finished", verdict="accepted", exit_code=0)
    journal.close()
    proc = remotemac("status", env={"REMOTEMAC_HOME": str(home), **COLS})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), proc.stdout
    assert "…" not in proc.stdout
    for run_id in ids:
        assert any(run_id in line for line in lines), (run_id, proc.stdout)


def test_ages_read_the_same_in_status_and_the_tui(tmp_path):
    """One duration format: a run 65 s old is ``1m05s`` in both front ends (status said
    ``0h01m``)."""
    import sqlite3

    from remotemac.vocab import human_age

    home = tmp_path / "home"
    journal = Journal(home / "journal.sqlite3")
    journal.create_run(
        "age-20261130-000000-a9e0",
        name="age",
        host="local",
        playbook_path=None,
        playbook={},
        out_dir=str(tmp_path),
        options={},
    )
    journal.set_run_state("age-20261130-000000-a9e0", "finished")
    journal.close()
    db = sqlite3.connect(home / "journal.sqlite3")
    with db:
        db.execute("UPDATE runs SET created_at = created_at - 65")
    db.close()
    proc = remotemac("status", env={"REMOTEMAC_HOME": str(home), **COLS})
    assert re.search(r" 1m0[5-9]s", proc.stdout) and "0h01m" not in proc.stdout, proc.stdout
    assert human_age(3725.4) == "1h02m" and human_age(65) == "1m05s"


def test_one_word_per_state_in_cli_and_tui(tmp_path):
    """``status --json`` and the TUI's runs table say the same word for each journal state."""
    import asyncio

    from remotemac.settings import LocalSettings
    from remotemac.tui.app import RemotemacApp
    from remotemac.tui.screens.runs import RunsScreen

    home = tmp_path / "home"
    journal = Journal(home / "journal.sqlite3")
    states = ("finished", "failed", "lost", "interrupted")
    for i, state in enumerate(states):
        journal.create_run(
            f"w-20261130-00000{i}-000{i}",
            name="w",
            host="local",
            playbook_path=None,
            playbook={},
            out_dir=str(tmp_path),
            options={},
        )
        journal.set_run_state(f"w-20261130-00000{i}-000{i}", state)
    proc = remotemac("status", "--json", env={"REMOTEMAC_HOME": str(home)})
    cli_words = {json.loads(x)["run_id"]: json.loads(x)["state"] for x in proc.stdout.splitlines()}

    async def tui_words() -> dict[str, str]:
        app = RemotemacApp(
            LocalSettings.from_options(str(home)), journal=journal, reattach=False, live_poll_s=0
        )
        async with app.run_test():
            screen = app.screen
            assert isinstance(screen, RunsScreen)
            return {cells[0]: cells[4] for _, _, cells in screen._load()}

    assert asyncio.run(tui_words()) == cli_words
    assert set(cli_words.values()) == set(states)


def test_audit_at_80_columns_keeps_paths_whole_and_says_the_verdict_once():
    fixture = Path(__file__).parent / "fixtures" / "audit" / "cuda_ext"
    proc = remotemac("audit", str(fixture), env=COLS)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("keep-linux") == 1, out
    for where in ("csrc/fused_kernel.cu:4", "model.py:3", "requirements.txt:4"):
        assert any(line.rstrip().endswith(where) for line in out.splitlines()), where
    assert all(len(line) <= 80 for line in out.splitlines()), out


@pytest.mark.slow
def test_doctor_not_fit_is_exit_1_and_documented():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme[readme.index("Exit codes:") :]
    row = next(line for line in table.splitlines() if line.startswith("| 1 "))
    assert "doctor" in row and "not fit" in row
    proc = remotemac("doctor", "local", "--json")  # this Linux machine is no Mac: not fit
    assert proc.returncode == 1 and json.loads(proc.stdout)["fit"] is False


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_status_of_one_run_reads_as_lines_not_a_dict(finished):
    proc = cli(finished, "status", finished["auto"])
    assert proc.returncode == 0, proc.stderr
    assert "{" not in proc.stdout and "'state'" not in proc.stdout
    assert "pull" in proc.stdout and "done" in proc.stdout and "duration" in proc.stdout
    assert all(
        len(line) <= 80 or finished["auto"] in line or "/" in line
        for line in proc.stdout.splitlines()
    )


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_ledger_into_head_ends_quietly(finished):
    env = {**finished["env"], "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run(
        f"{sys.executable} -m remotemac status {finished['auto']} --ledger | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=finished["folder"],
        timeout=60,
    )
    assert out.stderr == "", out.stderr
    assert len(out.stdout.splitlines()) == 1


def test_ledger_broken_pipe_on_a_long_ledger(tmp_path):
    """A ledger far bigger than the pipe's buffer: the writer meets EPIPE for sure."""
    home = tmp_path / "home"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    entry = {"time": 1.0, "host": "local", "exit_code": 0, "command": "true " + "x" * 80}
    (out_dir / "ledger.jsonl").write_text((json.dumps(entry) + "\n") * 20_000)
    journal = Journal(home / "journal.sqlite3")
    journal.create_run(
        "big-20261130-000000-beef",
        name="big",
        host="local",
        playbook_path=None,
        playbook={"name": "big", "host": "local", "workload": {"command": "true"}},
        out_dir=str(out_dir),
        options={},
    )
    journal.set_run_state("big-20261130-000000-beef", "finished")
    journal.close()
    env = {
        "REMOTEMAC_HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    out = subprocess.run(
        f"{sys.executable} -m remotemac status beef --ledger | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert "BrokenPipe" not in out.stderr and "error" not in out.stderr, out.stderr
    assert out.stdout.count("\n") == 1


# ---------------------------------------------------------------- --json everywhere


@pytest.mark.parametrize("command", ["status", "logs", "check", "audit", "doctor", "cleanup"])
def test_every_table_command_takes_json(command):
    proc = remotemac(command, "--help")
    assert proc.returncode == 0 and "--json" in proc.stdout, proc.stdout


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_logs_json_and_labelled_aligned_lines(finished):
    run_id = finished["auto"]
    proc = cli(finished, "logs", run_id)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines and all(" │ " in line for line in lines)
    # one column for the bar, whatever the device name (cpu and cpu-target here)
    assert len({line.index("│") for line in lines}) == 1
    devices = {line.split("│")[0].strip() for line in lines}
    assert devices == {"cpu", "cpu-target"}
    js = cli(finished, "logs", run_id, "--json")
    rows = [json.loads(x) for x in js.stdout.splitlines()]
    assert {r["device"] for r in rows} == {"cpu", "cpu-target"}
    assert {"device": "cpu", "line": "line 000012 of 12"} in rows


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_logs_of_an_unknown_device_lists_the_devices(finished):
    proc = cli(finished, "logs", finished["auto"], "--device", "mps")
    assert proc.returncode == 2
    assert "cpu, cpu-target" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- pull / wipe again


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_pull_or_wipe_again_keep_the_recorded_results(finished):
    run_id = finished["auto"]
    before = status_json(finished, run_id)["phases"]
    assert before["pull"]["summary"] and before["wipe"]["state"] == "done"
    wipe = cli(finished, "wipe", run_id, "--yes")
    assert wipe.returncode == 0 and "already wiped" in wipe.stdout, wipe.stdout + wipe.stderr
    pull = cli(finished, "pull", run_id)
    assert pull.returncode == 2 and "was wiped" in pull.stderr, pull.stdout + pull.stderr
    assert "✓" not in pull.stdout
    assert status_json(finished, run_id)["phases"] == before


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_pull_again_of_a_kept_run_says_already_pulled(finished):
    run_id = finished["manual"]
    before = status_json(finished, run_id)["phases"]
    proc = cli(finished, "pull", run_id)
    assert proc.returncode == 0 and "already pulled" in proc.stdout, proc.stdout + proc.stderr
    assert status_json(finished, run_id)["phases"] == before


# ---------------------------------------------------------------- check, errors


def test_check_looks_at_the_paths_and_takes_json(tmp_path):
    pb = lines_playbook(
        tmp_path,
        project={"path": "no-such-project"},
        data={"path": "no-such-data", "classification": "public"},
    )
    proc = remotemac("check", str(pb))
    assert proc.returncode == 2
    err = proc.stderr.splitlines()
    assert len(err) == 2 and all(line.startswith("remotemac: error: ") for line in err), err
    assert "project.path" in err[0] and "data.path" in err[1]  # in the file's order
    js = remotemac("check", str(pb), "--json")
    assert js.returncode == 2
    answer = json.loads(js.stdout)
    assert answer["ok"] is False and len(answer["problems"]) == 2
    good = remotemac("check", str(lines_playbook(tmp_path, name="good")), "--json")
    assert good.returncode == 0 and json.loads(good.stdout)["ok"] is True


def test_many_errors_each_prefixed_sorted_plain(tmp_path):
    pb = tmp_path / "bad.yaml"
    pb.write_text(
        "name: x\nhost: local\nnonsense: 1\nworkload:\n  command: echo\n"
        "  target: {device: tpu}\n  timeout: abc\ncost: {hourly_rate: abc}\n"
    )
    proc = remotemac("check", str(pb))
    assert proc.returncode == 2
    err = proc.stderr.splitlines()
    assert len(err) == 4 and all(line.startswith("remotemac: error: ") for line in err), err
    numbers = [int(line.split(f"{pb}:")[1].split(":")[0]) for line in err]
    assert numbers == sorted(numbers), err
    assert "Input should be" not in proc.stderr and "valid number" not in proc.stderr
    assert "expected a number, got 'abc'" in proc.stderr


# ---------------------------------------------------------------- trust, preflight, dry run


def test_trust_local_needs_no_trust(tmp_path):
    proc = remotemac("trust", "local", env={"REMOTEMAC_HOME": str(tmp_path)})
    assert proc.returncode == 0 and "local needs no trust" in proc.stdout, proc.stderr


@pytest.mark.e2e
def test_preflight_is_not_silent(tmp_path):
    pb = lines_playbook(
        tmp_path,
        workload={
            "command": "python3 emit.py --device {device} --data {data_dir} --out {output_dir} "
            "--lines 30 --seconds 3",
            "reference": {"device": "cpu"},
            "target": {"device": "cpu"},
            "timeout": "5m",
        },
    )
    proc = remotemac("preflight", str(pb), "--seconds", "3", cwd=tmp_path)
    assert "remotemac: preflight: running the workload" in proc.stderr, proc.stderr


def test_dry_run_names_the_devices_auto_may_become(tmp_path):
    pb = lines_playbook(
        tmp_path,
        workload={
            "command": "python3 emit.py --device {device} --data {data_dir} --out {output_dir}",
            "reference": {"device": "cpu"},
            "target": {"device": "auto"},
            "timeout": "5m",
        },
    )
    proc = remotemac("run", str(pb), "--dry-run", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    target = json.loads(proc.stdout)["commands"]["target"]
    assert "out/auto" not in target["command"] and "cpu-target" in target["command"]
    assert target["label"] == "<mps|cuda|cpu-target>"


def test_tui_with_playbooks_starts_them_unless_pick():
    """README: ``remotemac tui my.yaml`` runs it (the Pilot side: tests/test_tui_ux.py)."""
    import inspect

    from remotemac.tui.app import run_tui

    proc = remotemac("tui", "--help")
    assert "starts a run" in proc.stdout and "--pick" in proc.stdout, proc.stdout
    assert inspect.signature(run_tui).parameters["start"].default is True


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_wipe_without_yes_and_without_a_terminal_is_one_line_exit_2(finished):
    """`remotemac wipe RUN` from a script (stdin not a terminal, no --yes): the one line
    and exit 2 of an unconfirmed wipe, not click's bare "Aborted!" and exit 1."""
    before = status_json(finished, finished["manual"])["phases"]
    proc = subprocess.run(
        [sys.executable, "-m", "remotemac", "wipe", finished["manual"]],
        cwd=finished["folder"],
        env={**os.environ, **finished["env"], **COLS},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Aborted" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "remotemac: error: no answer to the question (end of input): nothing was done"
        " (give --yes to skip the question)"
    ), proc.stderr
    assert status_json(finished, finished["manual"])["phases"] == before


@pytest.mark.e2e  # the finished fixture: two whole CLI runs
def test_wipe_answered_no_says_nothing_was_done_exit_0(finished):
    """`n` to wipe's question is the user's choice, not an error: one line on stdout
    saying nothing was done, exit 0 (was `remotemac: error: wipe not confirmed`, exit 2)."""
    before = status_json(finished, finished["manual"])["phases"]
    proc = subprocess.run(
        [sys.executable, "-m", "remotemac", "wipe", finished["manual"]],
        cwd=finished["folder"],
        env={**os.environ, **finished["env"], **COLS},
        input="n\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "error" not in proc.stderr
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .endswith(
            f"? [y/N]: wipe not confirmed: nothing was done ({finished['manual']} keeps its data)"
        )
    ), proc.stdout
    assert status_json(finished, finished["manual"])["phases"] == before


@pytest.mark.parametrize("launched", [True, False])
def test_ctrl_c_lines_fit_80_columns_and_keep_the_run_id_whole(launched: bool):
    """The Ctrl-C hint was one 122-character line: at 80 columns the terminal wrapped it
    inside the run id. Now each line fits, the resume line holds the id whole."""
    from remotemac.cli import interrupted_lines

    run_id = "tiny-mlp-20261201-215406-d309"
    lines = interrupted_lines(launched, run_id)
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[-1] == f"resume with: remotemac attach {run_id}"
    assert ("keeps running on the host" in lines[0]) is launched


def test_dry_run_command_lines_fit_80_columns(tmp_path: Path):
    """A workload command of ~230 characters was one line of the plan; now it is
    wrapped between words, continuation lines indented, every line within 80 columns
    (``--json`` keeps it whole)."""
    import yaml

    project = tmp_path / "proj"
    project.mkdir()
    command = (
        "python train.py --device {device} --data {data_dir} --out {output_dir} "
        "--epochs 300 --batch-size 64 --lr 0.001 --seed 0 --workers 4 --amp "
        "--checkpoint-every 50 --log-every 25 --config configs/resnet18-imagenet-subset.yaml"
    )
    book = project / "pb.yaml"
    book.write_text(
        yaml.safe_dump(
            {
                "name": "wide",
                "host": "mac-rental",
                "remote_root": "~/rm",
                "workload": {"command": command, "target": {"device": "mps"}},
            }
        )
    )
    proc = remotemac(
        "--home", str(tmp_path / "home"), "run", str(book), "--dry-run", env={"COLUMNS": "80"}
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    start = next(i for i, x in enumerate(lines) if x.startswith("  $ python train.py"))
    shown = " ".join(x.strip() for x in lines[start : start + 4]).split("bytes to send")[0]
    assert "--config configs/resnet18-imagenet-subset.yaml" in shown
    assert "--out '~/rm/runs/<run-id>/out/cpu'" in shown
