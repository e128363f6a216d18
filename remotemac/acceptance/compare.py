"""Compare the target's outputs with the reference's, file by file and key by key.

This is the evidence behind the "results" observation: for every file a playbook's
``outputs.compare`` names, both sides are loaded into flat ``key -> leaf`` maps
(:mod:`remotemac.acceptance.loaders`) and each leaf is checked:

* arrays and tensors for shape, dtype and ``|a - b| <= atol + rtol * |b|``
  (``torch.allclose`` semantics, ``b`` the reference); numbers the same way;
* everything else (strings, None, bools, devices) is *metadata*: a checkpoint stores
  its output directory, a timestamp, the device it ran on, and those differ between
  the reference and the target by design. A metadata difference is reported and
  fails the rule only with ``strict: true``. Device names are normalised first
  (``mps``, ``mps:0``, ``cpu``, ``cuda:1`` are all "a device"), strict or not.

A rule chooses keys with ``keys:`` (globs of key paths, default all) and skips some
with ``ignore:``. The file's result names its first failing key and its worst keys
(largest error relative to the tolerance), so a reviewer sees which tensor failed and
by how much without reading every leaf.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from remotemac.acceptance.loaders import (
    Leaf,
    LoadError,
    as_number,
    leaf_shape,
    load_leaves,
)
from remotemac.acceptance.observations import (
    FileResult,
    MetadataDifference,
    TensorResult,
    WorstKey,
)
from remotemac.agent.protocol import JsonObject
from remotemac.playbook import CompareRule
from remotemac.termsafe import escape_controls

#: where the host puts its tensor copies of whole-model pickles, under each side's
#: outputs (agent/ckptconvert.py writes them; never a job's own output)
CONVERTED_DIR = ".remotemac-converted"
CONVERTED_MANIFEST = "manifest.json"

# PyTorch's own MPS tests (test/test_mps.py).
FLOAT32_TOL = (1.3e-6, 1e-5)  # (rtol, atol)
FLOAT16_TOL = (5e-2, 5e-2)
BFLOAT16_TOL = (1e-1, 5e-2)
EXACT_TOL = (0.0, 0.0)

# Denominator floor for the relative error: the smallest normal float32, so that a
# zero reference gives a large but finite relative error.
TINY = float(np.finfo(np.float32).tiny)
#: how many keys a file's result lists as its worst / its metadata differences
WORST_KEYS = 5
MAX_METADATA = 20
#: a device name as torch prints one: ``cpu``, ``mps``, ``mps:0``, ``cuda:1`` …
DEVICE_RE = re.compile(
    r"^(?:cpu|mps|cuda|xpu|hip|meta|xla|mtia|hpu|ipu|vulkan|privateuseone)(?::\d+)?$"
)
_PY_NUMBERS = ("int", "float", "number")


@dataclass
class ComparisonResult:
    #: True: every file compared and within tolerance; False: a compared file is not;
    #: None: nothing failed but a file was not compared (or none matched)
    within_tolerance: bool | None
    files: list[FileResult] = field(default_factory=list)

    def to_dict(self) -> JsonObject:
        """The ``observations.results`` object of acceptance.json."""
        return {
            "within_tolerance": self.within_tolerance,
            "files": [f.to_json() for f in self.files],
        }


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


def _glob_re(pattern: str) -> re.Pattern[str]:
    """``*`` any run of characters (dots included), ``?`` one; everything else literal.

    Brackets are literal on purpose: key paths contain ``[0]`` list indices.
    """
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(rf"^{body}(?:[.\[].*)?$", re.DOTALL)


def key_matches(key: str, patterns: tuple[str, ...] | list[str]) -> bool:
    """Does ``key`` match a glob, or lie below a key that does (``config`` covers
    ``config.out_dir`` and ``config.layers[0]``)?"""
    return any(_glob_re(p).match(key) for p in patterns)


def normalise_device(value: Any) -> Any:
    """A device name (``mps:0``, ``cuda``, ``cpu``) as the word "device", else unchanged."""
    if isinstance(value, str) and DEVICE_RE.match(value.strip()):
        return "device"
    return value


# ---------------------------------------------------------------- comparing


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _fmt(x: Any) -> str:
    """A number for a detail line: six significant digits, complex kept complex."""
    if np.iscomplexobj(x):
        return f"{complex(x):.6g}"
    return f"{float(x):.6g}"


def compare_arrays(
    a: np.ndarray, b: np.ndarray, rtol: float, atol: float
) -> tuple[float, float, bool, str]:
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
        problems.append(
            f"NaN positions differ at {n_nan} of {a.size} elements, first at {list(idx)}"
        )
    n_bad = int(bad.sum())
    if n_bad:
        worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), a.shape)
        at = [int(i) for i in worst]
        problems.append(
            f"{n_bad} of {a.size} elements outside rtol={rtol:g} atol={atol:g}; worst at "
            f"{at}: {_fmt(a[worst])} vs reference {_fmt(b[worst])}"
        )
    if not math.isfinite(max_abs):
        problems.append("infinite error (an infinity where the other side is finite)")
    return max_abs, max_rel, not problems, "; ".join(problems)


def _compare_csv(
    key: str,
    tgt: list[str],
    ref: list[str],
    rtol: float,
    atol: float,
) -> TensorResult:
    """A CSV column: numeric cells with the tolerance, text cells as metadata."""
    shape = [len(ref)]
    if len(tgt) != len(ref):
        return TensorResult(
            key,
            shape,
            "csv",
            None,
            None,
            False,
            f"{len(tgt)} rows vs reference {len(ref)}",
            rtol,
            atol,
        )
    num_t, num_r, text_bad = [], [], []
    for i, (ct, cr) in enumerate(zip(tgt, ref, strict=True)):
        xt, xr = as_number(ct), as_number(cr)
        if xt is not None and xr is not None:
            num_t.append(xt)
            num_r.append(xr)
        elif normalise_device(ct) != normalise_device(cr):
            text_bad.append(f"row {i}: {ct!r} vs reference {cr!r}")
    max_abs = max_rel = 0.0
    ok, detail = True, ""
    if num_r:
        max_abs, max_rel, ok, detail = compare_arrays(np.array(num_t), np.array(num_r), rtol, atol)
    metadata = False
    if text_bad:
        metadata = ok  # only text differs: metadata; numbers outside tolerance: a failure
        ok = False
        more = f" (+{len(text_bad) - 1} more)" if len(text_bad) > 1 else ""
        detail = "; ".join(filter(None, [detail, f"text differs at {text_bad[0]}{more}"]))
    return TensorResult(
        key,
        shape,
        "csv",
        _finite_or_none(max_abs),
        _finite_or_none(max_rel),
        ok,
        detail,
        rtol,
        atol,
        metadata,
    )


def _compare_metadata(key: str, tgt: Any, ref: Any) -> TensorResult:
    """Two non-numeric leaves: equal (device names normalised) or a metadata difference."""
    nt, nr = normalise_device(tgt), normalise_device(ref)
    if nt == nr and type(nt) is type(nr):
        note = f"device {tgt} vs reference {ref} (device names normalised)" if tgt != ref else ""
        return TensorResult(key, None, None, None, None, True, note, metadata=True)
    return TensorResult(
        key, None, None, None, None, False, f"{tgt!r} vs reference {ref!r}", metadata=True
    )


def compare_leaf(key: str, tgt: Leaf, ref: Leaf, rule: CompareRule) -> TensorResult:
    """One leaf of the target against the same leaf of the reference."""
    d_rtol, d_atol = default_tolerance(ref.dtype)
    rtol = rule.rtol if rule.rtol is not None else d_rtol
    atol = rule.atol if rule.atol is not None else d_atol
    if ref.dtype == "csv" and tgt.dtype == "csv":
        return _compare_csv(key, tgt.other, ref.other, rtol, atol)
    if ref.is_metadata and tgt.is_metadata:
        return _compare_metadata(key, tgt.other, ref.other)
    if ref.array is None or tgt.array is None:
        what = lambda lf: lf.dtype if lf.array is not None else type(lf.other).__name__  # noqa: E731
        return TensorResult(
            key, None, ref.dtype, None, None, False, f"{what(tgt)} vs reference {what(ref)}"
        )
    shape = [int(s) for s in ref.array.shape]
    problems = []
    # plain Python numbers: 1 and 1.0 are the same value (a JSON writer may print either)
    if tgt.dtype != ref.dtype and not (tgt.dtype in _PY_NUMBERS and ref.dtype in _PY_NUMBERS):
        problems.append(f"dtype {tgt.dtype} vs reference {ref.dtype}")
    if tgt.array.shape != ref.array.shape:
        problems.append(f"shape {list(tgt.array.shape)} vs reference {shape}")
        return TensorResult(
            key, shape, ref.dtype, None, None, False, "; ".join(problems), rtol, atol
        )
    max_abs, max_rel, ok, detail = compare_arrays(tgt.array, ref.array, rtol, atol)
    if detail:
        problems.append(detail)
    return TensorResult(
        key,
        shape,
        ref.dtype,
        _finite_or_none(max_abs),
        _finite_or_none(max_rel),
        ok and not problems,
        "; ".join(problems),
        rtol,
        atol,
    )


def _max_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _excess(t: TensorResult) -> float:
    """How far a key is from its tolerance (error / allowed error): ranks the worst keys."""
    if t.max_abs_err is None:
        return math.inf if not t.ok else -1.0
    allowed = (t.atol or 0.0) + (t.rtol or 0.0) * (
        t.max_abs_err / t.max_rel_err if t.max_rel_err else 0.0
    )
    return t.max_abs_err / allowed if allowed > 0 else (math.inf if t.max_abs_err else 0.0)


def _fails(t: TensorResult, strict: bool) -> bool:
    return not t.ok and (strict or not t.metadata)


def _select(leaves: dict[str, Leaf], rule: CompareRule) -> tuple[dict[str, Leaf], int]:
    """The leaves the rule's ``keys``/``ignore`` keep, and how many it skipped."""
    kept = {
        k: v
        for k, v in leaves.items()
        if (not rule.keys or key_matches(k, rule.keys))
        and not (rule.ignore and key_matches(k, rule.ignore))
    }
    return kept, len(leaves) - len(kept)


def _file_failure(rel: str, rule: CompareRule, detail: str) -> FileResult:
    return FileResult(rel, None, None, rule.rtol, rule.atol, False, detail, strict=rule.strict)


def not_compared(rel: str, rule: CompareRule, why: str) -> FileResult:
    """A file a rule matched that could not be compared: said so, never a failure."""
    why = escape_controls(why)
    return FileResult(
        rel,
        None,
        None,
        rule.rtol,
        rule.atol,
        None,
        f"not compared: {why}",
        strict=rule.strict,
        not_compared=why,
    )


def _same_bytes(a: Path, b: Path) -> bool:
    """Byte-identical files (size first, then the bytes in blocks)."""
    try:
        if a.stat().st_size != b.stat().st_size:
            return False
        with a.open("rb") as fa, b.open("rb") as fb:
            while True:
                x, y = fa.read(1 << 20), fb.read(1 << 20)
                if x != y:
                    return False
                if not x:
                    return True
    except OSError:
        return False


def converted_copy(root: Path, rel: str) -> tuple[Path, str] | None:
    """The host's tensor copy of a whole-model pickle (see agent/ckptconvert.py), if any."""
    try:
        manifest = json.loads((root / CONVERTED_DIR / CONVERTED_MANIFEST).read_text("utf-8"))
        entry = manifest["files"][rel]
        path = root / CONVERTED_DIR / str(entry["to"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not path.is_file() or not path.resolve().is_relative_to(root.resolve()):
        return None
    return path, escape_controls(str(entry.get("what") or "a pickled object"))


def _load_side(
    side: str, root: Path, rel: str, rule: CompareRule
) -> tuple[dict[str, Leaf] | None, str | None, str | None]:
    """(leaves, what was converted, why not comparable) of one side's file."""
    try:
        return load_leaves(root / rel, rule.safe_globals), None, None
    except LoadError as exc:
        if exc.cause is None:
            return None, None, f"{side}: {exc}"
        copy = converted_copy(root, rel)
        if copy is None:
            return (
                None,
                None,
                f"{side}: {exc}: a whole-model pickle (torch.save(model)) or a class "
                f"the rule does not allow (safe_globals: [{exc.cause}] for a standard-"
                "library class); the host did not convert it into tensors",
            )
    try:
        return load_leaves(copy[0]), copy[1], None
    except LoadError as exc:
        return None, None, f"{side}: the host's tensor copy: {exc}"


def compare_file(
    rel: str,
    reference: Path,
    target: Path,
    rule: CompareRule,
    roots: tuple[Path, Path] | None = None,
) -> FileResult:
    """Compare one output file present on both sides.

    Byte-identical files pass without loading. A file the safe loader cannot read is
    compared through the host's tensor copy when there is one, else not compared.
    """
    if _same_bytes(reference, target):
        return FileResult(
            rel,
            0.0,
            0.0,
            rule.rtol,
            rule.atol,
            True,
            "byte-identical: passed without loading",
            strict=rule.strict,
            identical=True,
        )
    depth = len(Path(rel).parts)  # the outputs' roots: ``root / rel`` is each file
    ref_root, tgt_root = roots or (reference.parents[depth - 1], target.parents[depth - 1])
    ref_all, ref_conv, why = _load_side("reference", ref_root, rel, rule)
    if why is not None or ref_all is None:
        return not_compared(rel, rule, why or "reference: unreadable")
    tgt_all, tgt_conv, why = _load_side("target", tgt_root, rel, rule)
    if why is not None or tgt_all is None:
        return not_compared(rel, rule, why or "target: unreadable")
    if (ref_conv is None) != (tgt_conv is None):
        return not_compared(
            rel, rule, "only one side's file needed the host's conversion into tensors"
        )
    ref_leaves, ignored = _select(ref_all, rule)
    tgt_leaves, _ = _select(tgt_all, rule)
    if ref_all and not ref_leaves and not tgt_leaves:
        return _file_failure(
            rel,
            rule,
            f"no key of {len(ref_all)} matches keys {list(rule.keys)} / ignore {list(rule.ignore)}",
        )
    tensors: list[TensorResult] = []
    for key, ref in ref_leaves.items():
        tgt = tgt_leaves.get(key)
        if tgt is None:
            tensors.append(
                TensorResult(
                    key, leaf_shape(ref), ref.dtype, None, None, False, "missing in target"
                )
            )
        else:
            tensors.append(compare_leaf(key, tgt, ref, rule))
    for key, tgt in tgt_leaves.items():
        if key not in ref_leaves:
            tensors.append(
                TensorResult(key, leaf_shape(tgt), tgt.dtype, None, None, False, "not in reference")
            )
    result = _summarise(rel, rule, tensors, ignored)
    if tgt_conv is not None:
        result.converted = tgt_conv
        result.detail = "; ".join(filter(None, [f"compared as tensors: {tgt_conv}", result.detail]))
    return result


def _summarise(
    rel: str, rule: CompareRule, tensors: list[TensorResult], ignored: int
) -> FileResult:
    """The file's verdict, first failing key, worst keys and metadata differences."""
    bad = [t for t in tensors if _fails(t, rule.strict)]
    meta = [t for t in tensors if t.metadata and not t.ok]
    numeric = [t for t in tensors if t.max_abs_err is not None or (not t.ok and not t.metadata)]
    worst = sorted(numeric, key=_excess, reverse=True)[:WORST_KEYS]
    parts = []
    if bad:
        shown = ", ".join(t.key for t in bad[:5]) + (
            f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""
        )
        parts.append(
            f"{len(bad)} of {len(tensors)} values outside tolerance or mismatched: "
            f"{shown}; first: {bad[0].key}: {bad[0].detail}"
        )
    if meta:
        verb = "fail (strict)" if rule.strict else "reported, not failing"
        parts.append(
            f"{len(meta)} metadata difference(s) {verb}: "
            + ", ".join(t.key for t in meta[:3])
            + (" …" if len(meta) > 3 else "")
        )
    rtols = {t.rtol for t in tensors if t.rtol is not None}
    atols = {t.atol for t in tensors if t.atol is not None}
    return FileResult(
        rel,
        _max_or_none([t.max_abs_err for t in tensors]),
        _max_or_none([t.max_rel_err for t in tensors]),
        rule.rtol if rule.rtol is not None else (max(rtols) if rtols else None),
        rule.atol if rule.atol is not None else (max(atols) if atols else None),
        not bad,
        "; ".join(parts) if bad else "",
        tensors,
        first_failing_key=bad[0].key if bad else None,
        worst=[WorstKey(t.key, t.max_abs_err, t.max_rel_err, t.ok) for t in worst],
        metadata_differences=[MetadataDifference(t.key, t.detail) for t in meta[:MAX_METADATA]],
        compared=len(tensors),
        ignored=ignored,
        strict=rule.strict,
    )


def _matches(root: Path, pattern: str) -> set[str]:
    """Files under ``root`` matching ``pattern``, as POSIX paths relative to it.

    Links that lead outside ``root`` are ignored: outputs come from the host.
    """
    if not root.is_dir():
        return set()
    real_root = root.resolve()
    found = set()
    for p in root.glob(pattern):
        rel = p.relative_to(root).as_posix()
        if rel.split("/")[0] == CONVERTED_DIR:  # the host's copies, not the job's outputs
            continue
        if p.is_file() and p.resolve().is_relative_to(real_root):
            found.add(rel)
    return found


def written_summary(*dirs: Path, limit: int = 8) -> str:
    """What the workload did write (relative paths, both sides), for a rule that matched nothing."""
    names: set[str] = set()
    for base in dirs:
        if base.is_dir():
            names.update(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())
    names = {n for n in names if n.split("/")[0] != CONVERTED_DIR}
    if not names:
        return "nothing (check that it writes under {output_dir})"
    shown = sorted(names)[:limit]
    more = len(names) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def compare_outputs(
    reference_dir: Path, target_dir: Path, rules: list[CompareRule]
) -> ComparisonResult:
    """Compare every file the rules name; each is compared or said not to be.

    A file on one side only, a file no loader can read, a rule that matches no file:
    "not compared: why" (the verdict is then incomplete, never "outside tolerance").
    ``within_tolerance`` is True only when at least one file was compared and every
    file passed (an empty comparison is not evidence), False when a compared file
    failed, None otherwise.
    """
    reference_dir, target_dir = Path(reference_dir), Path(target_dir)
    files: list[FileResult] = []
    seen: set[str] = set()
    for rule in rules:
        ref_set = _matches(reference_dir, rule.file)
        tgt_set = _matches(target_dir, rule.file)
        if not ref_set and not tgt_set:
            files.append(
                not_compared(
                    rule.file,
                    rule,
                    f"no file matches '{rule.file}' in the reference "
                    f"({reference_dir}) or the target ({target_dir}) "
                    f"outputs; the workload wrote: "
                    f"{written_summary(reference_dir, target_dir)}",
                )
            )
            continue
        for rel in sorted(ref_set | tgt_set):
            if rel in seen:  # the first rule that names a file decides its tolerances
                continue
            seen.add(rel)
            if rel not in tgt_set:
                files.append(
                    not_compared(rel, rule, f"missing in target outputs ({target_dir / rel})")
                )
            elif rel not in ref_set:
                files.append(
                    not_compared(rel, rule, f"missing in reference outputs ({reference_dir / rel})")
                )
            else:
                files.append(
                    compare_file(
                        rel,
                        reference_dir / rel,
                        target_dir / rel,
                        rule,
                        (reference_dir, target_dir),
                    )
                )
    return ComparisonResult(within_tolerance_of(files), files)


def within_tolerance_of(files: list[FileResult]) -> bool | None:
    """False when a compared file failed; True when every file was compared and passed."""
    if any(f.ok is False for f in files):
        return False
    if not files or any(f.ok is None for f in files):
        return None
    return True
