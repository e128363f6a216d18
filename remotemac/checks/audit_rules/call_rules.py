"""Python calls: torch.cuda APIs, CUDA builds, devices, NCCL and setup() requirements."""

from __future__ import annotations

import ast

from remotemac.checks.audit_rules import pycalls, pyguards
from remotemac.checks.audit_rules.cuda_api import behaviour
from remotemac.checks.audit_rules.deps_rules import SETUP_KWARGS, requirement_rules
from remotemac.checks.audit_rules.mixin import ScannerMixin
from remotemac.checks.audit_rules.model import NOTE

_OPTIONAL_KWARGS = frozenset({"extras_require", "tests_require"})


class CallRules(ScannerMixin):
    """Calls and what their arguments say."""

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = self.dotted(func) or ""
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and name != "torch.cuda":
            if not self.guard and not self._in_function("cuda"):
                self.hit("dot-cuda", func.end_lineno or node.lineno)  # the .cuda( line
        elif name.startswith("torch.cuda."):
            self._torch_cuda_call(name[len("torch.cuda.") :], node)
        elif name.endswith("get_device_capability") and not self.guard:
            self.hit("capability-check", node)
        if name.endswith("CUDAExtension") or (
            name.startswith("torch.utils.cpp_extension.load") and pycalls.loads_cuda(node)
        ):
            self._cuda_build(node)
        if name in pycalls.SUBPROCESS and any(pycalls.is_nvcc(a) for a in node.args):
            self.hit("nvcc", node)
        self._call_args(name, func, node)
        self._process_group(name, node)
        if name.endswith((".spawn", ".start_processes")) and not self.guard:
            self._spawn_size(node)
        self.generic_visit(node)

    def _spawn_size(self, node: ast.Call) -> None:
        """``mp.spawn(fn, nprocs=torch.cuda.device_count())``, directly or through a name."""
        nprocs = next((kw.value for kw in node.keywords if kw.arg == "nprocs"), None)
        if nprocs is None and len(node.args) >= 3:
            nprocs = node.args[2]
        if isinstance(nprocs, ast.Name):
            bound = [
                v for v in self.flow.bindings.get(nprocs.id, []) if not isinstance(v, ast.Pass)
            ]
            if bound and all(self._is_device_count(v) for v in bound):
                self.hit(
                    "device-count-spawn",
                    node,
                    why_suffix=f"Here through {nprocs.id} (line {bound[0].lineno}).",
                )
        elif nprocs is not None and self._is_device_count(nprocs):
            self.hit("device-count-spawn", node)

    def _is_device_count(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and (self.dotted(node.func) or "").endswith(
            "cuda.device_count"
        )

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
            if self.depth == 0 and not self.branch:
                self.hit("cuda-at-import", node)
            elif self.depth == 0:
                self.hit(
                    "cuda-call",
                    node,
                    why_suffix="Here at module level, on a conditional "
                    "path (an if-branch that is not a CUDA check).",
                )
            else:
                self.hit("cuda-call", node)
        elif kind == "unchecked":
            self.hit("cuda-unchecked", node)

    def _cuda_build(self, node: ast.Call) -> None:
        if not self.guard:
            self.hit("cuda-extension", node)
        elif self._has_cpp_build():
            self.hit("cpu-kernels-only", node)
        else:
            self.hit(
                "cuda-extension",
                node,
                severity=NOTE,
                why_suffix="Here it is only built when CUDA is present.",
            )

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
        if takes_device and node.args and pyguards.is_cuda_const(node.args[0]) and not self.guard:
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
                        self.hit(
                            rule, n, severity=NOTE, why_suffix="Here a marker keeps it off macOS."
                        )
                    elif optional:
                        self.hit(
                            rule,
                            n,
                            severity=NOTE,
                            why_suffix="Here it is an optional extra, not installed by default.",
                        )
                    else:
                        self.hit(rule, n)

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
        value = (
            self.dotted(node.value) if isinstance(node.value, (ast.Name, ast.Attribute)) else None
        )
        if value and value.endswith("CUDAExtension") and self.guard and self._has_cpp_build():
            self.hit("cpu-kernels-only", node)

    def _has_cpp_build(self) -> bool:
        return any(v.endswith("CppExtension") for v in self.flow.imports.values())
