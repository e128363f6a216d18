"""Shared fixtures: a local-host playbook factory and an isolated --home.

The real-sshd harness and fault proxy live in tests/harness/ (a pytest plugin).

Markers (registered in pyproject.toml) are applied here, so a contributor can run the fast
tests alone with ``pytest -m "not sshd and not e2e and not slow"`` (under a minute on 2
cores); CI runs everything:

- ``sshd``  the test starts a real OpenSSH sshd (it uses one of ``SSHD_FIXTURES``);
- ``e2e``   a real workload or agent process runs to its end: the CLI or the TUI through a
            whole run, the harness, runner or observer over a real workload, the agent
            runtime installed with pip, a deadman timer firing (listed in ``E2E``);
- ``slow``  the test takes a second or more on a loaded 2-core machine (listed in ``SLOW``;
            re-check with ``--durations=40`` when the fast set nears a minute).
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest_plugins = ["tests.harness.fixtures"]

REPO = Path(__file__).resolve().parent.parent
LINES_PROJECT = REPO / "tests" / "fixtures" / "projects" / "lines"


@pytest.fixture
def rm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rmhome"
    home.mkdir()
    monkeypatch.setenv("REMOTEMAC_HOME", str(home))
    return home


@pytest.fixture
def make_playbook(tmp_path: Path):
    """Write a playbook for the ``lines`` workload on the local host; keys override.

    A top-level key given as None is left out (e.g. ``environment=None``: the default
    environment, as a playbook over the fresh-host sshd should use).
    """

    def make(name: str = "lines", **overrides) -> Path:
        data = {
            "name": name,
            "host": "local",
            "remote_root": str(tmp_path / "host-root"),
            "project": {"path": str(LINES_PROJECT), "exclude": ["data/"]},
            "environment": {"python": sys.executable, "venv": False},
            "data": {
                "path": str(LINES_PROJECT / "data"),
                "classification": "public",
                "encrypt": True,
            },
            "workload": {
                "command": "python3 emit.py --device {device} --data {data_dir} "
                "--out {output_dir} --lines 40 --seconds 0.5 --torch",
                "reference": {"device": "cpu"},
                "target": {"device": "cpu"},
                "timeout": "5m",
            },
            "outputs": {
                "path": ".",
                "compare": [{"file": "result.json", "rtol": 1e-6, "atol": 1e-9}],
            },
            "stop_when": {"memory_growth": False},
        }
        for key, value in overrides.items():
            if value is None:
                data.pop(key, None)
            elif isinstance(value, dict) and isinstance(data.get(key), dict):
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return make


def remotemac(
    *args: str,
    cwd: Path | None = None,
    env: dict | None = None,
    timeout: float = 300,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as a user would."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "remotemac", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"remotemac {' '.join(args)} → {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def remotemac_in_process(*args: str) -> subprocess.CompletedProcess:
    """The same CLI entry (click group, error lines, exit codes) in this process.

    For the many one-line-error cases of one command: a subprocess costs ~0.2 s of CPU
    (interpreter, pydantic, click) per case. A module using this keeps at least one
    :func:`remotemac` test of the same command for the real process.
    """
    from remotemac.cli import entry

    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            entry(list(args), prog_name="remotemac")
        except SystemExit as exit_:
            code = exit_.code
    if not isinstance(code, int):  # sys.exit("message") or sys.exit(None)
        err.write("" if code is None else f"{code}\n")
        code = 0 if code is None else 1
    return subprocess.CompletedProcess(
        ["remotemac", *args], code, stdout=out.getvalue(), stderr=err.getvalue()
    )


SSHD_FIXTURES = frozenset(
    {
        "sshd",
        "sshd_factory",
        "fresh_host_lab",
        "host_torch_python",
        "client_key",
        "mac_sshd_factory",
    }
)
# Tests that run a workload end to end: the CLI or the TUI through a whole run, the
# harness or preflight over real torch (a module, or a ``module::test-name`` prefix).
E2E: tuple[str, ...] = (
    "test_readme_quickstart.py",
    "test_readme_walkthrough.py",
    "test_readme_contributor.py::test_contributor_lines_verbatim_in_a_fresh_venv",
    "test_interrupt_local.py",
    "test_observe_gpt.py",
    "test_pipeline_local.py",
    "test_fleet.py",
    "test_tui.py::test_quickstart_on_local",
    "test_tui.py::test_wipe_asks_first",
    "test_tui.py::test_quit_keeps_the_job",
    "test_tui.py::test_runs_screen_shows_what_the_host_says",
    "test_tui_ux.py::test_tui_with_a_playbook_runs_it",
    "test_tui_ux.py::test_run_dialog_dry_run",
    "test_agent_runtime.py::test_pipeline_on_bare_agent_python",
    "test_agent_runtime.py::test_run_whose_runtime_cannot_install",
    "test_harness.py::test_sigterm_writes_the_final_record",
    "test_preflight.py::test_quickstart_mlp",
    "test_preflight.py::test_float64_model",
    "test_preflight.py::test_linalg_svd",
    "test_preflight.py::test_transformer_with_sdpa",
    "test_preflight.py::test_time_limit_stops",
    "test_preflight.py::test_workload_error_is_reported",
    "test_preflight.py::test_render_labels",
    "test_cli_ux.py::test_preflight_is_not_silent",
    "test_harness.py::test_runs_on_python_39_without_torch",
    "test_observe_job.py::test_shell_wrapped_script_and_its_subprocess_are_observed",
    "test_observe_job.py::test_torchrun_workers_are_observed",
    "test_divergence_local.py",
    "test_divergence.py::test_tracing_",
    "test_stress_units.py::test_runner_",
    "test_deadman.py::test_launchd_",
    "test_agent_runtime.py::test_encrypted_sync_on_bare_python",
    "test_agent_runtime.py::test_two_runs_starting_together",
    "test_agent_runtime.py::test_auto_falls_back_to_laptop_wheels",
    "test_agent_runtime.py::test_failed_online_install",
    "test_agent_runtime.py::test_doctor_reports_runtime_absent_then_present",
    "test_agent_runtime.py::test_a_damaged_wheel_upload",
    # security promises checked over a whole CLI run on ``local``
    "test_hostile_journal.py::test_a_foreign_exception_marks_the_run_failed",
    "test_hostile_terminal.py::test_run_and_logs_escape_the_jobs_terminal_controls",
    "test_plaintext_project_upload.py::test_dataset_inside_the_project_never_lands",
    "test_redact_records.py::test_records_redact_the_command_and_env",
    "test_redact_records.py::test_show_secrets_keeps_them_in_the_records",
    "test_resident_sshd.py::test_3000_lines",
    "test_faults_sshd.py",
    "test_maclab_sshd.py",
)
# Module-scoped fixtures that run whole workloads: a test using one is e2e too.
E2E_FIXTURES: dict[str, frozenset[str]] = {
    "test_harness.py": frozenset({"runs"}),  # every harness scenario over real torch
    "test_cli_ux.py": frozenset({"finished"}),  # two CLI runs
}
# Tests that take seconds without an sshd or a whole run (processes, timers, shims).
SLOW: tuple[str, ...] = (
    "test_journal.py::test_processes_opening_a_fresh_journal_at_once",
    "test_hostfacts.py::test_collect_facts",
    "test_hostfacts.py::test_shims_replay_and_fail_like_the_tool",
    "test_hostfacts.py::test_mps_probe_real_torch",
    "test_doctor.py::test_doctor_coroutine_wires_gather_and_evaluate",
    "test_preflight.py::test_torch_free_loop_is_stopped",
    "test_ssh_faults.py::test_fault_proxy_throttle",
    "test_ssh_faults.py::test_fault_proxy_far_link",  # 1 s of transfer + 0.4 s of RTT
    "test_tui_snapshots.py",
    # a second or more each on a loaded 2-core machine (pytest --durations, issue 21)
    "test_tui.py::test_doctor_on_local_and_cleanup_unavailable",
    "test_tui.py::test_log_view_batches_bounds_and_searches",
    "test_tui.py::test_errors_are_lines_not_crashes",
    "test_tui_ux.py::test_log_lines_are_timestamped_aligned_and_filterable",
    "test_tui_ux.py::test_palette_entries_act_on_their_screen",
    "test_tui_ux.py::test_hosts_screen_keeps_why_and_fix_whole",
    "test_tui_ux.py::test_footer_shows_open_and_next_match",
    "test_tui_ux.py::test_fleet_screen_reads_the_journal_not_the_cwd",
    "test_destroy_kills.py::test_item06_the_job_remotemac_started_is_still_stopped",
    "test_agent_runtime.py::test_pins_have_wheels_for_every_supported_host",
    "test_cli_ux.py::test_doctor_not_fit_is_exit_1_and_documented",
    "test_compare_checkpoint.py::test_paths_devices_and_timestamps_are_metadata",
    "test_audit.py::test_generated_tree_is_walked_completely_and_fast",
    "test_input_fuzz.py::test_any_playbook_is_valid_or_exit_2_never_internal",
    "test_destroy_ownership.py::test_item07_check_refuses_home_shaped_roots",
    "test_destroy_ownership.py::test_item11_cleanup_finds_root_of_run_failed_in_provision",
    "test_doctor.py::test_gather_facts_local_transport",
    "test_doctor.py::test_main_doctor_json_on_this_linux_host",
    "test_resident_sshd.py::test_3000_lines",
    "test_faults_sshd.py",
)


def _listed(item: pytest.Item, entries: tuple[str, ...]) -> bool:
    """Whether ``item`` matches an entry: a module file name, or ``module::name`` prefix."""
    module = item.path.name
    name = f"{module}::{item.name}"
    return any(entry == module or name.startswith(entry) for entry in entries)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark sshd, e2e and slow tests by what they use, so ``-m`` can select the fast ones."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SSHD_FIXTURES:
            item.add_marker(pytest.mark.sshd)
        if _listed(item, E2E) or fixtures & E2E_FIXTURES.get(item.path.name, frozenset()):
            item.add_marker(pytest.mark.e2e)
        if _listed(item, SLOW):
            item.add_marker(pytest.mark.slow)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Keep the cyclic GC from eating the run (it took 9 s of 30 in the TUI tests).

    What collection built (torch, textual, every test module) is frozen out of the
    GC, so a full collection no longer walks it: frozen objects are never freed,
    which modules and test functions are not anyway. And the tests allocate fast
    (textual builds a strip cache per frame), so collections run every 50,000 new
    objects instead of every 700: garbage cycles live a little longer, nothing else.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Collect leftover garbage before the summary's plugins import their modules.

    CPython 3.11.7 keeps ast.parse's recursion bookkeeping in global state; a finalizer
    that formats a traceback while a plugin's module is being parsed corrupts it and
    the session dies with "AST constructor recursion depth mismatch".
    """
    gc.collect()


def pytest_report_header(config: pytest.Config) -> str:
    """Which login and which bare interpreters the sshd tests' lab uses (pyenv, uv, the
    OS's), so a log from another machine says what its "host" was."""
    from tests.harness import lab

    return lab.describe()
