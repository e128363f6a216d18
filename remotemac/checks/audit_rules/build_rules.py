"""CUDA sources, C/C++ files and build scripts (shell, Make, CMake, Dockerfiles).

A CUDA line behind a build switch is not a blocker: C/C++ inside ``#ifdef
WITH_CUDA`` (or ``#if defined(__CUDACC__)``…) is compiled only when CUDA is on,
and CMake CUDA inside ``if(WITH_CUDA)`` (an ``option``, usually OFF) is an
optional CUDA build: on macOS the CPU kernels are built instead.
"""

from __future__ import annotations

import re

from remotemac.checks.audit_rules.deps_rules import Lines
from remotemac.checks.audit_rules.model import NOTE, Finding, make

# --------------------------------------------------------------------------- other sources

_CXX_CUDA = re.compile(
    r"#\s*include\s*[<\"](?:cuda[\w_]*\.h|cublas\w*\.h|cudnn\w*\.h|curand\w*\.h|cusparse\w*\.h"
    r"|nccl\.h|thrust/|cub/|ATen/cuda/|c10/cuda/)|__global__|<<<|\bat::cuda::|\bc10::cuda::"
)
_CXX_WORDS = (
    "cuda",
    "__global__",
    "<<<",
    "cublas",
    "cudnn",
    "curand",
    "cusparse",
    "nccl",
    "thrust/",
    "cub/",
)
_CMAKE_CUDA = re.compile(
    r"enable_language\s*\(\s*CUDA|LANGUAGES[^)]*\bCUDA\b"
    r"|find_package\s*\(\s*CUDA(?:Toolkit)?\b",
    re.I,
)
_SHELL_NVCC = re.compile(r"(?:^|[\s;&|(/])nvcc(?:\s|$)")
_SHELL_ENV = re.compile(r"CUDA_VISIBLE_DEVICES|nvidia-smi|\bFROM\s+nvidia/cuda|CUDA_HOME")


def scan_cuda_source(file: str, text: str) -> list[Finding]:
    """A .cu/.cuh file is a blocker by itself; point at its first kernel when there is one."""
    lines = text.splitlines()
    for lineno, line in enumerate(lines, 1):
        if "__global__" in line and not line.lstrip().startswith("//"):
            return [make("cuda-source", file, lineno, line.strip())]
    return [make("cuda-source", file, 1, lines[0].strip() if lines else file)]


_PP = re.compile(r"^\s*#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)$")
_CUDA_MACRO = re.compile(r"cuda|__nvcc__|__cudacc__", re.I)
_CXX_GUARD_NOTE = "Here it is compiled only when CUDA is switched on ({})."


def cuda_condition(kind: str, cond: str) -> bool:
    """Whether the branch a preprocessor line opens is compiled only with CUDA."""
    if not _CUDA_MACRO.search(cond):
        return False
    if kind == "ifndef":
        return False
    if kind == "ifdef":
        return True
    return not re.search(r"!\s*(?:defined\s*\(?\s*)?\w*cuda", cond, re.I)


def scan_cxx(file: str, text: str) -> list[Finding]:
    """C/C++ sources: CUDA includes, kernels and launches, with ``#if`` guards tracked."""
    low = text.lower()
    if not any(w in low for w in _CXX_WORDS):
        return []
    out = Lines(file)
    frames: list[tuple[bool, str]] = []  # (branch compiled only with CUDA, condition)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not ("#" in line or "__global__" in line or "<<<" in line or "::cuda::" in line):
            continue
        pp = _PP.match(line)
        if pp:
            kind, cond = pp.group(1), pp.group(2).split("//")[0].strip()
            if kind in ("ifdef", "ifndef", "if"):
                frames.append((cuda_condition(kind, cond), f"#{kind} {cond}"))
            elif kind in ("elif", "else") and frames:
                opened = frames[-1][1]
                flipped = opened.startswith("#ifndef") and _CUDA_MACRO.search(opened)
                frames[-1] = (
                    bool(flipped) or (kind == "elif" and cuda_condition("if", cond)),
                    opened,
                )
            elif kind == "endif" and frames:
                frames.pop()
        s = line.lstrip()
        if s.startswith(("//", "*", "/*")) or not _CXX_CUDA.search(line):
            continue
        guard = next((c for on, c in reversed(frames) if on), None)
        if guard is None:
            out.add("cuda-cxx", lineno, s)
        elif ("cuda-cxx", lineno) not in out._seen:
            out._seen.add(("cuda-cxx", lineno))
            out.findings.append(
                make(
                    "cuda-cxx",
                    file,
                    lineno,
                    s,
                    severity=NOTE,
                    why_suffix=_CXX_GUARD_NOTE.format(guard),
                )
            )
    return out.findings


_CMAKE_IF = re.compile(r"^\s*(if|elseif|else|endif)\s*\((.*)\)?", re.I)
_CMAKE_OPTION = re.compile(r"^\s*option\s*\(\s*(\w+)", re.I)


def _cmake_findings(
    out: Lines, lineno: int, s: str, frames: list[bool], reported: list[bool]
) -> None:
    """One CMake line: a CUDA language/toolkit line is a blocker unless a switch guards it."""
    if not _CMAKE_CUDA.search(s):
        return
    if not any(frames):
        out.add("cmake-cuda", lineno, s)
    elif not reported:
        reported.append(True)
        out.add("cpu-kernels-only", lineno, s)


def _cmake_cuda_condition(cond: str, options: set[str]) -> tuple[bool, bool]:
    """(condition is about CUDA, condition is negated with NOT)."""
    negated = bool(re.match(r"\s*NOT\b", cond, re.I))
    about = bool(re.search(r"cuda", cond, re.I)) or any(
        re.search(rf"\b{re.escape(o)}\b", cond) for o in options if "CUDA" in o.upper()
    )
    return about, negated


def _cmake_branch(word: str, cond: str, frames: list[tuple[bool, bool]], options: set[str]) -> None:
    """Track if()/elseif()/else()/endif(): is the current branch the CUDA one?"""
    if word == "if":
        about, negated = _cmake_cuda_condition(cond, options)
        frames.append((about and not negated, about and negated))
    elif word == "elseif" and frames:
        about, negated = _cmake_cuda_condition(cond, options)
        frames[-1] = (about and not negated, False)
    elif word == "else" and frames:
        frames[-1] = (frames[-1][1], False)
    elif word == "endif" and frames:
        frames.pop()


def scan_build_script(file: str, text: str) -> list[Finding]:
    """Shell scripts, Makefiles, CMake and Dockerfiles: nvcc, CUDA languages, CUDA env."""
    out = Lines(file)
    cmake = file.endswith((".cmake", "CMakeLists.txt"))
    docker = "Dockerfile" in file.rsplit("/", 1)[-1]
    options: set[str] = set()
    frames: list[tuple[bool, bool]] = []  # per open if(): (this branch is CUDA, if() negated)
    reported: list[bool] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if cmake:
            m = _CMAKE_OPTION.match(s)
            if m:
                options.add(m.group(1))
            m = _CMAKE_IF.match(s)
            if m:
                _cmake_branch(m.group(1).lower(), m.group(2) or "", frames, options)
                continue
            _cmake_findings(out, lineno, s, [on for on, _ in frames], reported)
        elif _SHELL_NVCC.search(s) and not docker:
            out.add("nvcc", lineno, s)
        elif _SHELL_ENV.search(s) or (docker and "nvcc" in s):
            out.add("cuda-env", lineno, s)
    return out.findings
