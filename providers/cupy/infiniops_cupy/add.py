"""Add as a CuPy ElementwiseKernel: CuPy does the broadcasting and strides; in place when out is input."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from infiniops_cupy._common import DTYPES, PRIORITY, as_cupy, base_constraints, stream
from infiniops_py import Capability, Implementation

__all__ = ["IMPLEMENTATIONS", "add"]

_BF16_OP = (
    "z = __bfloat16_as_short(__float2bfloat16_rn(__bfloat162float(__short_as_bfloat16(x))"
    " + alpha * __bfloat162float(__short_as_bfloat16(y))))"
)


@functools.cache
def _kernel(dtype: torch.dtype) -> Any:
    import cupy

    if dtype == torch.bfloat16:  # CuPy has no bfloat16: the tensors travel as int16 bits
        return cupy.ElementwiseKernel("int16 x, int16 y, float32 alpha", "int16 z", _BF16_OP,
                                      "infiniops_add_bf16", preamble="#include <cuda_bf16.h>")
    return cupy.ElementwiseKernel("T x, T y, float32 alpha", "T z", "z = (T)((float)x + alpha * (float)y)",
                                  "infiniops_add")


def add(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    if out.numel() == 0:
        return out
    with stream(out.device):
        _kernel(out.dtype)(as_cupy(input), as_cupy(other), np.float32(alpha), as_cupy(out))
    return out


IMPLEMENTATIONS = [
    Implementation("add", "cupy", "cupy.add_elementwise", Capability(*base_constraints(), DTYPES), PRIORITY, add),
]
