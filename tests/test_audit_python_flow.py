"""Issue 18, Python side: small reproductions of what audit missed or got wrong on real
projects. Each writes one module to disk and audits it (no mocks)."""

from __future__ import annotations

from pathlib import Path

from remotemac.checks.audit import audit_project


def py(tmp_path: Path, source: str, name: str = "mod.py") -> set[tuple[int, str, str]]:
    """(line, rule, severity) for one Python file written to disk and audited."""
    (tmp_path / name).write_text(source)
    return {(f.line, f.rule, f.severity) for f in audit_project(tmp_path).findings}


def findings(tmp_path: Path, source: str, name: str = "mod.py"):
    (tmp_path / name).write_text(source)
    return audit_project(tmp_path).findings


# ------------------------------------------------------------------ value flow (missed)


def test_nccl_through_a_variable_is_found_at_the_call(tmp_path: Path) -> None:
    source = """import torch.distributed as dist

backend = 'nccl'


def setup(rank, world):
    dist.init_process_group(backend=backend, rank=rank, world_size=world)
"""
    found = findings(tmp_path, source)
    assert {(f.line, f.rule, f.severity) for f in found} == {(7, "nccl", "needs-refactor")}
    assert "line 3" in found[0].why


def test_nccl_through_argparse_default_dict_kwargs_and_env(tmp_path: Path) -> None:
    source = """import argparse
import os
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--dist-backend", default="nccl")
args = p.parse_args()
dist.init_process_group(backend=args.dist_backend)
cfg = dict(backend="nccl", init_method="env://")
dist.init_process_group(**cfg)
opts = {"backend": "nccl"}
dist.init_process_group(opts["backend"])
dist.new_group(backend=os.environ.get("BACKEND", "nccl"))
"""
    assert py(tmp_path, source) == {
        (8, "nccl", "needs-refactor"),
        (10, "nccl", "needs-refactor"),
        (12, "nccl", "needs-refactor"),
        (13, "nccl", "needs-refactor"),
    }


def test_a_backend_chosen_at_run_time_is_not_a_finding(tmp_path: Path) -> None:
    source = """import torch
import torch.distributed as dist

backend = "nccl" if torch.cuda.is_available() else "gloo"
dist.init_process_group(backend=backend)
other = "nccl"
if not torch.cuda.is_available():
    other = "gloo"
dist.init_process_group(other)
if torch.cuda.is_available():
    dist.init_process_group("nccl")
"""
    assert py(tmp_path, source) == {(11, "nccl", "note")}  # behind the CUDA check


def test_torch_backends_cuda_chains_and_imported_names(tmp_path: Path) -> None:
    source = """import torch
from torch.backends.cuda import sdp_kernel

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
with sdp_kernel(enable_flash=False):
    pass
if torch.cuda.is_available():
    torch.backends.cuda.matmul.allow_tf32 = False
"""
    assert py(tmp_path, source) == {
        (4, "cuda-backend-flag", "note"),
        (5, "cudnn-flag", "note"),
        (6, "cuda-backend-flag", "note"),
    }


def test_assigned_aliases_resolve(tmp_path: Path) -> None:
    source = """import torch
from torch.utils.cpp_extension import CUDAExtension

cuda = torch.cuda
Ext = CUDAExtension


def f():
    cuda.synchronize()


ext = Ext("x", ["x.cu"])
"""
    assert py(tmp_path, source) == {(9, "cuda-call", "note"), (12, "cuda-extension", "blocker")}


def test_alias_choosing_cpp_or_cuda_extension_is_an_optional_cuda_build(tmp_path: Path) -> None:
    source = """import os
from setuptools import setup
from torch.utils.cpp_extension import CppExtension, CUDAExtension

WITH_CUDA = os.getenv("FORCE_CUDA", "0") == "1"
Extension = CppExtension if not WITH_CUDA else CUDAExtension
setup(name="x", ext_modules=[Extension("x._C", ["csrc/x.cpp"])])
"""
    found = findings(tmp_path, source, "setup.py")
    assert {(f.line, f.rule, f.severity) for f in found} == {
        (6, "cpu-kernels-only", "needs-refactor")
    }
    assert "CPU kernels only on macOS" in found[0].why
    assert "mps tensors need a move to CPU" in found[0].why


def test_guarded_cuda_extension_with_a_cpp_build_is_cpu_kernels_only(tmp_path: Path) -> None:
    source = """import torch
from torch.utils.cpp_extension import CppExtension, CUDAExtension, CUDA_HOME

WITH_CUDA = torch.cuda.is_available() and CUDA_HOME is not None
ext = [CppExtension("x_cpu", ["cpu/x.cpp"])]
if WITH_CUDA:
    ext.append(CUDAExtension("x_cuda", ["cuda/x.cu"], extra_compile_args={"nvcc": ["-O3"]}))
"""
    assert py(tmp_path, source, "setup.py") == {(7, "cpu-kernels-only", "needs-refactor")}


# ------------------------------------------------------------------ reasons that cannot lie


def test_lazy_cuda_calls_are_not_said_to_raise(tmp_path: Path) -> None:
    source = """import torch

torch.cuda.manual_seed(0)
torch.cuda.manual_seed_all(0)
torch.cuda.empty_cache()


def f():
    torch.cuda.manual_seed(1)
    n = torch.cuda.memory_allocated()
    torch.cuda.synchronize()
    torch.cuda.jiterator._create_jit_fn("x")
    return n
"""
    found = findings(tmp_path, source)
    assert {(f.line, f.rule, f.severity) for f in found} == {
        (11, "cuda-call", "note"),
        (12, "cuda-unchecked", "note"),
    }
    raising = next(f for f in found if f.rule == "cuda-call")
    assert "raises" in raising.why and "checked on CPU-only torch" in raising.why
    unchecked = next(f for f in found if f.rule == "cuda-unchecked")
    assert "not checked" in unchecked.why and "may raise" in unchecked.why


def test_short_circuit_ternary_and_early_exit_guards(tmp_path: Path) -> None:
    source = """import torch

bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
ok = torch.cuda.is_available() and torch.cuda.synchronize()


def f(x):
    if not torch.cuda.is_available():
        return x
    torch.cuda.synchronize()
    return x.cuda()


def g(x):
    if x.device.type != "cuda":
        return x
    torch.cuda.synchronize()


def h(x):
    assert x.is_cuda
    torch.cuda.synchronize()


def i():
    torch.cuda.synchronize()
"""
    # h: x.is_cuda is a tensor's own answer, so the assert requires CUDA and guards the rest
    assert py(tmp_path, source) == {
        (22, "cuda-required", "needs-refactor"),
        (27, "cuda-call", "note"),
    }


def test_cuda_requirement_on_an_opt_in_branch_is_a_note(tmp_path: Path) -> None:
    source = """import torch


def attend(q, pack):
    if pack:
        assert q.device.type == "cuda", "packing needs flash-attn"
        major, _ = torch.cuda.get_device_capability(q.device)
    return q


def main(x):
    assert x.device.type == "cuda"
"""
    assert py(tmp_path, source) == {
        (6, "cuda-required", "note"),
        (12, "cuda-required", "needs-refactor"),
    }


def test_a_method_named_cuda_is_the_explicit_api(tmp_path: Path) -> None:
    source = """class Storage:
    def cuda(self):
        return Storage(self.col.cuda())

    def move(self):
        return self.col.cuda()
"""
    assert py(tmp_path, source) == {(6, "dot-cuda", "needs-refactor")}


# ------------------------------------------------------------------ MPS branch by code


def test_the_word_mps_in_a_comment_does_not_hide_a_missing_mps_branch(tmp_path: Path) -> None:
    source = '''import torch
# TODO: support mps one day


def pick():
    """mps would be nice"""
    return "cuda" if torch.cuda.is_available() else "cpu"
'''
    assert py(tmp_path, source) == {(7, "no-mps-branch", "note")}


def test_mps_code_elsewhere_in_the_function_is_an_mps_branch(tmp_path: Path) -> None:
    source = """import torch


def pick():
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


devices = [torch.device("cpu")]
if torch.cuda.is_available():
    devices += [torch.device("cuda:0")]
"""
    assert py(tmp_path, source) == {(13, "no-mps-branch", "note")}


# ------------------------------------------------------------------ dependencies


def test_optional_extras_are_notes_not_blockers(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["torch"]\n\n'
        '[project.optional-dependencies]\nflash = ["flash-attn>=2.0"]\n'
    )
    (tmp_path / "setup.py").write_text(
        'from setuptools import setup\nsetup(name="x", install_requires=["triton"],\n'
        '      extras_require={"fast": ["xformers"]})\n'
    )
    found = {(f.file, f.line, f.rule, f.severity) for f in audit_project(tmp_path).findings}
    assert found == {
        ("pyproject.toml", 6, "flash-attn", "note"),
        ("setup.py", 2, "triton", "blocker"),
        ("setup.py", 3, "xformers", "note"),
    }


def test_a_module_imported_only_lazily_does_not_block(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.attn import attend\n")
    (pkg / "attn.py").write_text(
        "def attend(q, fused=False):\n"
        "    if fused:\n"
        "        from pkg.triton_kernels import fused_attend\n"
        "        return fused_attend(q)\n"
        "    return q\n"
    )
    (pkg / "triton_kernels.py").write_text(
        "import triton\n\n\ndef fused_attend(q):\n    return q\n"
    )
    (pkg / "eager.py").write_text("import flash_attn\n")
    (pkg / "user.py").write_text("from pkg import eager\n")
    found = {(f.file, f.line, f.rule, f.severity) for f in audit_project(tmp_path).findings}
    assert found == {
        ("pkg/triton_kernels.py", 1, "triton", "note"),
        ("pkg/eager.py", 1, "flash-attn", "blocker"),
    }


def test_cuda_named_implementations_and_negated_tensor_checks(tmp_path: Path) -> None:
    source = """import torch


class FlashAttentionCUDAFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q):
        assert all([t.is_cuda for t in (q,)]), "inputs must be on cuda"
        return q


def to_csr(index, value):
    assert not index.is_cuda and not value.is_cuda
    return index


def fused(q):
    assert q.is_cuda and q.is_contiguous()
    return q
"""
    assert py(tmp_path, source) == {
        (7, "cuda-required", "note"),
        (17, "cuda-required", "needs-refactor"),
    }


def test_or_early_exit_and_multiline_dot_cuda_line(tmp_path: Path) -> None:
    source = """import torch


class Attend:
    def __init__(self, flash=False):
        if not torch.cuda.is_available() or not flash:
            return
        props = torch.cuda.get_device_properties(torch.device("cuda"))
        self.big = props.major >= 8


if __name__ == "__main__":
    model = Attend(
        flash=True,
    ).cuda()
"""
    assert py(tmp_path, source) == {(15, "dot-cuda", "needs-refactor")}


def test_single_file_gpt_trainer_from_the_issue() -> None:
    """The pure-PyTorch GPT trainer of issue 18: NCCL through a variable was missed (verdict
    portable), backends.cuda was missed, the bf16 check and manual_seed were false alarms, and
    the word mps in a comment hid the missing MPS branch."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "audit" / "gpt_trainer"
    report = audit_project(fixture)
    assert {(f.line, f.rule, f.severity) for f in report.findings} == {
        (13, "cuda-device", "needs-refactor"),
        (17, "nccl", "needs-refactor"),
        (19, "cuda-device", "needs-refactor"),
        (20, "cuda-call", "note"),  # set_device raises, but only on the ddp branch
        (23, "cuda-backend-flag", "note"),
        (24, "cudnn-flag", "note"),
        (25, "no-mps-branch", "note"),
    }
    assert report.verdict == "dual-track"
    assert any("multi-GPU machinery (nccl)" in r for r in report.reasons)
    assert any(
        r.startswith("For the macOS track, refactor: 2 CUDA-only code path(s)")
        for r in report.reasons
    )
