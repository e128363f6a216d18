"""CUDA sources, C/C++ files and build scripts (shell, Make, CMake, Dockerfiles)."""

from __future__ import annotations

import re

from remotemac.checks.audit_rules.deps_rules import _Lines
from remotemac.checks.audit_rules.model import Finding, make

# --------------------------------------------------------------------------- other sources

_CXX_CUDA = re.compile(
    r"#\s*include\s*[<\"](?:cuda[\w_]*\.h|cublas\w*\.h|cudnn\w*\.h|curand\w*\.h|cusparse\w*\.h"
    r"|nccl\.h|thrust/|cub/|ATen/cuda/|c10/cuda/)|__global__|<<<|\bat::cuda::|\bc10::cuda::"
)
_CXX_WORDS = ("cuda", "__global__", "<<<", "cublas", "cudnn", "curand", "cusparse", "nccl",
              "thrust/", "cub/")
_CMAKE_CUDA = re.compile(r"enable_language\s*\(\s*CUDA|LANGUAGES[^)]*\bCUDA\b"
                         r"|find_package\s*\(\s*CUDA(?:Toolkit)?\b", re.I)
_SHELL_NVCC = re.compile(r"(?:^|[\s;&|(/])nvcc(?:\s|$)")
_SHELL_ENV = re.compile(r"CUDA_VISIBLE_DEVICES|nvidia-smi|\bFROM\s+nvidia/cuda|CUDA_HOME")


def scan_cuda_source(file: str, text: str) -> list[Finding]:
    """A .cu/.cuh file is a blocker by itself; point at its first kernel when there is one."""
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        if "__global__" in line and not line.lstrip().startswith("//"):
            return [make("cuda-source", file, lineno, line.strip())]
    return [make("cuda-source", file, 1, lines[0].strip() if lines else file)]


def scan_cxx(file: str, text: str) -> list[Finding]:
    """C/C++ sources: CUDA includes, kernels and launches (comment lines skipped)."""
    low = text.lower()
    if not any(w in low for w in _CXX_WORDS):
        return []
    out = _Lines(file)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not ("#" in line or "__global__" in line or "<<<" in line or "::cuda::" in line):
            continue
        s = line.lstrip()
        if s.startswith(("//", "*", "/*")):
            continue
        if _CXX_CUDA.search(line):
            out.add("cuda-cxx", lineno, s)
    return out.findings


def scan_build_script(file: str, text: str) -> list[Finding]:
    """Shell scripts, Makefiles, CMake and Dockerfiles: nvcc, CUDA languages, CUDA env."""
    out = _Lines(file)
    cmake = file.endswith((".cmake", "CMakeLists.txt"))
    docker = "Dockerfile" in file.rsplit("/", 1)[-1]
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if cmake and _CMAKE_CUDA.search(s):
            out.add("cmake-cuda", lineno, s)
        elif _SHELL_NVCC.search(s) and not (docker or cmake):
            out.add("nvcc", lineno, s)
        elif _SHELL_ENV.search(s) or (docker and "nvcc" in s):
            out.add("cuda-env", lineno, s)
    return out.findings
