"""The ``torch`` provider: every operator with the fastest plain-PyTorch means, on cpu and cuda.

Each module holds one kernel family and exports ``IMPLEMENTATIONS``; `MODULES` lists them, and this module
gathers them for the ``infiniops_provider`` hook.
"""

from __future__ import annotations

from infiniops_py import Provider, hookimpl
from infiniops_py.registry import provider_from_modules

__all__ = ["MODULES", "infiniops_provider"]

MODULES = ("gemm", "add", "rms_norm", "fused_qk_norm", "paged_cache", "flash_attn", "causal_conv1d", "selective_scan",
           "silu_and_mul", "rotary_embedding", "fused_qk_norm_rope", "gemm_swiglu", "gemm_add_rms_norm",
           "rms_norm_gemm", "all_reduce", "rms_norm_gated", "sampling")


@hookimpl
def infiniops_provider() -> Provider:
    """The ``torch`` provider: the implementations of its `MODULES`, built for provider API 1."""
    return provider_from_modules("torch", "infiniops_torch", MODULES, api_version=1)
