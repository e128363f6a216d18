"""Reasons that cannot lie: every ``torch.cuda`` call audit says "raises without CUDA" is
called here on the installed CPU-only torch and must raise; every call it treats as lazy
(``torch.cuda.manual_seed``…) must return. Real torch, no mocks."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from remotemac.checks.audit_rules import cuda_api  # noqa: E402

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or torch.backends.cuda.is_built(),
    reason="needs a torch built without CUDA",
)

C = torch.cuda


def _enter(cm: object) -> object:
    return cm.__enter__()  # type: ignore[attr-defined]


#: how to call each name in cuda_api.RAISES
RAISING_CALLS: dict[str, Callable[[], object]] = {
    "synchronize": lambda: C.synchronize(),
    "current_device": lambda: C.current_device(),
    "set_device": lambda: C.set_device(0),
    "get_device_name": lambda: C.get_device_name(),
    "get_device_properties": lambda: C.get_device_properties(0),
    "get_device_capability": lambda: C.get_device_capability(),
    "mem_get_info": lambda: C.mem_get_info(),
    "reset_peak_memory_stats": lambda: C.reset_peak_memory_stats(),
    "reset_max_memory_allocated": lambda: C.reset_max_memory_allocated(),
    "memory_summary": lambda: C.memory_summary(),
    "ipc_collect": lambda: C.ipc_collect(),
    "initial_seed": lambda: C.initial_seed(),
    "get_rng_state": lambda: C.get_rng_state(),
    "current_stream": lambda: C.current_stream(),
    "default_stream": lambda: C.default_stream(),
    "Stream": lambda: C.Stream(),
    "Event": lambda: C.Event(enable_timing=True),
    "init": lambda: C.init(),
    "set_per_process_memory_fraction": lambda: C.set_per_process_memory_fraction(0.5),
    "CUDAGraph": lambda: C.CUDAGraph(),
    "set_sync_debug_mode": lambda: C.set_sync_debug_mode(0),
    "caching_allocator_alloc": lambda: C.caching_allocator_alloc(4),
    "can_device_access_peer": lambda: C.can_device_access_peer(0, 1),
    "device": lambda: _enter(C.device(0)),
    "nvtx.range_push": lambda: C.nvtx.range_push("x"),
    "nvtx.range_pop": lambda: C.nvtx.range_pop(),
    "FloatTensor": lambda: C.FloatTensor(2),
    "HalfTensor": lambda: C.HalfTensor(2),
    "LongTensor": lambda: C.LongTensor(2),
    "IntTensor": lambda: C.IntTensor(2),
    "BFloat16Tensor": lambda: C.BFloat16Tensor(2),
    "ByteTensor": lambda: C.ByteTensor(2),
    "BoolTensor": lambda: C.BoolTensor(2),
    "DoubleTensor": lambda: C.DoubleTensor(2),
}

#: how to call each name in cuda_api.LAZY
LAZY_CALLS: dict[str, Callable[[], object]] = {
    "is_available": lambda: C.is_available(),
    "device_count": lambda: C.device_count(),
    "is_initialized": lambda: C.is_initialized(),
    "_is_compiled": lambda: C._is_compiled(),
    "memory_allocated": lambda: C.memory_allocated(),
    "max_memory_allocated": lambda: C.max_memory_allocated(),
    "memory_reserved": lambda: C.memory_reserved(),
    "max_memory_reserved": lambda: C.max_memory_reserved(),
    "memory_stats": lambda: C.memory_stats(),
    "empty_cache": lambda: C.empty_cache(),
    "manual_seed": lambda: C.manual_seed(0),
    "manual_seed_all": lambda: C.manual_seed_all(0),
    "seed": lambda: C.seed(),
    "seed_all": lambda: C.seed_all(),
    "get_rng_state_all": lambda: C.get_rng_state_all(),
    "set_rng_state": lambda: C.set_rng_state(torch.ByteTensor(16)),
    "set_rng_state_all": lambda: C.set_rng_state_all([]),
    "is_bf16_supported": lambda: C.is_bf16_supported(),
    "get_arch_list": lambda: C.get_arch_list(),
    "stream": lambda: _enter(C.stream(None)),
}


def test_every_table_entry_has_a_real_call() -> None:
    assert set(RAISING_CALLS) == cuda_api.RAISES
    assert set(LAZY_CALLS) == cuda_api.LAZY
    assert not cuda_api.RAISES & cuda_api.LAZY


@pytest.mark.parametrize("name", sorted(RAISING_CALLS))
def test_raises_without_cuda(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(Exception):  # noqa: B017 - AssertionError, RuntimeError, … vary
            RAISING_CALLS[name]()
    assert cuda_api.behaviour(name) == "raises"


@pytest.mark.parametrize("name", sorted(LAZY_CALLS))
def test_lazy_calls_do_not_raise_without_cuda(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        LAZY_CALLS[name]()
    assert cuda_api.behaviour(name) == "lazy"


def test_unknown_calls_are_unchecked_not_raising() -> None:
    assert cuda_api.behaviour("jiterator._create_jit_fn") == "unchecked"


def test_other_rules_claims_hold_on_cpu_only_torch() -> None:
    """dot-cuda / cuda-device ("fails where CUDA is absent") and nccl ("macOS has none"):
    naming the device is fine, using it raises; an NCCL process group cannot start."""
    import torch.distributed as dist

    assert torch.device("cuda").type == "cuda"  # naming it does not raise…
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")  # …using it does
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1).cuda()
    assert not dist.is_nccl_available()
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="NCCL"):
        warnings.simplefilter("ignore")  # "NCCL support is not compiled", said before raising
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    assert not dist.is_initialized()
