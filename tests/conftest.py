"""Shared fixtures: a local-host playbook factory and an isolated --home.

The real-sshd harness and fault proxy live in tests/harness/ (a pytest plugin).

Test tiers (markers registered in pyproject.toml) let a contributor run the fast tests
alone with ``pytest -m "not sshd and not e2e and not slow"`` (under a minute on 2 cores);
CI runs everything. Each tier is declared where the test is defined, so renaming or
moving a test takes its tier with it:

- ``e2e``   a real workload or agent process runs to its end: the CLI or the TUI through a
            whole run, the harness, runner or observer over a real workload, the agent
            runtime installed with pip, a deadman timer firing. Declared in the test
            module: ``pytestmark = pytest.mark.e2e`` when every test of the module is one,
            else ``@pytest.mark.e2e`` on the test (also on each test that uses a
            module fixture running whole workloads, e.g. test_harness's ``runs``);
- ``slow``  the test takes a second or more on a loaded 2-core machine, without an sshd or a
            whole run (processes, timers, shims): ``pytestmark`` or ``@pytest.mark.slow``
            the same way; re-check with ``--durations=40`` when the fast set nears a
            minute;
- ``sshd``  the test starts a real OpenSSH sshd. The one tier applied here, from the
            fixtures the test uses (``SSHD_FIXTURES``, looked up in the test's whole
            fixture closure), so it follows the test through any rename; a test that starts
            an ``SSHD`` of tests/harness/sshd.py by hand, without them, carries
            ``@pytest.mark.sshd`` itself (as test_coalesce's real-sshd push does).

No list of test names lives here (tests/test_tiers_declared_in_place.py fails if one
comes back: a renamed test would silently leave its tier).
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.harness import hostbuilt, ramstores

pytest_plugins = ["tests.harness.fixtures"]

REPO = Path(__file__).resolve().parent.parent
LINES_PROJECT = REPO / "tests" / "fixtures" / "projects" / "lines"


@pytest.fixture
def rm_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The laptop's REMOTEMAC_HOME, and a tmux server of the test's own.

    The host ``local`` is this machine and this user: without a ``TMUX_TMPDIR`` of its
    own, every such test shares one tmux server with the tests of the other xdist
    worker. A server keeps the argv of the client that started it, so it may name one
    test's run dir; another test's jobs live in it. (CI once saw a test's teardown kill
    that server and with it the other worker's job: ``job-lost``.)
    """
    home = tmp_path / "rmhome"
    home.mkdir()
    monkeypatch.setenv("REMOTEMAC_HOME", str(home))
    tmux_dir = tmp_path / "tmux"
    tmux_dir.mkdir(mode=0o700)
    monkeypatch.setenv("TMUX_TMPDIR", str(tmux_dir))
    yield home
    env = {**os.environ, "TMUX_TMPDIR": str(tmux_dir)}
    subprocess.run(["tmux", "kill-server"], env=env, capture_output=True, check=False)


def _lines_book(name: str, root: str, project: Path, environment: dict, overrides: dict) -> dict:
    """The ``lines`` workload's playbook on the host ``local``; top-level keys override
    (a dict merges into the section, None removes the key)."""
    data = {
        "name": name,
        "host": "local",
        "remote_root": root,
        "project": {"path": str(project), "exclude": ["data/"]},
        "environment": environment,
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
    return data


@pytest.fixture(scope="session")
def host_built_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This worker's ``remote_root`` on the host ``local`` where the workload's venv was
    built once by the product, from a version and a lock file (tests/harness/hostbuilt.py
    says why and how); :func:`make_playbook`'s runs reuse it."""
    warm = hostbuilt.warm_root(tmp_path_factory.mktemp("host-built"))
    print(f"\nhost-built environment: first run {warm.seconds:.1f} s (venv built)")
    return warm.root


@pytest.fixture(scope="session")
def workload_python(host_built_root: Path) -> str:
    """The python of the venv the host built in :func:`host_built_root` (torch 2.13 and
    numpy from the lock file): for tests that run the agent's workload-side scripts (the
    harness, the checkpoint converter) as the runner does, under the workload's venv."""
    return hostbuilt.venv_python(host_built_root)


@pytest.fixture
def host_pythons(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host ``local`` as a host without the test venv: its interpreter search looks
    only in the OS's bin dirs (``$REMOTEMAC_PYTHON_PATH``), and torch comes from the
    machine's CPU wheel; set for the CLI this test starts (tests/harness/hostbuilt.py).
    Enough by itself for a torch-free workload whose ``environment`` asks for
    ``python: "3.11"`` and no requirements: the host builds an empty venv at once."""
    for key, value in hostbuilt.host_env().items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def host_built(tmp_path: Path, host_built_root: Path, host_pythons: None) -> hostbuilt.HostBuilt:
    """A host-built environment with torch for this test's runs on the host ``local``:
    the worker's warm root and project copies with a lock file (and ``host_pythons``)."""
    return hostbuilt.HostBuilt(host_built_root, tmp_path)


@pytest.fixture
def make_playbook(tmp_path: Path, host_built: hostbuilt.HostBuilt):
    """Write a playbook for the ``lines`` workload on the local host whose environment
    the host builds; keys override (as :func:`make_preinstalled_playbook`'s).

    The project (``lines``, or the one a ``project={"path": ...}`` override names) is
    copied with a ``requirements.lock`` (torch 2.13, numpy) and ``environment`` is
    ``{python: "3.11", requirements: requirements.lock}``: the host matches a 3.11 among
    its own interpreters (never the test venv: ``$REMOTEMAC_PYTHON_PATH``) and builds the
    venv with uv. ``remote_root`` is this worker's :func:`host_built_root`, where that
    venv already exists: the run reuses it through the product's env cache
    (``make_playbook.root``). A test checks what the record says with
    ``hostbuilt.assert_host_built(record, make_playbook.root)``.

    Teardown: the RAM stores of the runs the test's journal (under ``tmp_path``) lists.
    """

    def make(name: str = "lines", **overrides) -> Path:
        given = overrides.pop("project", None) or {}
        project = host_built.project(Path(given.get("path", LINES_PROJECT)), name)
        book = _lines_book(name, str(host_built.root), project, host_built.environment(), overrides)
        book["project"] = {**book["project"], **given, "path": str(project)}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(book, sort_keys=False))
        return path

    make.root = host_built.root  # type: ignore[attr-defined]
    yield make
    ramstores.remove_stores(ramstores.run_ids_under(tmp_path), {os.geteuid()})


@pytest.fixture
def make_preinstalled_playbook(tmp_path: Path):
    """Write a playbook for the ``lines`` workload on the local host, with a
    preinstalled environment and a root of the test's own; keys override.

    For tests about something else than the workload's environment (the CLI's and
    the TUI's output, interrupts, the journal, what a root holds, cleanup) that need a
    ``remote_root`` of their own (one with the venv built in it would cost a torch
    install per test). The host ``local`` is this machine, and the test runner's own
    interpreter (torch CPU installed) is handed over as ``environment.python`` with
    ``venv: false``, as a user whose host already has torch would. A rented Mac has
    no such interpreter (only 3.9.6, which cannot install current torch): that the
    host matches or brings an interpreter and builds the workload's environment under
    ``remote_root`` is what :func:`make_playbook`'s tests prove on the host ``local``
    (tests/test_pipeline_local.py) and the fresh-host sshd tests over a bare 3.9 host
    (tests/test_readme_walkthrough.py, tests/test_bring_sshd.py).

    A top-level key given as None is left out (e.g. ``environment=None``: the default
    environment, as a playbook over the fresh-host sshd should use).

    Its teardown is the local host's: the RAM stores (``/dev/shm/remotemac-<id>``) of
    the runs the test made under ``tmp_path`` are removed, as the lab's host removes
    its own, however the test ended: a ``wipe: manual``, lost or kept-running run keeps
    its plaintext there, and /dev/shm outlives the test.
    """

    def make(name: str = "lines", **overrides) -> Path:
        environment = {"python": sys.executable, "venv": False}
        data = _lines_book(name, str(tmp_path / "host-root"), LINES_PROJECT, environment, overrides)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    yield make
    ramstores.remove_stores(ramstores.run_ids_under(tmp_path), {os.geteuid()})


def as_in_a_terminal() -> None:
    """``preexec_fn`` of a CLI a test signals: SIGHUP and SIGINT at their defaults, as
    in a terminal's shell. A suite started under ``nohup`` inherits SIGHUP ignored, one
    started as a ``cmd &`` job of a non-interactive shell SIGINT, and the hang-up and
    Ctrl-C tests then tested nothing (CI under nohup: the SIGHUP'd run went on to
    "finished"; a normal user's ``… &``: the Ctrl-C'd run did too)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


# The fixtures that start a real sshd or build its lab (a test's fixture closure holds
# one of these whenever an sshd runs for it).
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that start a real sshd, by the fixtures they use (e2e and slow are
    declared on the tests themselves), so ``-m`` can select the fast ones; then put the
    heaviest files first (see :func:`cost_estimate`)."""
    for item in items:
        if set(getattr(item, "fixturenames", ())) & SSHD_FIXTURES:
            item.add_marker(pytest.mark.sshd)
    weights: dict[str, float] = {}
    for item in items:
        weights[str(item.path)] = weights.get(str(item.path), 0.0) + cost_estimate(item)
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda it: (-weights[str(it.path)], order[id(it)]))


def cost_estimate(item: pytest.Item) -> float:
    """A rough cost of one test, from what it declares: scripts/test hands pytest-xdist
    whole files in collection order (``--dist loadfile --no-loadscope-reorder``), so the
    long files must start first or the last one runs alone on one core while the other
    worker idles. (xdist's own reorder puts the files with the most tests first: the
    many-test unit files, and a 4-test file whose one test takes 3 minutes last: CI saw
    it end the run.) A declared timeout beyond the default says how long it may run."""
    names = {m.name for m in item.iter_markers()}
    weight = 0.1 + 10 * ("e2e" in names) + 5 * ("sshd" in names) + 3 * ("slow" in names)
    timeout = item.get_closest_marker("timeout")
    if timeout is not None and timeout.args and float(timeout.args[0]) > 600:
        weight += float(timeout.args[0]) / 20
    return weight


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


@pytest.fixture(scope="session", autouse=True)
def no_ram_store_outlives_the_session(tmp_path_factory: pytest.TempPathFactory):
    """At the end of the session (of each xdist worker), no run this session made still
    has a RAM store in /dev/shm; any found is removed and the session errors, naming it.

    Why this way: /dev/shm is shared with every other session on the machine (other
    checkouts, the other xdist worker), so a before/after listing of it would blame
    this session for their stores, or remove them. The runs looked at are only those
    this worker made: the run ids in the journals and the host roots' ``runs/`` dirs
    under its own pytest temp dir (``getbasetemp()``, one per worker), and only ids of
    ``journal.new_run_id``'s shape (name, UTC second, 4 random hex digits), which no
    other session reuses. A test that leaves a run unwiped on purpose cleans up in its
    teardown (the sshd lab's ``HostDirs.remove``, the local host's ``make_*playbook``, or
    its own); this catches the one that does not. Runs on an sshd host that no journal
    under the temp dir knows (agent calls by hand) are the lab host's teardown's to
    remove: their root is gone with it, so this cannot see them.
    """
    yield
    owners = {os.geteuid()}
    with contextlib.suppress(Exception):  # no lab user on this machine: only our own
        from tests.harness import lab

        owners.add(lab.lab_ids()[0])
    left = ramstores.remove_escaped(tmp_path_factory.getbasetemp(), owners)
    if left:
        pytest.fail(
            f"{len(left)} RAM store(s) of this session's runs outlived their test "
            f"(removed now; the test that made them must clean up): {', '.join(left)}",
            pytrace=False,
        )
