"""The ``triton`` provider: every operator as a Triton kernel with its launcher, one module per kernel.

Each module exports ``IMPLEMENTATIONS``; `MODULES` lists them (no AllReduce: the torch provider's
torch.distributed serves the collective), and this module gathers them for the ``infiniops_provider`` hook.
"""

from __future__ import annotations

from infiniops_py import Provider, hookimpl
from infiniops_py.registry import provider_from_modules
from infiniops_triton._common import interpreting_on_cpu

__all__ = ["MODULES", "infiniops_provider"]

MODULES = ("gemm", "add", "rms_norm", "fused_qk_norm", "paged_cache", "flash_attn", "causal_conv1d", "selective_scan",
           "silu_and_mul", "rotary_embedding", "fused_qk_norm_rope", "gemm_swiglu", "gemm_add_rms_norm",
           "rms_norm_gemm", "rms_norm_gated", "sampling")


@hookimpl
def infiniops_provider() -> Provider:
    """The ``triton`` provider: the implementations of its `MODULES`, built for provider API 1.

    Under the CPU interpreter (``interpreting_on_cpu``) the interpreter is patched first, before any kernel
    module is imported.
    """
    if interpreting_on_cpu():  # the CPU interpreter run (CI): make it compute what the GPU computes
        from infiniops_triton._interpreter import patch_interpreter

        patch_interpreter()
    return provider_from_modules("triton", "infiniops_triton", MODULES, api_version=1)
