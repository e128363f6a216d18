"""Strict host key checking against the user's known_hosts and remotemac's own.

Why our own check instead of asyncssh's: asyncssh reports every failure as "not
verifiable", cannot tell unknown from changed, and for a non-22 port falls back
to the port-less entry. We match the exact known_hosts name (``host`` or
``[host]:port``), tell the user which case it is with the SHA256 fingerprint,
and trust on first use only through the explicit ``remotemac trust`` step.

Every connection remotemac opens goes through :class:`HostKeyPolicy`: a key is
accepted only if it is listed (not revoked) for that name, or signed by a listed
``@cert-authority``. There is no "accept anyway" code path.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from remotemac.errors import HostKeyError

OWN_KNOWN_HOSTS = "known_hosts"


def own_known_hosts(home_dir: Path) -> Path:
    """remotemac's own known_hosts file under ``--home``."""
    return Path(home_dir) / OWN_KNOWN_HOSTS


def fingerprint(key: asyncssh.SSHKey) -> str:
    """``SHA256:…`` exactly as ``ssh`` and ``ssh-keygen -l`` print it."""
    return key.get_fingerprint("sha256")


def normalize_fingerprint(value: str) -> str:
    """Accept ``SHA256:abc``, ``abc`` or ``abc=`` (padding) and return ``SHA256:abc``."""
    value = value.strip()
    if value.upper().startswith("SHA256:"):
        value = value[7:]
    if value.upper().startswith("MD5:") or ":" in value:
        raise HostKeyError(
            f"unsupported fingerprint {value!r}", hint="give the SHA256:… form from ssh-keygen -l"
        )
    return "SHA256:" + value.rstrip("=")


@dataclass
class KeyCheck:
    """What the host offered and what we made of it (filled during the handshake)."""

    name: str
    offered: asyncssh.SSHKey | None = None
    pinned: list[asyncssh.SSHKey] = field(default_factory=list)
    revoked: bool = False

    @property
    def offered_fingerprint(self) -> str:
        return fingerprint(self.offered) if self.offered is not None else "?"


class HostKeyPolicy:
    """Trusted keys from the user's known_hosts files plus ``<home>/known_hosts``."""

    def __init__(self, home_dir: Path, user_files: Sequence[Path]) -> None:
        self.own_file = own_known_hosts(home_dir)
        self.files = [Path(p) for p in user_files] + [self.own_file]
        text = []
        for path in self.files:
            try:
                text.append(path.read_text(errors="replace"))
            except OSError:
                continue
        self._db = asyncssh.import_known_hosts("\n".join(text))

    def lookup(self, name: str) -> tuple[list, list, list]:
        """(host keys, CA keys, revoked keys) listed for exactly ``name``."""
        # _match, not match: match() retries without the port, which would let a
        # key pinned for port 22 vouch for a different server on another port.
        result = self._db._match(name, "", None)
        return list(result[0]), list(result[1]), list(result[2])

    def for_connection(self, name: str) -> tuple[Callable[..., tuple], KeyCheck]:
        """A ``known_hosts`` callable for asyncssh and the record it fills."""
        keys, cas, revoked = self.lookup(name)
        check = KeyCheck(name=name, pinned=keys)

        def known_hosts(_host: str, _addr: str, _port: int | None) -> tuple:
            return keys, cas, revoked

        return known_hosts, check

    def verdict(self, check: KeyCheck, spec: str) -> HostKeyError:
        """The one-line error for a key the handshake refused."""
        fp = check.offered_fingerprint
        if check.revoked:
            return HostKeyError(
                f"host key {fp} for {check.name} is marked @revoked in known_hosts",
                hint="refusing to connect",
            )
        if check.pinned:
            files = ", ".join(str(p) for p in self.files)
            return HostKeyError(
                f"HOST KEY CHANGED for {check.name}: it offered {fp}, which differs from the"
                f" pinned key",
                hint=f"refused; if the host was really re-imaged, remove the old entry with"
                f" `ssh-keygen -R '{check.name}' -f FILE` (files: {files}) and trust it again",
            )
        return HostKeyError(
            f"unknown host key for {check.name}: {fp}",
            hint=f"compare it with the one your provider published, then run"
            f" `remotemac trust {spec} --fingerprint {fp}`",
        )


class VerifyingClient(asyncssh.SSHClient):
    """asyncssh client that records the offered key and never accepts an unlisted one.

    asyncssh calls ``validate_host_public_key`` only for keys *not* in the trusted
    set we gave it; we note the key and say no.
    """

    def __init__(self, check: KeyCheck) -> None:
        self.check = check
        self.lost_reason = ""

    def connection_lost(self, exc: Exception | None) -> None:
        # kept so the transport can say *why* the link died (e.g. keepalive)
        self.lost_reason = str(exc) if exc else "closed by the host"

    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self.check.offered = key
        return False

    def validate_host_ca_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        return False


@dataclass(frozen=True)
class TrustResult:
    name: str
    fingerprint: str
    path: Path
    already_trusted: bool


async def fetch_host_key(
    host_spec: str,
    *,
    home_dir: Path,
    ssh_config: Path | None = None,
    identity: Path | None = None,
    timeout: float = 15.0,
) -> tuple[asyncssh.SSHKey, str]:
    """Ask the host for its key (through ProxyJump hops, which must be trusted already).

    No authentication happens and the connection is dropped right after the key
    exchange, whose key we only report: nothing is trusted here.
    """
    from remotemac.transport.sshconnect import probe_host_key

    key = await probe_host_key(
        host_spec,
        home_dir=Path(home_dir),
        ssh_config=ssh_config,
        identity=identity,
        timeout=timeout,
    )
    return key, fingerprint(key)


async def trust_host_async(
    host_spec: str,
    home_dir: Path,
    fingerprint_expected: str | None,
    confirm: Callable[[str], bool],
    *,
    ssh_config: Path | None = None,
    identity: Path | None = None,
) -> TrustResult:
    """Pin the key ``host_spec`` offers into ``<home>/known_hosts``.

    With ``fingerprint_expected`` the key is pinned only if it matches (no
    question asked); without, ``confirm(question)`` must return True. A key that
    differs from one already pinned is refused: that is a changed key.
    """
    from remotemac.transport.sshconfig import resolve

    params = resolve(host_spec, ssh_config=ssh_config, identity=identity)
    key, fp = await fetch_host_key(
        host_spec, home_dir=home_dir, ssh_config=ssh_config, identity=identity
    )
    policy = HostKeyPolicy(Path(home_dir), params.known_hosts_files)
    keys, _cas, revoked = policy.lookup(params.key_name)
    own = policy.own_file
    if key in revoked:
        raise policy.verdict(KeyCheck(params.key_name, key, keys, revoked=True), host_spec)
    if key in keys:
        return TrustResult(params.key_name, fp, own, already_trusted=True)
    if keys:
        raise policy.verdict(KeyCheck(params.key_name, key, keys), host_spec)
    if fingerprint_expected is not None:
        if normalize_fingerprint(fingerprint_expected) != fp:
            raise HostKeyError(
                f"{params.key_name} offered {fp}, not the expected"
                f" {normalize_fingerprint(fingerprint_expected)}",
                hint="refused; check the fingerprint your provider published",
            )
    elif not confirm(f"Trust host key {fp} ({key.get_algorithm()}) for {params.key_name}?"):
        raise HostKeyError(f"host key {fp} for {params.key_name} not trusted", hint="declined")
    _append_pin(own, params.key_name, key)
    return TrustResult(params.key_name, fp, own, already_trusted=False)


def trust_host(
    host_spec: str,
    home_dir: Path,
    fingerprint: str | None,  # noqa: F811 - the CLI's option name
    confirm: Callable[[str], bool],
    *,
    ssh_config: Path | None = None,
    identity: Path | None = None,
) -> TrustResult:
    """Synchronous :func:`trust_host_async` for the CLI (``remotemac trust``)."""
    return asyncio.run(
        trust_host_async(
            host_spec, home_dir, fingerprint, confirm, ssh_config=ssh_config, identity=identity
        )
    )


def _append_pin(path: Path, name: str, key: asyncssh.SSHKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    keytype, blob = key.export_public_key("openssh").decode().split()[:2]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a") as fh:
        fh.write(f"{name} {keytype} {blob}\n")
