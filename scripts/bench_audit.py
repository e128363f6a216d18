"""Time ``remotemac audit`` on a generated project tree (default 10,000 files).

The tree mimics a large research repository: Python modules (a quarter with
CUDA-isms, some mentioning CUDA only in comments), CUDA/C++ sources, shell
scripts, requirements, docs, JSON/YAML configs, binary tensors, a .git
directory and a .gitignored build directory. ``--worst-case`` makes every file
a Python module that passes the pre-filter, so every one is parsed.

    python scripts/bench_audit.py [--files 10000] [--worst-case] [--keep DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remotemac.checks.audit import audit_project  # noqa: E402

PLAIN = '''"""Module {i}: data pipeline pieces."""
import numpy as np
import torch
from torch import nn


class Layer{i}(nn.Module):
    def __init__(self, width: int = {w}) -> None:
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.proj(x)) + x)


def batches(n: int, seed: int = {i}):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield torch.from_numpy(rng.standard_normal((32, {w})).astype("float32"))
'''
COMMENT_ONLY = (
    PLAIN
    + """

# Historical note: this used to call .cuda() on every batch (see issue {i}).
"""
)
CUDA_ISMS = (
    PLAIN
    + """

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def step(model, x):
    model = model.cuda()
    out = model(x.to("cuda"))
    torch.cuda.synchronize()
    return out
"""
)
KERNEL = """#include <cuda_runtime.h>
__global__ void k{i}(float* x, int n) {{ int j = threadIdx.x; if (j < n) x[j] *= 2; }}
"""
CPP = """#include <torch/extension.h>
int helper{i}(int x) {{ return x * 2; }}
"""
SHELL = """#!/bin/sh
set -e
python train.py --seed {i}
"""
DOC = "# Notes {i}\n\nThis page talks about CUDA and `.cuda()`; it is not read.\n"


def generate_tree(root: Path, n_files: int, *, worst_case: bool = False, seed: int = 0) -> int:
    """Write ``n_files`` files under ``root`` (plus a .git dir and an ignored build dir).

    Returns the number of files audit should consider (not ignored, not in .git).
    """
    rng = random.Random(seed)
    (root / ".git" / "objects").mkdir(parents=True)
    for i in range(200):
        (root / ".git" / "objects" / f"obj{i}").write_bytes(bytes(range(256)) * 4)
    (root / ".gitignore").write_text("build/\n*.pt\n!keep.pt\n__pycache__/\n")
    (root / "build").mkdir()
    for i in range(300):
        (root / "build" / f"gen{i}.py").write_text("import flash_attn\n")
    (root / "requirements.txt").write_text("torch>=2.2\nnumpy\n")
    counted = 2  # requirements.txt and .gitignore
    for i in range(n_files - 2):
        pkg = root / f"pkg{i % 40}" / f"sub{i % 7}"
        pkg.mkdir(parents=True, exist_ok=True)
        w = rng.choice((64, 128, 256))
        if worst_case:
            (pkg / f"m{i}.py").write_text(CUDA_ISMS.format(i=i, w=w))
            counted += 1
            continue
        r = rng.random()
        if r < 0.45:
            (pkg / f"m{i}.py").write_text(PLAIN.format(i=i, w=w))
        elif r < 0.52:
            (pkg / f"c{i}.py").write_text(COMMENT_ONLY.format(i=i, w=w))
        elif r < 0.62:
            (pkg / f"d{i}.py").write_text(CUDA_ISMS.format(i=i, w=w))
        elif r < 0.65:
            (pkg / f"k{i}.cu").write_text(KERNEL.format(i=i))
        elif r < 0.70:
            (pkg / f"x{i}.cpp").write_text(CPP.format(i=i))
        elif r < 0.75:
            (pkg / f"run{i}.sh").write_text(SHELL.format(i=i))
        elif r < 0.88:
            (pkg / f"doc{i}.md").write_text(DOC.format(i=i))
        elif r < 0.95:
            (pkg / f"cfg{i}.json").write_text('{"lr": 0.001, "device": "cuda"}\n')
        else:
            (pkg / f"w{i}.npy").write_bytes(b"\x93NUMPY" + bytes(2048))
        counted += 1
    return counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--worst-case", action="store_true")
    parser.add_argument("--keep", type=Path, help="generate here and keep the tree")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        expected = generate_tree(root, args.files, worst_case=args.worst_case)
        start = time.perf_counter()
        report = audit_project(root)
        wall = time.perf_counter() - start
    if report.files_seen != expected:
        print(f"error: audit saw {report.files_seen} files, expected {expected}", file=sys.stderr)
        return 1
    counts = report.counts()
    print(f"files in tree: {expected} (+ .git and a gitignored build/ dir)")
    print(f"files read: {report.files_scanned}; findings: {counts}; verdict: {report.verdict}")
    print(f"elapsed: {wall:.2f} s  ->  {expected / wall:,.0f} files/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
