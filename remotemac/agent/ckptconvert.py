"""Turn the job's pickled checkpoints into plain tensors, on the host, after the job.

Why on the host: ``torch.save(model)`` (PyTorch's word_language_model example, many
research repos) pickles the model's class, so only ``torch.load(weights_only=False)``
reads it back, and that runs whatever code the pickle names. The laptop never does
that with bytes a rented host sent (the host is not trusted). The host's own job made
the file and already ran the project's code there, so the runner runs this script
under the workload's own interpreter and environment once the job has ended: each
file a compare rule matches that the safe loader refuses is loaded there and written
again as what it holds in tensors (a module as its ``state_dict()``, an
``argparse.Namespace`` as its fields, any other object as its type's name), in a file
``torch.load(weights_only=True)`` reads. The copies go under
``<output dir>/.remotemac-converted/`` with a ``manifest.json`` saying what each was;
the originals are untouched (they are pulled and hashed as they are).

Most checkpoints need nothing of this: a ``state_dict`` (PyTorch's examples/mnist), a
dict of tensors, numbers and strings, an optimizer's state. :func:`reads_safely_as_is`
tells those from the rest by reading the pickle's opcodes with the standard library,
never running them, and the runner starts no interpreter when every file is one (an
interpreter importing torch only to find every file loads as it is cost 2-3 s of a
loaded 2-core host after each side's job: a quarter of a short run).

Usage: ``python ckptconvert.py`` with a JSON request on stdin
(``{"dir": OUTPUT_DIR, "patterns": [GLOB, ...]}``); prints one JSON line.
Standard library plus the workload's torch; Python 3.9.
"""

from __future__ import annotations

import json
import os
import pickletools
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:  # for the annotations only: this file also runs on its own
    from .protocol import JsonObject

CONVERTED_DIR = ".remotemac-converted"
MANIFEST = "manifest.json"
TORCH_SUFFIXES = (".pt", ".pth", ".tar", ".ckpt")

#: The globals of a plain checkpoint, a subset of what torch's safe loader allows by
#: default (torch/_weights_only_unpickler.py's ``_get_allowed_globals``): an ordered
#: dict, tensors and parameters rebuilt from their storages, the storages' types. As
#: ``pickletools`` spells a GLOBAL's argument ("module name").
PLAIN_GLOBALS = frozenset(
    ["collections OrderedDict"]
    + ["torch._utils %s" % f for f in ("_rebuild_tensor_v2", "_rebuild_parameter")]
    + [
        "torch %sStorage" % kind
        for kind in (
            "Float",
            "Double",
            "Half",
            "BFloat16",
            "Long",
            "Int",
            "Short",
            "Char",
            "Byte",
            "Bool",
            "ComplexFloat",
            "ComplexDouble",
        )
    ]
)
#: The opcodes of such a pickle at torch.save's protocol 2, each one the safe loader
#: implements (a subset of its list: no NEWOBJ, no EMPTY_SET).
PLAIN_OPCODES = frozenset(
    [
        "PROTO",
        "STOP",
        "MARK",
        "GLOBAL",
        "REDUCE",
        "BUILD",
        "BINPERSID",
        "EMPTY_DICT",
        "EMPTY_LIST",
        "EMPTY_TUPLE",
        "SETITEM",
        "SETITEMS",
        "APPEND",
        "APPENDS",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG1",
        "BINFLOAT",
        "BINUNICODE",
        "SHORT_BINSTRING",
        "BINGET",
        "LONG_BINGET",
        "BINPUT",
        "LONG_BINPUT",
    ]
)
#: a checkpoint's pickle holds its structure, not its tensors: a larger one is not read here
MAX_PICKLE_BYTES = 64 << 20


def reads_safely_as_is(path: str) -> bool:
    """Does ``torch.load(path, weights_only=True)`` read this file as it is? True only
    when that is sure from the file alone: torch.save's zip archive, its one
    ``data.pkl`` at protocol 2 made only of :data:`PLAIN_OPCODES` and
    :data:`PLAIN_GLOBALS`. The pickle is walked by ``pickletools.genops``, which
    decodes opcodes and runs none; anything else (a legacy or other file, another
    protocol, a class of the project's, ``argparse.Namespace``) is False, and the
    converter decides with torch itself, as before. Why it is enough: the laptop loads
    every pulled file with the safe loader anyway; a file wrongly called plain here is
    refused there and named "not compared", never unpickled beyond it."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            prefixes = {name.split("/", 1)[0] for name in names}
            if len(prefixes) != 1:
                return False
            record = "%s/data.pkl" % prefixes.pop()
            pickles = [name for name in names if name.endswith(".pkl")]
            if pickles != [record]:
                return False
            with archive.open(record) as fh:
                data = fh.read(MAX_PICKLE_BYTES + 1)
        if len(data) > MAX_PICKLE_BYTES:
            return False
        for opcode, arg, _pos in pickletools.genops(data):
            if opcode.name not in PLAIN_OPCODES:
                return False
            if opcode.name == "PROTO" and arg != 2:
                return False
            if opcode.name == "GLOBAL" and arg not in PLAIN_GLOBALS:
                return False
        return True
    except Exception:  # noqa: BLE001 - not a zip, truncated, unreadable: torch decides
        return False


def _plain(value: Any, torch: Any) -> Any:
    """``value`` with every module, namespace and other object made loadable safely."""
    if isinstance(value, torch.nn.Module):
        return {k: v.detach().cpu() for k, v in value.state_dict().items()}
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {
            str(k) if not isinstance(k, (int, str)) else k: _plain(v, torch)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_plain(v, torch) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ == "Namespace":
        return {k: _plain(v, torch) for k, v in vars(value).items()}
    return "%s.%s" % (type(value).__module__, type(value).__qualname__)


def _what(obj: Any, torch: Any) -> str:
    kind = "%s.%s" % (type(obj).__module__, type(obj).__qualname__)
    if isinstance(obj, torch.nn.Module):
        return "whole model %s (torch.save(model)) as its state_dict()" % kind
    return "%s holding objects the safe loader refuses, as tensors and plain values" % kind


def _project_paths(cwd: str) -> List[str]:
    """Where the pickle's classes live: the job's directory and its code folders."""
    paths = [cwd]
    try:
        for entry in sorted(os.listdir(cwd)):
            sub = os.path.join(cwd, entry)
            if os.path.isdir(sub) and any(n.endswith(".py") for n in os.listdir(sub)):
                paths.append(sub)
    except OSError:
        pass
    return paths


def convert(out_dir: str, patterns: List[str]) -> JsonObject:
    import torch  # agent-imports: lazy - the workload's own torch

    root = Path(out_dir)
    files: Dict[str, Dict[str, str]] = {}
    failed: Dict[str, str] = {}
    seen = set()
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            rel = path.relative_to(root).as_posix()
            if rel in seen or rel.split("/")[0] == CONVERTED_DIR or not path.is_file():
                continue
            seen.add(rel)
            if path.is_symlink() or not path.name.lower().endswith(TORCH_SUFFIXES):
                continue
            try:
                torch.load(str(path), weights_only=True, map_location="cpu")
                continue  # the laptop's safe loader reads it as it is
            except Exception:  # noqa: BLE001 - refused: convert it below
                pass
            try:
                obj = torch.load(str(path), weights_only=False, map_location="cpu")
                plain = _plain(obj, torch)
                dest = root / CONVERTED_DIR / (rel + ".pt")
                dest.parent.mkdir(parents=True, exist_ok=True)
                torch.save(plain, str(dest))
                torch.load(str(dest), weights_only=True)  # what the laptop will do
                files[rel] = {"to": rel + ".pt", "what": _what(obj, torch)}
            except Exception as exc:  # noqa: BLE001 - reported, the laptop says not compared
                failed[rel] = "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0][:300])
    if files:
        manifest = root / CONVERTED_DIR / MANIFEST
        manifest.write_text(json.dumps({"files": files}, indent=1, sort_keys=True))
    return {"converted": sorted(files), "failed": failed}


def main() -> int:
    req = json.loads(sys.stdin.read())
    cwd = os.getcwd()
    sys.path[:0] = _project_paths(cwd)
    try:
        result = convert(req["dir"], list(req.get("patterns") or ["**/*"]))
    except Exception as exc:  # noqa: BLE001 - no torch here, or an unreadable dir
        result = {"converted": [], "failed": {}, "error": "%s: %s" % (type(exc).__name__, exc)}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
