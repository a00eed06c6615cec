"""What the SSD kernels share: autotune configs that collapse to one under the interpreter, dot precision."""

from __future__ import annotations

import os
from typing import Any

import torch
import triton

__all__ = ["autotune_configs", "dot_precision", "fit_to_chunk", "interpreting"]


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def autotune_configs(candidates: list[dict[str, Any]], interpreter: dict[str, Any]) -> list[triton.Config]:
    """`candidates` as `triton.Config`s; under the interpreter only `interpreter` (nothing to tune there).

    Each dict holds the kernel's block sizes plus ``num_warps`` and ``num_stages``.
    """
    chosen = [interpreter] if interpreting() else candidates
    out = []
    for c in chosen:
        meta = {k: v for k, v in c.items() if k not in ("num_warps", "num_stages")}
        out.append(triton.Config(meta, num_warps=c["num_warps"], num_stages=c["num_stages"]))
    return out


def fit_to_chunk(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    """Autotune pruning: drop configs whose token blocks (``BLOCK_M``, ``BLOCK_K``) exceed the chunk; when
    none fits, keep the one with the smallest blocks (it masks the excess)."""
    chunk = kwargs.get("CHUNK", named_args.get("CHUNK"))

    def blocks(c: triton.Config) -> tuple[int, int]:
        return c.kwargs.get("BLOCK_M", 0), c.kwargs.get("BLOCK_K", 0)

    fits = [c for c in configs if max(blocks(c)) <= chunk]
    return fits or [min(configs, key=blocks)]


def dot_precision(dtype: torch.dtype) -> str:
    """``tf32x3`` for fp32 inputs: three TF32 tensor-core products, fp32-accurate to ~1e-6 (one TF32 pass
    would break the fp32 tolerance; ``ieee`` runs on the FMA units and spills at these tile sizes); else
    ``tf32``, which 16-bit operands ignore (tensor cores with fp32 accumulation)."""
    return "tf32x3" if dtype == torch.float32 else "tf32"
