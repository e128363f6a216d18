"""A pure-PyTorch path beside a project's CUDA kernels, named so a Mac run can take it.

Projects with CUDA kernels often keep the same computation in PyTorch ops, for tests
or as the slow path: mamba-ssm's ``selective_scan_ref`` beside ``selective_scan_cuda``,
causal-conv1d's ``causal_conv1d_ref``. The kernels stay a blocker on MPS, but the
verdict should name the way round them instead of "no drop-in replacement".

A project pass over every Python file's text (``ImportLog.texts``), after the scan:

- kernel modules: imports of the project's own CUDA extension (a ``CUDAExtension``
  name in its setup.py) or of a module named ``<stem>_cuda`` (``_cuda_ext``,
  ``_cuda_kernels``) that is not one of the project's Python modules;
- a reference is a top-level function of the same file that calls no kernel and no
  kernel wrapper, named ``<stem>_ref`` / ``_reference`` / ``_naive`` / ``_torch`` /
  ``_pytorch`` / ``_python`` / ``_slow`` (or with the word first), where the stem is the
  kernel module's or a wrapper's (``selective_scan_fn``, ``SelectiveScanFn``);
- or the other branch of a dispatch ``if``/``else`` whose one branch calls a kernel
  and whose other calls such a pure function of the file.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from remotemac.checks.audit_rules.model import Finding, make
from remotemac.checks.audit_rules.parsing import parse_source

_KERNEL_NAME = re.compile(r"^(?P<stem>[a-z0-9_]*[a-z0-9])_cuda(?:_ext|_kernels?|_lib|_C)?$", re.I)
_REF_WORDS = ("ref", "reference", "naive", "torch", "pytorch", "python", "slow")
_WRAPPER_SUFFIX = re.compile(r"(_(fn|func|function|cuda|kernel|op|fwd|forward|interface))+$")
_REASON = re.compile(
    r"CUDA kernels \((?P<mod>[^)]+)\): blocker on MPS; (?P<paths>.+?) (?:is a|are) pure-PyTorch"
)
_WHERE = re.compile(r" \([^()]*:\d+\)")


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower().lstrip("_")


def _stem(name: str) -> str:
    return _WRAPPER_SUFFIX.sub("", _snake(name))


def extension_names(texts: dict[str, bytes]) -> set[str]:
    """The module names the project's ``CUDAExtension(...)`` calls build."""
    names: set[str] = set()
    for rel, data in texts.items():
        if b"CUDAExtension" not in data:
            continue
        try:
            tree = parse_source(data, filename=rel)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Call) and _call_name(n.func).endswith("CUDAExtension")):
                continue
            value = n.args[0] if n.args else None
            value = next((k.value for k in n.keywords if k.arg == "name"), value)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                names.add(value.value.rsplit(".", 1)[-1])
    return names


def _call_name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _kernel_imports(tree: ast.Module, built: set[str], own: set[str]) -> dict[str, tuple[str, int]]:
    """Local name → (kernel module, import line) for the file's kernel-module imports."""
    found: dict[str, tuple[str, int]] = {}

    def consider(full: str, local: str, line: int) -> None:
        last = full.rsplit(".", 1)[-1]
        if full.startswith("torch") or full in own or last in own:
            return
        if last in built or _KERNEL_NAME.match(last):
            found[local] = (last, line)

    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                consider(a.name, a.asname or a.name.split(".")[0], n.lineno)
        elif isinstance(n, ast.ImportFrom):
            if (n.module or "").rsplit(".", 1)[-1] in own:
                continue  # names from one of the project's Python modules are Python objects
            for a in n.names:
                consider(f"{n.module or ''}.{a.name}".lstrip("."), a.asname or a.name, n.lineno)
    return found


def _calls(node: ast.AST) -> Iterable[ast.Call]:
    return (n for n in ast.walk(node) if isinstance(n, ast.Call))


def _root(func: ast.AST) -> str:
    while isinstance(func, ast.Attribute):
        func = func.value
    return func.id if isinstance(func, ast.Name) else ""


def _tops(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    return [
        n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]


def _calls_kernel(node: ast.AST, kernels: dict[str, tuple[str, int]], wrappers: set[str]) -> bool:
    return any(
        _root(c.func) in kernels or _root(c.func) in wrappers or _call_name(c.func) in wrappers
        for c in _calls(node)
    )


def _wrappers(tree: ast.Module, kernels: dict[str, tuple[str, int]]) -> set[str]:
    """Top-level functions and classes that call a kernel, directly or through another
    (selective_scan_fn → SelectiveScanFn.apply → selective_scan_cuda.fwd)."""
    wrappers: set[str] = set()
    changed = True
    while changed:
        changed = False
        for t in _tops(tree):
            if t.name not in wrappers and _calls_kernel(t, kernels, wrappers):
                wrappers.add(t.name)
                changed = True
    return wrappers


def _file_references(tree: ast.Module, kernels: dict[str, tuple[str, int]]):  # noqa: ANN202
    """(kernel module, import line, reference name, its line) found in one file."""
    tops = _tops(tree)
    wrappers = _wrappers(tree, kernels)

    def calls_kernel(node: ast.AST, wrappers: set[str]) -> bool:
        return _calls_kernel(node, kernels, wrappers)

    pure = {
        t.name: t
        for t in tops
        if isinstance(t, (ast.FunctionDef, ast.AsyncFunctionDef)) and t.name not in wrappers
    }
    stems = {_stem(m) for m, _ in kernels.values()}
    stems |= {_stem(w) for w in wrappers}
    stems.discard("")
    named = [
        name
        for name in pure
        if any(
            name.lower().lstrip("_") in (f"{s}_{w}", f"{w}_{s}") for s in stems for w in _REF_WORDS
        )
    ]
    for n in ast.walk(tree):
        if not isinstance(n, (ast.If, ast.IfExp)):
            continue
        body = n.body if isinstance(n, ast.If) else [n.body]
        orelse = n.orelse if isinstance(n, ast.If) else [n.orelse]
        for kernel_side, other in ((body, orelse), (orelse, body)):
            if any(calls_kernel(s, wrappers) for s in kernel_side):
                for s in other:
                    named += [_call_name(c.func) for c in _calls(s) if _call_name(c.func) in pure]
    module, line = min(kernels.values(), key=lambda v: v[1])
    seen: set[str] = set()
    for name in named:
        if name not in seen:
            seen.add(name)
            yield module, line, name, pure[name].lineno


def _parse(rel: str, data: bytes) -> ast.Module | None:
    try:
        return parse_source(data, filename=rel)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _module_names(rel: str) -> set[str]:
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return {".".join(parts[i:]) for i in range(len(parts))}


def _imported_wrappers(
    tree: ast.Module, exported: dict[str, tuple[str, int, set[str]]]
) -> dict[str, tuple[str, int]]:
    """Local names bound to another file's kernel wrappers (``from pkg.cpp_functions
    import conv_fwd_function``; ``from pkg import cpp_functions``)."""
    found: dict[str, tuple[str, int]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and not n.level:
            for a in n.names:
                whole = f"{n.module}.{a.name}"
                if n.module in exported and a.name in exported[n.module][2]:
                    found[a.asname or a.name] = (exported[n.module][0], n.lineno)
                elif whole in exported:
                    found[a.asname or a.name] = (exported[whole][0], n.lineno)
        elif isinstance(n, ast.Import):
            for a in n.names:
                if a.name in exported and a.asname:
                    found[a.asname] = (exported[a.name][0], n.lineno)
    return found


def reference_paths(texts: dict[str, bytes], keep: set[str]) -> list[Finding]:
    """One note per file that calls CUDA kernels (directly or through another file's
    wrappers) and holds a pure-PyTorch path for them; ``keep`` are the files whose
    findings count (the project's own code)."""
    built = extension_names(texts)
    own = {rel[:-3].replace("/", ".").rsplit(".", 1)[-1] for rel in texts if rel.endswith(".py")}
    own -= built
    sources = {
        rel: data
        for rel, data in sorted(texts.items())
        if rel in keep and rel.endswith(".py") and b"import" in data
    }
    trees: dict[str, ast.Module] = {}
    direct: dict[str, dict[str, tuple[str, int]]] = {}
    exported: dict[str, tuple[str, int, set[str]]] = {}  # module name → (kernel, line, names)
    for rel, data in sources.items():
        if b"_cuda" not in data.lower() and not any(b.encode() in data for b in built):
            continue
        tree = _parse(rel, data)
        kernels = _kernel_imports(tree, built, own) if tree is not None else {}
        if tree is None or not kernels:
            continue
        trees[rel], direct[rel] = tree, kernels
        module, line = min(kernels.values(), key=lambda v: v[1])
        for name in _module_names(rel):
            exported[name] = (module, line, _wrappers(tree, kernels))
    stems = {name.rsplit(".", 1)[-1].encode() for name in exported}
    out: list[Finding] = []
    for rel, data in sources.items():
        kernels = dict(direct.get(rel, {}))
        if rel not in trees and any(stem in data for stem in stems):
            tree = _parse(rel, data)
            if tree is not None:
                trees[rel] = tree
        if rel not in trees:
            continue
        kernels.update(_imported_wrappers(trees[rel], exported))
        refs = list(_file_references(trees[rel], kernels)) if kernels else []
        if refs:
            out.append(_note(rel, data, refs))
    return out


def _note(rel: str, data: bytes, refs: list[tuple[str, int, str, int]]) -> Finding:
    module, line = refs[0][0], refs[0][1]
    paths = ", ".join(f"`{name}` ({rel}:{at})" for _, _, name, at in refs)
    text = data.decode("utf-8", "replace").splitlines()[line - 1].strip()
    return make(
        "reference-path",
        rel,
        line,
        text,
        why_suffix=f"Here: CUDA kernels ({module}): blocker on MPS; {paths} "
        + _switch(len(refs))
        + ".",
    )


def _switch(count: int) -> str:
    if count == 1:
        return "is a pure-PyTorch path: switch to it on mps"
    return "are pure-PyTorch paths: switch to them on mps"


def verdict_reasons(findings: list[Finding]) -> list[str]:
    """The verdict's line for each kernel module with a reference path."""
    out: list[str] = []
    for f in findings:
        m = _REASON.search(f.why) if f.rule == "reference-path" else None
        if m:
            names = _WHERE.sub("", m["paths"])
            out.append(
                f"CUDA kernels ({m['mod']}): blocker on MPS; {names} "
                f"{_switch(names.count('`') // 2)} ({f.where()})."
            )
    return out
