"""SSHTransport against a real OpenSSH sshd on loopback: exec, SFTP, ProxyJump, errors."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from remotemac.errors import EXIT_HOST, AuthError, HostError, HostKeyError
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport
from remotemac.transport.sshconnect import (
    ConnectRefused,
    ConnectTimeout,
    DNSError,
    SFTPUnavailable,
)
from tests.harness.sshd import ClientKey, free_port

pytestmark = pytest.mark.timeout(60)


def _transport(env: tuple, **kw: object) -> SSHTransport:
    home, cfg, alias = env
    return SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg, **kw))  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_exec_round_trip_quotes_every_argument(sshd, ssh_env):
    tricky = ["a b", "it's", "$HOME", "*", "semi;colon", "", "new\nline"]
    async with _transport(ssh_env(sshd)) as t:
        res = await t.exec(["printf", "%s|"] + tricky)
        assert res.ok and res.stdout.decode() == "|".join(tricky) + "|"
        payload = bytes(range(256)) * 100
        res = await t.exec(["sh", "-c", "cat; echo oops >&2; exit 7"], stdin=payload)
        assert (res.exit_code, res.stdout, res.stderr) == (7, payload, b"oops\n")


@pytest.mark.asyncio
async def test_exec_check_raises_with_last_stderr_line(sshd, ssh_env):
    async with _transport(ssh_env(sshd)) as t:
        with pytest.raises(HostError) as err:
            await t.exec(["sh", "-c", "echo first >&2; echo 'last words' >&2; exit 2"], check=True)
        assert "last words" in err.value.line() and "exit 2" in err.value.line()
        assert err.value.exit_code == EXIT_HOST


@pytest.mark.asyncio
async def test_exec_timeout_is_a_host_error(sshd, ssh_env):
    async with _transport(ssh_env(sshd)) as t:
        start = time.monotonic()
        with pytest.raises(HostError, match="timed out after 0.5 s"):
            await t.exec(["sleep", "5"], timeout=0.5)
        assert time.monotonic() - start < 3
        assert (await t.exec(["true"])).ok  # the connection survives


@pytest.mark.asyncio
async def test_many_concurrent_execs_stay_under_max_sessions(sshd, ssh_env):
    """OpenSSH refuses an 11th session; 30 concurrent execs must all succeed."""
    async with _transport(ssh_env(sshd)) as t:
        await t.stat("/")  # the SFTP session holds one channel too
        results = await asyncio.gather(
            *(t.exec(["sh", "-c", f"sleep 0.2; echo {i}"]) for i in range(30))
        )
        assert [r.stdout.decode().strip() for r in results] == [str(i) for i in range(30)]


@pytest.mark.asyncio
async def test_sftp_round_trip(sshd, ssh_env, tmp_path):
    remote = sshd.home / "remote"
    async with _transport(ssh_env(sshd)) as t:
        # `~` means one place to the laptop and to the agent's expanduser on the host
        expanded = (
            await t.exec(["python3", "-c", "import os; print(os.path.expanduser('~'))"])
        ).text()
        assert await t.home() == expanded.strip()
        await t.makedirs(str(remote / "a" / "b"), mode=0o750)
        await t.makedirs(str(remote / "a" / "b"))  # exists: fine
        assert (remote / "a" / "b").is_dir()

        await t.write_bytes(str(remote / "a" / "small.txt"), b"0123456789", mode=0o640)
        st = await t.stat(str(remote / "a" / "small.txt"))
        assert st is not None and (st.kind, st.size, st.extra["mode"]) == ("file", 10, 0o640)
        assert not [p for p in (remote / "a").iterdir() if "rm-tmp" in p.name]
        assert await t.read_from(str(remote / "a" / "small.txt"), 3, 4) == b"3456"
        assert await t.read_from(str(remote / "a" / "small.txt"), 10) == b""
        with pytest.raises(FileNotFoundError):
            await t.read_from(str(remote / "missing"), 0)
        assert await t.stat(str(remote / "missing")) is None

        data = os.urandom(3 * 1024 * 1024 + 17)
        src = tmp_path / "src.bin"
        src.write_bytes(data)
        moved: list[int] = []
        await t.put(str(src), str(remote / "a" / "big.bin"), progress=moved.append)
        assert sum(moved) == len(data)
        back = tmp_path / "back.bin"
        await t.get(str(remote / "a" / "big.bin"), str(back))
        assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(data).digest()

        os.symlink("small.txt", remote / "a" / "link")
        entries = await t.listdir(str(remote / "a"))
        kinds = {Path(e.path).name: e.kind for e in entries}
        assert kinds == {"b": "dir", "small.txt": "file", "big.bin": "file", "link": "link"}


@pytest.mark.asyncio
async def test_proxyjump_through_second_sshd(sshd_factory, fault_proxy, ssh_env, tmp_path):
    """The target is reached only through the jump host (its link runs via a proxy we watch)."""
    jump, target = sshd_factory(), sshd_factory()
    jump_proxy = fault_proxy(jump)
    home, cfg, _ = ssh_env(jump, jump_proxy)  # alias testhost0 → jump via proxy
    (home / "known_hosts").open("a").write(target.known_hosts_line())
    target.write_ssh_config(
        cfg, "target", known_hosts=tmp_path / "user_known_hosts", extra={"ProxyJump": "testhost0"}
    )
    events: list = []
    async with SSHTransport(
        "target", home_dir=home, options=SSHOptions(ssh_config=cfg), emit=events.append
    ) as t:
        res = await t.exec(["sh", "-c", "echo $SSH_CONNECTION"])
        assert res.ok
        assert jump_proxy.accepted == 1 and jump_proxy.bytes_forwarded > 0
        # the target saw a connection from the jump host's side, on the target's port
        assert res.text().split()[2:] == [target.host, str(target.port)]
        assert await t.read_from("/etc/hostname", 0) == Path("/etc/hostname").read_bytes()


@pytest.mark.asyncio
async def test_proxyjump_jump_host_key_is_checked_too(sshd_factory, ssh_env, tmp_path):
    jump, target = sshd_factory(), sshd_factory()
    home, cfg, _ = ssh_env(jump, trust=False)
    (home / "known_hosts").write_text(target.known_hosts_line())  # only the target is trusted
    target.write_ssh_config(
        cfg, "target", known_hosts=tmp_path / "user_known_hosts", extra={"ProxyJump": "testhost0"}
    )
    with pytest.raises(HostKeyError, match=rf"unknown host key for \[127.0.0.1\]:{jump.port}"):
        await SSHTransport("target", home_dir=home, options=SSHOptions(ssh_config=cfg)).connect()


@pytest.mark.asyncio
async def test_connection_refused_is_one_clear_line(tmp_path):
    port = free_port()
    start = time.monotonic()
    with pytest.raises(ConnectRefused) as err:
        await SSHTransport(f"root@127.0.0.1:{port}", home_dir=tmp_path).connect()
    assert time.monotonic() - start < 3
    assert err.value.exit_code == EXIT_HOST
    assert f"connection refused by root@127.0.0.1:{port}" in err.value.line()
    assert "\n" not in err.value.line()


@pytest.mark.asyncio
async def test_dns_failure_is_one_clear_line(tmp_path):
    with pytest.raises(DNSError) as err:
        await SSHTransport(
            "me@no-such-host.invalid", home_dir=tmp_path, options=SSHOptions(connect_timeout=5)
        ).connect()
    assert err.value.exit_code == EXIT_HOST
    assert "cannot resolve host name 'no-such-host.invalid'" in err.value.line()


@pytest.mark.asyncio
async def test_connect_timeout(sshd, fault_proxy, ssh_env):
    proxy = fault_proxy(sshd)
    proxy.blackhole()
    start = time.monotonic()
    with pytest.raises(ConnectTimeout, match="timed out after 1 s connecting to"):
        await _transport(ssh_env(sshd, proxy), connect_timeout=1).connect()
    assert time.monotonic() - start < 3


@pytest.mark.asyncio
async def test_auth_failure_is_fast_and_clear(sshd, ssh_env, tmp_path):
    stranger = ClientKey.generate(tmp_path / "stranger")
    home, _cfg, _alias = ssh_env(sshd)
    start = time.monotonic()
    with pytest.raises(AuthError) as err:
        await SSHTransport(
            sshd.spec, home_dir=home, options=SSHOptions(identity=stranger.private)
        ).connect()
    assert time.monotonic() - start < 3
    assert err.value.exit_code == EXIT_HOST
    assert f"authentication failed for {sshd.user}@127.0.0.1:{sshd.port}" in err.value.line()


@pytest.mark.asyncio
async def test_passphrase_protected_key_is_prompted_not_stored(sshd_factory, ssh_env, tmp_path):
    locked = ClientKey.generate(tmp_path / "locked", passphrase="s3cret-pass")
    server = sshd_factory(client_key=locked)
    home, cfg, alias = ssh_env(server)
    asked: list[Path] = []

    def prompt(path: Path) -> str:
        asked.append(path)
        return "s3cret-pass"

    async with SSHTransport(
        alias, home_dir=home, options=SSHOptions(ssh_config=cfg, passphrase_prompt=prompt)
    ) as t:
        assert (await t.exec(["true"])).ok
    assert asked == [locked.private]
    assert not any(b"s3cret-pass" in p.read_bytes() for p in home.rglob("*") if p.is_file())

    # no terminal and no agent: a clear auth error that says what to do
    with pytest.raises(AuthError, match="ssh-add"):
        await SSHTransport(
            alias,
            home_dir=home,
            options=SSHOptions(ssh_config=cfg, passphrase_prompt=lambda _p: None),
        ).connect()


@pytest.mark.asyncio
async def test_missing_sftp_subsystem(sshd_factory, ssh_env):
    server = sshd_factory(sftp=False)
    async with _transport(ssh_env(server)) as t:
        assert (await t.exec(["true"])).ok
        with pytest.raises(SFTPUnavailable, match="SFTP subsystem is missing") as err:
            await t.read_from("/etc/hostname", 0)
        assert err.value.exit_code == EXIT_HOST


def test_options_travel_whole_to_the_transport(tmp_path):
    """One SSHOptions object reaches the transport: its deadline and channel cap apply."""
    opts = SSHOptions(reconnect_deadline=42.0, max_channels=3)
    t = SSHTransport("me@127.0.0.1:1", home_dir=tmp_path, options=opts)
    assert t.options is opts and t.reconnect_deadline == 42.0
    assert t._channels._value == 3
    assert SSHTransport("me@127.0.0.1:1", home_dir=tmp_path).reconnect_deadline == 600.0
