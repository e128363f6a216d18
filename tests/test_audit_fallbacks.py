"""Audit, round two (issue 34): reference paths beside CUDA kernels, version and API
fallbacks, notebook shell lines, and ``device_count()`` sizing a spawn.

Each pattern is a small reproduction of what the public projects of the issue do (an SSM
package with CUDA kernels and a pure-PyTorch reference; trainers that support old and new
torch; QLoRA notebooks; DDP scripts started with ``mp.spawn``), written to real files and
audited as a project.
"""

from __future__ import annotations

import json
from pathlib import Path

from remotemac.checks.audit import audit_project

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "audit"


def _audit(tmp_path: Path, files: dict[str, str]) -> set[tuple[str, int, str, str]]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return {(f.file, f.line, f.rule, f.severity) for f in audit_project(tmp_path).findings}


# ------------------------------------------------------------------ reference paths


def test_a_pure_pytorch_reference_beside_cuda_kernels_is_named() -> None:
    report = audit_project(FIXTURES / "ssm_ref")
    refs = [f for f in report.findings if f.rule == "reference-path"]
    assert [(f.file, f.line) for f in refs] == [("ssm_like/ops/selective_scan_interface.py", 4)]
    assert "`selective_scan_ref` (ssm_like/ops/selective_scan_interface.py:25)" in refs[0].why
    assert "is a pure-PyTorch path: switch to it on mps" in refs[0].why
    assert report.verdict == "keep-linux"  # the kernels themselves still do not build
    said = " ".join(report.reasons)
    assert "CUDA kernels (selective_scan_cuda): blocker on MPS" in said, said
    assert "`selective_scan_ref` is a pure-PyTorch path: switch to it on mps" in said, said


KERNEL_DISPATCH = """import torch

import causal_conv_cuda


def _conv_fallback(x, w):
    return torch.nn.functional.conv1d(x, w, padding=w.shape[-1] - 1)[..., : x.shape[-1]]


def causal_conv(x, w):
    if x.is_cuda:
        return causal_conv_cuda.fwd(x, w)
    else:
        return _conv_fallback(x, w)
"""


def test_a_dispatch_if_else_names_the_pure_pytorch_branch(tmp_path: Path) -> None:
    _audit(tmp_path, {"conv.py": KERNEL_DISPATCH})
    (ref,) = [f for f in audit_project(tmp_path).findings if f.rule == "reference-path"]
    assert ref.line == 3 and "`_conv_fallback` (conv.py:6)" in ref.why, ref.why


def test_a_ref_named_function_that_calls_the_kernel_is_not_a_reference(tmp_path: Path) -> None:
    source = (
        "import scan_cuda\n\n\ndef scan_ref(x):\n    return scan_cuda.fwd(x)\n\n\n"
        "def scan(x):\n    return scan_cuda.fwd(x)\n"
    )
    _audit(tmp_path, {"scan.py": source})
    assert not [f for f in audit_project(tmp_path).findings if f.rule == "reference-path"]


# ------------------------------------------------------------------ guards and fallbacks


def test_rocm_and_cuda_version_guards_are_guards(tmp_path: Path) -> None:
    source = """import torch


def setup(model):
    if torch.version.hip:
        torch.backends.cudnn.benchmark = True
        device = "cuda"
    fused = torch.version.cuda and torch.cuda.get_device_capability()[0] >= 8
    return model, fused
"""
    # only the note that this device choice has no mps branch: the code is the ROCm path
    assert _audit(tmp_path, {"setup_model.py": source}) == {
        ("setup_model.py", 5, "no-mps-branch", "note")
    }


def test_hasattr_torch_amp_fallback_is_not_the_mac_path(tmp_path: Path) -> None:
    source = """import torch


def make_scaler():
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler()
    else:
        return torch.cuda.amp.GradScaler()


def make_autocast():
    if not hasattr(torch, "autocast"):
        return torch.cuda.amp.autocast()
    return torch.autocast("cpu")
"""
    assert _audit(tmp_path, {"amp_compat.py": source}) == set()


def test_try_new_api_except_torch_cuda_amp_is_a_fallback(tmp_path: Path) -> None:
    source = """import torch

try:
    from torch.amp import GradScaler, autocast
except ImportError:
    from torch.cuda.amp import GradScaler, autocast


def scaler():
    try:
        return torch.amp.GradScaler("cpu")
    except (AttributeError, TypeError):
        return torch.cuda.amp.GradScaler()
"""
    assert _audit(tmp_path, {"amp_try.py": source}) == set()


def test_torch_cuda_amp_without_a_new_api_beside_it_is_still_found(tmp_path: Path) -> None:
    source = "import torch\n\ntry:\n    import apex\nexcept ImportError:\n    pass\n\n" + (
        "scaler = torch.cuda.amp.GradScaler()\n"
    )
    found = _audit(tmp_path, {"old_amp.py": source})
    assert ("old_amp.py", 8, "cuda-amp", "needs-refactor") in found, found


# ------------------------------------------------------------------ notebooks


def _notebook(*cells: str) -> str:
    return json.dumps(
        {
            "cells": [
                {"cell_type": "code", "source": c.splitlines(keepends=True), "metadata": {}}
                for c in cells
            ],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def test_notebook_shell_lines_are_scanned_as_shell(tmp_path: Path) -> None:
    nb = _notebook(
        "!pip install -q -U bitsandbytes transformers\n%pip install flash-attn==2.5.8\n",
        "import torch\n!pip install numpy\nx = torch.ones(2)\n",
        "%%bash\npip install --upgrade xformers\nnvcc --version\n",
        "%%capture\n!pip install torch --index-url https://download.pytorch.org/whl/cu121\n",
    )
    report = audit_project(_write(tmp_path, "qlora.ipynb", nb))
    got = {(f.cell, f.line, f.rule, f.severity) for f in report.findings}
    assert got == {
        (1, 1, "bitsandbytes", "blocker"),
        (1, 2, "flash-attn", "blocker"),
        (3, 2, "xformers", "blocker"),
        (4, 2, "cuda-index", "needs-refactor"),
    }, got
    assert any(f.where() == "qlora.ipynb:cell 1:line 1" for f in report.findings)


def _write(root: Path, name: str, text: str) -> Path:
    (root / name).write_text(text, encoding="utf-8")
    return root


# ------------------------------------------------------------------ spawn sized by device_count


def test_device_count_sizing_a_spawn_is_found(tmp_path: Path) -> None:
    source = """import torch
import torch.multiprocessing as mp


def main(rank, world_size):
    pass


if __name__ == "__main__":
    mp.spawn(main, args=(1,), nprocs=torch.cuda.device_count())
"""
    indirect = """import torch
from torch.multiprocessing import spawn


def run(rank, n):
    pass


def launch():
    world_size = torch.cuda.device_count()
    spawn(run, args=(world_size,), nprocs=world_size, join=True)
"""
    found = _audit(tmp_path, {"ddp.py": source, "launch.py": indirect})
    assert ("ddp.py", 10, "device-count-spawn", "needs-refactor") in found, found
    assert ("launch.py", 11, "device-count-spawn", "needs-refactor") in found, found


def test_a_spawn_sized_safely_is_not_found(tmp_path: Path) -> None:
    source = """import torch
import torch.multiprocessing as mp


def main(rank):
    pass


def launch():
    n = max(1, torch.cuda.device_count())
    mp.spawn(main, nprocs=n)
    if torch.cuda.is_available():
        mp.spawn(main, nprocs=torch.cuda.device_count())
"""
    found = _audit(tmp_path, {"safe.py": source})
    assert not [f for f in found if f[2] == "device-count-spawn"], found


def test_a_reference_beside_wrappers_imported_from_the_kernel_module_is_named(
    tmp_path: Path,
) -> None:
    """causal-conv1d 1.7.0's layout: ``cpp_functions.py`` imports the kernels and wraps
    them; ``causal_conv1d_interface.py`` imports the wrappers and holds ``_ref``."""
    wrappers = (
        "import torch\n\nimport conv1d_cuda\n\n\n"
        "def conv1d_fwd_function(x, w):\n    return conv1d_cuda.conv1d_fwd(x, w)\n"
    )
    interface = (
        "import torch\n\nfrom convpkg.cpp_functions import conv1d_fwd_function\n\n\n"
        "class Conv1dFn(torch.autograd.Function):\n"
        "    @staticmethod\n    def forward(ctx, x, w):\n"
        "        return conv1d_fwd_function(x, w)\n\n\n"
        "def conv1d_fn(x, w):\n    return Conv1dFn.apply(x, w)\n\n\n"
        "def conv1d_ref(x, w):\n    return torch.nn.functional.conv1d(x, w)\n"
    )
    _audit(
        tmp_path,
        {
            "convpkg/__init__.py": "",
            "convpkg/cpp_functions.py": wrappers,
            "convpkg/interface.py": interface,
        },
    )
    (ref,) = [f for f in audit_project(tmp_path).findings if f.rule == "reference-path"]
    assert (ref.file, ref.line) == ("convpkg/interface.py", 3)
    assert (
        "CUDA kernels (conv1d_cuda)" in ref.why
        and "`conv1d_ref` (convpkg/interface.py:16)" in ref.why
    )


def test_a_function_named_cuda_from_a_project_module_is_no_kernel(tmp_path: Path) -> None:
    """ring-attention-pytorch 0.5.20: ``from pkg.ring_flash_attention_cuda import
    ring_flash_attn_cuda`` is a Python function of the project (its Triton path)."""
    files = {
        "pkg/__init__.py": "",
        "pkg/ring_flash_attention_cuda.py": "import torch\n\n\ndef ring_flash_attn_cuda(q):\n"
        "    return q\n",
        "pkg/ring.py": "import torch\n\nfrom pkg.ring_flash_attention_cuda import "
        "ring_flash_attn_cuda\n\n\ndef ring_flash_attn_ref(q):\n    return q\n\n\n"
        "def attend(q):\n    if q.is_cuda:\n        return ring_flash_attn_cuda(q)\n"
        "    return ring_flash_attn_ref(q)\n",
    }
    _audit(tmp_path, files)
    assert not [f for f in audit_project(tmp_path).findings if f.rule == "reference-path"]
