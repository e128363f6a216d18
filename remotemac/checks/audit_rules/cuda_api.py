"""Which ``torch.cuda`` calls raise on a torch without CUDA, and which are lazy.

A finding that says "raises without CUDA" must be true, so each name in
``RAISES`` and ``LAZY`` is called on the installed CPU-only torch by
tests/test_audit_cuda_api.py (2.13.0+cpu when written): the ``RAISES`` ones must
raise, the ``LAZY`` ones must return. A call in neither table is reported as
unchecked, never as raising.
"""

from __future__ import annotations

#: raise AssertionError/RuntimeError/AttributeError/TypeError when torch has no CUDA
RAISES = frozenset(
    {
        "synchronize",
        "current_device",
        "set_device",
        "get_device_name",
        "get_device_properties",
        "get_device_capability",
        "mem_get_info",
        "reset_peak_memory_stats",
        "reset_max_memory_allocated",
        "memory_summary",
        "ipc_collect",
        "initial_seed",
        "get_rng_state",
        "current_stream",
        "default_stream",
        "Stream",
        "Event",
        "init",
        "set_per_process_memory_fraction",
        "CUDAGraph",
        "set_sync_debug_mode",
        "caching_allocator_alloc",
        "can_device_access_peer",
        "device",
        "nvtx.range_push",
        "nvtx.range_pop",
        "FloatTensor",
        "HalfTensor",
        "LongTensor",
        "IntTensor",
        "BFloat16Tensor",
        "ByteTensor",
        "BoolTensor",
        "DoubleTensor",
    }
)

#: return quietly without CUDA (seeding, cache and memory queries, capability queries)
LAZY = frozenset(
    {
        "is_available",
        "device_count",
        "is_initialized",
        "_is_compiled",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "memory_stats",
        "empty_cache",
        "manual_seed",
        "manual_seed_all",
        "seed",
        "seed_all",
        "get_rng_state_all",
        "set_rng_state",
        "set_rng_state_all",
        "is_bf16_supported",
        "get_arch_list",
        "stream",
    }
)


def behaviour(sub: str) -> str:
    """ "raises", "lazy" or "unchecked" for ``torch.cuda.<sub>``."""
    if sub in RAISES:
        return "raises"
    if sub in LAZY:
        return "lazy"
    return "unchecked"
