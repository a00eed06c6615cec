"""The ``torch`` provider: every operator with the fastest plain-PyTorch means, on cpu and cuda.

Each module holds one kernel family and exports ``IMPLEMENTATIONS``; this module gathers them for the
``infiniops_provider`` hook.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from infiniops_py import Provider, hookimpl

__all__ = ["infiniops_provider"]

_MODULES = ("gemm", "add", "rms_norm", "fused_qk_norm", "paged_cache", "flash_attn", "causal_conv1d", "selective_scan")


@hookimpl
def infiniops_provider() -> Provider:
    import importlib

    impls = [impl for m in _MODULES for impl in importlib.import_module(f"infiniops_torch.{m}").IMPLEMENTATIONS]
    try:
        ver = version("infiniops-provider-torch")
    except PackageNotFoundError:
        ver = "0+unknown"
    return Provider(name="torch", version=ver, implementations=impls, api_version=1)  # hookspecs.PROVIDER_API
