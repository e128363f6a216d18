"""Signs in a workload's log that it took a CUDA path at run time.

Many failed migrations start with a package that imports fine and picks CUDA at
the first step; its log says so even when the exit code does not. Each pattern
matches a stable fragment of the message (torch, the CUDA runtime, NCCL).
"""

from __future__ import annotations

import re
from pathlib import Path

PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (why, re.compile(rx))
    for why, rx in (
        ("torch built without CUDA was asked for CUDA", r"Torch not compiled with CUDA enabled"),
        ("no CUDA GPU on this machine", r"No CUDA GPUs are available"),
        (
            "the CUDA driver is missing",
            r"(?i)found no nvidia driver|CUDA driver (?:version|initiali[sz]ation|is insufficient)",
        ),
        ("the CUDA runtime library was loaded", r"libcudart(?:\.so)?"),
        ("the CUDA compiler was invoked", r"\bnvcc\b"),
        (
            "NCCL (CUDA-only collective backend) was used",
            r"\bNCCL\b(?: error|WARN|INFO)?|ProcessGroupNCCL",
        ),
        ("a CUDA runtime error", r"\bCUDA error\b|cudaGetDeviceCount|CUDA_VISIBLE_DEVICES"),
    )
)
MAX_HITS = 20


def scan_log(path: Path, max_hits: int = MAX_HITS) -> list[dict[str, object]]:
    """Lines of ``path`` that show a CUDA path: [{line_no, line, why}], first hits first."""
    hits: list[dict[str, object]] = []
    if not path.exists():
        return hits
    with path.open(encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            for why, pattern in PATTERNS:
                if pattern.search(line):
                    hits.append(
                        {
                            "line_no": number,
                            "line": line.strip()[:300],
                            "why": why,
                            "log": path.name,
                        }
                    )
                    break
            if len(hits) >= max_hits:
                break
    return hits
