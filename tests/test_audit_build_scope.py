"""Issue 18, build systems and scope: CMake switches, #ifdef guards, optional CUDA builds,
what is read (--exclude, .gitignore, notebooks) and what decides the verdict (zones)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from remotemac.checks.audit import audit_project
from remotemac.checks.audit_rules import scan_build_script, scan_cxx
from remotemac.frontend.audit import main_audit

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "audit"


def rows(found) -> set[tuple[int, str, str]]:
    return {(f.line, f.rule, f.severity) for f in found}


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


# ------------------------------------------------------------------ CMake and C++

CMAKE = """cmake_minimum_required(VERSION 3.10)
project(ext)
option(WITH_CUDA "Enable CUDA support" OFF)

if(WITH_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit)
endif()
if (NOT WITH_CUDA)
  message(STATUS "CPU only")
else()
  find_package(CUDA)
endif()
"""


def test_cmake_cuda_behind_an_off_option_is_an_optional_build() -> None:
    assert rows(scan_build_script("CMakeLists.txt", CMAKE)) == {
        (6, "cpu-kernels-only", "needs-refactor")
    }


def test_cmake_cuda_without_a_switch_is_a_blocker() -> None:
    text = "project(ext LANGUAGES CXX CUDA)\nif(UNIX)\n  enable_language(CUDA)\nendif()\n"
    assert rows(scan_build_script("CMakeLists.txt", text)) == {
        (1, "cmake-cuda", "blocker"),
        (3, "cmake-cuda", "blocker"),
    }


CXX = """#include <torch/extension.h>
#ifdef WITH_CUDA
#ifdef USE_ROCM
#include <hip/hip_version.h>
#else
#include <cuda.h>
#endif
#endif
#if defined(__CUDACC__) && !defined(USE_ROCM)
#include <cuda_fp16.h>
#endif
#ifndef WITH_CUDA
#include <cuda_runtime.h>
#else
#include <ATen/cuda/CUDAContext.h>
#endif
#if !defined(WITH_CUDA)
#include <cublas_v2.h>
#endif
#include <c10/cuda/CUDAGuard.h>
"""


def test_ifdef_guards_make_cuda_cxx_a_note() -> None:
    found = scan_cxx("csrc/version.cpp", CXX)
    assert rows(found) == {
        (6, "cuda-cxx", "note"),
        (10, "cuda-cxx", "note"),
        (13, "cuda-cxx", "blocker"),
        (15, "cuda-cxx", "note"),
        (18, "cuda-cxx", "blocker"),
        (20, "cuda-cxx", "blocker"),
    }
    assert "#ifdef WITH_CUDA" in next(f for f in found if f.line == 6).why


def test_extension_package_with_optional_cuda_is_cpu_kernels_only(tmp_path: Path) -> None:
    """The torch-scatter shape: setup.py picks CppExtension or CUDAExtension, CMake has an
    OFF option, .cu kernels sit in csrc/cuda: no blocker, and the verdict says what a
    user acts on (CPU kernels on macOS, mps tensors must move to CPU)."""
    write(
        tmp_path,
        {
            "setup.py": (
                "import torch\n"
                "from setuptools import setup\n"
                "from torch.utils.cpp_extension import CppExtension, CUDAExtension, CUDA_HOME\n"
                "WITH_CUDA = torch.cuda.is_available() and CUDA_HOME is not None\n"
                "suffices = ['cpu', 'cuda'] if WITH_CUDA else ['cpu']\n"
                "exts = []\n"
                "for suffix in suffices:\n"
                "    Extension = CppExtension if suffix == 'cpu' else CUDAExtension\n"
                "    exts.append(Extension(f'x._{suffix}', ['csrc/x.cpp']))\n"
                "setup(name='x', ext_modules=exts)\n"
            ),
            "CMakeLists.txt": CMAKE,
            "csrc/cuda/x_cuda.cu": "__global__ void k() {}\n",
            "csrc/version.cpp": CXX.split("#if defined")[0],
        },
    )
    report = audit_project(tmp_path)
    assert rows(report.findings) == {
        (8, "cpu-kernels-only", "needs-refactor"),
        (6, "cpu-kernels-only", "needs-refactor"),
        (1, "cuda-source", "note"),
        (6, "cuda-cxx", "note"),
    }
    assert report.verdict == "refactor-for-portability"
    reason = " ".join(report.reasons)
    assert "CPU kernels only" in reason and "mps tensors" in reason
    assert "setup.py:8" in reason


def test_one_unconditional_cuda_build_keeps_cuda_sources_blockers(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "setup.py": (
                "from torch.utils.cpp_extension import CUDAExtension\n"
                "ext = CUDAExtension('k', ['k.cu'])\n"
            ),
            "CMakeLists.txt": CMAKE,
            "k.cu": "__global__ void k() {}\n",
        },
    )
    report = audit_project(tmp_path)
    assert ("k.cu", 1, "cuda-source", "blocker") in {
        (f.file, f.line, f.rule, f.severity) for f in report.findings
    }
    assert report.verdict == "keep-linux"
    assert report.reasons[0].startswith("Keep this project on Linux/CUDA:")


# ------------------------------------------------------------------ scope


def test_tests_fixtures_ci_and_docs_are_set_apart(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "train.py": "import torch\nx = torch.zeros(1).cuda()\n",
            "tests/test_x.py": "import flash_attn\n",
            "tests/fixtures/proj/model.py": "import flash_attn\n",
            ".github/workflows/build.sh": "nvcc -O3 k.cu\n",
            "conda/pkg/build.sh": "nvcc k.cu\n",
            "docs/conf.py": "import triton\n",
            "test_top.py": "import deepspeed\n",
        },
    )
    report = audit_project(tmp_path)
    assert rows(report.findings) == {(2, "dot-cuda", "needs-refactor")}
    assert report.verdict == "refactor-for-portability"
    assert {(f.file, f.zone) for f in report.set_apart} == {
        ("tests/test_x.py", "tests"),
        ("tests/fixtures/proj/model.py", "fixtures"),
        (".github/workflows/build.sh", "ci"),
        ("conda/pkg/build.sh", "ci"),
        ("docs/conf.py", "docs"),
        ("test_top.py", "tests"),
    }
    assert report.apart_counts() == {"fixtures": 1, "tests": 2, "ci": 2, "docs": 1}
    assert "set apart" in report.summary()


def test_exclude_and_gitignore(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            ".gitignore": "generated/\n",
            "generated/k.py": "import flash_attn\n",
            "vendor/third/k.py": "import flash_attn\n",
            "benchmarks/bench.py": "import triton\n",
            "src/keep.py": "import xformers\n",
        },
    )
    report = audit_project(tmp_path, exclude=("vendor/", "benchmarks/*.py"))
    assert {f.file for f in report.findings} == {"src/keep.py"}
    assert report.skipped["gitignored"] == 1
    assert report.skipped["excluded"] == 2


def test_notebook_code_cells_are_scanned_with_cell_and_line(tmp_path: Path) -> None:
    nb = {
        "cells": [
            {"cell_type": "markdown", "source": ["Uses `.cuda()` and import flash_attn\n"]},
            {
                "cell_type": "code",
                "source": ["!pip install flash-attn\n", "import torch\n", "%matplotlib inline\n"],
            },
            {"cell_type": "code", "source": "%%bash\nnvcc k.cu\n"},
            {
                "cell_type": "code",
                "source": ["backend = 'nccl'\n", "\n", "model = torch.nn.Linear(2, 2).cuda()\n"],
            },
            {
                "cell_type": "code",
                "source": [
                    "import torch.distributed as dist\n",
                    "dist.init_process_group(backend=backend)\n",
                ],
            },
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (tmp_path / "explore.ipynb").write_text(json.dumps(nb))
    report = audit_project(tmp_path)
    assert {(f.cell, f.line, f.rule) for f in report.findings} == {
        (1, 1, "flash-attn"),  # the shell line installs it (issue 34: it was blanked)
        (3, 3, "dot-cuda"),
        (4, 2, "nccl"),
    }
    assert {f.where() for f in report.findings} == {
        "explore.ipynb:cell 1:line 1",
        "explore.ipynb:cell 3:line 3",
        "explore.ipynb:cell 4:line 2",
    }
    (tmp_path / "broken.ipynb").write_text("{not json")
    assert audit_project(tmp_path).unparsed == ["broken.ipynb"]


def test_cli_exclude_and_table_name_the_set_apart_counts(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from remotemac.cli import main

    write(
        tmp_path,
        {
            "train.py": "import torch\nx = torch.zeros(1).cuda()\n",
            "ci/run.sh": "nvcc k.cu\n",
            "old/k.py": "import flash_attn\n",
        },
    )
    result = CliRunner().invoke(
        main, ["audit", str(tmp_path), "--exclude", "old/"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "Set apart, not in the verdict: 1 in ci" in " ".join(result.output.split())
    assert "refactor-for-portability" in result.output and "flash" not in result.output
    assert "Refactor, then run on a Mac" in " ".join(result.output.split())


def test_json_lists_set_apart_findings(tmp_path: Path) -> None:
    from rich.console import Console

    write(tmp_path, {"tests/test_k.py": "import flash_attn\n"})
    buf = io.StringIO()
    main_audit(tmp_path, as_json=True, console=Console(file=buf))
    data = json.loads(buf.getvalue())
    assert data["findings"] == [] and data["verdict"] == "portable"
    assert data["set_apart"][0]["zone"] == "tests"
    assert data["set_apart_counts"] == {"tests": 1}
