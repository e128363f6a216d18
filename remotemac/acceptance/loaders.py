"""Load one output file into a flat ``key path -> leaf`` map, whatever its format.

Checkpoints nest: ``{"model": state_dict, "optimizer": {"state": {0: {...}},
"param_groups": [...]}, "iter_num": 500, "config": {"out_dir": ..., "device": ...}}``.
Every leaf gets a key path (``model.transformer.h.0.attn.weight``,
``optimizer.param_groups[0].lr``, ``config.out_dir``) that compare rules select with
``keys:``/``ignore:`` globs, and a kind the comparison needs: an array (tensor, numpy
array, list of numbers), a number, or metadata (a string, a device, None, a bool).

numpy is required; torch is imported only when a ``.pt``/``.pth`` file is loaded
(``weights_only=True``: a file from a rented host must not run code here), so the
orchestrator starts without torch. ``.safetensors`` is read here directly (an 8-byte
header length, a JSON header, raw little-endian buffers): no extra dependency.
"""

from __future__ import annotations

import csv
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from remotemac.termsafe import escape_controls

SUPPORTED_SUFFIXES = (
    ".pt",
    ".pth",
    ".pth.tar",
    ".tar",
    ".ckpt",
    ".safetensors",
    ".npy",
    ".npz",
    ".json",
    ".csv",
)
#: torch.save writes the same zip archive whatever the name: ``last.pth.tar`` (the
#: ImageNet example, timm), ``.ckpt`` (Lightning) read like ``.pt``
TORCH_SUFFIXES = (".pt", ".pth", ".tar", ".ckpt")
#: modules a ``safe_globals`` name may come from without running a project's code here
SAFE_GLOBAL_MODULES = ("torch", "numpy", "collections")
ROOT_KEY = "(root)"  # a bare tensor/array; not "<…>", which Markdown would eat
#: a header larger than this is not a real safetensors file (the format caps it at 100 MB)
SAFETENSORS_MAX_HEADER = 100 * 1024 * 1024


@dataclass
class Leaf:
    """A compared value: a numeric array (with its dtype name) or any other value.

    ``other`` holds a non-numeric leaf (str, None, bool, a device's name); those are
    metadata unless the rule is strict. ``dtype == "csv"`` marks a CSV column (its
    cells in ``other``).
    """

    array: np.ndarray | None
    dtype: str | None
    other: Any = None

    @property
    def is_metadata(self) -> bool:
        return self.array is None and self.dtype != "csv"


class LoadError(Exception):
    """A file could not be read into leaves; the message becomes the file's detail.

    ``cause`` names what stopped the safe loader when it was a class it does not allow
    (``model.RNNModel``): a whole-model pickle, or a class the rule may allow.
    """

    def __init__(self, message: str, cause: str | None = None) -> None:
        super().__init__(message)
        self.cause = cause


_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def load_error_line(exc: BaseException) -> tuple[str, str | None]:
    """(one readable line for a torch.load failure, the global that stopped it).

    torch's weights_only message is a paragraph with ANSI bold in its first line and
    the cause (``Unsupported global: GLOBAL model.RNNModel …``) four lines down: the
    cause is the line, and no control byte survives.
    """
    text = escape_controls(str(exc)).replace("\\x1b[1m", "").replace("\\x1b[0m", "")
    found = _UNSUPPORTED_GLOBAL.search(str(exc))
    if found:
        name = found.group(1)
        return f"the safe loader does not allow {name} (Unsupported global)", name
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__), None


def resolve_safe_globals(names: tuple[str, ...] | list[str]) -> list[Any]:
    """The classes a rule's ``safe_globals`` names, for torch's safe loader.

    Only from the standard library, torch or numpy: resolving ``model.RNNModel`` here
    would import (run) the project's code on the laptop, which the safe loader exists
    to avoid. Raises LoadError naming the first name that cannot be allowed.
    """
    import importlib
    import sys

    out = []
    for name in names:
        module, _, attr = name.rpartition(".")
        top = module.split(".")[0]
        stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
        if not module or not (top in stdlib or top in SAFE_GLOBAL_MODULES):
            raise LoadError(
                f"safe_globals: {name} is not from the standard library, torch or numpy; "
                "allowing it would run the project's code here (the host converts "
                "whole-model pickles into tensors instead)"
            )
        try:
            obj = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as exc:
            raise LoadError(f"safe_globals: cannot find {name}: {exc}") from exc
        out.append(obj)
    return out


def _torch_dtype_name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def _tensor_leaf(tensor: Any) -> Leaf:
    import torch

    name = _torch_dtype_name(tensor.dtype)
    t = tensor.detach().cpu()
    if t.is_sparse:
        t = t.to_dense()
    if not _numpy_can_hold(t.dtype):  # bfloat16, float8, complex32 …
        t = t.to(torch.float32) if not t.is_complex() else t.to(torch.complex64)
    return Leaf(t.numpy(), name)


def _numpy_can_hold(dtype: Any) -> bool:
    import torch

    return dtype in (
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    )


def _is_torch(value: Any, name: str) -> bool:
    """``isinstance(value, torch.<name>)`` without importing torch for non-torch values."""
    if not type(value).__module__.startswith("torch"):
        return False
    import torch

    return isinstance(value, getattr(torch, name))


def _numeric_list(value: list[Any]) -> np.ndarray | None:
    """A rectangular list of plain numbers as an array, else None."""

    def plain(v: Any) -> bool:
        if isinstance(v, list):
            return all(plain(x) for x in v)
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if not value or not plain(value):
        return None
    try:
        arr = np.array(value, dtype=np.float64)
    except ValueError:  # ragged
        return None
    return arr


def _join(prefix: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    return f"{prefix}.{key}" if prefix else str(key)


def flatten(value: Any, prefix: str = "", *, numbers: str = "float") -> Iterator[tuple[str, Leaf]]:
    """Yield ``(key path, leaf)`` for every leaf of nested dicts/lists/tuples.

    ``numbers`` names the dtype of plain Python numbers: ``number`` for JSON/CSV (no
    int/float distinction is meaningful there), ``float``/``int`` for pickled values.
    Dict keys that are ints (an optimizer's ``state``) join with a dot like names.
    """
    if isinstance(value, dict):
        for k, v in value.items():
            yield from flatten(v, _join(prefix, str(k)), numbers=numbers)
        return
    if isinstance(value, (list, tuple)):
        arr = _numeric_list(list(value)) if isinstance(value, list) else None
        if arr is not None:
            yield prefix or ROOT_KEY, Leaf(arr, "number" if numbers == "number" else "float64")
            return
        for i, v in enumerate(value):
            yield from flatten(v, _join(prefix, i), numbers=numbers)
        return
    key = prefix or ROOT_KEY
    if isinstance(value, np.ndarray):
        yield key, Leaf(value, str(value.dtype))
    elif _is_torch(value, "Tensor"):
        yield key, _tensor_leaf(value)
    elif type(value).__module__ == "argparse" and type(value).__name__ == "Namespace":
        # a trainer's saved ``args``: its fields, each compared (or metadata) on its own
        yield from flatten(dict(vars(value)), prefix, numbers=numbers)
    elif _is_torch(value, "device"):
        yield key, Leaf(None, None, str(value))
    elif isinstance(value, bool) or value is None or isinstance(value, str):
        yield key, Leaf(None, None, value)
    elif isinstance(value, (int, float, np.number)):
        if numbers == "number":
            dtype = "number"
        else:
            dtype = "int" if isinstance(value, (int, np.integer)) else "float"
        yield key, Leaf(np.asarray(value, dtype=np.float64), dtype)
    else:
        yield key, Leaf(None, None, value)


def _load_pt(path: Path, safe_globals: tuple[str, ...] | list[str] = ()) -> dict[str, Leaf]:
    try:
        import torch
    except ImportError as exc:
        raise LoadError(
            f"torch is not installed here, cannot load {path.suffix} (pip install torch)"
        ) from exc
    allowed = resolve_safe_globals(safe_globals) if safe_globals else []
    try:
        if allowed:
            # the context, not add_safe_globals: allowed for this file only
            with torch.serialization.safe_globals(allowed):
                obj = torch.load(path, weights_only=True, map_location="cpu")
        else:
            obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any load failure is the file's detail
        line, cause = load_error_line(exc)
        raise LoadError(f"cannot load with torch.load(weights_only=True): {line}", cause) from exc
    return dict(flatten(obj, numbers="float"))


# safetensors dtype -> (numpy dtype, name as torch prints it); BF16 and F8 are widened
_ST_DTYPES: dict[str, tuple[str, str]] = {
    "F64": ("<f8", "float64"),
    "F32": ("<f4", "float32"),
    "F16": ("<f2", "float16"),
    "I64": ("<i8", "int64"),
    "I32": ("<i4", "int32"),
    "I16": ("<i2", "int16"),
    "I8": ("i1", "int8"),
    "U8": ("u1", "uint8"),
    "U16": ("<u2", "uint16"),
    "U32": ("<u4", "uint32"),
    "U64": ("<u8", "uint64"),
    "BOOL": ("?", "bool"),
    "BF16": ("<u2", "bfloat16"),
}


def read_safetensors(path: Path) -> tuple[dict[str, Leaf], dict[str, str]]:
    """(tensors, ``__metadata__``) of a .safetensors file, checked against its size.

    Format: u64 little-endian header size N, N bytes of JSON ``{name: {dtype, shape,
    data_offsets: [begin, end]}, "__metadata__": {str: str}}``, then the buffers
    (offsets relative to the end of the header).
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LoadError(f"cannot read .safetensors: {exc}") from exc
    if len(data) < 8:
        raise LoadError("not a .safetensors file (shorter than its 8-byte header size)")
    (size,) = struct.unpack("<Q", data[:8])
    if size > SAFETENSORS_MAX_HEADER or 8 + size > len(data):
        raise LoadError(f"not a .safetensors file (header size {size} for {len(data)} bytes)")
    try:
        header = json.loads(data[8 : 8 + size].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise LoadError(f"cannot parse the .safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise LoadError("the .safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + size :]
    out: dict[str, Leaf] = {}
    for name, info in header.items():
        try:
            np_dtype, label = _ST_DTYPES[info["dtype"]]
            shape = [int(s) for s in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise LoadError(f"tensor {name!r}: unsupported or malformed entry ({exc})") from exc
        count = int(np.prod(shape)) if shape else 1
        if not 0 <= begin <= end <= len(body) or end - begin != count * np.dtype(np_dtype).itemsize:
            raise LoadError(
                f"tensor {name!r}: offsets {begin}..{end} do not fit its "
                f"{info['dtype']} shape {shape} in {len(body)} bytes"
            )
        arr = np.frombuffer(body[begin:end], dtype=np_dtype).reshape(shape)
        if label == "bfloat16":  # the upper half of a float32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = Leaf(np.array(arr), label)
    return out, {str(k): str(v) for k, v in dict(meta).items()}


def _load_safetensors(path: Path) -> dict[str, Leaf]:
    tensors, meta = read_safetensors(path)
    for key, value in meta.items():
        tensors[f"__metadata__.{key}"] = Leaf(None, None, value)
    return tensors


def _load_npy(path: Path) -> dict[str, Leaf]:
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"cannot load .npy: {exc}") from exc
    return {ROOT_KEY: Leaf(arr, str(arr.dtype))}


def _load_npz(path: Path) -> dict[str, Leaf]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: Leaf(npz[name], str(npz[name].dtype)) for name in npz.files}
    except Exception as exc:  # noqa: BLE001
        raise LoadError(f"cannot load .npz: {exc}") from exc


def _load_json(path: Path) -> dict[str, Leaf]:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LoadError(f"cannot parse JSON: {exc}") from exc
    return dict(flatten(obj, numbers="number"))


def as_number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _load_csv(path: Path) -> dict[str, Leaf]:
    """One leaf per column: numbers where both sides are numeric, text compared equal.

    A first row with no numeric cell is the header and names the columns.
    """
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            rows = [row for row in csv.reader(fh)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise LoadError(f"cannot read CSV: {exc}") from exc
    if not rows:
        return {}
    header: list[str] | None = None
    if all(as_number(c) is None for c in rows[0]):
        header, rows = rows[0], rows[1:]
    width = max([len(r) for r in rows] + [len(header or [])])
    out: dict[str, Leaf] = {}
    for j in range(width):
        name = header[j] if header and j < len(header) and header[j] else f"col{j}"
        cells = [r[j] if j < len(r) else "" for r in rows]
        out[name] = Leaf(None, "csv", cells)
    return out


LOADERS = {
    ".pt": _load_pt,
    ".pth": _load_pt,
    ".tar": _load_pt,
    ".ckpt": _load_pt,
    ".safetensors": _load_safetensors,
    ".npy": _load_npy,
    ".npz": _load_npz,
    ".json": _load_json,
    ".csv": _load_csv,
}


def load_leaves(path: Path, safe_globals: tuple[str, ...] | list[str] = ()) -> dict[str, Leaf]:
    """All leaves of one output file, keyed by their path inside it.

    ``safe_globals``: classes the rule allows torch's safe loader (``.pt`` and its kin).
    """
    loader = LOADERS.get(path.suffix.lower())
    if loader is None:
        raise LoadError(
            f"unsupported file type '{escape_controls(path.suffix)}' "
            f"(supported: {' '.join(SUPPORTED_SUFFIXES)})"
        )
    if loader is _load_pt:
        return _load_pt(path, safe_globals)
    return loader(path)


def leaf_shape(leaf: Leaf) -> list[int] | None:
    if leaf.array is not None:
        return [int(s) for s in leaf.array.shape]
    if leaf.dtype == "csv":
        return [len(leaf.other)]
    return None
