"""The ``cupy`` provider: CUDA C kernels compiled by CuPy (NVRTC), cuBLAS through CuPy's binding.

Tensors cross from torch to CuPy through DLPack with no copy, and every kernel runs on torch's current
CUDA stream. The provider imports without CuPy or a GPU: its implementations are then listed and gated
("cupy is not importable", "no CUDA device"), and nothing else breaks.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

from infiniops_py import Provider, hookimpl

__all__ = ["infiniops_provider"]

_MODULES = ("gemm", "add", "rms_norm", "fused_qk_norm", "paged_cache", "causal_conv1d", "selective_scan")


@hookimpl
def infiniops_provider() -> Provider:
    impls = [impl for m in _MODULES for impl in importlib.import_module(f"infiniops_cupy.{m}").IMPLEMENTATIONS]
    try:
        ver = version("infiniops-provider-cupy")
    except PackageNotFoundError:
        ver = "0+unknown"
    return Provider(name="cupy", version=ver, implementations=impls, api_version=1)  # hookspecs.PROVIDER_API
