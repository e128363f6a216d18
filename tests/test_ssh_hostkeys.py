"""Strict host keys against a real sshd: unknown refused, trust, changed always refused."""

from __future__ import annotations

import subprocess

import pytest

from remotemac.errors import EXIT_HOST, HostKeyError
from remotemac.transport.hostkeys import (
    fetch_host_key,
    normalize_fingerprint,
    trust_host,
    trust_host_async,
)
from remotemac.transport.options import SSHOptions
from remotemac.transport.ssh import SSHTransport

pytestmark = pytest.mark.timeout(60)


def _never(question: str) -> bool:
    raise AssertionError(f"must not ask: {question}")


@pytest.mark.asyncio
async def test_unknown_key_refused_then_accepted_after_trust_with_fingerprint(sshd, ssh_env):
    home, cfg, alias = ssh_env(sshd, trust=False)
    with pytest.raises(HostKeyError) as err:
        await SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)).connect()
    line = err.value.line()
    assert err.value.exit_code == EXIT_HOST
    assert f"unknown host key for [127.0.0.1]:{sshd.port}: {sshd.fingerprint}" in line
    assert f"remotemac trust {alias} --fingerprint {sshd.fingerprint}" in line

    result = await trust_host_async(alias, home, sshd.fingerprint, _never, ssh_config=cfg)
    assert result.fingerprint == sshd.fingerprint and not result.already_trusted
    assert (home / "known_hosts").read_text() == sshd.known_hosts_line()
    async with SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)) as t:
        assert (await t.exec(["true"])).ok
    again = await trust_host_async(alias, home, None, _never, ssh_config=cfg)
    assert again.already_trusted


def test_trust_is_sync_for_the_cli_and_refuses_a_wrong_fingerprint(sshd, ssh_env):
    home, cfg, alias = ssh_env(sshd, trust=False)
    wrong = "SHA256:" + "A" * 43
    with pytest.raises(HostKeyError, match="not the expected"):
        trust_host(alias, home, wrong, _never, ssh_config=cfg)
    assert not (home / "known_hosts").exists()
    # without --fingerprint the user is asked; "no" pins nothing
    questions: list[str] = []
    with pytest.raises(HostKeyError, match="not trusted"):
        trust_host(alias, home, None, lambda q: questions.append(q) or False, ssh_config=cfg)
    assert sshd.fingerprint in questions[0]
    assert not (home / "known_hosts").exists()
    trust_host(sshd.spec, home, None, lambda q: True)  # plain [user@]host:port spec
    assert (home / "known_hosts").read_text() == sshd.known_hosts_line()
    assert oct((home / "known_hosts").stat().st_mode & 0o777) == "0o600"


@pytest.mark.asyncio
async def test_changed_key_refused_even_after_trusting_the_old_one(sshd, ssh_env, sshd_new_hostkey):
    home, cfg, alias = ssh_env(sshd, trust=False)
    await trust_host_async(alias, home, sshd.fingerprint, _never, ssh_config=cfg)
    old_fp = sshd.fingerprint
    sshd_new_hostkey(sshd)
    assert sshd.fingerprint != old_fp
    with pytest.raises(HostKeyError) as err:
        await SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)).connect()
    assert "HOST KEY CHANGED" in err.value.line() and sshd.fingerprint in err.value.line()
    # trust refuses to overwrite a pin, even when given the new key's fingerprint
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
        await trust_host_async(alias, home, sshd.fingerprint, _never, ssh_config=cfg)
    assert (home / "known_hosts").read_text().count("\n") == 1


@pytest.mark.asyncio
async def test_key_change_during_reconnect_is_not_retried(sshd, ssh_env, sshd_new_hostkey):
    home, cfg, alias = ssh_env(sshd)
    events: list = []
    t = SSHTransport(
        alias,
        home_dir=home,
        options=SSHOptions(ssh_config=cfg, reconnect_deadline=30),
        emit=events.append,
    )
    async with t:
        assert (await t.stat("/")) is not None
        sshd_new_hostkey(sshd)  # kills the session and comes back with another key
        with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
            await t.stat("/")
    states = [e.state for e in events]
    assert states[-1] == "lost" and states.count("reconnecting") == 1


@pytest.mark.asyncio
async def test_users_own_known_hosts_counts_including_hashed_entries(sshd, ssh_env, tmp_path):
    home, cfg, alias = ssh_env(sshd, trust=False)
    user_kh = tmp_path / "user_known_hosts"  # the file ssh_env's config points at
    sshd.write_known_hosts(user_kh)
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(user_kh)], check=True, capture_output=True)
    assert user_kh.read_text().startswith("|1|")  # hashed, as Debian's ssh writes them
    async with SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)) as t:
        assert (await t.exec(["true"])).ok
    assert not (home / "known_hosts").exists()


@pytest.mark.asyncio
async def test_key_pinned_for_port_22_does_not_vouch_for_another_port(sshd, ssh_env):
    home, cfg, alias = ssh_env(sshd, trust=False)
    (home / "known_hosts").write_text(sshd.known_hosts_line(name=sshd.host))  # "127.0.0.1 key"
    with pytest.raises(HostKeyError, match="unknown host key"):
        await SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)).connect()


@pytest.mark.asyncio
async def test_revoked_key_is_refused(sshd, ssh_env):
    home, cfg, alias = ssh_env(sshd)
    with open(home / "known_hosts", "a") as fh:
        fh.write("@revoked " + sshd.known_hosts_line())
    with pytest.raises(HostKeyError, match="revoked"):
        await SSHTransport(alias, home_dir=home, options=SSHOptions(ssh_config=cfg)).connect()


@pytest.mark.asyncio
async def test_fetch_host_key_trusts_nothing(sshd, ssh_env):
    home, cfg, alias = ssh_env(sshd, trust=False)
    key, fp = await fetch_host_key(alias, home_dir=home, ssh_config=cfg)
    assert fp == sshd.fingerprint
    assert not (home / "known_hosts").exists()


def test_fingerprint_forms():
    fp = "SHA256:abcDEF+/12"
    assert normalize_fingerprint(fp) == fp
    assert normalize_fingerprint("abcDEF+/12=") == fp
    with pytest.raises(HostKeyError):
        normalize_fingerprint("MD5:aa:bb:cc")
