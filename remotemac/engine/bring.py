"""The laptop's half of bringing a binary thing to the host (agent/bring.py is the other).

One mechanism for everything remotemac brings: a relocatable CPython, uv, and the
agent runtime's wheels (engine/runtime.py uploads those through :func:`upload`).
The way in follows ``agent.runtime_install`` / ``$REMOTEMAC_RUNTIME_INSTALL``
(engine/runtime.py): ``online`` (the host downloads the URL), ``offline`` (this
laptop downloads it once into ``<home>/downloads``, checks its sha256, uploads
it; the host checks it again), ``auto`` (online, then offline).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from remotemac.agent.protocol import BringAnswer, ErrorCode, JsonObject, Op
from remotemac.engine.agentclient import AgentClient, AgentError
from remotemac.errors import HostEnvironmentError, IntegrityError
from remotemac.events import Event, PhaseProgress, Warning

DOWNLOAD_TIMEOUT_S = 60.0
BRING_TIMEOUT_S = 900.0

Emit = Callable[[Event], None]


@dataclass(frozen=True)
class Artifact:
    """One archive with a known sha256 and the directory it becomes on the host."""

    what: str  # python | uv
    name: str  # the directory under <root>/runtime
    url: str
    sha256: str
    format: str  # tar.gz | zip
    label: str  # for people: "CPython 3.11.14 (linux x86_64)"

    @property
    def filename(self) -> str:
        return urllib.parse.unquote(self.url.rsplit("/", 1)[-1]) or self.name


def fetch(home: Path, url: str, sha256: str, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """``url`` (http, https or file) in ``<home>/downloads``, checked; downloaded once."""
    cache = home / "downloads" / sha256[:16]
    dest = cache / (urllib.parse.unquote(url.rsplit("/", 1)[-1]) or "archive")
    if dest.is_file() and _sha256(dest) == sha256:
        return dest
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = dest.with_name(f"{dest.name}.part-{os.getpid()}")
    try:
        if url.startswith("file://"):
            shutil.copyfile(urllib.request.url2pathname(urllib.parse.urlparse(url).path), tmp)
        elif url.startswith(("http://", "https://")):
            with urllib.request.urlopen(url, timeout=timeout) as src, open(tmp, "wb") as out:  # noqa: S310
                shutil.copyfileobj(src, out, 1 << 20)
        else:
            raise OSError(f"not a URL remotemac can fetch: {url}")
        if _sha256(tmp) != sha256:
            raise IntegrityError(
                f"{url}: downloaded to this laptop, but its sha256 differs from the source's",
                hint="the download or the metadata is damaged; run again",
            )
        os.replace(tmp, dest)
    except OSError as exc:
        raise HostEnvironmentError(
            f"this laptop could not download {url}: {exc}",
            hint="check this laptop's network (or set UV_PYTHON_INSTALL_MIRROR)",
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


async def upload(
    agent: AgentClient,
    files: list[tuple[Path, str]],
    remote_dir: str,
    *,
    emit: Emit,
    run_id: str,
    phase: str,
    unit: str,
) -> None:
    """Put each (local file, remote name) into ``remote_dir`` (below ``<root>/runtime``),
    one progress event per file, and say so in the ledger."""
    await agent.transport.makedirs(remote_dir)
    for i, (local, name) in enumerate(files, 1):
        await agent.transport.put(str(local), f"{remote_dir}/{name}")
        emit(
            PhaseProgress(
                run_id, phase=phase, done=i, total=len(files), unit=unit, detail=f"uploaded {name}"
            )
        )
    agent.ledger.append(
        agent.transport.name, f"upload {len(files)} {unit} to {remote_dir}", 0, op=f"upload-{unit}"
    )


async def bring(
    agent: AgentClient,
    art: Artifact,
    *,
    home: Path | None,
    method: str = "auto",
    emit: Emit | None = None,
    run_id: str = "",
    phase: str = "provision",
) -> BringAnswer:
    """Make ``<root>/runtime/<art.name>`` exist on the host; the agent's answer."""
    emit = emit or (lambda _e: None)
    host = agent.transport.name
    request = {
        "root": agent.root,
        "name": art.name,
        "what": art.what,
        "format": art.format,
        "sha256": art.sha256,
    }
    answer = BringAnswer(failed="offline chosen")
    if method != "offline":
        emit(
            PhaseProgress(
                run_id, phase=phase, done=0, total=None, detail=f"{host} fetching {art.label}"
            )
        )
        answer = await _call(agent, dict(request, method="online", url=art.url), art)
    if answer.failed:
        if method == "online" or home is None:
            raise HostEnvironmentError(
                f"{host}: bringing {art.label}: {answer.failed}",
                hint="let the host reach the download site, or set agent.runtime_install: "
                "offline (or REMOTEMAC_RUNTIME_INSTALL=offline) so this laptop brings it",
            )
        if method == "auto":
            emit(
                Warning(
                    run_id,
                    code="bring-offline",
                    message=f"{host} cannot download {art.label} itself ({answer.failed}); "
                    "bringing it from this laptop",
                )
            )
        local = await asyncio.to_thread(fetch, home, art.url, art.sha256)
        remote = f"{agent.root}/runtime/upload-{art.sha256[:12]}-{os.getpid()}"
        await upload(
            agent,
            [(local, art.filename)],
            remote,
            emit=emit,
            run_id=run_id,
            phase=phase,
            unit=art.what,
        )
        answer = await _call(
            agent, dict(request, method="offline", upload=f"{remote}/{art.filename}"), art
        )
    if not answer.reused:
        agent.ledger.append(
            host,
            f"brought {art.label} into {answer.dir} ({answer.method}, "
            f"{answer.bytes / (1 << 20):.0f} MiB, {answer.seconds} s)",
            0,
            op=f"bring-{art.what}",
        )
    return answer


async def _call(agent: AgentClient, request: JsonObject, art: Artifact) -> BringAnswer:
    where = f"{agent.transport.name}: bringing {art.label}"
    try:
        return BringAnswer.from_json(await agent.call(Op.BRING, request, timeout=BRING_TIMEOUT_S))
    except AgentError as exc:
        if exc.code == ErrorCode.INTEGRITY:
            raise IntegrityError(f"{where}: {exc.message}", hint="run again") from None
        raise HostEnvironmentError(f"{where}: {exc.message}") from None
