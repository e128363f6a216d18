"""Predict MPS support of ATen operators from the installed torch's own metadata.

The wheel ships ``torchgen/packaged/ATen/native/native_functions.yaml``; it says
which backends have a kernel for each operator overload. Reading it (instead of
keeping our own list) makes the prediction follow the torch version the user has.
The rules, as PyTorch applies them:

* an ``MPS`` key in ``dispatch:`` (keys are comma lists) is an MPS kernel;
* composite keys, or no ``dispatch:`` at all, run on any backend;
* ``structured_delegate: foo.out`` means the dense kernels are ``foo.out``'s,
  even when the op's own ``dispatch:`` lists sparse/nested keys;
* a few ops always run on CPU on MPS (MPSFallback.mm), unless the yaml gives them
  an MPS kernel (a kernel and a fallback cannot both be registered);
* device-specific CPU variants seen in a CPU trace (``*_for_cpu``, mkldnn) are
  mapped to what the same call does on MPS;
* dtype rules: no float64, no complex128, int64 convolutions fail.

torch itself is never imported here: the yaml is found with ``find_spec``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from remotemac.errors import BadInput

YAML_RELPATH = Path("packaged/ATen/native/native_functions.yaml")

# Keys whose kernel serves every dense backend, MPS included.
COMPOSITE_KEYS = frozenset(
    {
        "CompositeImplicitAutograd",
        "CompositeExplicitAutograd",
        "CompositeExplicitAutogradNonFunctional",
    }
)

# Registered to the CPU fallback for MPS in aten/src/ATen/mps/MPSFallback.mm.
ALWAYS_FALLBACK = frozenset(
    {"embedding_renorm_", "linalg_svd", "linalg_svd.U", "col2im", "upsample_nearest3d.vec"}
)

# A CPU trace sees what a composite always-fallback op decomposes into; on MPS the
# fallback catches the op before it decomposes. child overload -> parent function name.
FALLBACK_CHILDREN = {
    "_linalg_svd": "linalg_svd",
    "_linalg_svd.U": "linalg_svd",
    "upsample_nearest3d": "upsample_nearest3d",
}

# CPU-only implementations chosen inside a device-neutral call -> what MPS runs.
DEVICE_VARIANTS = {
    "_scaled_dot_product_flash_attention_for_cpu": "_scaled_dot_product_attention_math_for_mps",
    # With gradients MPS takes the composite math path, whose backward is autograd's.
    "_scaled_dot_product_flash_attention_for_cpu_backward": "_scaled_dot_product_attention_math",
    "mkldnn_rnn_layer": "_lstm_mps",
    "mkldnn_rnn_layer_backward": "lstm_mps_backward",
    "mkldnn_convolution": "_mps_convolution",
    "_slow_conv2d_forward": "_mps_convolution",
    "_slow_conv2d_backward.output_mask": "mps_convolution_backward",
    "_convert_weight_to_int4pack_for_cpu": "_convert_weight_to_int4pack",
    "_weight_int4pack_mm_for_cpu": "_weight_int4pack_mm",
}

# Namespaces of markers that do no tensor work (record_function from the profiler).
DEVICE_AGNOSTIC_NAMESPACES = frozenset({"profiler"})

CONV_OPS = ("convolution", "_convolution", "conv", "_mps_convolution", "mkldnn_convolution")


@dataclass(frozen=True)
class OpEntry:
    """One ``- func:`` of native_functions.yaml, reduced to what matters here."""

    name: str
    keys: frozenset[str]
    delegate: str | None
    has_dispatch: bool


@dataclass(frozen=True)
class Support:
    """How an overload would run on MPS.

    kind: ``mps`` (own or delegate kernel), ``composite``, ``mapped`` (a CPU
    variant whose MPS counterpart is supported), ``agnostic``, ``fallback``
    (always-fallback list), ``missing`` (no MPS kernel) or ``unknown`` (not in
    the yaml).
    """

    kind: str
    via: str | None = None

    @property
    def covered(self) -> bool:
        return self.kind in ("mps", "composite", "mapped", "agnostic")


@dataclass(frozen=True)
class DtypeIssue:
    verdict: str  # fail | caveat
    reason: str


class OpTable:
    """Parsed native_functions.yaml with delegate and variant resolution."""

    def __init__(self, entries: dict[str, OpEntry], path: Path | None = None) -> None:
        self.entries = entries
        self.path = path

    def __len__(self) -> int:
        return len(self.entries)

    def support(self, op: str) -> Support:
        """Predicted MPS support of an overload (``aten::add.Tensor`` or ``add.Tensor``)."""
        namespace, _, name = op.rpartition("::")
        if namespace in DEVICE_AGNOSTIC_NAMESPACES:
            return Support("agnostic")
        if namespace not in ("", "aten"):
            return Support("unknown")
        if name in DEVICE_VARIANTS:
            target = DEVICE_VARIANTS[name]
            resolved = self._kernel(target)
            return Support("mapped", target) if resolved.covered else Support("missing", target)
        resolved = self._kernel(name)
        if name in ALWAYS_FALLBACK and resolved.kind != "mps":
            return Support("fallback")
        return resolved

    def _kernel(self, name: str, depth: int = 0) -> Support:
        entry = self.entries.get(name)
        if entry is None:
            return Support("unknown")
        if "MPS" in entry.keys:
            return Support("mps", None if depth == 0 else name)
        if entry.keys & COMPOSITE_KEYS:
            return Support("composite", None if depth == 0 else name)
        if not entry.has_dispatch and entry.delegate is None:
            return Support("composite", None if depth == 0 else name)  # CompositeImplicit
        if entry.delegate is not None and depth < 4:
            found = self._kernel(entry.delegate, depth + 1)
            if found.kind != "unknown":
                return found
        return Support("missing")


def dtype_issues(op: str, dtypes: Iterable[str]) -> list[DtypeIssue]:
    """What MPS does with these dtypes for this op, whatever kernel it has."""
    found = set(dtypes)
    name = op.rpartition("::")[2].split(".")[0]
    issues = []
    if "float64" in found:
        issues.append(DtypeIssue("fail", "float64 unsupported on MPS"))
    if "complex128" in found:
        issues.append(DtypeIssue("fail", "complex128 unsupported on MPS"))
    if "int64" in found and name.startswith(CONV_OPS):
        issues.append(DtypeIssue("fail", "int64 convolution unsupported on MPS"))
    if "int64" in found and name.startswith("scatter_reduce"):
        issues.append(DtypeIssue("caveat", "int64 scatter_reduce: reduce='prod' fails on MPS"))
    return issues


def native_functions_path() -> Path:
    """Locate the packaged yaml of the installed torch without importing torch."""
    try:
        spec = importlib.util.find_spec("torchgen")
    except (ImportError, ValueError):
        spec = None
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        candidate = Path(root) / YAML_RELPATH
        if candidate.is_file():
            return candidate
    raise BadInput(
        "preflight: torch's native_functions.yaml was not found in this Python",
        hint=f"install torch for the interpreter running remotemac; looked for torchgen/{YAML_RELPATH}",
    )


def torch_version() -> str | None:
    """Version of the installed torch distribution (metadata only, no import)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def parse_entries(docs: list[dict]) -> dict[str, OpEntry]:
    """Reduce yaml documents to OpEntry by overload name (``add.Tensor``)."""
    entries = {}
    for doc in docs:
        func = doc.get("func") if isinstance(doc, dict) else None
        if not isinstance(func, str):
            continue
        name = func.split("(", 1)[0].strip()
        dispatch = doc.get("dispatch") or {}
        keys = frozenset(k.strip() for key in dispatch for k in str(key).split(","))
        entries[name] = OpEntry(name, keys, doc.get("structured_delegate"), bool(dispatch))
    return entries


@functools.lru_cache(maxsize=4)
def _load(path: Path, mtime_ns: int) -> OpTable:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with path.open("r", encoding="utf-8") as fh:
        docs = yaml.load(fh, Loader=loader)  # noqa: S506 - a safe loader
    if not isinstance(docs, list):
        raise BadInput(f"preflight: {path} is not a list of operator entries")
    return OpTable(parse_entries(docs), path)


def load_table(path: Path | None = None) -> OpTable:
    """The parsed table for ``path`` (default: the installed torch's), cached."""
    path = Path(path) if path is not None else native_functions_path()
    return _load(path, path.stat().st_mtime_ns)
