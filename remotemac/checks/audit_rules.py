"""What ties a project to CUDA: the rule table and one detector per kind of file.

Detectors get the bytes of one file (the walker in ``audit.py`` reads each file
once) and return findings; they never touch the disk, so what is read is decided
in one place and every rule can be tested on a string. Python is parsed with
``ast`` so that comments, docstrings and log messages that merely mention CUDA
never become findings: only imports, calls, attribute uses and string constants
in a device position count.
"""

from __future__ import annotations

import ast
import bisect
import re
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass

BLOCKER = "blocker"
NEEDS_REFACTOR = "needs-refactor"
NOTE = "note"
SEVERITIES = (BLOCKER, NEEDS_REFACTOR, NOTE)

SDPA = "torch.nn.functional.scaled_dot_product_attention (runs on MPS)"


@dataclass(frozen=True)
class Rule:
    """One reason a project is tied to CUDA, with the way out.

    ``replaceable`` is False for blockers with no portable drop-in (custom
    kernels, CUDA-only libraries): they make the verdict "keep-linux".
    ``linux_pipeline`` marks multi-GPU training machinery that argues for keeping
    the Linux pipeline and adding a macOS track ("dual-track").
    """

    id: str
    severity: str
    why: str
    alternative: str
    replaceable: bool = True
    linux_pipeline: bool = False


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    text: str
    severity: str
    why: str
    alternative: str
    rule: str

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _r(id: str, severity: str, why: str, alternative: str, **kw: bool) -> Rule:
    return Rule(id, severity, why, alternative, **kw)


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        _r("cuda-source", BLOCKER, "CUDA C++ kernels compile with nvcc for NVIDIA GPUs only.",
           "Rewrite the kernel as PyTorch ops (or a Metal shader) and keep a Linux track "
           "until then.", replaceable=False),
        _r("cuda-extension", BLOCKER,
           "A torch.utils.cpp_extension CUDA build needs nvcc and an NVIDIA GPU.",
           "Ship a CppExtension / pure-PyTorch fallback for macOS; keep the CUDA build "
           "behind a torch.cuda.is_available() check.", replaceable=False),
        _r("nvcc", BLOCKER, "Compiles code with nvcc, which does not exist on macOS.",
           "Build the CUDA part only on Linux; provide a PyTorch/Metal path for MPS.",
           replaceable=False),
        _r("cuda-cxx", BLOCKER, "C/C++ code that includes CUDA headers or launches kernels.",
           "Guard it behind a build flag and provide a CPU/PyTorch path.", replaceable=False),
        _r("cmake-cuda", BLOCKER, "CMake enables the CUDA language or toolkit.",
           "Make CUDA optional in CMake (check_language(CUDA)) and build without it on macOS.",
           replaceable=False),
        _r("flash-attn", BLOCKER,
           "flash_attn ships CUDA kernels only; it neither builds nor imports on macOS.",
           f"{SDPA}; re-check numerics, and varlen/packed-sequence use.", replaceable=False),
        _r("triton", BLOCKER, "Hand-written Triton kernels target NVIDIA/AMD GPUs; no Metal "
           "backend.", "Express the kernel in PyTorch ops (torch.compile fuses them on MPS) "
           "or a Metal shader.", replaceable=False),
        _r("vllm", BLOCKER, "vLLM serves models on CUDA (or ROCm) GPUs only.",
           "transformers generate() on mps, llama.cpp or MLX for local inference.",
           replaceable=False),
        _r("pycuda", BLOCKER, "PyCUDA / cuda-python drive the CUDA driver directly.",
           "Port to PyTorch ops on the torch device.", replaceable=False),
        _r("tensorrt", BLOCKER, "TensorRT runs on NVIDIA GPUs only.",
           "Core ML (coremltools) or ONNX Runtime's CoreML provider.", replaceable=False),
        _r("numba-cuda", BLOCKER, "numba.cuda kernels run on NVIDIA GPUs only.",
           "numba @njit on CPU or PyTorch ops on mps.", replaceable=False),
        _r("xformers", BLOCKER, "xformers' fused attention kernels are CUDA-only.", SDPA),
        _r("bitsandbytes", BLOCKER, "bitsandbytes' 8-bit/4-bit kernels are CUDA-first; macOS "
           "support is partial.", "torch.optim.AdamW instead of 8-bit optimizers; torchao or "
           "full precision instead of 4-bit weights (more memory)."),
        _r("apex", BLOCKER, "NVIDIA apex (amp, fused optimizers and norms) builds against CUDA.",
           "torch.autocast + torch.amp.GradScaler, torch.nn.LayerNorm/RMSNorm, torch.optim."),
        _r("deepspeed", BLOCKER, "DeepSpeed's engine, ZeRO and fused ops expect CUDA and NCCL.",
           "A plain PyTorch (or Accelerate) loop for the single-device Mac run; keep DeepSpeed "
           "on the Linux track.", linux_pipeline=True),
        _r("cupy", BLOCKER, "CuPy arrays live on NVIDIA GPUs only.",
           "NumPy on CPU or torch tensors on mps."),
        _r("rapids", BLOCKER, "RAPIDS (cudf, cuml, cugraph) runs on NVIDIA GPUs only.",
           "pandas / polars / scikit-learn on CPU."),
        _r("nccl", NEEDS_REFACTOR, "NCCL is NVIDIA's collective library; macOS has none.",
           'Pick the backend at run time: "nccl" if torch.cuda.is_available() else "gloo".',
           linux_pipeline=True),
        _r("cuda-device", NEEDS_REFACTOR, 'A hard-coded "cuda" device fails where CUDA is '
           "absent.", "Take the device from a flag or pick cuda → mps → cpu at run time."),
        _r("dot-cuda", NEEDS_REFACTOR, ".cuda() moves to CUDA unconditionally.",
           ".to(device) with the device chosen at run time."),
        _r("cuda-at-import", NEEDS_REFACTOR, "A torch.cuda call at module level runs on import "
           "and raises without CUDA.", "Move it into a function behind "
           "torch.cuda.is_available(); use torch.mps / torch.accelerator equivalents."),
        _r("cuda-required", NEEDS_REFACTOR, "The code refuses to run without CUDA.",
           "Accept mps (torch.backends.mps.is_available()) and cpu as well."),
        _r("capability-check", NEEDS_REFACTOR, "A CUDA compute-capability check raises or "
           "misleads without CUDA.", "Guard it with torch.cuda.is_available(); test features "
           "(dtype support) directly on other devices."),
        _r("cuda-amp", NEEDS_REFACTOR, "torch.cuda.amp is CUDA-only (and deprecated).",
           'torch.amp.autocast(device_type=...) and torch.amp.GradScaler(...).'),
        _r("cuda-call", NOTE, "A torch.cuda call inside a function raises if it runs without "
           "CUDA.", "Guard it with torch.cuda.is_available() or use torch.accelerator / "
           "torch.mps equivalents."),
        _r("cudnn-flag", NOTE, "torch.backends.cudnn settings have no effect on MPS.",
           "Keep them (harmless); for determinism use torch.use_deterministic_algorithms."),
        _r("no-mps-branch", NOTE, "Device selection falls back from cuda straight to cpu, so "
           "a Mac runs on CPU.", 'Add an "mps" branch: torch.backends.mps.is_available().'),
        _r("cu-wheel", NEEDS_REFACTOR, "A CUDA build of a wheel (+cuXXX) has no macOS "
           "variant; pip cannot install it there.", "Pin the plain version (PyPI's macOS "
           "wheels include MPS) or add a sys_platform marker."),
        _r("cuda-index", NEEDS_REFACTOR, "A CUDA-only package index has no macOS wheels.",
           'Use PyPI on macOS: restrict the index with a marker or a per-platform file.'),
        _r("nvidia-wheel", NEEDS_REFACTOR, "nvidia-* wheels are CUDA runtime libraries for "
           "Linux/Windows only.", 'Drop them (torch pulls them in on Linux) or add '
           '; sys_platform == "linux".'),
        _r("gpu-variant", NEEDS_REFACTOR, "A GPU-only variant of a package (…-gpu, a cuda "
           "extra) has no macOS build.", "Depend on the plain package on macOS."),
        _r("conda-cuda", NEEDS_REFACTOR, "A conda CUDA package, build or channel has no "
           "osx-arm64 build.", "Split the environment per platform or drop CUDA packages on "
           "osx-arm64 (PyTorch's osx-arm64 build includes MPS)."),
        _r("nvml", NOTE, "NVML GPU monitoring finds no GPU on a Mac.",
           "Guard it; read MPS memory with torch.mps.current_allocated_memory()."),
        _r("cuda-env", NOTE, "CUDA-specific environment or tooling (CUDA_VISIBLE_DEVICES, "
           "nvidia-smi, CUDA base images) is ignored or absent on macOS.",
           "Keep it for the Linux track; nothing to do for MPS."),
    )
}


def make(rule_id: str, file: str, line: int, text: str, *, severity: str | None = None,
         why_suffix: str = "") -> Finding:
    """A finding for ``rule_id``; ``severity`` downgrades it (guarded code, lock files)."""
    rule = RULES[rule_id]
    why = rule.why + (f" {why_suffix}" if why_suffix else "")
    return Finding(file, line, _clip(text), severity or rule.severity, why, rule.alternative,
                   rule_id)


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------- packages

#: import name (top level, or dotted prefix) -> rule
IMPORT_RULES: dict[str, str] = {
    "flash_attn": "flash-attn", "flash_attn_interface": "flash-attn",
    "xformers": "xformers", "bitsandbytes": "bitsandbytes", "apex": "apex",
    "deepspeed": "deepspeed", "vllm": "vllm", "cupy": "cupy", "cupyx": "cupy",
    "triton": "triton", "pycuda": "pycuda", "cuda": "pycuda", "tensorrt": "tensorrt",
    "torch_tensorrt": "tensorrt", "numba.cuda": "numba-cuda", "cudf": "rapids",
    "cuml": "rapids", "cugraph": "rapids", "torch.cuda.nccl": "nccl", "pynvml": "nvml",
}

#: normalised distribution name -> rule
DIST_RULES: dict[str, str] = {
    "flash-attn": "flash-attn", "flash-attn-3": "flash-attn", "xformers": "xformers",
    "bitsandbytes": "bitsandbytes", "apex": "apex", "deepspeed": "deepspeed", "vllm": "vllm",
    "cupy": "cupy", "triton": "triton", "pycuda": "pycuda", "cuda-python": "pycuda",
    "tensorrt": "tensorrt", "torch-tensorrt": "tensorrt", "cudf": "rapids", "cuml": "rapids",
    "cugraph": "rapids", "nvidia-ml-py": "nvml", "nvidia-ml-py3": "nvml", "pynvml": "nvml",
    "onnxruntime-gpu": "gpu-variant", "tensorflow-gpu": "gpu-variant",
    "paddlepaddle-gpu": "gpu-variant", "mxnet-cu": "gpu-variant",
}

#: conda package names that only exist for CUDA platforms
CONDA_CUDA = frozenset({
    "cudatoolkit", "cuda-toolkit", "pytorch-cuda", "cudnn", "nccl", "cuda", "cuda-nvcc",
    "cuda-runtime", "cuda-cudart", "cuda-libraries", "pytorch-gpu", "tensorflow-gpu", "cutensor",
})

_NORM = re.compile(r"[-_.]+")
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$", re.S)
_CU_VERSION = re.compile(r"(?:\+|%2[bB])cu\d{2,3}")
_CUDA_INDEX = re.compile(
    r"download\.pytorch\.org/whl/(?:nightly/|test/)?cu\d+|pypi\.(?:ngc\.)?nvidia\.com"
    r"|/whl/cu\d+|data\.dgl\.ai/wheels/cu|conda\.anaconda\.org/nvidia|storage\.googleapis"
    r"\.com/jax-releases/jax_cuda"
)
_LINUX_MARKER = re.compile(
    r"(sys_platform|platform_system)\s*==\s*['\"](linux|win32|windows)['\"]"
    r"|sys_platform\s*!=\s*['\"]darwin['\"]|platform_system\s*!=\s*['\"]darwin['\"]"
    r"|platform_machine\s*==\s*['\"](x86_64|amd64|AMD64)['\"]", re.I)


def normalise(name: str) -> str:
    return _NORM.sub("-", name).lower()


def dist_rule(name: str) -> str | None:
    """The rule a distribution name falls under, if any."""
    n = normalise(name)
    if n in DIST_RULES:
        return DIST_RULES[n]
    if n.startswith("cupy-cuda"):
        return "cupy"
    if n.startswith(("cudf-", "cuml-", "cugraph-")):
        return "rapids"
    if n.startswith(("jax-cuda", "jaxlib-cuda", "mxnet-cu")):
        return "gpu-variant"
    if n.startswith("nvidia-"):
        return "nvml" if n.startswith("nvidia-ml") else "nvidia-wheel"
    return None


def url_rule(text: str) -> str | None:
    """cu-wheel for a CUDA build in a URL or version, cuda-index for a CUDA-only index."""
    if _CU_VERSION.search(text):
        return "cu-wheel"
    if _CUDA_INDEX.search(text):
        return "cuda-index"
    return None


def requirement_rules(req: str) -> tuple[list[str], bool]:
    """Rules hit by one PEP 508 requirement string, and whether a marker keeps it off macOS.

    Strings that are not requirements (descriptions, keywords) return no rules.
    """
    spec, _, marker = req.partition(";")
    m = _REQ.match(spec)
    if not m:
        return [], False
    name, extras, rest = m.group(1), m.group(2) or "", m.group(3).strip()
    if rest and rest[0] not in "=<>!~@(,*^":
        return [], False
    rules: list[str] = []
    rule = dist_rule(name)
    if rule:
        rules.append(rule)
    if re.search(r"cuda|gpu", extras, re.I):
        rules.append("gpu-variant")
    u = url_rule(rest)
    if u:
        rules.append(u)
    return rules, bool(_LINUX_MARKER.search(marker))


# --------------------------------------------------------------------------- python

_CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$", re.I)
_SUBPROCESS = frozenset({
    "subprocess.run", "subprocess.call", "subprocess.check_call", "subprocess.check_output",
    "subprocess.Popen", "os.system", "os.popen", "os.execvp", "os.spawnlp",
})
_DEVICE_KWARGS = frozenset({"device", "map_location", "device_type", "default_device"})
_HARMLESS_CUDA = frozenset({"is_available", "device_count", "is_initialized", "_is_compiled",
                            "is_built"})
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "OSError",
                            "BaseException", "RuntimeError"})
_SETUP_KWARGS = frozenset({"install_requires", "extras_require", "setup_requires",
                           "tests_require"})

#: cheap pre-filter (lower-case substrings, so comments can pass it; ast decides): a
#: Python file without any of these is not parsed, and a statement whose lines hold
#: none of them is not visited (imports always are)
PY_TRIGGERS = (
    b"cuda", b"nccl", b"triton", b"flash_attn", b"xformers", b"bitsandbytes", b"apex",
    b"deepspeed", b"vllm", b"cupy", b"cudnn", b"nvcc", b"tensorrt", b"pynvml", b"cudf",
    b"cuml", b"cugraph", b"capability", b".cu'", b'.cu"', b".cuh", b"install_requires",
    b"extras_require",
)


def _is_cuda_const(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(_CUDA_DEVICE.match(node.value))
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return (isinstance(first, ast.Constant) and isinstance(first.value, str)
                and first.value.lower().startswith("cuda"))
    return False


def _contains_cuda_device(nodes: list[ast.AST]) -> bool:
    return any(_is_cuda_const(n) for top in nodes for n in ast.walk(top))


class PythonScanner:
    """One pass over a module's AST, with just enough context to avoid false alarms.

    Context kept: import aliases (``import torch as th``), function depth (module
    level = import time), CUDA guards (``if torch.cuda.is_available():``,
    ``if device == "cuda":``, ``if use_cuda:``) under which CUDA code is the
    intended branch, and ``try/except ImportError`` blocks that make imports optional.
    """

    def __init__(self, file: str, data: bytes, trigger_lines: list[int] | None = None) -> None:
        """``trigger_lines`` (from the pre-filter) prunes statements; None visits all."""
        self.file = file
        self.data = data
        self.trigger_lines = trigger_lines
        self._lines: list[str] | None = None
        self.aliases: dict[str, str] = {}
        self.depth = 0
        self.guard = 0
        self.optional = 0
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, int]] = set()
        self._dispatch: dict[type, object] = {}
        self.scopes: list[ast.AST] = []
        self._mps_scope: dict[int, bool] = {}

    # -- plumbing
    def line_text(self, lineno: int) -> str:
        if self._lines is None:
            self._lines = self.data.decode("utf-8", "replace").splitlines()
        return self._lines[lineno - 1] if 0 < lineno <= len(self._lines) else ""

    def hit(self, rule: str, node: ast.AST, *, severity: str | None = None,
            why_suffix: str = "") -> None:
        lineno = getattr(node, "lineno", 1)
        if (rule, lineno) in self._seen:
            return
        self._seen.add((rule, lineno))
        self.findings.append(make(rule, self.file, lineno, self.line_text(lineno).strip(),
                                  severity=severity, why_suffix=why_suffix))

    def run(self, tree: ast.AST) -> list[Finding]:
        self.scopes.append(tree)
        self.visit(tree)
        return self.findings

    def visit(self, node: ast.AST) -> None:
        if (self.trigger_lines is not None and isinstance(node, ast.stmt)
                and not isinstance(node, (ast.Import, ast.ImportFrom))
                and not self._has_trigger(node.lineno, node.end_lineno or node.lineno)):
            return
        cls = node.__class__
        fn = self._dispatch.get(cls)
        if fn is None:
            fn = getattr(self, "visit_" + cls.__name__, self.generic_visit)
            self._dispatch[cls] = fn
        fn(node)  # type: ignore[operator]

    def _has_trigger(self, first: int, last: int) -> bool:
        lines = self.trigger_lines or []
        i = bisect.bisect_left(lines, first)
        return i < len(lines) and lines[i] <= last

    def _text_mentions_mps(self, first: int, last: int) -> bool:
        """Whether lines first..last say "mps" (text is enough for a note's guard)."""
        if self._lines is None:
            self.line_text(1)
        return any("mps" in ln for ln in (self._lines or [])[first - 1:last])

    def generic_visit(self, node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            self.visit(child)

    def visit_all(self, nodes: list) -> None:
        for n in nodes:
            self.visit(n)

    def dotted(self, node: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    # -- imports
    def _import_rule(self, module: str) -> str | None:
        for key in (module, module.split(".")[0]):
            if key in IMPORT_RULES:
                return IMPORT_RULES[key]
        for prefix, rule in IMPORT_RULES.items():
            if "." in prefix and module.startswith(prefix + "."):
                return rule
        return None

    def _import_hit(self, rule: str, node: ast.AST) -> None:
        if self.optional:
            self.hit(rule, node, severity=NOTE,
                     why_suffix="Here the import is optional (try/except ImportError).")
        elif self.guard:
            self.hit(rule, node, severity=NOTE,
                     why_suffix="Here the import sits behind a CUDA check.")
        else:
            self.hit(rule, node)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.asname:
                self.aliases[a.asname] = a.name
            rule = self._import_rule(a.name)
            if rule:
                self._import_hit(rule, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            for a in node.names:
                self.aliases.pop(a.asname or a.name, None)
            return
        rule = self._import_rule(node.module)
        if node.module.startswith("torch.cuda.amp") and not self.guard:
            self.hit("cuda-amp", node)
        for a in node.names:
            full = f"{node.module}.{a.name}"
            self.aliases[a.asname or a.name] = full
            rule = rule or self._import_rule(full)
        if rule:
            self._import_hit(rule, node)

    # -- scopes and guards
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.visit_all(node.decorator_list)
        args = node.args
        positional = args.posonlyargs + args.args
        for arg, default in zip(positional[len(positional) - len(args.defaults):],
                                args.defaults, strict=True):
            self._device_default(arg.arg, default)
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            if default is not None:
                self._device_default(arg.arg, default)
        self.visit_all(args.defaults)
        self.visit_all([d for d in args.kw_defaults if d is not None])
        self.depth += 1
        self.scopes.append(node)
        self.visit_all(node.body)
        self.scopes.pop()
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    def _device_default(self, name: str, default: ast.AST) -> None:
        if "device" in name.lower() and _is_cuda_const(default) and not self.guard:
            self.hit("cuda-device", default)

    def _is_guard(self, test: ast.AST, *, strong: bool = False) -> bool:
        """Whether ``test`` selects the CUDA path; ``strong`` ignores ``use_cuda``-style flags
        (good enough to silence code behind them, too vague to claim CUDA is required)."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return False
        for n in ast.walk(test):
            if isinstance(n, ast.Call):
                name = self.dotted(n.func) or ""
                if name.endswith(("cuda.is_available", "cuda.device_count")):
                    return True
            elif isinstance(n, ast.Compare):
                positive = all(isinstance(op, (ast.Eq, ast.Is, ast.In)) for op in n.ops)
                if positive and any(_is_cuda_const(c) for c in [n.left, *n.comparators]):
                    return True
            elif not strong and self._is_cuda_flag(n):
                return True
        return False

    def _is_cuda_flag(self, n: ast.AST) -> bool:
        """``use_cuda`` or ``args.cuda``: an opt-in flag, not the torch.cuda module."""
        if isinstance(n, ast.Name):
            return "cuda" in n.id.lower()
        if isinstance(n, ast.Attribute):
            return "cuda" in n.attr.lower() and not (self.dotted(n) or "").startswith("torch.")
        return False

    def _guarded(self, node: ast.If | ast.IfExp, body: list[ast.AST],
                 orelse: list[ast.AST]) -> None:
        self.visit(node.test)
        guard = self._is_guard(node.test)
        if guard:
            self.guard += 1
            if (_contains_cuda_device(body) and self._is_guard(node.test, strong=True)
                    and not self._scope_mentions_mps()
                    and not any(self._text_mentions_mps(n.lineno, n.end_lineno or n.lineno)
                                for n in orelse)):
                self.hit("no-mps-branch", node)
        self.visit_all(body)
        if guard:
            self.guard -= 1
        self.visit_all(orelse)

    def _scope_mentions_mps(self) -> bool:
        """An early-return chain (if cuda: return …; if mps: return …) is fine."""
        scope = self.scopes[-1]
        key = id(scope)
        if key not in self._mps_scope:
            if isinstance(scope, ast.Module):
                self._mps_scope[key] = b"mps" in self.data
            else:
                self._mps_scope[key] = self._text_mentions_mps(
                    scope.lineno, scope.end_lineno or scope.lineno)
        return self._mps_scope[key]

    def visit_If(self, node: ast.If) -> None:
        t = node.test
        if (isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not)
                and self._is_guard(t.operand, strong=True) and not self.guard
                and any(isinstance(s, ast.Raise) or (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                    and (self.dotted(s.value.func) or "").endswith(("exit", "abort")))
                    for s in node.body)):
            self.hit("cuda-required", node)
        self._guarded(node, node.body, node.orelse)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._guarded(node, [node.body], [node.orelse])

    def visit_Assert(self, node: ast.Assert) -> None:
        if self._is_guard(node.test, strong=True) and not self.guard:
            self.hit("cuda-required", node)
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        optional = any(self._catches_import_error(h) for h in node.handlers)
        self.optional += optional
        self.visit_all(node.body)
        self.optional -= optional
        self.visit_all(node.handlers)
        self.visit_all(node.orelse)
        self.visit_all(node.finalbody)

    visit_TryStar = visit_Try

    def _catches_import_error(self, handler: ast.ExceptHandler) -> bool:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        return any((self.dotted(t) or "").split(".")[-1] in _IMPORT_ERRORS for t in types)

    # -- assignments and attributes
    def visit_Assign(self, node: ast.Assign) -> None:
        if _is_cuda_const(node.value) and not self.guard and any(
                self._is_device_target(t) for t in node.targets):
            self.hit("cuda-device", node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None and _is_cuda_const(node.value) and not self.guard and (
                self._is_device_target(node.target)):
            self.hit("cuda-device", node)
        self.generic_visit(node)

    @staticmethod
    def _is_device_target(target: ast.AST) -> bool:
        name = target.id if isinstance(target, ast.Name) else (
            target.attr if isinstance(target, ast.Attribute) else "")
        name = name.lower()
        return "device" in name or name in ("dev", "gpu")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.dotted(node)
        if name is None:
            self.generic_visit(node)
            return
        if name.startswith("torch.backends.cudnn."):
            if not self.guard:
                self.hit("cudnn-flag", node)
        elif name.startswith("torch.distributed.Backend.NCCL"):
            self.hit("nccl", node)

    # -- calls
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self.dotted(func) or ""
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and name != "torch.cuda":
            if not self.guard:
                self.hit("dot-cuda", node)
        elif name.startswith("torch.cuda."):
            self._torch_cuda_call(name[len("torch.cuda."):], node)
        elif name.endswith("get_device_capability") and not self.guard:
            self.hit("capability-check", node)
        if name.endswith("CUDAExtension") or (
                name.startswith("torch.utils.cpp_extension.load") and self._loads_cuda(node)):
            self._cuda_build(node)
        if name in _SUBPROCESS and any(self._is_nvcc(a) for a in node.args):
            self.hit("nvcc", node)
        self._call_args(name, func, node)
        self.generic_visit(node)

    def _torch_cuda_call(self, sub: str, node: ast.Call) -> None:
        if sub in _HARMLESS_CUDA:
            return
        if sub.startswith(("get_device_capability", "get_device_properties")):
            if not self.guard:
                self.hit("capability-check", node)
        elif sub.startswith("nccl"):
            self.hit("nccl", node)
        elif self.guard:
            return
        elif sub.startswith("amp."):
            self.hit("cuda-amp", node)
        elif self.depth == 0:
            self.hit("cuda-at-import", node)
        else:
            self.hit("cuda-call", node)

    def _cuda_build(self, node: ast.Call) -> None:
        if self.guard:
            self.hit("cuda-extension", node, severity=NOTE,
                     why_suffix="Here it is only built when CUDA is present.")
        else:
            self.hit("cuda-extension", node)

    @staticmethod
    def _loads_cuda(node: ast.Call) -> bool:
        for kw in node.keywords:
            if kw.arg == "cuda_sources":
                return True
            if kw.arg == "with_cuda" and isinstance(kw.value, ast.Constant) and kw.value.value:
                return True
        sources = [kw.value for kw in node.keywords if kw.arg == "sources"] + node.args[1:2]
        for src in sources:
            for n in ast.walk(src):
                if (isinstance(n, ast.Constant) and isinstance(n.value, str)
                        and n.value.endswith((".cu", ".cuh"))):
                    return True
        return False

    @staticmethod
    def _is_nvcc(arg: ast.AST) -> bool:
        items = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
        if not items:
            return False
        first = items[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            words = first.value.split()
            return bool(words) and words[0].rsplit("/", 1)[-1] == "nvcc"
        return False

    def _call_args(self, name: str, func: ast.AST, node: ast.Call) -> None:
        attr = func.attr if isinstance(func, ast.Attribute) else name
        takes_device = name == "torch.device" or attr in ("to", "set_default_device", "device")
        if takes_device and node.args and _is_cuda_const(node.args[0]) and not self.guard:
            self.hit("cuda-device", node)
        for kw in node.keywords:
            value = kw.value
            if _is_cuda_const(value) and self._device_keyword(kw.arg, node):
                if not self.guard:
                    self.hit("cuda-device", node)
            elif kw.arg == "backend" and isinstance(value, ast.Constant) and isinstance(
                    value.value, str) and "nccl" in value.value.lower():
                self.hit("nccl", node)
            elif kw.arg == "extra_compile_args" and isinstance(value, ast.Dict) and any(
                    isinstance(k, ast.Constant) and k.value == "nvcc" for k in value.keys):
                self.hit("nvcc", value)
            elif kw.arg in _SETUP_KWARGS and name.endswith("setup"):
                self._setup_requirements(value)
        if name.endswith("init_process_group") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str) and (
                    "nccl" in first.value.lower()):
                self.hit("nccl", node)

    @staticmethod
    def _device_keyword(arg: str | None, node: ast.Call) -> bool:
        """device=/map_location=…, or argparse's default= for a --device option."""
        if arg in _DEVICE_KWARGS:
            return True
        return arg == "default" and any(
            isinstance(a, ast.Constant) and isinstance(a.value, str)
            and ("device" in a.value or "gpu" in a.value) for a in node.args)

    def _setup_requirements(self, value: ast.AST) -> None:
        for n in ast.walk(value):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                rules, linux_only = requirement_rules(n.value)
                for rule in rules:
                    if linux_only:
                        self.hit(rule, n, severity=NOTE,
                                 why_suffix="Here a marker keeps it off macOS.")
                    else:
                        self.hit(rule, n)


def _trigger_lines(low: bytes) -> list[int]:
    """Sorted line numbers holding a trigger word (``low`` is the lower-cased source)."""
    positions = sorted(
        pos for word in PY_TRIGGERS if word in low for pos in _find_all(low, word))
    out: list[int] = []
    line, last = 1, 0
    for pos in positions:
        line += low.count(b"\n", last, pos)
        last = pos
        if not out or out[-1] != line:
            out.append(line)
    return out


def _find_all(data: bytes, word: bytes) -> Iterator[int]:
    pos = data.find(word)
    while pos != -1:
        yield pos
        pos = data.find(word, pos + 1)


def scan_python(file: str, data: bytes, *, force: bool = False) -> list[Finding] | None:
    """Findings for one Python file; None when it does not parse (counted, not fatal).

    ``force`` (setup.py) parses and visits everything: requirement strings such as
    "flash-attn" do not contain the trigger words.
    """
    low = data.lower()
    if not force and not any(word in low for word in PY_TRIGGERS):
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escapes etc. are not ours to report
            tree = ast.parse(data, filename=file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    try:
        return PythonScanner(file, data, None if force else _trigger_lines(low)).run(tree)
    except RecursionError:  # pathologically nested generated code
        return None


# --------------------------------------------------------------------------- dependency files

_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'')
_KEY = re.compile(r'^\s*"?([A-Za-z0-9_.-]+)"?\s*=')
_LOCK_NOTE = "Here it is pinned in a lock file; fix the declared dependency it comes from."
_MARKER_NOTE = "Here a marker keeps it off macOS."


def _strip_comment(line: str, *, requirements: bool = False) -> str:
    """Drop a trailing ``#`` comment that is not inside quotes (or, for pip files, a URL)."""
    if requirements:
        return re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[:i]
    return line


class _Lines:
    """Collects findings for a line-oriented file, one per (rule, line)."""

    def __init__(self, file: str, *, lock: bool = False) -> None:
        self.file = file
        self.lock = lock
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, int]] = set()
        self._lock_seen: set[tuple[str, str]] = set()

    def add(self, rule: str, lineno: int, text: str, *, linux_only: bool = False,
            key: str = "") -> None:
        if (rule, lineno) in self._seen:
            return
        if self.lock:
            # uv.lock repeats an index URL for every wheel: report each distinct thing once.
            k = (rule, key or text.strip())
            if k in self._lock_seen:
                return
            self._lock_seen.add(k)
        self._seen.add((rule, lineno))
        if self.lock:
            self.findings.append(make(rule, self.file, lineno, text.strip(), severity=NOTE,
                                      why_suffix=_LOCK_NOTE))
        elif linux_only and RULES[rule].severity != NOTE:
            self.findings.append(make(rule, self.file, lineno, text.strip(), severity=NOTE,
                                      why_suffix=_MARKER_NOTE))
        else:
            self.findings.append(make(rule, self.file, lineno, text.strip()))

    def requirement(self, req: str, lineno: int, text: str) -> None:
        rules, linux_only = requirement_rules(req)
        for rule in rules:
            self.add(rule, lineno, text, linux_only=linux_only, key=normalise(req))

    def urls(self, s: str, lineno: int, text: str) -> None:
        rule = url_rule(s)
        if rule:
            m = _CUDA_INDEX.search(s)
            self.add(rule, lineno, text, key=m.group(0) if m and rule == "cuda-index" else text)


def scan_requirements(file: str, text: str) -> list[Finding]:
    """requirements*.txt / constraints*.txt: one requirement or pip option per line."""
    out = _Lines(file)
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno, raw = i + 1, lines[i]
        while raw.endswith("\\") and i + 1 < len(lines):
            i += 1
            raw = raw[:-1] + " " + lines[i]
        i += 1
        line = _strip_comment(raw, requirements=True).strip()
        if not line:
            continue
        out.urls(line, lineno, line)
        if line.startswith("-"):
            continue  # --index-url / -f / -r / -e: only URLs matter, checked above
        out.requirement(line, lineno, line)
    return out.findings


_TOML_DEP_KEYS = frozenset({"dependencies", "requires", "dev-dependencies",
                            "constraint-dependencies", "override-dependencies"})


def scan_toml(file: str, text: str, *, names_are_keys: tuple[str, ...] = (),
              lock: bool = False) -> list[Finding]:
    """pyproject.toml, Pipfile and TOML lock files, line by line (no TOML parser needed).

    Requirement strings only count inside dependency keys or tables, so a
    ``description`` or ``keywords`` entry that mentions triton is not a finding.
    ``names_are_keys`` lists tables whose keys are package names (Poetry, Pipfile).
    """
    out = _Lines(file, lock=lock)
    section, key = "", ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if line.startswith("[") and not line.startswith(('["', "['")) and line.endswith("]"):
            section, key = line.strip("[] "), ""
            continue
        m = _KEY.match(line)
        if m:
            key = m.group(1)
        strings = [a or b for a, b in _QUOTED.findall(line)]
        if lock:
            if not m or key not in ("name", "version", "source", "url", "registry"):
                continue
            for s in strings:
                out.urls(s, lineno, line)
                if key == "name":
                    out.requirement(s, lineno, line)
            continue
        for s in strings:
            out.urls(s, lineno, line)
        in_dep_table = any(t in section for t in ("dependencies", "dependency-groups",
                                                  "optional-dependencies"))
        if m and (section in names_are_keys or (
                in_dep_table and section.startswith("tool.poetry"))):
            out.requirement(key, lineno, line)
            if any(_LINUX_MARKER.search(s) for s in strings):
                continue
        elif in_dep_table or key in _TOML_DEP_KEYS:
            for s in strings:
                out.requirement(s, lineno, line)
    return out.findings


def scan_setup_cfg(file: str, text: str) -> list[Finding]:
    """setup.cfg: requirements under [options] install_requires and [options.extras_require]."""
    out = _Lines(file)
    section, key = "", ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw, requirements=True).rstrip()
        stripped = line.strip()
        if not stripped or stripped.startswith(";"):
            continue
        if stripped.startswith("["):
            section, key = stripped.strip("[]").strip(), ""
            continue
        out.urls(stripped, lineno, stripped)
        value = stripped
        if not raw[:1].isspace() and ("=" in line or ":" in line):
            key, _, value = (p.strip() for p in re.split(r"([=:])", line, maxsplit=1))
        relevant = section == "options.extras_require" or (
            section == "options" and key in _SETUP_KWARGS)
        if relevant and value:
            out.requirement(value, lineno, stripped)
    return out.findings


def scan_conda(file: str, text: str, *, lock: bool = False) -> list[Finding]:
    """environment.yml and conda-lock.yml: channels, conda specs and nested pip lists."""
    out = _Lines(file, lock=lock)
    top = ""
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).rstrip()
        stripped = line.strip()
        if not stripped:
            continue
        if not raw[:1].isspace() and stripped.endswith(":"):
            top = stripped[:-1]
        out.urls(stripped, lineno, stripped)
        m = re.match(r"^-?\s*(?:name:\s*)?(['\"]?)([^\s'\"]+)\1\s*$", stripped.lstrip("- "))
        is_item = stripped.startswith("-") or stripped.startswith("name:")
        if not (m and is_item):
            continue
        item = m.group(2)
        if lock and not stripped.lstrip("- ").startswith("name:"):
            continue
        if top == "channels":
            if item.lower() == "nvidia":
                out.add("conda-cuda", lineno, stripped)
            continue
        if item.startswith("-"):
            continue
        name = re.split(r"[=<>!~ \[]", item, maxsplit=1)[0].lower()
        build = item.split("=")[2] if item.count("=") >= 2 else ""
        if (name in CONDA_CUDA or name.startswith(("cuda-", "libcu", "magma-cuda"))
                or "cuda" in build.lower()):
            out.add("conda-cuda", lineno, stripped, key=name)
        else:
            out.requirement(item.replace("=", "==", 1) if "==" not in item and "=" in item
                            and not re.search(r"[<>!~]=", item) else item, lineno, stripped)
    return out.findings


def scan_conda_explicit(file: str, text: str) -> list[Finding]:
    """An ``@EXPLICIT`` conda lock: one package URL per line; CUDA builds show in the name."""
    out = _Lines(file, lock=True)
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "@")):
            continue
        pkg = line.rsplit("/", 1)[-1]
        if "cuda" in pkg.lower() or "/nvidia/" in line:
            out.add("conda-cuda", lineno, pkg, key=pkg.split("-")[0])
        else:
            out.requirement(pkg.split("-")[0], lineno, pkg)
    return out.findings


def scan_json_lock(file: str, text: str) -> list[Finding]:
    """Pipfile.lock: package keys, pinned versions and source URLs."""
    out = _Lines(file, lock=True)
    for lineno, raw in enumerate(text.splitlines(), 1):
        m = re.match(r'^\s*"([A-Za-z0-9._-]+)":\s*(.*)$', raw)
        if not m:
            continue
        k, rest = m.groups()
        if rest.startswith("{"):
            out.requirement(k, lineno, raw)
        elif k in ("version", "url"):
            out.urls(rest, lineno, raw)
    return out.findings


# --------------------------------------------------------------------------- other sources

_CXX_CUDA = re.compile(
    r"#\s*include\s*[<\"](?:cuda[\w_]*\.h|cublas\w*\.h|cudnn\w*\.h|curand\w*\.h|cusparse\w*\.h"
    r"|nccl\.h|thrust/|cub/|ATen/cuda/|c10/cuda/)|__global__|<<<|\bat::cuda::|\bc10::cuda::"
)
_CXX_WORDS = ("cuda", "__global__", "<<<", "cublas", "cudnn", "curand", "cusparse", "nccl",
              "thrust/", "cub/")
_CMAKE_CUDA = re.compile(r"enable_language\s*\(\s*CUDA|LANGUAGES[^)]*\bCUDA\b"
                         r"|find_package\s*\(\s*CUDA(?:Toolkit)?\b", re.I)
_SHELL_NVCC = re.compile(r"(?:^|[\s;&|(/])nvcc(?:\s|$)")
_SHELL_ENV = re.compile(r"CUDA_VISIBLE_DEVICES|nvidia-smi|\bFROM\s+nvidia/cuda|CUDA_HOME")


def scan_cuda_source(file: str, text: str) -> list[Finding]:
    """A .cu/.cuh file is a blocker by itself; point at its first kernel when there is one."""
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        if "__global__" in line and not line.lstrip().startswith("//"):
            return [make("cuda-source", file, lineno, line.strip())]
    return [make("cuda-source", file, 1, lines[0].strip() if lines else file)]


def scan_cxx(file: str, text: str) -> list[Finding]:
    """C/C++ sources: CUDA includes, kernels and launches (comment lines skipped)."""
    low = text.lower()
    if not any(w in low for w in _CXX_WORDS):
        return []
    out = _Lines(file)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not ("#" in line or "__global__" in line or "<<<" in line or "::cuda::" in line):
            continue
        s = line.lstrip()
        if s.startswith(("//", "*", "/*")):
            continue
        if _CXX_CUDA.search(line):
            out.add("cuda-cxx", lineno, s)
    return out.findings


def scan_build_script(file: str, text: str) -> list[Finding]:
    """Shell scripts, Makefiles, CMake and Dockerfiles: nvcc, CUDA languages, CUDA env."""
    out = _Lines(file)
    cmake = file.endswith((".cmake", "CMakeLists.txt"))
    docker = "Dockerfile" in file.rsplit("/", 1)[-1]
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if cmake and _CMAKE_CUDA.search(s):
            out.add("cmake-cuda", lineno, s)
        elif _SHELL_NVCC.search(s) and not (docker or cmake):
            out.add("nvcc", lineno, s)
        elif _SHELL_ENV.search(s) or (docker and "nvcc" in s):
            out.add("cuda-env", lineno, s)
    return out.findings
