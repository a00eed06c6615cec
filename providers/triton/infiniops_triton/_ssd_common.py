"""What the SSD kernels share: autotune configs that collapse to one under the interpreter, dot precision."""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["autotune_configs", "dot", "dot_mode", "interpreting"]


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


def dot_mode(dtype: torch.dtype) -> str:
    """How `dot` multiplies tiles of inputs in `dtype`.

    ``ieee`` for fp32 (the fp32 tolerance rules out TF32); ``upcast`` for bf16 under the interpreter
    (Triton 3.6's interpreter multiplies bf16 bit patterns as integers); else ``tf32``, which 16-bit
    operands ignore (tensor cores, fp32 accumulation).
    """
    if dtype == torch.float32:
        return "ieee"
    return "upcast" if interpreting() and dtype == torch.bfloat16 else "tf32"


@triton.jit
def dot(a, b, MODE: tl.constexpr):
    """``a @ b`` with fp32 accumulation, as `dot_mode` chose."""
    if MODE == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=MODE)
