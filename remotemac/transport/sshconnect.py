"""Open one asyncssh connection (through ProxyJump hops) and name what went wrong.

Why here and not in asyncssh's own config handling: every hop must go through
:class:`~remotemac.transport.hostkeys.HostKeyPolicy`, and every failure must
become one line with exit 3 (refused, DNS, timeout, auth, unknown or changed
key) that says which hop failed.
"""

from __future__ import annotations

import asyncio
import errno
import getpass
import os
import socket
import sys
import weakref
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

from remotemac.errors import AuthError, HostError, HostKeyError, TransientHostError
from remotemac.transport.coalesce import DirectConnector
from remotemac.transport.fastdata import receive_data_directly, send_data_directly
from remotemac.transport.fastlogin import fast_login
from remotemac.transport.hostkeys import HostKeyPolicy, KeyCheck, VerifyingClient
from remotemac.transport.ignorepackets import drop_cbc_ignores
from remotemac.transport.options import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_KEEPALIVE_COUNT_MAX,
    DEFAULT_KEEPALIVE_INTERVAL_S,
    PassphrasePrompt,
    SSHOptions,
)
from remotemac.transport.sshconfig import HostParams, default_identities, resolve

T = TypeVar("T")

# AES-GCM first: hardware AES on both ends makes it the fastest cipher for bulk
# SFTP; chacha20 stays available for hosts without AES-NI.
ENCRYPTION_ALGS = [
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
]


#: per-channel flow-control window: asyncssh's 2 MiB caps SFTP at 2 MiB per round
#: trip (20 MiB/s at 100 ms); 16 MiB covers the 64 x 255 KiB requests in flight.
CHANNEL_WINDOW = 16 << 20
#: largest SSH packet we accept on a channel: 128 KiB instead of asyncssh's 32 KiB cuts
#: the per-packet Python work of a pull (sshd sends SFTP read answers in packets this
#: big) by four; on loopback it took download_to from ~0.7x to ~1x scp's rate
CHANNEL_MAX_PACKET = 128 << 10
#: what OpenSSH's sshd says when it ends a login at its ``MaxAuthTries`` (auth.c,
#: ``auth_maxtries_exceeded``): a disconnect with a protocol-error code, not a refusal,
#: so asyncssh raises it as a plain DisconnectError
TOO_MANY_AUTH_TRIES = "too many authentication failures"


_CLIENTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lost_reason(conn: asyncssh.SSHClientConnection) -> str:
    """Why asyncssh closed ``conn`` (e.g. "Server not responding to keepalive"), if known."""
    client = _CLIENTS.get(conn)
    return client.lost_reason if client is not None else ""


class DNSError(TransientHostError):
    """The host name does not resolve (transient: a laptop waking up has no DNS yet)."""


class ConnectRefused(TransientHostError):
    """Nothing listens on the port (transient: sshd restarting, host rebooting)."""


class ConnectTimeout(TransientHostError):
    """No answer in time: host down, firewall or a dead route."""


class SFTPUnavailable(HostError):
    """The host's sshd has no sftp subsystem."""


def default_passphrase_prompt(path: Path) -> str | None:
    """Ask on the terminal; None when there is no terminal (never stored anywhere)."""
    if not (sys.stdin and sys.stdin.isatty()):
        return None
    return getpass.getpass(f"Passphrase for {path}: ")


def _agent_public_blobs() -> set[bytes]:
    """Public key blobs the running ssh-agent holds (to skip prompting for those)."""
    sock = os.environ.get("SSH_AUTH_SOCK")
    if not sock or not os.path.exists(sock):
        return set()
    try:
        # the agent protocol in a few lines: request identities (11), answer (12)
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(2)
            conn.connect(sock)
            conn.sendall(b"\0\0\0\1\x0b")
            head = _recv_exact(conn, 4)
            body = _recv_exact(conn, int.from_bytes(head, "big"))
        if not body or body[0] != 12:
            return set()
        count, pos, blobs = int.from_bytes(body[1:5], "big"), 5, set()
        for _ in range(count):
            size = int.from_bytes(body[pos : pos + 4], "big")
            blobs.add(body[pos + 4 : pos + 4 + size])
            pos += 4 + size
            pos += 4 + int.from_bytes(body[pos : pos + 4], "big")  # comment
        return blobs
    except (OSError, ValueError):
        return set()


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise OSError("agent closed the connection")
        data += chunk
    return data


def load_client_keys(
    params: HostParams, prompt: PassphrasePrompt | None, held: list[bytes] | None = None
) -> tuple[list[asyncssh.SSHKeyPair], list[str]]:
    """Load identity files; prompt for passphrases of keys the agent does not hold.

    Returns the key pairs and notes about keys that were skipped (for the auth
    error message). Passphrases are used once and dropped. The public blobs of
    identity files left to the agent go into ``held`` (with IdentitiesOnly the agent
    may offer only those: see _connect_kwargs).
    """
    files = list(params.identity_files)
    if not files and not params.identities_only:
        files = default_identities()
    agent = _agent_public_blobs()
    keys: list[asyncssh.SSHKeyPair] = []
    notes: list[str] = []
    for path in files:
        if not path.is_file():
            if params.identity_files:
                notes.append(f"identity {path} not found")
            continue
        pub = Path(f"{path}.pub")
        if agent and pub.is_file():
            try:
                blob = asyncssh.read_public_key(pub).public_data
                if blob in agent:
                    if held is not None:
                        held.append(blob)
                    continue  # the agent signs with it: no passphrase needed
            except (OSError, asyncssh.KeyImportError):
                pass
        try:
            keys.extend(asyncssh.load_keypairs([str(path)]))
            continue
        except asyncssh.KeyImportError as exc:
            if "passphrase" not in str(exc).lower():
                notes.append(f"cannot read key {path}: {exc}")
                continue
        except OSError as exc:
            notes.append(f"cannot read key {path}: {exc.strerror}")
            continue
        keys.extend(_load_encrypted(path, prompt or default_passphrase_prompt, notes))
    return keys, notes


def _load_encrypted(path: Path, prompt: PassphrasePrompt, notes: list[str]) -> list:
    for _ in range(3):
        passphrase = prompt(path)
        if passphrase is None:
            notes.append(
                f"key {path} is passphrase-protected and there is no terminal to ask"
                f" (add it to ssh-agent: ssh-add {path})"
            )
            return []
        try:
            return asyncssh.load_keypairs([str(path)], passphrase=passphrase)
        except asyncssh.KeyEncryptionError as exc:
            notes.append(f"cannot decrypt {path}: {exc} (pip install bcrypt)")
            return []
        except asyncssh.KeyImportError:
            continue
        finally:
            del passphrase
    notes.append(f"wrong passphrase for {path}")
    return []


def _first(*values: T | None) -> T:
    """The first value that is not ``None`` (the caller's, then ssh_config's, then ours)."""
    return next(v for v in values if v is not None)


def _connect_kwargs(
    params: HostParams,
    opts: SSHOptions,
    tunnel: asyncssh.SSHClientConnection | None,
    known_hosts: Any,
    client_keys: list[Any],
    held: list[bytes] = (),  # type: ignore[assignment]
) -> tuple[dict, float]:
    """asyncssh.connect's arguments for one hop, and its connect timeout."""
    keepalive = _first(
        opts.keepalive_interval, params.server_alive_interval, DEFAULT_KEEPALIVE_INTERVAL_S
    )
    count_max = _first(
        opts.keepalive_count_max, params.server_alive_count_max, DEFAULT_KEEPALIVE_COUNT_MAX
    )
    # ssh_config's ConnectTimeout 0 means "the system's": ours then
    timeout = _first(
        opts.connect_timeout, params.connect_timeout or None, DEFAULT_CONNECT_TIMEOUT_S
    )
    kwargs: dict = dict(
        host=params.hostname,
        port=params.port,
        # no jump host: a direct TCP connection whose packets go out one write per turn
        tunnel=tunnel or DirectConnector(),
        username=params.user,
        config=[],
        known_hosts=known_hosts,
        client_keys=client_keys or (),
        ignore_encrypted=True,
        passphrase=None,
        preferred_auth="publickey",
        encryption_algs=ENCRYPTION_ALGS,
        compression_algs=None,
        window=CHANNEL_WINDOW,
        max_pktsize=CHANNEL_MAX_PACKET,
        keepalive_interval=keepalive,
        keepalive_count_max=count_max,
        connect_timeout=timeout,
        login_timeout=timeout,
    )
    if params.identities_only and (client_keys or held):
        # the agent offers only the named keys, those it holds among them too (asyncssh
        # offers the agent's keys first: unrestricted, a user with many keys there hits
        # sshd's MaxAuthTries before the named one, which is what the hint says to set)
        kwargs["agent_identities"] = [k.public_data for k in client_keys] + list(held)
    return kwargs, timeout


async def _connect_hop(
    params: HostParams,
    opts: SSHOptions,
    home_dir: Path,
    tunnel: asyncssh.SSHClientConnection | None,
    *,
    probe: bool = False,
) -> asyncssh.SSHClientConnection:
    policy = HostKeyPolicy(home_dir, params.known_hosts_files)
    known_hosts, check = policy.for_connection(params.key_name)
    if probe:
        check.pinned = []

        def known_hosts(_h: str, _a: str, _p: int | None) -> tuple:  # noqa: F811
            return [], [], []

    held: list[bytes] = []
    client_keys, notes = (
        ([], []) if probe else load_client_keys(params, opts.passphrase_prompt, held)
    )
    kwargs, timeout = _connect_kwargs(params, opts, tunnel, known_hosts, client_keys, held)
    where = params.display
    clients: list[VerifyingClient] = []

    def make_client() -> VerifyingClient:
        clients.append(LoginClient(check))
        return clients[-1]

    kwargs["client_factory"] = make_client
    try:
        conn = await asyncssh.connect(**kwargs)
        drop_cbc_ignores(conn)  # half the packets of a push (see ignorepackets.py)
        send_data_directly(conn)  # fewer copies per data packet (see fastdata.py)
        receive_data_directly(conn)
        _CLIENTS[conn] = clients[-1]
        return conn
    except asyncssh.HostKeyNotVerifiable as exc:
        if check.offered is None and "revoked" in str(exc).lower():
            check.revoked = True
        if probe and check.offered is not None:
            raise _Probed(check) from None
        raise policy.verdict(check, params.spec) from None
    except asyncssh.PermissionDenied:
        extra = "; ".join(notes)
        raise AuthError(
            f"authentication failed for {where}" + (f" ({extra})" if extra else ""),
            hint="check -i/IdentityFile, ssh-add -l, and authorized_keys on the host",
        ) from None
    except socket.gaierror as exc:
        raise DNSError(
            f"cannot resolve host name {params.hostname!r} ({exc.strerror})",
            hint="check the host name or your network/DNS",
        ) from None
    except ConnectionRefusedError:
        raise ConnectRefused(
            f"connection refused by {where}", hint="is sshd running there and the port right?"
        ) from None
    except (asyncio.TimeoutError, TimeoutError):
        raise ConnectTimeout(
            f"timed out after {timeout:g} s connecting to {where}",
            hint="is the host up and reachable from here?",
        ) from None
    except asyncssh.ChannelOpenError as exc:
        # ProxyJump: the jump host could not reach the next hop
        raise TransientHostError(
            f"cannot reach {where} through the jump host: {exc.reason}",
            hint="check ProxyJump and the HostName/Port behind it",
        ) from None
    except asyncssh.DisconnectError as exc:
        if TOO_MANY_AUTH_TRIES in exc.reason.lower():
            # every key offered before the right one counts: a retry offers the same
            # keys in the same order and is refused the same way (was a transient
            # error, so a reconnect kept trying until its deadline)
            raise AuthError(
                f"authentication failed for {where}: it ended the login after too many "
                "keys were offered (its sshd's MaxAuthTries; ssh-agent keys go first)",
                hint="offer only this host's key: IdentityFile KEY and IdentitiesOnly yes "
                "in its Host block of the ssh config",
            ) from None
        raise TransientHostError(
            f"{where} closed the connection: {exc.reason}",
            hint="retry; check the host's sshd logs if it persists",
        ) from None
    except OSError as exc:
        reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
        raise TransientHostError(
            f"cannot connect to {where}: {reason}", hint="check the network and the host"
        ) from None


class LoginClient(VerifyingClient):
    """The host-key check of VerifyingClient, and a login three round trips shorter
    (fastlogin.py), set on the connection before its login starts."""

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        fast_login(conn)


class _Probed(Exception):
    def __init__(self, check: KeyCheck) -> None:
        super().__init__("probed")
        self.check = check


_QUIETED_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def _is_lost_sftp_task(context: dict) -> bool:
    task = context.get("future") or context.get("task")
    coro = getattr(task, "get_coro", lambda: None)()
    return isinstance(
        context.get("exception"), (asyncssh.DisconnectError, ConnectionError)
    ) and "_SFTPParallelIO" in getattr(coro, "__qualname__", "")


def quiet_lost_sftp_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Drop asyncio's "Task exception was never retrieved" for asyncssh's SFTP workers.

    When the link dies mid-transfer, asyncssh's parallel put/get raises the first
    worker's ConnectionLost and leaves the others' unread; asyncio then logs each one,
    with a traceback, when the task is garbage collected. The transport has already
    reported the loss and retried, so those lines are noise on the user's terminal
    (and, on CPython 3.11.7, formatting them inside a running ``ast.parse`` corrupts
    the parser's recursion bookkeeping). Every other context goes to the handler that
    was there before.
    """
    if loop in _QUIETED_LOOPS:
        return
    previous = loop.get_exception_handler()

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if _is_lost_sftp_task(context):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    _QUIETED_LOOPS.add(loop)


async def open_connection(
    params: HostParams, opts: SSHOptions, home_dir: Path
) -> tuple[asyncssh.SSHClientConnection, list[asyncssh.SSHClientConnection]]:
    """Connect through every ProxyJump hop, strictly; return (final, jump connections)."""
    quiet_lost_sftp_tasks(asyncio.get_running_loop())
    jumps: list[asyncssh.SSHClientConnection] = []
    tunnel = None
    try:
        for jump_spec in params.proxy_jump:
            jump = resolve(jump_spec, ssh_config=opts.ssh_config)
            tunnel = await _connect_hop(jump, opts, home_dir, tunnel)
            jumps.append(tunnel)
        conn = await _connect_hop(params, opts, home_dir, tunnel)
    except BaseException:
        for jump_conn in reversed(jumps):
            jump_conn.close()
        raise
    return conn, jumps


async def probe_host_key(
    host_spec: str,
    *,
    home_dir: Path,
    ssh_config: Path | None = None,
    identity: Path | None = None,
    timeout: float = 15.0,
) -> asyncssh.SSHKey:
    """The key ``host_spec`` offers, learned from a key exchange that trusts nothing."""
    params = resolve(host_spec, ssh_config=ssh_config, identity=identity)
    opts = SSHOptions(ssh_config=ssh_config, identity=identity, connect_timeout=timeout)
    jumps: list[asyncssh.SSHClientConnection] = []
    tunnel = None
    try:
        for jump_spec in params.proxy_jump:
            tunnel = await _connect_hop(
                resolve(jump_spec, ssh_config=ssh_config), opts, home_dir, tunnel
            )
            jumps.append(tunnel)
        conn = await _connect_hop(params, opts, home_dir, tunnel, probe=True)
        conn.close()  # pragma: no cover - the probe never authenticates
        raise HostKeyError(f"{params.key_name} offered no host key", hint="retry")
    except _Probed as probed:
        assert probed.check.offered is not None
        return probed.check.offered
    finally:
        for jump_conn in reversed(jumps):
            jump_conn.close()
