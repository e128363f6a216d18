"""Compare the target's outputs with the reference's, file by file and tensor by tensor.

This is the evidence behind the "results" observation: for every file a playbook's
``outputs.compare`` names, both sides are loaded into flat ``key -> leaf`` maps
(``state_dict.fc.weight``, ``metrics.loss``, ``history[3].acc``) and each leaf is
checked for shape and dtype agreement and for ``|a - b| <= atol + rtol * |b|``
(``torch.allclose`` semantics, ``b`` the reference). A reviewer needs to see which
file and which tensor failed and by how much, so every leaf is reported.

numpy is required; torch is imported only when a ``.pt``/``.pth`` file is loaded,
so comparing ``.npy``/``.json``/``.csv`` outputs works without torch.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# PyTorch's own MPS tests (test/test_mps.py), see /work/shared/mps-facts.md.
FLOAT32_TOL = (1.3e-6, 1e-5)  # (rtol, atol)
FLOAT16_TOL = (5e-2, 5e-2)
BFLOAT16_TOL = (1e-1, 5e-2)
EXACT_TOL = (0.0, 0.0)

# Denominator floor for the relative error: the smallest normal float32, so that a
# zero reference gives a large but finite relative error.
TINY = float(np.finfo(np.float32).tiny)

SUPPORTED_SUFFIXES = (".pt", ".pth", ".npy", ".npz", ".json", ".csv")
ROOT_KEY = "(root)"  # a bare tensor/array; not "<…>", which Markdown would eat


@dataclass(frozen=True)
class CompareRule:
    """One ``outputs.compare`` entry: a glob relative to the output dir and tolerances.

    ``None`` tolerances mean "PyTorch's MPS test defaults for the leaf's dtype".
    """

    file: str
    rtol: float | None = None
    atol: float | None = None


@dataclass
class TensorResult:
    key: str
    shape: list[int] | None
    dtype: str | None
    max_abs_err: float | None
    max_rel_err: float | None
    ok: bool
    detail: str = ""
    rtol: float | None = None
    atol: float | None = None


@dataclass
class FileResult:
    path: str
    max_abs_err: float | None
    max_rel_err: float | None
    rtol: float | None
    atol: float | None
    ok: bool
    detail: str = ""
    tensors: list[TensorResult] = field(default_factory=list)


@dataclass
class ComparisonResult:
    within_tolerance: bool
    files: list[FileResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The ``observations.results`` object of acceptance.json."""
        return {
            "within_tolerance": self.within_tolerance,
            "files": [asdict(f) for f in self.files],
        }


@dataclass
class Leaf:
    """A compared value: a numeric array (with its dtype name) or any other value."""

    array: np.ndarray | None
    dtype: str | None
    other: Any = None


class LoadError(Exception):
    """A file could not be read into leaves; the message becomes the file's detail."""


def default_tolerance(dtype: str | None) -> tuple[float, float]:
    """(rtol, atol) PyTorch's MPS tests use for ``dtype``; integers and bools are exact."""
    name = (dtype or "float32").lower()
    if name == "float16" or name == "half":
        return FLOAT16_TOL
    if name == "bfloat16":
        return BFLOAT16_TOL
    if name.startswith(("int", "uint", "bool")) or name in ("int", "bool"):
        return EXACT_TOL
    return FLOAT32_TOL


# ---------------------------------------------------------------- loading


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
        torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128,
        torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
    )


def _is_tensor(value: Any) -> bool:
    mod = type(value).__module__
    if not mod.startswith("torch"):
        return False
    import torch

    return isinstance(value, torch.Tensor)


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
    elif _is_tensor(value):
        yield key, _tensor_leaf(value)
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


def _load_pt(path: Path) -> dict[str, Leaf]:
    try:
        import torch
    except ImportError as exc:
        raise LoadError(f"torch is not installed here, cannot load {path.suffix} "
                        "(pip install torch)") from exc
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - any load failure is the file's detail
        raise LoadError(f"cannot load with torch.load(weights_only=True): "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc
    return dict(flatten(obj, numbers="float"))


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


def _as_number(cell: str) -> float | None:
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
    if all(_as_number(c) is None for c in rows[0]):
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
    ".npy": _load_npy,
    ".npz": _load_npz,
    ".json": _load_json,
    ".csv": _load_csv,
}


def load_leaves(path: Path) -> dict[str, Leaf]:
    """All leaves of one output file, keyed by their path inside it."""
    loader = LOADERS.get(path.suffix.lower())
    if loader is None:
        raise LoadError(f"unsupported file type '{path.suffix}' "
                        f"(supported: {' '.join(SUPPORTED_SUFFIXES)})")
    return loader(path)


# ---------------------------------------------------------------- comparing


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _fmt(x: Any) -> str:
    """A number for a detail line: six significant digits, complex kept complex."""
    if np.iscomplexobj(x):
        return f"{complex(x):.6g}"
    return f"{float(x):.6g}"


def compare_arrays(a: np.ndarray, b: np.ndarray, rtol: float, atol: float) -> tuple[
        float, float, bool, str]:
    """Compare target ``a`` with reference ``b`` of equal shape.

    Returns (max_abs_err, max_rel_err, ok, detail). Equal values (including equal
    infinities) count as exact; NaN positions must agree.
    """
    if a.dtype == np.bool_ or b.dtype == np.bool_:
        a = a.astype(np.int8)
        b = b.astype(np.int8)
    kind = np.complex128 if (np.iscomplexobj(a) or np.iscomplexobj(b)) else np.float64
    a = np.asarray(a, dtype=kind)
    b = np.asarray(b, dtype=kind)
    if a.size == 0:
        return 0.0, 0.0, True, ""
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    nan_mismatch = nan_a != nan_b
    with np.errstate(invalid="ignore", over="ignore"):
        equal = (a == b) | (nan_a & nan_b)
        diff = np.where(equal | nan_mismatch, 0.0, np.abs(a - b))
        rel = diff / np.maximum(np.abs(b), TINY)
        bound = atol + rtol * np.abs(b)
        bad = ~equal & ~nan_mismatch & ~(diff <= bound)
    max_abs = float(diff.max())
    max_rel = float(np.where(nan_mismatch | equal, 0.0, rel).max())
    problems = []
    n_nan = int(nan_mismatch.sum())
    if n_nan:
        idx = tuple(int(i) for i in np.argwhere(nan_mismatch)[0])
        problems.append(f"NaN positions differ at {n_nan} of {a.size} elements, "
                        f"first at {list(idx)}")
    n_bad = int(bad.sum())
    if n_bad:
        worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), a.shape)
        at = [int(i) for i in worst]
        problems.append(
            f"{n_bad} of {a.size} elements outside rtol={rtol:g} atol={atol:g}; worst at "
            f"{at}: {_fmt(a[worst])} vs reference {_fmt(b[worst])}")
    if not math.isfinite(max_abs):
        problems.append("infinite error (an infinity where the other side is finite)")
    return max_abs, max_rel, not problems, "; ".join(problems)


def _compare_csv(key: str, tgt: list[str], ref: list[str], rtol: float, atol: float,
                 ) -> TensorResult:
    shape = [len(ref)]
    if len(tgt) != len(ref):
        return TensorResult(key, shape, "csv", None, None, False,
                            f"{len(tgt)} rows vs reference {len(ref)}", rtol, atol)
    num_t, num_r, text_bad = [], [], []
    for i, (ct, cr) in enumerate(zip(tgt, ref, strict=True)):
        xt, xr = _as_number(ct), _as_number(cr)
        if xt is not None and xr is not None:
            num_t.append(xt)
            num_r.append(xr)
        elif ct != cr:
            text_bad.append(f"row {i}: {ct!r} vs reference {cr!r}")
    max_abs = max_rel = 0.0
    ok, detail = True, ""
    if num_r:
        max_abs, max_rel, ok, detail = compare_arrays(
            np.array(num_t), np.array(num_r), rtol, atol)
    if text_bad:
        ok = False
        more = f" (+{len(text_bad) - 1} more)" if len(text_bad) > 1 else ""
        detail = "; ".join(filter(None, [detail, f"text differs at {text_bad[0]}{more}"]))
    return TensorResult(key, shape, "csv", _finite_or_none(max_abs), _finite_or_none(max_rel),
                        ok, detail, rtol, atol)


def compare_leaf(key: str, tgt: Leaf, ref: Leaf, rule: CompareRule) -> TensorResult:
    """One leaf of the target against the same leaf of the reference."""
    d_rtol, d_atol = default_tolerance(ref.dtype)
    rtol = rule.rtol if rule.rtol is not None else d_rtol
    atol = rule.atol if rule.atol is not None else d_atol
    if ref.dtype == "csv" and tgt.dtype == "csv":
        return _compare_csv(key, tgt.other, ref.other, rtol, atol)
    if ref.array is None or tgt.array is None:
        if ref.array is None and tgt.array is None:
            ok = tgt.other == ref.other and type(tgt.other) is type(ref.other)
            detail = "" if ok else f"{tgt.other!r} vs reference {ref.other!r}"
            return TensorResult(key, None, None, None, None, ok, detail)
        what = lambda lf: lf.dtype if lf.array is not None else type(lf.other).__name__  # noqa: E731
        return TensorResult(key, None, ref.dtype, None, None, False,
                            f"{what(tgt)} vs reference {what(ref)}")
    shape = [int(s) for s in ref.array.shape]
    problems = []
    if tgt.dtype != ref.dtype:
        problems.append(f"dtype {tgt.dtype} vs reference {ref.dtype}")
    if tgt.array.shape != ref.array.shape:
        problems.append(f"shape {list(tgt.array.shape)} vs reference {shape}")
        return TensorResult(key, shape, ref.dtype, None, None, False, "; ".join(problems),
                            rtol, atol)
    max_abs, max_rel, ok, detail = compare_arrays(tgt.array, ref.array, rtol, atol)
    if detail:
        problems.append(detail)
    return TensorResult(key, shape, ref.dtype, _finite_or_none(max_abs),
                        _finite_or_none(max_rel), ok and not problems, "; ".join(problems),
                        rtol, atol)


def _max_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def compare_file(rel: str, reference: Path, target: Path, rule: CompareRule) -> FileResult:
    """Compare one output file present on both sides."""
    try:
        ref_leaves = load_leaves(reference)
    except LoadError as exc:
        return FileResult(rel, None, None, rule.rtol, rule.atol, False, f"reference: {exc}")
    try:
        tgt_leaves = load_leaves(target)
    except LoadError as exc:
        return FileResult(rel, None, None, rule.rtol, rule.atol, False, f"target: {exc}")
    tensors: list[TensorResult] = []
    for key, ref in ref_leaves.items():
        tgt = tgt_leaves.get(key)
        if tgt is None:
            tensors.append(TensorResult(key, _shape(ref), ref.dtype, None, None, False,
                                        "missing in target"))
        else:
            tensors.append(compare_leaf(key, tgt, ref, rule))
    for key, tgt in tgt_leaves.items():
        if key not in ref_leaves:
            tensors.append(TensorResult(key, _shape(tgt), tgt.dtype, None, None, False,
                                        "not in reference"))
    bad = [t.key for t in tensors if not t.ok]
    ok = not bad
    if bad:
        shown = ", ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
        detail = f"{len(bad)} of {len(tensors)} values outside tolerance or mismatched: {shown}"
    else:
        detail = ""
    rtols = {t.rtol for t in tensors if t.rtol is not None}
    atols = {t.atol for t in tensors if t.atol is not None}
    return FileResult(
        rel,
        _max_or_none([t.max_abs_err for t in tensors]),
        _max_or_none([t.max_rel_err for t in tensors]),
        rule.rtol if rule.rtol is not None else (max(rtols) if rtols else None),
        rule.atol if rule.atol is not None else (max(atols) if atols else None),
        ok, detail, tensors)


def _shape(leaf: Leaf) -> list[int] | None:
    if leaf.array is not None:
        return [int(s) for s in leaf.array.shape]
    if leaf.dtype == "csv":
        return [len(leaf.other)]
    return None


def _matches(root: Path, pattern: str) -> set[str]:
    """Files under ``root`` matching ``pattern``, as POSIX paths relative to it.

    Links that lead outside ``root`` are ignored: outputs come from the host.
    """
    if not root.is_dir():
        return set()
    real_root = root.resolve()
    found = set()
    for p in root.glob(pattern):
        if p.is_file() and p.resolve().is_relative_to(real_root):
            found.add(p.relative_to(root).as_posix())
    return found


def written_summary(*dirs: Path, limit: int = 8) -> str:
    """What the workload did write (relative paths, both sides), for a rule that matched nothing."""
    names: set[str] = set()
    for base in dirs:
        if base.is_dir():
            names.update(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
    if not names:
        return "nothing (check that it writes under {output_dir})"
    shown = sorted(names)[:limit]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def compare_outputs(reference_dir: Path, target_dir: Path,
                    rules: list[CompareRule]) -> ComparisonResult:
    """Compare every file the rules name; a file on one side only is a failure.

    ``within_tolerance`` is True only when at least one file was compared and every
    file passed: an empty comparison is not evidence.
    """
    reference_dir, target_dir = Path(reference_dir), Path(target_dir)
    files: list[FileResult] = []
    seen: set[str] = set()
    for rule in rules:
        ref_set = _matches(reference_dir, rule.file)
        tgt_set = _matches(target_dir, rule.file)
        if not ref_set and not tgt_set:
            files.append(FileResult(rule.file, None, None, rule.rtol, rule.atol, False,
                                    f"no file matches '{rule.file}' in the reference "
                                    f"({reference_dir}) or the target ({target_dir}) outputs; "
                                    f"the workload wrote: {written_summary(reference_dir, target_dir)}"))
            continue
        for rel in sorted(ref_set | tgt_set):
            if rel in seen:  # the first rule that names a file decides its tolerances
                continue
            seen.add(rel)
            if rel not in tgt_set:
                files.append(FileResult(rel, None, None, rule.rtol, rule.atol, False,
                                        f"missing in target outputs ({target_dir / rel})"))
            elif rel not in ref_set:
                files.append(FileResult(rel, None, None, rule.rtol, rule.atol, False,
                                        f"missing in reference outputs ({reference_dir / rel})"))
            else:
                files.append(compare_file(rel, reference_dir / rel, target_dir / rel, rule))
    within = bool(files) and all(f.ok for f in files)
    return ComparisonResult(within, files)
