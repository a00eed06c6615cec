"""What the SSD kernels share: autotune configs that collapse to one under the interpreter, dot precision,
fast exponentials and the products of an fp32 operand with a 16-bit one.

Those products take one of three forms (a kernel's ``PRODUCT`` constexpr; fp32 inputs ignore it):

- `SPLIT`: the fp32 operand as a rounded 16-bit high part plus the rounded rest, two tensor-core products
  (relative error ~2^-16);
- `TF32`: the 16-bit operand widened to fp32 (exactly), one TF32 product (the fp32 operand rounded to TF32's
  10-bit mantissa: ~2^-11);
- `ROUND`: the fp32 operand rounded to the 16-bit dtype, one product (bf16: ~2^-9; state-spaces/mamba's
  choice).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = [
    "LOG2E",
    "PRODUCTS",
    "ROUND",
    "SPLIT",
    "TF32",
    "autotune_configs",
    "dot_f32_left",
    "dot_f32_right",
    "dot_precision",
    "fast_exp",
    "fit_to_chunk",
    "interpreting",
    "split_f32",
]

SPLIT, TF32, ROUND = 0, 1, 2  # the product forms (module docstring)
PRODUCTS = {"split": SPLIT, "tf32": TF32, "round": ROUND}  # by name, for configurations and tables
LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E): one ex2.approx, not libdevice's expf


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def autotune_configs(candidates: list[dict[str, Any]], interpreter: dict[str, Any]) -> list[triton.Config]:
    """`candidates` as `triton.Config`s; under the interpreter only `interpreter` (nothing to tune there).

    Each dict holds the kernel's block sizes plus ``num_warps``, ``num_stages`` and optionally ``maxnreg`` (a
    register cap per thread, for more programs per SM).
    """
    chosen = [interpreter] if interpreting() else candidates
    out = []
    for c in chosen:
        meta = {k: v for k, v in c.items() if k not in ("num_warps", "num_stages", "maxnreg")}
        out.append(triton.Config(meta, num_warps=c["num_warps"], num_stages=c["num_stages"],
                                 maxnreg=c.get("maxnreg")))
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


@triton.jit
def fast_exp(x):
    """``exp(x)`` in fp32 through ``exp2`` (relative error ~2^-22, far below every tolerance)."""
    return tl.exp2(x * LOG2E)


@triton.jit
def _rest(value, high):
    """``value - high``, or 0 where they are equal (an infinite `value` keeps its inf, not inf - inf)."""
    return tl.where(value == high, 0.0, value - high)


@triton.jit
def split_f32(value, DTYPE: tl.constexpr):
    """fp32 `value` as ``(hi, lo)`` in the 16-bit `DTYPE`: ``hi`` rounded, ``lo`` the rounded rest (``hi + lo``
    within ~2^-16 relative of `value`; an infinite value keeps ``lo`` 0)."""
    hi = value.to(DTYPE)
    lo = _rest(value, hi.to(tl.float32)).to(DTYPE)
    return hi, lo


@triton.jit
def dot_f32_right(a, b, acc, DOT_PRECISION: tl.constexpr, PRODUCT: tl.constexpr):
    """``acc + a @ b`` for `a` in the inputs' dtype (exact) and `b` fp32 (weights, states).

    16-bit inputs: `PRODUCT` picks the form (module docstring). `SPLIT` splits `b` into a rounded high part and
    the rounded rest, two tensor-core products (relative error ~2^-16 instead of the 2^-8 of one bf16
    rounding, which broke the bf16 and fp16 tolerances at the Mamba-2 layer shape); fp32 inputs: one
    product at `DOT_PRECISION`.
    """
    if a.dtype == tl.float32:
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    elif PRODUCT == 1:  # TF32
        acc = tl.dot(a.to(tl.float32), b, acc, input_precision="tf32")
    elif PRODUCT == 2:  # ROUND
        acc = tl.dot(a, b.to(a.dtype), acc)
    else:
        hi = b.to(a.dtype)
        lo = _rest(b, hi.to(tl.float32)).to(a.dtype)
        acc = tl.dot(a, hi, acc)
        acc = tl.dot(a, lo, acc)
    return acc


@triton.jit
def dot_f32_left(a, b, acc, DOT_PRECISION: tl.constexpr, PRODUCT: tl.constexpr):
    """``acc + a @ b`` for `a` fp32 and `b` in the inputs' dtype: `dot_f32_right` with the sides swapped."""
    if b.dtype == tl.float32:
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    elif PRODUCT == 1:  # TF32
        acc = tl.dot(a, b.to(tl.float32), acc, input_precision="tf32")
    elif PRODUCT == 2:  # ROUND
        acc = tl.dot(a.to(b.dtype), b, acc)
    else:
        hi = a.to(b.dtype)
        lo = _rest(a, hi.to(tl.float32)).to(b.dtype)
        acc = tl.dot(hi, b, acc)
        acc = tl.dot(lo, b, acc)
    return acc
