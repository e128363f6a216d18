"""Turn a host spec into concrete connection parameters, the way ``ssh`` would.

A spec is an ssh_config alias or ``[user@]host[:port]``. Values given in the spec
win over the config file (as on ssh's command line); ``--ssh-config`` replaces
``~/.ssh/config`` (like ``ssh -F``). We resolve everything here, once, so that
connecting (including each ProxyJump hop) never lets asyncssh read config on
its own and so never bypasses remotemac's host key checks.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from pathlib import Path

from asyncssh.config import SSHClientConfig

from remotemac.errors import BadInput
from remotemac.hostspec import split_spec

DEFAULT_PORT = 22
DEFAULT_IDENTITIES = ("id_ed25519", "id_ecdsa", "id_ecdsa_sk", "id_ed25519_sk", "id_rsa")


@dataclass(frozen=True)
class HostParams:
    """Everything needed to open one SSH connection (one hop)."""

    spec: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[Path, ...] = ()
    identities_only: bool = False
    proxy_jump: tuple[str, ...] = ()
    server_alive_interval: int | None = None
    server_alive_count_max: int | None = None
    connect_timeout: int | None = None
    known_hosts_files: tuple[Path, ...] = ()
    host_key_alias: str | None = None
    config_paths: tuple[Path, ...] = ()

    @property
    def display(self) -> str:
        """``user@host:port`` for messages and the journal."""
        return f"{self.user}@{self.hostname}:{self.port}"

    @property
    def key_name(self) -> str:
        """The name host keys are looked up and pinned under (known_hosts form)."""
        if self.host_key_alias:
            return self.host_key_alias
        host = self.hostname
        return host if self.port == DEFAULT_PORT else f"[{host}]:{self.port}"


def parse_spec(spec: str) -> tuple[str | None, str, int | None]:
    """Split ``[user@]host[:port]`` (IPv6 in brackets); raise BadInput otherwise."""
    try:
        return split_spec(spec)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def config_paths(ssh_config: Path | None) -> tuple[Path, ...]:
    """``--ssh-config`` if given, else ``~/.ssh/config`` when it exists."""
    if ssh_config is not None:
        if not Path(ssh_config).is_file():
            raise BadInput(f"ssh config {ssh_config} not found", hint="check --ssh-config")
        return (Path(ssh_config),)
    default = Path("~/.ssh/config").expanduser()
    return (default,) if default.is_file() else ()


def resolve(
    spec: str, *, ssh_config: Path | None = None, identity: Path | None = None
) -> HostParams:
    """Resolve a spec through the ssh config into :class:`HostParams`."""
    user, host, port = parse_spec(spec)
    paths = config_paths(ssh_config)
    local_user = getpass.getuser()
    try:
        cfg = SSHClientConfig.load(
            None,
            list(paths),
            False,
            False,
            False,
            local_user,
            user if user else (),
            host,
            port if port else (),
        )
    except Exception as exc:  # asyncssh.ConfigParseError and OSError
        raise BadInput(
            f"cannot read ssh config: {exc}", hint="fix the file or pass --ssh-config"
        ) from None

    identities: list[Path] = []
    if identity is not None:
        identities.append(Path(identity).expanduser())
    for item in cfg.get("IdentityFile", ()) or ():
        path = Path(str(item)).expanduser()
        if path not in identities:
            identities.append(path)
    jump = str(cfg.get("ProxyJump") or "")
    jumps = () if jump.lower() in ("", "none") else tuple(j.strip() for j in jump.split(","))
    kh_files = cfg.get("UserKnownHostsFile")
    known: tuple[Path, ...]
    if kh_files:
        known = tuple(Path(str(p)).expanduser() for p in kh_files if str(p).lower() != "none")
    else:
        known = (Path("~/.ssh/known_hosts").expanduser(), Path("~/.ssh/known_hosts2").expanduser())
    return HostParams(
        spec=spec,
        hostname=str(cfg.get("Hostname") or host),
        port=int(cfg.get("Port") or DEFAULT_PORT),
        user=str(cfg.get("User") or local_user),
        identity_files=tuple(identities),
        identities_only=bool(cfg.get("IdentitiesOnly", False)),
        proxy_jump=jumps,
        server_alive_interval=_opt_int(cfg.get("ServerAliveInterval")),
        server_alive_count_max=_opt_int(cfg.get("ServerAliveCountMax")),
        connect_timeout=_opt_int(cfg.get("ConnectTimeout")),
        known_hosts_files=known,
        host_key_alias=_opt_str(cfg.get("HostKeyAlias")),
        config_paths=paths,
    )


def default_identities() -> list[Path]:
    """The key files ``ssh`` tries when none is configured."""
    ssh_dir = Path("~/.ssh").expanduser()
    return [ssh_dir / name for name in DEFAULT_IDENTITIES if (ssh_dir / name).is_file()]


def _opt_int(value: object) -> int | None:
    return None if value in (None, "") else int(value)  # type: ignore[arg-type]


def _opt_str(value: object) -> str | None:
    return None if value in (None, "") else str(value)
