"""Reading Python conditions: is this branch the CUDA one, does this code pick MPS?

Pure functions over ``ast`` nodes, so the scanner's guard logic can be tested
and reused (``and`` chains, ternaries, early exits) without a visitor.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

Dotted = Callable[[ast.AST], "str | None"]

_CUDA_DEVICE = re.compile(r"^cuda(:\d+)?$", re.I)
_MPS_DEVICE = re.compile(r"^mps(:\d+)?$", re.I)
_EXITS = ("exit", "abort", "skip", "skipTest")
#: a truthy value only on a CUDA (or ROCm) build of torch: ``if torch.version.hip:``,
#: ``torch.version.cuda and …``
_GPU_BUILD = ("torch.version.cuda", "torch.version.hip")
#: APIs whose presence is probed to choose between torch versions: the other branch is the
#: old torch's fallback (``torch.cuda.amp`` before ``torch.amp`` existed), not a Mac's path
_NEW_APIS = ("torch.amp", "torch.autocast", "torch.accelerator", "torch.get_autocast_dtype")


def is_cuda_const(node: ast.AST) -> bool:
    """``"cuda"``, ``"cuda:0"`` or an f-string starting with cuda."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(_CUDA_DEVICE.match(node.value))
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return (
            isinstance(first, ast.Constant)
            and isinstance(first.value, str)
            and first.value.lower().startswith("cuda")
        )
    return False


def selects_cuda_device(nodes: list[ast.AST]) -> bool:
    """A "cuda" device picked in code: assigned, returned, or given to torch.device /
    .to / device= (not any "cuda" string, which may be a name or a message)."""
    for top in nodes:
        if is_cuda_const(top):  # the value of a ternary
            return True
        for n in ast.walk(top):
            if isinstance(n, (ast.Assign, ast.AnnAssign, ast.Return)) and n.value is not None:
                if is_cuda_const(n.value):
                    return True
            elif isinstance(n, ast.Call):
                func = n.func
                attr = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if attr in ("device", "to") and n.args and is_cuda_const(n.args[0]):
                    return True
                if any(kw.arg == "device" and is_cuda_const(kw.value) for kw in n.keywords):
                    return True
    return False


def is_cuda_flag(n: ast.AST, dotted: Dotted) -> bool:
    """``use_cuda``, ``WITH_CUDA`` or ``args.cuda``: an opt-in flag, not the torch.cuda module."""
    if isinstance(n, ast.Name):
        return "cuda" in n.id.lower()
    if isinstance(n, ast.Attribute):
        return "cuda" in n.attr.lower() and not (dotted(n) or "").startswith("torch.")
    return False


def is_tensor_on_cuda(n: ast.AST) -> bool:
    """``x.is_cuda``: a tensor's own answer, as definite as torch.cuda.is_available()."""
    return isinstance(n, ast.Attribute) and n.attr == "is_cuda"


def is_guard(test: ast.AST, dotted: Dotted, *, strong: bool = False) -> bool:
    """Whether ``test`` being true selects the CUDA path.

    ``strong`` ignores ``use_cuda``-style flags: good enough to silence code
    behind them, too vague to claim the code requires CUDA. ``not …`` parts never
    count: ``not x.is_cuda`` selects the other path.
    """
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return False
    if isinstance(test, ast.BoolOp):
        found = [is_guard(v, dotted, strong=strong) for v in test.values]
        return all(found) if isinstance(test.op, ast.Or) else any(found)
    if isinstance(test, ast.Call):
        name = dotted(test.func) or ""
        if name.endswith(("cuda.is_available", "cuda.device_count")):
            return True
    elif isinstance(test, ast.Compare):
        positive = all(isinstance(op, (ast.Eq, ast.Is, ast.In)) for op in test.ops)
        if positive and any(is_cuda_const(c) for c in [test.left, *test.comparators]):
            return True
    elif (
        is_tensor_on_cuda(test)
        or (not strong and is_cuda_flag(test, dotted))
        or (isinstance(test, ast.Attribute) and dotted(test) in _GPU_BUILD)
    ):
        return True
    return any(
        is_guard(child, dotted, strong=strong)
        for child in ast.iter_child_nodes(test)
        if not isinstance(child, ast.expr_context)
    )


def api_probe(test: ast.AST, dotted: Dotted) -> bool | None:
    """``hasattr(torch.amp, "GradScaler")`` → True (the test is true on a new torch),
    ``not hasattr(torch, "autocast")`` → False; None when the test probes no torch API."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = api_probe(test.operand, dotted)
        return None if inner is None else not inner
    if not (isinstance(test, ast.Call) and dotted(test.func) in ("hasattr", "getattr")):
        return None
    if len(test.args) < 2 or not (
        isinstance(test.args[1], ast.Constant) and isinstance(test.args[1].value, str)
    ):
        return None
    owner = dotted(test.args[0]) or ""
    return True if owner == "torch" or owner.startswith("torch.") else None


def uses_new_api(nodes: list[ast.stmt], dotted: Dotted) -> bool:
    """The body of ``try: <new API> except …: <old API>`` (torch.amp, torch.autocast …)."""
    for top in nodes:
        for n in ast.walk(top):
            if isinstance(n, ast.ImportFrom) and n.module:
                names = [f"{n.module}.{a.name}" for a in n.names] + [n.module]
                if any(name.startswith(_NEW_APIS) for name in names):
                    return True
            elif isinstance(n, ast.Attribute) and (dotted(n) or "").startswith(_NEW_APIS):
                return True
    return False


def is_main_check(test: ast.AST) -> bool:
    """``if __name__ == "__main__":`` (the script's entry, not an opt-in path)."""
    return isinstance(test, ast.Compare) and any(
        isinstance(n, ast.Name) and n.id == "__name__" for n in [test.left, *test.comparators]
    )


def is_negated_guard(test: ast.AST, dotted: Dotted) -> bool:
    """``not torch.cuda.is_available()`` or ``device.type != "cuda"``; in an ``or`` chain one
    such part is enough (``if not cuda or not flash: return`` leaves CUDA behind)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(is_negated_guard(v, dotted) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        operand = test.operand
        return is_guard(operand, dotted, strong=True) or is_cuda_flag(operand, dotted)
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.NotEq, ast.IsNot, ast.NotIn))
    ):
        return any(is_cuda_const(c) for c in [test.left, *test.comparators])
    return False


def terminates(body: list[ast.stmt], dotted: Dotted) -> bool:
    """A block that never falls through: return, raise, continue, break or sys.exit()."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise, ast.Continue, ast.Break)):
        return True
    return (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and (dotted(last.value.func) or "").endswith(_EXITS)
    )


def refuses_without_cuda(node: ast.If, dotted: Dotted) -> bool:
    """``if not torch.cuda.is_available(): raise …`` (the code requires CUDA)."""
    t = node.test
    return (
        isinstance(t, ast.UnaryOp)
        and isinstance(t.op, ast.Not)
        and is_guard(t.operand, dotted, strong=True)
        and any(
            isinstance(s, ast.Raise)
            or (
                isinstance(s, ast.Expr)
                and isinstance(s.value, ast.Call)
                and (dotted(s.value.func) or "").endswith(("exit", "abort"))
            )
            for s in node.body
        )
    )


def picks_mps(nodes: list[ast.AST], *, own_code_only: bool = False) -> bool:
    """Code (not a comment) that names the MPS device: ``"mps"``, ``torch.backends.mps``,
    ``torch.mps``. ``own_code_only`` leaves out nested function and class bodies (a
    module's device list is not fixed by a helper defined in it)."""
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            if _MPS_DEVICE.match(n.value):
                return True
        elif isinstance(n, ast.Attribute) and n.attr == "mps":
            return True
        for child in ast.iter_child_nodes(n):
            if own_code_only and isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
            ):
                continue
            stack.append(child)
    return False
