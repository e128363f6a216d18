"""Python sources, read with ``ast`` so that prose about CUDA is never a finding.

Only imports, calls, attribute uses and string constants in a device position
count; guards (``if torch.cuda.is_available():``), optional imports and
module-level value flow decide the severity.
"""

from __future__ import annotations

import ast
import bisect
import re
import warnings
from collections.abc import Iterator

from remotemac.checks.audit_rules.deps_rules import IMPORT_RULES, SETUP_KWARGS, requirement_rules
from remotemac.checks.audit_rules.model import NOTE, Finding, make

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
            elif kw.arg in SETUP_KWARGS and name.endswith("setup"):
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


