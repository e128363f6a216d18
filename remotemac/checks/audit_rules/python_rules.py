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
from collections.abc import Iterator

from remotemac.checks.audit_rules import pycalls, pyguards
from remotemac.checks.audit_rules.call_rules import CallRules
from remotemac.checks.audit_rules.guard_rules import GuardRules
from remotemac.checks.audit_rules.import_rules import ImportLog, ImportRules
from remotemac.checks.audit_rules.model import Finding, make
from remotemac.checks.audit_rules.parsing import parse_source
from remotemac.checks.audit_rules.valueflow import Flow, build_flow

__all__ = ["PY_TRIGGERS", "ImportLog", "PythonScanner", "scan_python"]


#: cheap pre-filter (lower-case substrings, so comments can pass it; ast decides): a
#: Python file without any of these is not parsed, and a statement whose lines hold
#: none of them is not visited (imports always are)
PY_TRIGGERS = (
    b"cuda",
    b"nccl",
    b"triton",
    b"flash_attn",
    b"xformers",
    b"bitsandbytes",
    b"apex",
    b"deepspeed",
    b"vllm",
    b"cupy",
    b"cudnn",
    b"nvcc",
    b"tensorrt",
    b"pynvml",
    b"cudf",
    b"cuml",
    b"cugraph",
    b"capability",
    b".cu'",
    b'.cu"',
    b".cuh",
    b"install_requires",
    b"extras_require",
    b"init_process_group",
    b"new_group",
    b"sdp_kernel",
    b"nprocs",
)


class PythonScanner(GuardRules, ImportRules, CallRules):
    """One pass over a module's AST, with just enough context to avoid false alarms.

    Context kept: the module's value flow (aliases, constants, options), function
    depth (module level = import time), CUDA guards under which CUDA code is the
    intended branch, and ``try/except ImportError`` blocks that make imports optional.
    """

    def __init__(
        self,
        file: str,
        data: bytes,
        trigger_lines: list[int] | None = None,
        imports: ImportLog | None = None,
    ) -> None:
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

    def hit(
        self, rule: str, node: ast.AST | int, *, severity: str | None = None, why_suffix: str = ""
    ) -> None:
        lineno = node if isinstance(node, int) else getattr(node, "lineno", 1)
        if (rule, lineno) in self._seen:
            return
        self._seen.add((rule, lineno))
        self.findings.append(
            make(
                rule,
                self.file,
                lineno,
                self.line_text(lineno).strip(),
                severity=severity,
                why_suffix=why_suffix,
            )
        )

    def run(self, tree: ast.AST) -> list[Finding]:
        self.flow = build_flow(tree)
        self.scopes.append(tree)
        self.visit(tree)
        return self.findings

    def visit(self, node: ast.AST) -> None:
        if (
            self.trigger_lines is not None
            and isinstance(node, ast.stmt)
            and not isinstance(node, (ast.Import, ast.ImportFrom))
            and not self._has_trigger(node.lineno, node.end_lineno or node.lineno)
        ):
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

    def dotted(self, node: ast.AST) -> str | None:
        return self.flow.dotted(node)

    # -- scopes and guards
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.visit_all(node.decorator_list)
        args = node.args
        positional = args.posonlyargs + args.args
        for arg, default in zip(
            positional[len(positional) - len(args.defaults) :], args.defaults, strict=True
        ):
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

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    def _device_default(self, name: str, default: ast.AST) -> None:
        if "device" in name.lower() and pyguards.is_cuda_const(default) and not self.guard:
            self.hit("cuda-device", default)

    # -- assignments and attributes
    def visit_Assign(self, node: ast.Assign) -> None:
        if (
            pyguards.is_cuda_const(node.value)
            and not self.guard
            and any(pycalls.is_device_target(t) for t in node.targets)
        ):
            self.hit("cuda-device", node)
        self._build_choice(node, node.targets)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if (
            node.value is not None
            and pyguards.is_cuda_const(node.value)
            and not self.guard
            and (pycalls.is_device_target(node.target))
        ):
            self.hit("cuda-device", node)
        self.generic_visit(node)

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


def _trigger_lines(low: bytes) -> list[int]:
    """Sorted line numbers holding a trigger word (``low`` is the lower-cased source)."""
    positions = sorted(pos for word in PY_TRIGGERS if word in low for pos in _find_all(low, word))
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


def scan_python(
    file: str, data: bytes, *, force: bool = False, imports: ImportLog | None = None
) -> list[Finding] | None:
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
        tree = parse_source(data, filename=file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    try:
        return PythonScanner(file, data, None if force else _trigger_lines(low), imports).run(tree)
    except RecursionError:  # pathologically nested generated code
        return None
