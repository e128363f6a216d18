"""Shapes of Python calls the scanner cares about: builds, nvcc, device arguments."""

from __future__ import annotations

import ast

SUBPROCESS = frozenset(
    {
        "subprocess.run",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "subprocess.Popen",
        "os.system",
        "os.popen",
        "os.execvp",
        "os.spawnlp",
    }
)
DEVICE_KWARGS = frozenset({"device", "map_location", "device_type", "default_device"})
PROCESS_GROUP = ("init_process_group", "new_group")


def loads_cuda(node: ast.Call) -> bool:
    """``cpp_extension.load(...)`` given CUDA sources or ``with_cuda=True``."""
    for kw in node.keywords:
        if kw.arg == "cuda_sources":
            return True
        if kw.arg == "with_cuda" and isinstance(kw.value, ast.Constant) and kw.value.value:
            return True
    sources = [kw.value for kw in node.keywords if kw.arg == "sources"] + node.args[1:2]
    for src in sources:
        for n in ast.walk(src):
            if (
                isinstance(n, ast.Constant)
                and isinstance(n.value, str)
                and n.value.endswith((".cu", ".cuh"))
            ):
                return True
    return False


def is_nvcc(arg: ast.AST) -> bool:
    """A subprocess argument (string or list) whose program is nvcc."""
    items = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
    if not items:
        return False
    first = items[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        words = first.value.split()
        return bool(words) and words[0].rsplit("/", 1)[-1] == "nvcc"
    return False


def device_keyword(arg: str | None, node: ast.Call) -> bool:
    """device=/map_location=…, or argparse's default= for a --device option."""
    if arg in DEVICE_KWARGS:
        return True
    return arg == "default" and any(
        isinstance(a, ast.Constant)
        and isinstance(a.value, str)
        and ("device" in a.value or "gpu" in a.value)
        for a in node.args
    )


def is_device_target(target: ast.AST) -> bool:
    """An assignment target named like a device (device, dev, gpu, self.device)."""
    name = (
        target.id
        if isinstance(target, ast.Name)
        else (target.attr if isinstance(target, ast.Attribute) else "")
    )
    name = name.lower()
    return "device" in name or name in ("dev", "gpu")


def nvcc_flags(value: ast.AST) -> bool:
    """``extra_compile_args={"nvcc": [...]}``."""
    return isinstance(value, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == "nvcc" for k in value.keys
    )
