"""The ``triton`` provider: every operator as a Triton kernel with its launcher, one module per kernel.

Each module exports ``IMPLEMENTATIONS``; this module gathers them for the ``infiniops_provider`` hook.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

from infiniops_py import Provider, hookimpl
from infiniops_triton._common import interpreting_on_cpu

__all__ = ["infiniops_provider"]

_MODULES = ("gemm", "add", "rms_norm", "fused_qk_norm", "paged_cache", "flash_attn", "causal_conv1d",
            "selective_scan")


@hookimpl
def infiniops_provider() -> Provider:
    if interpreting_on_cpu():  # the CPU interpreter run (CI): make it compute what the GPU computes
        from infiniops_triton._interpreter import patch_interpreter

        patch_interpreter()
    impls = [impl for m in _MODULES for impl in importlib.import_module(f"infiniops_triton.{m}").IMPLEMENTATIONS]
    try:
        ver = version("infiniops-provider-triton")
    except PackageNotFoundError:
        ver = "0+unknown"
    return Provider(name="triton", version=ver, implementations=impls, api_version=1)  # hookspecs.PROVIDER_API
