"""The audit's vocabulary: severities, the rule table and the Finding record.

Every detector module builds findings through ``make`` so that a rule's
severity, reason and way out are written once, here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

BLOCKER = "blocker"
NEEDS_REFACTOR = "needs-refactor"
NOTE = "note"
SEVERITIES = (BLOCKER, NEEDS_REFACTOR, NOTE)

SDPA = "torch.nn.functional.scaled_dot_product_attention (runs on MPS)"


@dataclass(frozen=True)
class Rule:
    """One reason a project is tied to CUDA, with the way out.

    ``replaceable`` is False for blockers with no portable drop-in (custom
    kernels, CUDA-only libraries): they make the verdict "keep-linux".
    ``linux_pipeline`` marks multi-GPU training machinery that argues for keeping
    the Linux pipeline and adding a macOS track ("dual-track").
    """

    id: str
    severity: str
    why: str
    alternative: str
    replaceable: bool = True
    linux_pipeline: bool = False


@dataclass(frozen=True)
class Finding:
    """One match: where (file, line, and the notebook cell if any), what and why.

    ``zone`` is "project" for the project's own code; tests, fixtures, ci and
    docs findings are reported apart and do not count in the verdict.
    """

    file: str
    line: int
    text: str
    severity: str
    why: str
    alternative: str
    rule: str
    cell: int | None = None
    zone: str = "project"

    def where(self) -> str:
        """``file:line``, or ``nb.ipynb:cell 3:line 2`` for a notebook."""
        if self.cell is not None:
            return f"{self.file}:cell {self.cell}:line {self.line}"
        return f"{self.file}:{self.line}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _r(id: str, severity: str, why: str, alternative: str, **kw: bool) -> Rule:
    return Rule(id, severity, why, alternative, **kw)


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        _r(
            "cuda-source",
            BLOCKER,
            "CUDA C++ kernels compile with nvcc for NVIDIA GPUs only.",
            "Rewrite the kernel as PyTorch ops (or a Metal shader) and keep a Linux track "
            "until then.",
            replaceable=False,
        ),
        _r(
            "cuda-extension",
            BLOCKER,
            "A torch.utils.cpp_extension CUDA build needs nvcc and an NVIDIA GPU.",
            "Ship a CppExtension / pure-PyTorch fallback for macOS; keep the CUDA build "
            "behind a torch.cuda.is_available() check.",
            replaceable=False,
        ),
        _r(
            "nvcc",
            BLOCKER,
            "Compiles code with nvcc, which does not exist on macOS.",
            "Build the CUDA part only on Linux; provide a PyTorch/Metal path for MPS.",
            replaceable=False,
        ),
        _r(
            "cuda-cxx",
            BLOCKER,
            "C/C++ code that includes CUDA headers or launches kernels.",
            "Guard it behind a build flag and provide a CPU/PyTorch path.",
            replaceable=False,
        ),
        _r(
            "cmake-cuda",
            BLOCKER,
            "CMake enables the CUDA language or toolkit.",
            "Make CUDA optional in CMake (check_language(CUDA)) and build without it on macOS.",
            replaceable=False,
        ),
        _r(
            "flash-attn",
            BLOCKER,
            "flash_attn ships CUDA kernels only; it neither builds nor imports on macOS.",
            f"{SDPA}; re-check numerics, and varlen/packed-sequence use.",
            replaceable=False,
        ),
        _r(
            "triton",
            BLOCKER,
            "Hand-written Triton kernels target NVIDIA/AMD GPUs; no Metal backend.",
            "Express the kernel in PyTorch ops (torch.compile fuses them on MPS) "
            "or a Metal shader.",
            replaceable=False,
        ),
        _r(
            "vllm",
            BLOCKER,
            "vLLM serves models on CUDA (or ROCm) GPUs only.",
            "transformers generate() on mps, llama.cpp or MLX for local inference.",
            replaceable=False,
        ),
        _r(
            "pycuda",
            BLOCKER,
            "PyCUDA / cuda-python drive the CUDA driver directly.",
            "Port to PyTorch ops on the torch device.",
            replaceable=False,
        ),
        _r(
            "tensorrt",
            BLOCKER,
            "TensorRT runs on NVIDIA GPUs only.",
            "Core ML (coremltools) or ONNX Runtime's CoreML provider.",
            replaceable=False,
        ),
        _r(
            "numba-cuda",
            BLOCKER,
            "numba.cuda kernels run on NVIDIA GPUs only.",
            "numba @njit on CPU or PyTorch ops on mps.",
            replaceable=False,
        ),
        _r("xformers", BLOCKER, "xformers' fused attention kernels are CUDA-only.", SDPA),
        _r(
            "bitsandbytes",
            BLOCKER,
            "bitsandbytes' 8-bit/4-bit kernels are CUDA-first; macOS support is partial.",
            "torch.optim.AdamW instead of 8-bit optimizers; torchao or "
            "full precision instead of 4-bit weights (more memory).",
        ),
        _r(
            "apex",
            BLOCKER,
            "NVIDIA apex (amp, fused optimizers and norms) builds against CUDA.",
            "torch.autocast + torch.amp.GradScaler, torch.nn.LayerNorm/RMSNorm, torch.optim.",
        ),
        _r(
            "deepspeed",
            BLOCKER,
            "DeepSpeed's engine, ZeRO and fused ops expect CUDA and NCCL.",
            "A plain PyTorch (or Accelerate) loop for the single-device Mac run; keep DeepSpeed "
            "on the Linux track.",
            linux_pipeline=True,
        ),
        _r(
            "cupy",
            BLOCKER,
            "CuPy arrays live on NVIDIA GPUs only.",
            "NumPy on CPU or torch tensors on mps.",
        ),
        _r(
            "rapids",
            BLOCKER,
            "RAPIDS (cudf, cuml, cugraph) runs on NVIDIA GPUs only.",
            "pandas / polars / scikit-learn on CPU.",
        ),
        _r(
            "nccl",
            NEEDS_REFACTOR,
            "NCCL is NVIDIA's collective library; macOS has none.",
            'Pick the backend at run time: "nccl" if torch.cuda.is_available() else "gloo".',
            linux_pipeline=True,
        ),
        _r(
            "cuda-device",
            NEEDS_REFACTOR,
            'A hard-coded "cuda" device fails where CUDA is absent.',
            "Take the device from a flag or pick cuda → mps → cpu at run time.",
        ),
        _r(
            "dot-cuda",
            NEEDS_REFACTOR,
            ".cuda() moves to CUDA unconditionally.",
            ".to(device) with the device chosen at run time.",
        ),
        _r(
            "cuda-at-import",
            NEEDS_REFACTOR,
            "A torch.cuda call at module level runs on import "
            "and raises on a torch without CUDA (checked on CPU-only torch).",
            "Move it into a function behind torch.cuda.is_available(); use torch.mps / "
            "torch.accelerator equivalents.",
        ),
        _r(
            "cuda-required",
            NEEDS_REFACTOR,
            "The code refuses to run without CUDA.",
            "Accept mps (torch.backends.mps.is_available()) and cpu as well.",
        ),
        _r(
            "capability-check",
            NEEDS_REFACTOR,
            "A CUDA compute-capability check raises or misleads without CUDA.",
            "Guard it with torch.cuda.is_available(); test features "
            "(dtype support) directly on other devices.",
        ),
        _r(
            "cuda-amp",
            NEEDS_REFACTOR,
            "torch.cuda.amp is CUDA-only (and deprecated).",
            "torch.amp.autocast(device_type=...) and torch.amp.GradScaler(...).",
        ),
        _r(
            "cuda-call",
            NOTE,
            "A torch.cuda call inside a function that raises on a torch "
            "without CUDA (checked on CPU-only torch) if it runs there.",
            "Guard it with torch.cuda.is_available() or use torch.accelerator / torch.mps "
            "equivalents.",
        ),
        _r(
            "cuda-unchecked",
            NOTE,
            "A torch.cuda call this audit has not checked without CUDA: "
            "it may raise or do nothing on a Mac.",
            "Guard it with torch.cuda.is_available() "
            "or use torch.accelerator / torch.mps equivalents.",
        ),
        _r(
            "cpu-kernels-only",
            NEEDS_REFACTOR,
            "Optional CUDA build: CPU kernels only on macOS, "
            "so its ops on mps tensors need a move to CPU.",
            "Move the tensors these ops take to "
            'CPU and back (x.cpu() … .to("mps")), or keep the work that needs them on '
            "Linux/CUDA.",
        ),
        _r(
            "device-count-spawn",
            NEEDS_REFACTOR,
            "torch.cuda.device_count() is 0 on a Mac: a spawn it sizes (nprocs=0) starts "
            "no process, so the job ends at once having done nothing.",
            "Size it by max(1, torch.cuda.device_count()) or a --nprocs flag; on mps run "
            "one process.",
        ),
        _r(
            "reference-path",
            NOTE,
            "The project's CUDA kernels are a blocker on MPS.",
            "Call the pure-PyTorch path on mps (import the kernel module only where it is "
            "used, inside a try/except ImportError).",
        ),
        _r(
            "cudnn-flag",
            NOTE,
            "torch.backends.cudnn settings have no effect on MPS.",
            "Keep them (harmless); for determinism use torch.use_deterministic_algorithms.",
        ),
        _r(
            "cuda-backend-flag",
            NOTE,
            "torch.backends.cuda settings (TF32 matmul, SDPA kernel choice) have no effect on MPS.",
            "Keep them (harmless) for the CUDA track; MPS picks its own kernels.",
        ),
        _r(
            "no-mps-branch",
            NOTE,
            "Device selection falls back from cuda straight to cpu, so a Mac runs on CPU.",
            'Add an "mps" branch: torch.backends.mps.is_available().',
        ),
        _r(
            "cu-wheel",
            NEEDS_REFACTOR,
            "A CUDA build of a wheel (+cuXXX) has no macOS variant; pip cannot install it there.",
            "Pin the plain version (PyPI's macOS wheels include MPS) or add a sys_platform marker.",
        ),
        _r(
            "cuda-index",
            NEEDS_REFACTOR,
            "A CUDA-only package index has no macOS wheels.",
            "Use PyPI on macOS: restrict the index with a marker or a per-platform file.",
        ),
        _r(
            "nvidia-wheel",
            NEEDS_REFACTOR,
            "nvidia-* wheels are CUDA runtime libraries for Linux/Windows only.",
            'Drop them (torch pulls them in on Linux) or add ; sys_platform == "linux".',
        ),
        _r(
            "gpu-variant",
            NEEDS_REFACTOR,
            "A GPU-only variant of a package (…-gpu, a cuda extra) has no macOS build.",
            "Depend on the plain package on macOS.",
        ),
        _r(
            "conda-cuda",
            NEEDS_REFACTOR,
            "A conda CUDA package, build or channel has no osx-arm64 build.",
            "Split the environment per platform or drop CUDA packages on "
            "osx-arm64 (PyTorch's osx-arm64 build includes MPS).",
        ),
        _r(
            "nvml",
            NOTE,
            "NVML GPU monitoring finds no GPU on a Mac.",
            "Guard it; read MPS memory with torch.mps.current_allocated_memory().",
        ),
        _r(
            "cuda-env",
            NOTE,
            "CUDA-specific environment or tooling (CUDA_VISIBLE_DEVICES, "
            "nvidia-smi, CUDA base images) is ignored or absent on macOS.",
            "Keep it for the Linux track; nothing to do for MPS.",
        ),
    )
}


def make(
    rule_id: str,
    file: str,
    line: int,
    text: str,
    *,
    severity: str | None = None,
    why_suffix: str = "",
) -> Finding:
    """A finding for ``rule_id``; ``severity`` downgrades it (guarded code, lock files)."""
    rule = RULES[rule_id]
    why = rule.why + (f" {why_suffix}" if why_suffix else "")
    return Finding(
        file, line, _clip(text), severity or rule.severity, why, rule.alternative, rule_id
    )


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
