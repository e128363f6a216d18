"""The cost of the divergence trace (agent/modtrace.py) on a GPT-style training step.

One process, one model (nanoGPT-shaped: tied embedding, SDPA attention, MLP blocks,
AdamW), peers timed in the same minute and interleaved: training steps with tracing
off (no hook registered), and the same number of steps with the trace on for the
first 1 and the first 10 of them. Prints the time per step of each, the ratio to off,
the cost of one traced step over an untraced one, and the size of each trace file.

    python scripts/bench_trace.py [--steps 20] [--layers 4] [--width 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]


def _modtrace():
    spec = importlib.util.spec_from_file_location(
        "_remotemac_modtrace", ROOT / "remotemac" / "agent" / "modtrace.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, vocab: int = 512, block: int = 64) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(block, width)
        self.h = nn.ModuleList(Block(width, 4) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def train(args: argparse.Namespace, trace_steps: int, path: str | None) -> float:
    """Seconds for ``args.steps`` training steps, the first ``trace_steps`` traced."""
    torch.manual_seed(0)
    model = GPT(args.layers, args.width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 512, (8, 64))
    y = torch.randint(0, 512, (8, 64))
    model(x, y).backward()  # warm-up, untimed
    trace = _modtrace().start(torch, path, trace_steps, "cpu") if trace_steps else None
    t0 = time.perf_counter()
    for _ in range(args.steps):
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if trace is not None:
        trace.stop()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    kinds = (("off", 0), ("on, 1 step", 1), ("on, 10 steps", 10))
    times: dict[str, list[float]] = {k: [] for k, _ in kinds}
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, n in kinds:  # interleaved: the machine's load hits every peer alike
                path = os.path.join(tmp, f"{n}-{r}.trace.jsonl") if n else None
                times[name].append(train(args, n, path))
                if path:
                    sizes[name] = os.path.getsize(path)
    off = statistics.median(times["off"]) / args.steps
    print(
        f"GPT {args.layers} layers x {args.width}, batch 8 x 64 tokens, AdamW, 1 thread; "
        f"{args.steps} steps, median of {args.rounds} interleaved rounds"
    )
    print(f"{'':14} {'s/step':>9} {'x off':>7} {'per traced step':>16} {'trace':>10}")
    for name, n in kinds:
        per = statistics.median(times[name]) / args.steps
        traced = f"{(per - off) * args.steps / n / off + 1:.2f}x" if n else "—"
        size = f"{sizes[name] / 1024:.0f} KiB" if n else "—"
        print(f"{name:14} {per:9.4f} {per / off:7.2f} {traced:>16} {size:>10}")
    print("(a traced step's cost against an untraced one; this machine is shared and loaded)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
