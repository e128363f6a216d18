"""The login's requests as a real OpenSSH sshd sees them (transport/fastlogin.py).

sshd at LogLevel DEBUG1 logs every user-auth request it reads (``userauth-request
for user U service ssh-connection method M``), and at VERBOSE how it answered
publickey ones: ``Postponed publickey`` for an unsigned query it would take,
``Failed publickey`` for a key it refuses (query or signed), ``Accepted publickey``
for the signed login. Each request waits for its answer, one round trip on the link
each, so these lines count the login's round trips after the key exchange (asyncssh's
own login: none, query, signed = 3; now 1 for a key file).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from remotemac.errors import AuthError
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport
from tests.harness.sshd import SSHD, ClientKey

pytestmark = pytest.mark.timeout(60)

REQUEST = re.compile(
    r"userauth-request for user \S+ service \S+ method (\S+)"
    r"|\b(Failed|Postponed|Accepted) publickey for "
)


class ChattySSHD(SSHD):
    """The lab's sshd, logging each user-auth request (command line beats the config)."""

    def _popen_argv(self) -> list[str]:
        return [*super()._popen_argv(), "-o", "LogLevel=DEBUG1"]


@pytest.fixture
def sshd(fresh_host_lab, client_key, tmp_path):
    with ChattySSHD(tmp_path / "sshd", client_key=client_key) as server:
        yield server


def requests(server: SSHD) -> list[str]:
    """The user-auth requests sshd read ("method M") and its verdicts on publickey
    ones ("Verdict"), in order."""
    return [f"method {m[1]}" if m[1] else m[2] for m in REQUEST.finditer(server.log())]


async def login_requests(server: SSHD, home: Path, cfg: Path, alias: str) -> list[str]:
    """Log in (a command run to be sure) and return what sshd logged of the login."""
    before = len(requests(server))
    async with SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)) as t:
        assert (await t.exec(["true"])).ok
    return requests(server)[before:]


def wait_for_log(server: SSHD, text: str) -> None:
    """Wait until sshd has logged ``text`` (it logs a login's end as it closes: the line
    may trail the client's error)."""
    deadline = time.monotonic() + 5
    while text not in server.log():
        assert time.monotonic() < deadline, server.log()[-2000:]
        time.sleep(0.05)


def config_with_keys(server: SSHD, path: Path, alias: str, keys: list[Path], **kw: object) -> Path:
    """An ssh_config block for ``server`` whose IdentityFile lines are ``keys``, in order."""
    block = server.ssh_config_block(alias, **kw)  # type: ignore[arg-type]
    ours = f"  IdentityFile {server.client_key.private}\n"
    path.write_text(block.replace(ours, "".join(f"  IdentityFile {k}\n" for k in keys)))
    return path


def wrong_key_first(server: SSHD, tmp_path: Path, stranger: Path) -> Path:
    """ssh_config for host alias ``wrongfirst``: ``stranger``'s key offered before the host's."""
    return config_with_keys(
        server,
        tmp_path / "wrong_first",
        "wrongfirst",
        [stranger, server.client_key.private],
        known_hosts=tmp_path / "ukh",
    )


@contextlib.contextmanager
def ssh_agent(tmp_path: Path, monkeypatch: Any, *keys: Path) -> Iterator[None]:
    """A real ssh-agent holding ``keys`` (listed in this order), as SSH_AUTH_SOCK."""
    sock = tmp_path / "agent.sock"
    out = subprocess.run(
        ["ssh-agent", "-s", "-a", str(sock)], check=True, capture_output=True, text=True
    ).stdout
    pid = int(re.search(r"SSH_AGENT_PID=(\d+)", out)[1])  # type: ignore[index]
    try:
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        for key in keys:
            subprocess.run(["ssh-add", "-q", str(key)], check=True, env={**os.environ})
        yield
    finally:
        os.kill(pid, 15)


@pytest.mark.asyncio
async def test_a_key_file_logs_in_with_one_signed_request(sshd, ssh_env):
    home, cfg, alias = ssh_env(sshd)
    # asyncssh's own: method none, method publickey, Postponed, method publickey, Accepted
    assert await login_requests(sshd, home, cfg, alias) == ["method publickey", "Accepted"]


@pytest.mark.asyncio
async def test_a_refused_key_is_passed_over_for_the_next(sshd, ssh_env, tmp_path):
    stranger = ClientKey.generate(tmp_path / "stranger")
    home, _cfg, _alias = ssh_env(sshd)
    cfg = config_with_keys(
        sshd,
        tmp_path / "two_keys",
        "twokeys",
        [stranger.private, sshd.client_key.private],
        known_hosts=tmp_path / "user_known_hosts",
    )
    assert await login_requests(sshd, home, cfg, "twokeys") == [
        "method publickey",
        "Failed",
        "method publickey",
        "Accepted",
    ]


@pytest.mark.asyncio
async def test_only_refused_keys_still_end_in_one_clear_line(sshd, ssh_env, tmp_path):
    strangers = [ClientKey.generate(tmp_path / f"stranger{i}").private for i in range(2)]
    home, _cfg, _alias = ssh_env(sshd)
    cfg = config_with_keys(
        sshd, tmp_path / "strangers", "strangers", strangers, known_hosts=tmp_path / "ukh"
    )
    before = requests(sshd)
    with pytest.raises(AuthError) as err:
        await SSHTransport("strangers", home_dir=home, options=SSHOptions(ssh_config=cfg)).connect()
    assert f"authentication failed for {sshd.user}@127.0.0.1:{sshd.port}" in err.value.line()
    assert "\n" not in err.value.line()
    assert requests(sshd)[len(before) :] == ["method publickey", "Failed"] * 2


@pytest.mark.asyncio
async def test_a_host_at_its_max_auth_tries_is_an_auth_error_not_a_link_error(
    fresh_host_lab, client_key, ssh_env, tmp_path
):
    """sshd with ``MaxAuthTries 1`` and a wrong key offered first ends the login with
    a disconnect ("Too many authentication failures", a protocol-error code), which
    came out as a transient link error ("retry"), one a reconnect kept retrying until
    its deadline. It is an AuthError now, in one line saying which setting to fix; with
    the host's key offered first, the same host logs in."""
    stranger = ClientKey.generate(tmp_path / "stranger").private
    with ChattySSHD(
        tmp_path / "sshd", client_key=client_key, extra_config=["MaxAuthTries 1"]
    ) as server:
        home, _cfg, _alias = ssh_env(server)
        cfg = wrong_key_first(server, tmp_path, stranger)
        before = requests(server)
        with pytest.raises(AuthError) as err:
            await SSHTransport(
                "wrongfirst", home_dir=home, options=SSHOptions(ssh_config=cfg)
            ).connect()
        line = err.value.line()
        assert f"authentication failed for {server.user}@127.0.0.1:{server.port}" in line
        assert "MaxAuthTries" in line and "IdentitiesOnly yes" in line and "\n" not in line
        wait_for_log(server, "maximum authentication attempts exceeded")
        assert requests(server)[len(before) :] == ["method publickey", "Failed"]
        right = config_with_keys(
            server,
            tmp_path / "right_first",
            "rightfirst",
            [client_key.private, stranger],
            known_hosts=tmp_path / "ukh",
        )
        assert await login_requests(server, home, right, "rightfirst") == [
            "method publickey",
            "Accepted",
        ]


@pytest.mark.asyncio
async def test_identities_only_limits_the_agent_to_the_named_key_it_holds(
    fresh_host_lab, client_key, ssh_env, tmp_path, monkeypatch
):
    """The MaxAuthTries hint's own remedy, with the named key in ssh-agent behind
    another: sshd at ``MaxAuthTries 1``, the agent holding a stranger's key first and
    the host's key second, the ssh_config naming the host's key with ``IdentitiesOnly
    yes``. The key file is left to the agent (no passphrase asked), and the agent may
    offer only that key: one request, accepted. Before, the agent offered its keys
    unrestricted and the stranger's ended the login."""
    stranger = ClientKey.generate(tmp_path / "stranger").private
    # the agent lists them in this order
    with (
        ssh_agent(tmp_path, monkeypatch, stranger, client_key.private),
        ChattySSHD(
            tmp_path / "sshd", client_key=client_key, extra_config=["MaxAuthTries 1"]
        ) as server,
    ):
        home, cfg, alias = ssh_env(server)  # IdentityFile the host's key, IdentitiesOnly yes
        assert (await login_requests(server, home, cfg, alias))[-1] == "Accepted"
        assert "Failed" not in requests(server)


@pytest.mark.asyncio
async def test_a_reconnect_refused_at_max_auth_tries_stops_at_once(
    fresh_host_lab, client_key, ssh_env, tmp_path
):
    """The link drops and the host's sshd comes back with ``MaxAuthTries 1`` (a wrong key
    is offered first): the reconnect took that for link trouble and kept logging in
    until the reconnect deadline, to fail as a lost link. Now the first refusal ends it
    as an AuthError."""
    stranger = ClientKey.generate(tmp_path / "stranger").private
    with ChattySSHD(tmp_path / "sshd", client_key=client_key) as server:
        home, _cfg, _alias = ssh_env(server)
        cfg = wrong_key_first(server, tmp_path, stranger)
        opts = SSHOptions(ssh_config=cfg, reconnect_deadline=20)
        async with SSHTransport("wrongfirst", home_dir=home, options=opts) as t:
            assert (await t.exec(["true"])).ok  # the default MaxAuthTries (6) lets it in
            server.extra_config.append("MaxAuthTries 1")
            server.restart()
            before = requests(server)
            started = time.monotonic()
            with pytest.raises(AuthError, match="MaxAuthTries"):
                await t.exec(["true"], idempotent=True)
            took = time.monotonic() - started
        assert took < 5, took
        wait_for_log(server, "maximum authentication attempts exceeded")
        assert requests(server)[len(before) :] == ["method publickey", "Failed"]


@pytest.mark.asyncio
async def test_an_agent_key_is_still_queried_before_it_signs(sshd, ssh_env, tmp_path, monkeypatch):
    """A signature from an agent may ask the user (ssh-add -c, a security key): the
    unsigned query spares that for a key the host would refuse, so agent keys keep it."""
    with ssh_agent(tmp_path, monkeypatch, sshd.client_key.private):
        home, cfg, alias = ssh_env(sshd)
        # no "method none": the configured method goes first for agent keys too
        assert await login_requests(sshd, home, cfg, alias) == [
            "method publickey",
            "Postponed",
            "method publickey",
            "Accepted",
        ]


@pytest.mark.asyncio
async def test_an_rsa_key_signs_with_sha2_when_the_login_follows_the_service_request(
    fresh_host_lab, ssh_env, tmp_path
):
    """The first login request goes before the service is accepted, but only once the
    host's extension info is read: sshd 8.8+ refuses RSA signed with SHA-1, the
    algorithm asyncssh falls back on when it has no ``server-sig-algs``."""
    private = tmp_path / "rsa" / "id_rsa"
    private.parent.mkdir()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", str(private)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    rsa = ClientKey(private=private, public=Path(f"{private}.pub"))
    with ChattySSHD(tmp_path / "sshd", client_key=rsa) as server:
        home, cfg, alias = ssh_env(server)
        assert await login_requests(server, home, cfg, alias) == ["method publickey", "Accepted"]
        assert re.search(r"Accepted publickey for \S+ from .* ssh2: RSA SHA256:", server.log())


@pytest.mark.asyncio
async def test_the_login_starts_before_the_service_is_accepted(sshd, ssh_env, caplog):
    """Against an OpenSSH host, the first login request follows the service request at
    once (after the host's extension info), not after its acceptance: asyncssh's own
    debug log says "Trying public key auth" before "Request for service ... accepted".
    (A review found the other tests pass with this part switched off.)"""
    import logging

    import asyncssh

    asyncssh.set_debug_level(2)
    caplog.set_level(logging.DEBUG, logger="asyncssh")
    try:
        home, cfg, alias = ssh_env(sshd)
        assert await login_requests(sshd, home, cfg, alias) == ["method publickey", "Accepted"]
    finally:
        asyncssh.set_debug_level(1)
    msgs = [r.getMessage() for r in caplog.records]
    tried = next(i for i, m in enumerate(msgs) if "Trying public key auth" in m)
    accepted = next(i for i, m in enumerate(msgs) if "service" in m.lower() and "accepted" in m)
    assert tried < accepted, msgs[: accepted + 3]
