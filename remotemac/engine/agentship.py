"""The agent's sources, and the two ways they reach a host.

The agent (``remotemac/agent/*.py``) runs on the host under its own ``python3``.
It gets there in one of two ways, both built here and nowhere else:

* **Uploaded** (:func:`agent_bundle`): every file, keyed by a content hash, into
  ``<remote_root>/agent/<hash>/`` (engine/agentclient.py). Runs use it: the
  resident agent, the one-shot ``hostagent OP`` and the sync receiver start from
  there, each by the one boot of agent/shared.py (:func:`agent_argv`), which loads
  that directory as the package ``rmagent``.
* **In memory** (:func:`exec_in_memory`): a few modules' sources travel on stdin
  to ``python3 -c BOOTSTRAP``, which loads them as modules and calls one function.
  Nothing lands on the host's disk, which is what cleanup (it must not recreate
  the root it removes, nor leave a copy) and doctor (it must leave nothing behind)
  need, and how the root is claimed before anything is written below it.

The request is JSON on stdin, zlib-compressed (it may hold paths and run ids, never anything for
argv); the answer is one JSON line ``{"ok": true, "result": ...}`` or
``{"ok": false, "error": "Type: message"}`` with exit status 1, so a caller
reads both the same way. :data:`IN_MEMORY_ORDER` says which modules can travel
this way and in which order they load; scripts/check_agent_imports.py fails CI
when a module gains a sibling import the order does not satisfy.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from remotemac.agent import shared
from remotemac.agent.protocol import JsonObject
from remotemac.transport.base import ExecResult, RemoteProcess, Transport

AGENT_SRC = Path(__file__).resolve().parent.parent / "agent"

#: The modules the in-memory bootstrap loads, in load order: each after every sibling it
#: imports when it loads. A call into module M ships the prefix of this tuple up to M,
#: which must also hold every sibling M's prefix imports inside a function (they resolve
#: through ``sys.modules`` when called). Checked by scripts/check_agent_imports.py.
IN_MEMORY_ORDER: tuple[str, ...] = (
    "hostfacts",  # doctor: facts; imports no sibling, so it travels alone
    "protocol",  # the op names, job states and codes both sides share; imports no sibling
    "procid",
    "agentutil",  # (safefs imports it inside a function)
    "safefs",
    "rootclaim",  # claiming the root at every run's start: six modules (80 KB), not 16 (240)
    "shared",  # what both sides compute the same way, the boot line; imports no sibling
    "pythons",  # doctor: which Python the workload gets; imports only shared
    "proctree",  # wipeops: the process table, for a job's daemons in a new session
    "ramstore",
    "specscrub",
    "envfreeze",
    "guards",
    "hostagent",
    "deadman",
    "wipeops",
    "cleanupops",  # cleanup, and claiming the root
    "agentruntime",  # doctor: the agent runtime's status (its install path imports hostagent)
)
#: the modules callers enter through (each one's prefix of IN_MEMORY_ORDER is closed)
IN_MEMORY_ENTRIES: tuple[str, ...] = (
    "rootclaim",
    "hostfacts",
    "pythons",
    "cleanupops",
    "agentruntime",
)

#: Python 3.9, standard library only; the request and the sources come on stdin. The
#: modules load as the package ``rmagent`` (as agent/shared.py's boot makes the uploaded
#: copy): their relative imports find the siblings loaded before them.
_LOAD_AND_CALL = (
    "try:\n"
    " P='rmagent';p=types.ModuleType(P);p.__path__=[];sys.modules[P]=p\n"
    " for n,s in d['modules']:\n"
    "  m=types.ModuleType(P+'.'+n);m.__file__='<remotemac-agent>/'+n+'.py';m.__package__=P\n"
    "  sys.modules[P+'.'+n]=m;setattr(p,n,m)\n"
    "  exec(compile(s,'remotemac-agent/'+n+'.py','exec'),m.__dict__)\n"
    " r=getattr(sys.modules[P+'.'+d['module']],d['fn'])(d['req'])\n"
    " sys.stdout.write(json.dumps({'ok':True,'result':r})+'\\n')\n"
    "except Exception as e:\n"
    " sys.stdout.write(json.dumps({'ok':False,'error':'%s: %s'%(type(e).__name__,e)})+'\\n')\n"
    " sys.exit(1)\n"
)
BOOTSTRAP = (
    "import json,sys,types,zlib\n"
    "d=json.loads(zlib.decompress(sys.stdin.buffer.read()))\n" + _LOAD_AND_CALL
)
#: The claim that goes on as the resident agent (issue 36): the payload comes framed
#: (4-byte length, read with ``os.read``, never a byte past it: what follows on stdin
#: is the resident agent's first request), the answer line is flushed, and when the
#: root is claimed as asked (its real path the one given) with this agent installed
#: below it, the process becomes ``then`` (the resident agent's argv, exactly as the
#: laptop would start it) on the same channel: no second exec channel (two round
#: trips) and no second wait for the laptop.
BOOTSTRAP_THEN = (
    "import json,os,struct,sys,types,zlib\n"
    "def x(n):\n"
    " b=b''\n"
    " while len(b)<n:\n"
    "  c=os.read(0,n-len(b))\n"
    "  if not c:sys.exit(1)\n"
    "  b+=c\n"
    " return b\n"
    "d=json.loads(zlib.decompress(x(struct.unpack('>I',x(4))[0])))\n"
    + _LOAD_AND_CALL
    + "sys.stdout.flush()\n"
    "t=d.get('then')\n"
    "if t and isinstance(r,dict) and r.get('agent_ready') and r.get('real_root')==d['req']['root']:\n"
    " os.execvp(t[0],t)\n"
)


#: the one boot every uploaded agent process starts by (agent/shared.py)
AGENT_BOOT = shared.BOOT


def agent_argv(
    python: str, agent_dir: str, module: str, *args: str, site: bool = False
) -> list[str]:
    """How the laptop starts an uploaded agent module on the host (agent/shared.py)."""
    return shared.agent_argv(python, agent_dir, module, *args, site=site)


def agent_file(module: str) -> Path:
    """Where one agent module lives on this machine (preflight runs optrace.py locally)."""
    path = AGENT_SRC / f"{module}.py"
    if not path.is_file():
        raise ValueError(f"no agent module {module!r} in {AGENT_SRC}")
    return path


@lru_cache(maxsize=1)
def agent_bundle() -> tuple[str, dict[str, bytes]]:
    """(content hash, {file name: bytes}) of the agent's Python files, for upload."""
    files = {p.name: p.read_bytes() for p in sorted(AGENT_SRC.glob("*.py"))}
    digest = hashlib.sha256()
    for name, data in files.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:16], files


def in_memory_modules(module: str) -> list[str]:
    """The modules a call into ``module`` ships: IN_MEMORY_ORDER up to and with it."""
    if module not in IN_MEMORY_ENTRIES:
        raise ValueError(f"{module} is not an in-memory entry ({', '.join(IN_MEMORY_ENTRIES)})")
    return list(IN_MEMORY_ORDER[: IN_MEMORY_ORDER.index(module) + 1])


async def open_in_memory_then(
    transport: Transport, python: str, module: str, fn: str, req: JsonObject, then: list[str]
) -> RemoteProcess:
    """Start ``module.fn(req)`` from memory on a channel that, when the answer allows,
    goes on as ``then`` (BOOTSTRAP_THEN); the caller reads the answer line. Never re-run
    (a dropped link raises TransientHostError: the caller claims the ordinary way)."""
    proc = await transport.open_process([python, "-S", "-c", BOOTSTRAP_THEN])
    try:
        body = zlib.compress(
            json.dumps({**json.loads(payload_json(module, fn, req)), "then": then}).encode(),
            6,
        )
        await proc.write(struct.pack(">I", len(body)) + body)
    except BaseException:
        await proc.close()
        raise
    return proc


def in_memory_payload(module: str, fn: str, req: JsonObject) -> bytes:
    """What the bootstrap reads on stdin: the sources in load order, the call, the
    request, as zlib-compressed JSON (a quarter of the bytes: on a far link the claim
    that starts every run waited for TCP's slow start to carry 80 KB of source)."""
    return zlib.compress(payload_json(module, fn, req), 6)


def payload_json(module: str, fn: str, req: JsonObject) -> bytes:
    """:func:`in_memory_payload` before it is compressed."""
    _, files = agent_bundle()
    return json.dumps(
        {
            "modules": [[m, files[f"{m}.py"].decode("utf-8")] for m in in_memory_modules(module)],
            "module": module,
            "fn": fn,
            "req": req,
        }
    ).encode()


async def exec_in_memory(
    transport: Transport,
    python: str,
    module: str,
    fn: str,
    req: JsonObject,
    *,
    timeout: float | None,
    idempotent: bool = False,
) -> ExecResult:
    """Run ``module.fn(req)`` on the host from memory; :func:`read_answer` reads the result.

    ``idempotent``: the call may run again after the link dropped under it.
    """
    # keyword arguments of Transport.exec, not a message
    kwargs: dict[str, Any] = {"stdin": in_memory_payload(module, fn, req), "timeout": timeout}
    if idempotent:  # only passed when asked: not every transport takes it
        kwargs["idempotent"] = True
    return await transport.exec([python, "-c", BOOTSTRAP], **kwargs)


def read_answer(result: ExecResult) -> JsonObject | None:
    """The bootstrap's answer (its last stdout line), or None when it printed none."""
    lines = result.text().strip().splitlines()
    if not lines:
        return None
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return None
    return answer if isinstance(answer, dict) and "ok" in answer else None
