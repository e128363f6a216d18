"""Simple value flow inside one module: which string a name, option or key holds.

``backend = "nccl"`` … ``init_process_group(backend=backend)`` is the same NCCL
requirement as the literal, and ``Extension = CppExtension if … else
CUDAExtension`` is the same build choice as a direct call. One pre-pass over the
module records:

- names bound to exactly one string constant, everywhere in the module
  (assignments and parameter defaults; a name bound to two different values or
  to anything else is a switch, so it resolves to nothing);
- argparse options' defaults, by ``dest``, read back through ``args.dest``;
- dict literals and ``dict(...)`` calls bound to a name, read back through
  ``d["k"]``, ``d.get("k")`` and ``**d``;
- aliases: a name bound once to an imported attribute (``cuda = torch.cuda``),
  and conditional aliases (``A if cond else B``) that choose between two.

Scopes are flattened: a module is small enough that a name reused for two
meanings is rare, and the "exactly one value" rule keeps that rare case quiet.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

_UNKNOWN = object()  # a binding to something that is not a string constant
_ENV_GETTERS = frozenset({"os.environ.get", "os.getenv"})


@dataclass
class Flow:
    """What the pre-pass learnt about one module."""

    imports: dict[str, str] = field(default_factory=dict)
    strings: dict[str, list[object]] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    options: dict[str, tuple[str, int]] = field(default_factory=dict)
    dicts: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)
    bindings: dict[str, list[ast.AST]] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    choices: dict[str, tuple[list[str], int]] = field(default_factory=dict)

    # ------------------------------------------------------------------ reading
    def dotted(self, node: ast.AST) -> str | None:
        """``a.b.c`` with the root resolved through imports and assigned aliases."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        root = self.imports.get(node.id) or self.aliases.get(node.id) or node.id
        parts.append(root)
        return ".".join(reversed(parts))

    def string(self, node: ast.AST | None) -> tuple[str, int] | None:
        """The one string ``node`` evaluates to, and the line it was written on."""
        if node is None:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value, node.lineno
        if isinstance(node, ast.Name):
            values = self.strings.get(node.id)
            if values and all(v == values[0] for v in values) and isinstance(values[0], str):
                return values[0], self.lines[node.id]
            return None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return self.options.get(node.attr)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return self.dicts.get(node.value.id, {}).get(key.value)
            return None
        if isinstance(node, ast.Call):
            return self._call_string(node)
        return None

    def _call_string(self, node: ast.Call) -> tuple[str, int] | None:
        func = node.func
        name = self.dotted(func) or ""
        if name in _ENV_GETTERS and len(node.args) >= 2:
            return self.string(node.args[1])
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "get"
            and isinstance(func.value, ast.Name)
            and node.args
        ):
            key = node.args[0]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                found = self.dicts.get(func.value.id, {}).get(key.value)
                if found:
                    return found
                return self.string(node.args[1]) if len(node.args) >= 2 else None
        return None

    def keyword_string(self, call: ast.Call, keyword: str) -> tuple[str, int] | None:
        """The string passed as ``keyword=`` directly or through ``**d``."""
        for kw in call.keywords:
            if kw.arg == keyword:
                return self.string(kw.value)
            if kw.arg is None and isinstance(kw.value, ast.Name):
                found = self.dicts.get(kw.value.id, {}).get(keyword)
                if found:
                    return found
        return None

    # ------------------------------------------------------------------ building
    def bind(self, name: str, value: ast.AST | None, line: int) -> None:
        self.bindings.setdefault(name, []).append(value if value is not None else ast.Pass())
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            self.strings.setdefault(name, []).append(value.value)
            self.lines.setdefault(name, line)
        else:
            self.strings.setdefault(name, []).append(_UNKNOWN)
        if isinstance(value, ast.Dict):
            self.dicts[name] = {
                k.value: (v.value, v.lineno)
                for k, v in zip(value.keys, value.values, strict=True)
                if isinstance(k, ast.Constant)
                and isinstance(k.value, str)
                and isinstance(v, ast.Constant)
                and isinstance(v.value, str)
            }
        elif (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and (value.func.id == "dict")
        ):
            self.dicts[name] = {
                kw.arg: (kw.value.value, kw.value.lineno)
                for kw in value.keywords
                if kw.arg and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)
            }

    def option(self, call: ast.Call) -> None:
        """``parser.add_argument("--dist-backend", default="nccl")`` → dist_backend."""
        default = next((kw.value for kw in call.keywords if kw.arg == "default"), None)
        if not (isinstance(default, ast.Constant) and isinstance(default.value, str)):
            return
        dest = next(
            (
                kw.value.value
                for kw in call.keywords
                if kw.arg == "dest" and isinstance(kw.value, ast.Constant)
            ),
            None,
        )
        if dest is None:
            flags = [
                a.value
                for a in call.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
            long = [f for f in flags if f.startswith("--")] or flags
            if not long:
                return
            dest = long[0].lstrip("-").replace("-", "_")
        self.options[str(dest)] = (default.value, default.lineno)

    def resolve_aliases(self) -> None:
        """Names bound once to a dotted name, or to ``A if cond else B`` of two names."""
        for name, values in self.bindings.items():
            if len(values) != 1:
                continue
            value = values[0]
            if isinstance(value, (ast.Name, ast.Attribute)):
                target = self.dotted(value)
                if target and target != name and "." in target:
                    self.aliases[name] = target
            elif isinstance(value, ast.IfExp):
                options = [self.dotted(v) for v in (value.body, value.orelse)]
                if all(options):
                    self.choices[name] = ([str(o) for o in options], value.lineno)


def build_flow(tree: ast.AST) -> Flow:
    """One pass over ``tree``'s statements (expressions are not entered, for speed)
    collecting imports, bindings, argparse options and dicts."""
    flow = Flow()
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        _collect(flow, node)
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            children = getattr(node, name, None)
            if isinstance(children, list):
                stack.extend(children)
    flow.resolve_aliases()
    return flow


_BINDERS = (
    ast.Import,
    ast.ImportFrom,
    ast.Assign,
    ast.AnnAssign,
    ast.AugAssign,
    ast.For,
    ast.AsyncFor,
    ast.With,
    ast.AsyncWith,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Expr,
)


def _collect(flow: Flow, node: ast.AST) -> None:
    """What one statement binds or declares."""
    if not isinstance(node, _BINDERS):
        return
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.asname:
                flow.imports[a.asname] = a.name
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for a in node.names:
            flow.imports[a.asname or a.name] = f"{node.module}.{a.name}"
    elif isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                flow.bind(target.id, node.value, node.lineno)
            elif isinstance(target, (ast.Tuple, ast.List)):
                for elt in target.elts:
                    if isinstance(elt, ast.Name):
                        flow.bind(elt.id, None, node.lineno)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        flow.bind(
            node.target.id, node.value if isinstance(node, ast.AnnAssign) else None, node.lineno
        )
    elif isinstance(node, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith)):
        targets = (
            [node.target]
            if isinstance(node, (ast.For, ast.AsyncFor))
            else [i.optional_vars for i in node.items if i.optional_vars is not None]
        )
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    flow.bind(n.id, None, node.lineno)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        positional = args.posonlyargs + args.args
        defaults: list[ast.AST | None] = [None] * (len(positional) - len(args.defaults))
        defaults += list(args.defaults)
        for arg, default in [
            *zip(positional, defaults, strict=True),
            *zip(args.kwonlyargs, args.kw_defaults, strict=True),
        ]:
            flow.bind(arg.arg, default, getattr(default, "lineno", node.lineno))
    elif (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "add_argument"
    ):
        flow.option(node.value)
