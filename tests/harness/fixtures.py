"""pytest fixtures for the real-sshd harness (load with ``pytest_plugins``).

- ``client_key``       session-wide ed25519 client key (one ssh-keygen call per run)
- ``fresh_host_lab``   session-wide: sets up the fresh-host lab (tests/harness/lab.py) and
                       asserts, over a real ssh login, that it is bare; every sshd needs it
- ``host_torch_python`` session-wide: path of a lab-host interpreter with torch + numpy
                       (for tests named ``*host_torch*``)
- ``sshd``             a running sshd, fresh per test (start-up ~0.1 s), login = lab user
- ``sshd_factory``     ``sshd_factory(**SSHD kwargs)`` starts more; all stopped at teardown
- ``mac_sshd_factory`` like ``sshd_factory``, for the Mac-shaped lab host
                       (tests/harness/maclab.py: user ``rmmac``, HFS+-rules home, no /proc)
- ``fault_proxy``      ``fault_proxy(sshd)`` puts a FaultProxy in front of one
- ``sshd_new_hostkey`` ``sshd_new_hostkey(sshd)`` restarts it on the same port with a new key
- ``trusted_home``     ``trusted_home(*sshds, via_proxy=None)``: a ``--home`` dir whose
                       known_hosts trusts those sshds
- ``ssh_env``          ``ssh_env(sshd, proxy=None)``: (home, ssh_config, alias) ready for
                       ``SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg))``
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import lab
from tests.harness.faultproxy import FaultProxy
from tests.harness.sshd import SSHD, ClientKey

# An xdist worker (scripts/test runs two) is started with COLUMNS=80 and LINES=24 in its
# environment, which a serial run lacks; every subprocess inherits them, and a TUI run in a
# real tmux pane then lays itself out for 80 columns, not the pane's. Workers see the
# environment of a serial run.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


@pytest.fixture(scope="session")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> ClientKey:
    return ClientKey.generate(tmp_path_factory.mktemp("client-key"))


def ssh_argv(server: SSHD, directory: Path) -> list[str]:
    """OpenSSH client argv reaching ``server`` (own config and known_hosts)."""
    known = server.write_known_hosts(directory / "known_hosts", append=False)
    cfg = directory / "ssh_config"
    cfg.write_text(server.ssh_config_block("lab", known_hosts=known, extra={"BatchMode": "yes"}))
    return ["ssh", "-F", str(cfg), "lab"]


@pytest.fixture(scope="session")
def fresh_host_lab(tmp_path_factory: pytest.TempPathFactory, client_key: ClientKey) -> dict:
    """Set the lab up (idempotent) and prove, through a real login, that it is bare.

    Fails the session's sshd tests loudly if the login sees a Python other than the
    lab's 3.9, a third-party module, or a PATH with the test venv or /root in it.
    """
    lab.ensure_lab()
    work = tmp_path_factory.mktemp("lab-probe")
    with SSHD(work / "sshd", client_key=client_key) as server:
        return lab.assert_bare(ssh_argv(server, work))


@pytest.fixture(scope="session")
def host_torch_python(fresh_host_lab: dict) -> str:
    """An interpreter on the lab host with torch (CPU) and numpy, for ``*host_torch*`` tests.

    Use it as ``environment: {python: host_torch_python, venv: false}``: the host has
    torch preinstalled, which a rental does not; the test's name must say so.
    """
    return lab.ensure_host_torch_python()


@pytest.fixture
def sshd_factory(
    tmp_path_factory: pytest.TempPathFactory, client_key: ClientKey, fresh_host_lab: dict
) -> Iterator[Callable[..., SSHD]]:
    started: list[SSHD] = []

    def start(**kwargs: object) -> SSHD:
        kwargs.setdefault("client_key", client_key)
        server = SSHD(tmp_path_factory.mktemp("sshd"), **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.cleanup()


@pytest.fixture
def mac_sshd_factory(
    tmp_path_factory: pytest.TempPathFactory, client_key: ClientKey
) -> Iterator[Callable[..., SSHD]]:
    """Mac-shaped lab hosts (Simulation: see tests/harness/maclab.py), stopped at teardown."""
    from tests.harness.maclab import MacSSHD

    started: list[SSHD] = []

    def start(**kwargs: object) -> SSHD:
        kwargs.setdefault("client_key", client_key)
        server = MacSSHD(tmp_path_factory.mktemp("macsshd"), **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.cleanup()


@pytest.fixture
def sshd(sshd_factory: Callable[..., SSHD]) -> SSHD:
    return sshd_factory()


@pytest.fixture
def fault_proxy() -> Iterator[Callable[[SSHD], FaultProxy]]:
    proxies: list[FaultProxy] = []

    def start(server: SSHD) -> FaultProxy:
        proxy = FaultProxy(server.host, server.port).start()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.stop()


@pytest.fixture
def sshd_new_hostkey() -> Callable[[SSHD], SSHD]:
    def restart(server: SSHD) -> SSHD:
        return server.restart(new_host_key=True)

    return restart


def trust_line(server: SSHD, port: int | None = None) -> str:
    """known_hosts line for ``server`` reached at ``port`` (e.g. a proxy's)."""
    port = port or server.port
    return server.known_hosts_line(server.host if port == 22 else f"[{server.host}]:{port}")


@pytest.fixture
def trusted_home(tmp_path: Path) -> Callable[..., Path]:
    """Make a remotemac home whose own known_hosts trusts the given sshds."""

    def make(*servers: SSHD, proxies: dict[SSHD, FaultProxy] | None = None) -> Path:
        home = tmp_path / "rm-home"
        home.mkdir(exist_ok=True)
        with open(home / "known_hosts", "a") as fh:
            for server in servers:
                proxy = (proxies or {}).get(server)
                fh.write(trust_line(server, proxy.port if proxy else None))
        return home

    return make


@pytest.fixture
def ssh_env(tmp_path: Path, trusted_home: Callable[..., Path]) -> Callable[..., tuple]:
    """(home, ssh_config, alias) for one sshd, optionally reached through a proxy.

    The ssh_config sets ``UserKnownHostsFile`` to an empty file so the test never
    depends on the real ``~/.ssh/known_hosts``.
    """
    counter = iter(range(1000))

    def make(
        server: SSHD,
        proxy: FaultProxy | None = None,
        *,
        trust: bool = True,
        extra: dict[str, str] | None = None,
    ) -> tuple[Path, Path, str]:
        alias = f"testhost{next(counter)}"
        empty = tmp_path / "user_known_hosts"
        empty.touch()
        if trust:
            home = trusted_home(server, proxies={server: proxy} if proxy else None)
        else:
            home = tmp_path / "rm-home"
            home.mkdir(exist_ok=True)
        cfg = server.write_ssh_config(
            tmp_path / "ssh_config",
            alias,
            known_hosts=empty,
            port=proxy.port if proxy else None,
            extra=extra,
        )
        return home, cfg, alias

    return make
