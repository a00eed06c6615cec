"""The ``cupy`` provider: CUDA C kernels compiled by CuPy (NVRTC), cuBLAS through CuPy's binding.

Tensors cross from torch to CuPy through DLPack with no copy, and every kernel runs on torch's current
CUDA stream. The provider imports without CuPy or a GPU: its implementations are then listed and gated
("cupy is not importable", "no CUDA device"), and nothing else breaks.
"""

from __future__ import annotations

import dataclasses

from infiniops_py import Provider, hookimpl
from infiniops_py.registry import provider_from_modules

__all__ = ["MODULES", "infiniops_provider"]

# no FlashAttention, decode fusions, sampling nor AllReduce (the torch provider's torch.distributed serves
# the collective)
MODULES = ("gemm", "add", "rms_norm", "fused_qk_norm", "paged_cache", "causal_conv1d", "selective_scan")


@hookimpl
def infiniops_provider() -> Provider:
    """The ``cupy`` provider: the implementations of its `MODULES`, built for provider API 1.

    Importing its modules needs neither CuPy nor a GPU (each module defers CuPy to its first call).
    """
    provider = provider_from_modules("cupy", "infiniops_cupy", MODULES, api_version=1)
    # CuPy refuses cuBLAS (and most CUDA library) calls while a stream captures a graph, and its own memory
    # pool may allocate: none of its implementations is graph-safe, so measured ranking never promotes one
    # over a capturable implementation (they serve by priority, or when forced with use("cupy")).
    provider.implementations = [dataclasses.replace(i, graph_safe=False) for i in provider.implementations]
    return provider
