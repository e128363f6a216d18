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

Usage: ``python ckptconvert.py`` with a JSON request on stdin
(``{"dir": OUTPUT_DIR, "patterns": [GLOB, ...]}``); prints one JSON line.
Standard library plus the workload's torch; Python 3.9.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:  # for the annotations only: this file also runs on its own
    from .protocol import JsonObject

CONVERTED_DIR = ".remotemac-converted"
MANIFEST = "manifest.json"
TORCH_SUFFIXES = (".pt", ".pth", ".tar", ".ckpt")


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
