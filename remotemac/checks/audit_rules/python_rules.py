"""Python sources, read with ``ast`` so that prose about CUDA is never a finding.

Only imports, calls, attribute uses and string constants in a device position
count. Severity then depends on context: guards (``if torch.cuda.is_available():``,
``and`` chains, ternaries, early exits), optional imports, and the module's value
flow (``valueflow``) for names, options and aliases. Whether a ``torch.cuda`` call
raises comes from ``cuda_api``, whose tables are checked against real torch.
"""

from __future__ import annotations

import ast
import bisect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from remotemac.checks.audit_rules import pycalls, pyguards
from remotemac.checks.audit_rules.cuda_api import behaviour
from remotemac.checks.audit_rules.deps_rules import IMPORT_RULES, SETUP_KWARGS, requirement_rules
from remotemac.checks.audit_rules.model import NOTE, Finding, make
from remotemac.checks.audit_rules.valueflow import Flow, build_flow


@dataclass
class ImportLog:
    """Imports between a project's modules: (importer, module, eager, line), and every
    Python file's text (an import the scanner did not visit is found by name there)."""

    edges: list[tuple[str, str, bool, int]] = field(default_factory=list)
    texts: dict[str, bytes] = field(default_factory=dict)

_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "OSError",
                            "BaseException", "RuntimeError"})
_OPTIONAL_KWARGS = frozenset({"extras_require", "tests_require"})

#: cheap pre-filter (lower-case substrings, so comments can pass it; ast decides): a
#: Python file without any of these is not parsed, and a statement whose lines hold
#: none of them is not visited (imports always are)
PY_TRIGGERS = (
    b"cuda", b"nccl", b"triton", b"flash_attn", b"xformers", b"bitsandbytes", b"apex",
    b"deepspeed", b"vllm", b"cupy", b"cudnn", b"nvcc", b"tensorrt", b"pynvml", b"cudf",
    b"cuml", b"cugraph", b"capability", b".cu'", b'.cu"', b".cuh", b"install_requires",
    b"extras_require", b"init_process_group", b"new_group", b"sdp_kernel",
)


class PythonScanner:
    """One pass over a module's AST, with just enough context to avoid false alarms.

    Context kept: the module's value flow (aliases, constants, options), function
    depth (module level = import time), CUDA guards under which CUDA code is the
    intended branch, and ``try/except ImportError`` blocks that make imports optional.
    """

    def __init__(self, file: str, data: bytes, trigger_lines: list[int] | None = None,
                 imports: ImportLog | None = None) -> None:
        """``trigger_lines`` (from the pre-filter) prunes statements; None visits all.
        ``imports`` collects which project modules this one imports, and how."""
        self.file = file
        self.imports = imports
        self.data = data
        self.trigger_lines = trigger_lines
        self._lines: list[str] | None = None
        self.flow = Flow()
        self.depth = 0
        self.guard = 0
        self.optional = 0
        self.branch = 0  # inside an if-branch that is not a CUDA check (an opt-in path)
        self.findings: list[Finding] = []
        self._seen: set[tuple[str, int]] = set()
        self._dispatch: dict[type, object] = {}
        self.scopes: list[ast.AST] = []
        self.names: list[str] = [file.rsplit("/", 1)[-1]]  # file, classes, functions
        self._mps_scope: dict[int, bool] = {}

    # -- plumbing
    def line_text(self, lineno: int) -> str:
        if self._lines is None:
            self._lines = self.data.decode("utf-8", "replace").splitlines()
        return self._lines[lineno - 1] if 0 < lineno <= len(self._lines) else ""

    def hit(self, rule: str, node: ast.AST | int, *, severity: str | None = None,
            why_suffix: str = "") -> None:
        lineno = node if isinstance(node, int) else getattr(node, "lineno", 1)
        if (rule, lineno) in self._seen:
            return
        self._seen.add((rule, lineno))
        self.findings.append(make(rule, self.file, lineno, self.line_text(lineno).strip(),
                                  severity=severity, why_suffix=why_suffix))

    def run(self, tree: ast.AST) -> list[Finding]:
        self.flow = build_flow(tree)
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

    def generic_visit(self, node: ast.AST) -> None:
        for _name, value in ast.iter_fields(node):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self.visit_block(value)
                else:
                    for item in value:
                        if isinstance(item, ast.AST):
                            self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    def visit_all(self, nodes: list) -> None:
        for n in nodes:
            self.visit(n)

    def visit_block(self, body: list[ast.stmt]) -> None:
        """Statements in order; after ``if not cuda: return``, the rest is the CUDA path."""
        added = 0
        for stmt in body:
            self.visit(stmt)
            if (isinstance(stmt, ast.If) and not stmt.orelse
                    and pyguards.is_negated_guard(stmt.test, self.dotted)
                    and pyguards.terminates(stmt.body, self.dotted)) or (
                    isinstance(stmt, ast.Assert) and self.depth
                    and self._is_guard(stmt.test, strong=True)):
                self.guard += 1
                added += 1
        self.guard -= added

    def dotted(self, node: ast.AST) -> str | None:
        return self.flow.dotted(node)

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

    def _log_import(self, module: str, node: ast.AST) -> None:
        if self.imports is not None:
            eager = not (self.depth or self.guard or self.optional)
            self.imports.edges.append((self.file, module, eager, getattr(node, "lineno", 1)))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self._log_import(a.name, node)
            rule = self._import_rule(a.name)
            if rule:
                self._import_hit(rule, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.file.split("/")[:-1]
            base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
            prefix = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                self._log_import(prefix, node)
                self._log_import(f"{prefix}.{a.name}", node)
            return
        if not node.module:
            return
        self._log_import(node.module, node)
        for a in node.names:
            self._log_import(f"{node.module}.{a.name}", node)
        rule = self._import_rule(node.module)
        if node.module.startswith("torch.cuda.amp") and not self.guard:
            self.hit("cuda-amp", node)
        for a in node.names:
            rule = rule or self._import_rule(f"{node.module}.{a.name}")
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
        self.names.append(node.name)
        self.visit_block(node.body)
        self.names.pop()
        self.scopes.pop()
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.names.append(node.name)
        self.generic_visit(node)
        self.names.pop()

    def _cuda_named(self) -> str | None:
        """The file, class or function whose name says it is the CUDA implementation."""
        return next((n for n in reversed(self.names) if "cuda" in n.lower()), None)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    def _device_default(self, name: str, default: ast.AST) -> None:
        if "device" in name.lower() and pyguards.is_cuda_const(default) and not self.guard:
            self.hit("cuda-device", default)

    def _is_guard(self, test: ast.AST, *, strong: bool = False) -> bool:
        return pyguards.is_guard(test, self.dotted, strong=strong)

    def _guarded(self, node: ast.If | ast.IfExp, body: list, orelse: list) -> None:
        self.visit(node.test)
        guard = self._is_guard(node.test)
        branch = isinstance(node, ast.If) and not guard and not pyguards.is_main_check(node.test)
        self.branch += branch
        if guard:
            self.guard += 1
            if (pyguards.selects_cuda_device(body) and self._is_guard(node.test, strong=True)
                    and not self._scope_picks_mps() and not pyguards.picks_mps(orelse)):
                self.hit("no-mps-branch", node)
        if isinstance(node, ast.If):
            self.visit_block(body)
        else:
            self.visit_all(body)
        if guard:
            self.guard -= 1
        if isinstance(node, ast.If):
            self.visit_block(orelse)
        else:
            self.visit_all(orelse)
        self.branch -= branch

    def _requires_cuda(self, node: ast.AST) -> None:
        """Code that refuses to run without CUDA; on an opt-in branch, or in an
        implementation named for CUDA (``RingFlashAttentionCUDAFunction``,
        ``kernels_cuda.py``), it is only a note: the portable path routes around it."""
        named = self._cuda_named()
        if named:
            self.hit("cuda-required", node, severity=NOTE,
                     why_suffix=f"Here inside a CUDA-specific implementation ({named}), "
                     "which a portable path routes around.")
        elif self.branch:
            self.hit("cuda-required", node, severity=NOTE,
                     why_suffix="Here only on a conditional path, which a Mac run can avoid.")
        else:
            self.hit("cuda-required", node)

    def _in_function(self, name: str) -> bool:
        """Inside ``def cuda(self)``: the method that implements an explicit ``.cuda()``."""
        scope = self.scopes[-1]
        return isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and scope.name == name

    def _scope_picks_mps(self) -> bool:
        """An early-return chain (if cuda: return …; if mps: return …) is fine."""
        scope = self.scopes[-1]
        key = id(scope)
        if key not in self._mps_scope:
            self._mps_scope[key] = pyguards.picks_mps(
                [scope], own_code_only=isinstance(scope, ast.Module))
        return self._mps_scope[key]

    def visit_If(self, node: ast.If) -> None:
        if not self.guard and pyguards.refuses_without_cuda(node, self.dotted):
            self._requires_cuda(node)
        self._guarded(node, node.body, node.orelse)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._guarded(node, [node.body], [node.orelse])

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        """``torch.cuda.is_available() and torch.cuda.f()``: f only runs with CUDA."""
        added = 0
        for value in node.values:
            self.visit(value)
            if isinstance(node.op, ast.And) and self._is_guard(value):
                self.guard += 1
                added += 1
        self.guard -= added

    def visit_Assert(self, node: ast.Assert) -> None:
        if self._is_guard(node.test, strong=True) and not self.guard:
            self._requires_cuda(node)
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        optional = any(self._catches_import_error(h) for h in node.handlers)
        self.optional += optional
        self.visit_block(node.body)
        self.optional -= optional
        self.visit_all(node.handlers)
        self.visit_block(node.orelse)
        self.visit_block(node.finalbody)

    visit_TryStar = visit_Try

    def _catches_import_error(self, handler: ast.ExceptHandler) -> bool:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        return any((self.dotted(t) or "").split(".")[-1] in _IMPORT_ERRORS for t in types)

    # -- assignments and attributes
    def visit_Assign(self, node: ast.Assign) -> None:
        if pyguards.is_cuda_const(node.value) and not self.guard and any(
                pycalls.is_device_target(t) for t in node.targets):
            self.hit("cuda-device", node)
        self._build_choice(node, node.targets)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None and pyguards.is_cuda_const(node.value) and not self.guard and (
                pycalls.is_device_target(node.target)):
            self.hit("cuda-device", node)
        self.generic_visit(node)

    def _build_choice(self, node: ast.Assign, targets: list[ast.AST]) -> None:
        """``Ext = CppExtension if … else CUDAExtension`` or ``Ext = CUDAExtension`` under
        a CUDA check: an optional CUDA build, CPU kernels only on macOS."""
        for t in targets:
            if not isinstance(t, ast.Name):
                continue
            choice = self.flow.choices.get(t.id)
            if choice and any(o.endswith("CUDAExtension") for o in choice[0]):
                if any(o.endswith("CppExtension") for o in choice[0]):
                    self.hit("cpu-kernels-only", node)
                return
        value = self.dotted(node.value) if isinstance(node.value, (ast.Name, ast.Attribute)) \
            else None
        if value and value.endswith("CUDAExtension") and self.guard and self._has_cpp_build():
            self.hit("cpu-kernels-only", node)

    def _has_cpp_build(self) -> bool:
        return any(v.endswith("CppExtension") for v in self.flow.imports.values())

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self.dotted(node)
        if name is None:
            self.generic_visit(node)
            return
        self._attribute_name(name, node)

    def _attribute_name(self, name: str, node: ast.AST) -> None:
        if name.startswith("torch.backends.cudnn."):
            if not self.guard:
                self.hit("cudnn-flag", node)
        elif name.startswith("torch.backends.cuda."):
            if not self.guard:
                self.hit("cuda-backend-flag", node)
        elif name.startswith("torch.distributed.Backend.NCCL"):
            self.hit("nccl", node, **self._nccl_context())

    def visit_Name(self, node: ast.Name) -> None:
        """A from-imported name: ``from torch.backends.cuda import sdp_kernel``."""
        target = self.flow.imports.get(node.id) or self.flow.aliases.get(node.id)
        if target and target.startswith("torch.backends."):
            self._attribute_name(target, node)

    # -- calls
    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self.dotted(func) or ""
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and name != "torch.cuda":
            if not self.guard and not self._in_function("cuda"):
                self.hit("dot-cuda", func.end_lineno or node.lineno)  # the .cuda( line
        elif name.startswith("torch.cuda."):
            self._torch_cuda_call(name[len("torch.cuda."):], node)
        elif name.endswith("get_device_capability") and not self.guard:
            self.hit("capability-check", node)
        if name.endswith("CUDAExtension") or (
                name.startswith("torch.utils.cpp_extension.load") and pycalls.loads_cuda(node)):
            self._cuda_build(node)
        if name in pycalls.SUBPROCESS and any(pycalls.is_nvcc(a) for a in node.args):
            self.hit("nvcc", node)
        self._call_args(name, func, node)
        self._process_group(name, node)
        self.generic_visit(node)

    def _torch_cuda_call(self, sub: str, node: ast.Call) -> None:
        if sub.startswith(("get_device_capability", "get_device_properties")):
            if not self.guard:
                self.hit("capability-check", node)
            return
        if sub.startswith("nccl"):
            self.hit("nccl", node)
            return
        if self.guard:
            return
        if sub.startswith("amp."):
            self.hit("cuda-amp", node)
            return
        kind = behaviour(sub)
        if kind == "raises":
            self.hit("cuda-at-import" if self.depth == 0 else "cuda-call", node)
        elif kind == "unchecked":
            self.hit("cuda-unchecked", node)

    def _cuda_build(self, node: ast.Call) -> None:
        if not self.guard:
            self.hit("cuda-extension", node)
        elif self._has_cpp_build():
            self.hit("cpu-kernels-only", node)
        else:
            self.hit("cuda-extension", node, severity=NOTE,
                     why_suffix="Here it is only built when CUDA is present.")

    def _nccl_context(self) -> dict[str, str]:
        if self.guard:
            return {"severity": NOTE, "why_suffix": "Here it sits behind a CUDA check."}
        return {}

    def _process_group(self, name: str, node: ast.Call) -> None:
        """NCCL chosen by a literal, a variable, an option default or a dict entry."""
        found = self.flow.keyword_string(node, "backend") if name != "dict" else None
        if found is None and name.endswith(pycalls.PROCESS_GROUP) and node.args:
            found = self.flow.string(node.args[0])
        if found is None or "nccl" not in found[0].lower():
            return
        value, line = found
        suffix = "" if line == node.lineno else f"Here through a value set on line {line}."
        ctx = self._nccl_context()
        if suffix:
            ctx["why_suffix"] = (ctx.get("why_suffix", "") + " " + suffix).strip()
        self.hit("nccl", node, **ctx)

    def _call_args(self, name: str, func: ast.AST, node: ast.Call) -> None:
        attr = func.attr if isinstance(func, ast.Attribute) else name
        takes_device = name == "torch.device" or attr in ("to", "set_default_device", "device")
        if (takes_device and node.args and pyguards.is_cuda_const(node.args[0])
                and not self.guard):
            self.hit("cuda-device", node)
        for kw in node.keywords:
            value = kw.value
            if pyguards.is_cuda_const(value) and pycalls.device_keyword(kw.arg, node):
                if not self.guard:
                    self.hit("cuda-device", node)
            elif kw.arg == "extra_compile_args" and pycalls.nvcc_flags(value) and not self.guard:
                self.hit("nvcc", value)
            elif kw.arg in SETUP_KWARGS and name.endswith("setup"):
                self._setup_requirements(value, optional=kw.arg in _OPTIONAL_KWARGS)

    def _setup_requirements(self, value: ast.AST, *, optional: bool) -> None:
        for n in ast.walk(value):
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                rules, linux_only = requirement_rules(n.value)
                for rule in rules:
                    if linux_only:
                        self.hit(rule, n, severity=NOTE,
                                 why_suffix="Here a marker keeps it off macOS.")
                    elif optional:
                        self.hit(rule, n, severity=NOTE,
                                 why_suffix="Here it is an optional extra, not installed by "
                                 "default.")
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


def scan_python(file: str, data: bytes, *, force: bool = False,
                imports: ImportLog | None = None) -> list[Finding] | None:
    """Findings for one Python file; None when it does not parse (counted, not fatal).

    ``force`` (setup.py) parses and visits everything: requirement strings such as
    "flash-attn" do not contain the trigger words. ``imports`` collects import edges.
    """
    if imports is not None:
        imports.texts[file] = data
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
        return PythonScanner(file, data, None if force else _trigger_lines(low),
                             imports).run(tree)
    except RecursionError:  # pathologically nested generated code
        return None


