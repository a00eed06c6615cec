"""RmsNorm and fused add + RmsNorm: one CUDA block per row, fp32 sums, vLLM's rounding order."""

from __future__ import annotations

import numpy as np
import torch

from infiniops_cupy._common import DTYPES, PRIORITY, SCALAR_TYPES, as_cupy, base_constraints, module, stream
from infiniops_py import Capability, Implementation

__all__ = ["IMPLEMENTATIONS", "fused_add_rms_norm", "rms_norm"]

_SOURCE = r"""
extern "C" __global__ void rms_norm(const SCALAR* __restrict__ x, long long x_row_stride,
                                    const SCALAR* __restrict__ w, SCALAR* __restrict__ out,
                                    long long hidden, float eps) {
    __shared__ float shared[32];
    const SCALAR* xr = x + blockIdx.x * x_row_stride;   // one row per block
    SCALAR* yr = out + blockIdx.x * hidden;              // out is contiguous
    float ss = 0.0f;
    for (long long i = threadIdx.x; i < hidden; i += blockDim.x) { float v = to_f(xr[i]); ss += v * v; }
    const float rstd = rsqrtf(block_sum(ss, shared) / (float)hidden + eps);
    for (long long i = threadIdx.x; i < hidden; i += blockDim.x)
        yr[i] = from_f<SCALAR>(rnd(to_f(xr[i]) * rstd) * to_f(w[i]));
}

extern "C" __global__ void fused_add_rms_norm(SCALAR* __restrict__ x, long long x_row_stride,
                                              SCALAR* __restrict__ res, long long res_row_stride,
                                              const SCALAR* __restrict__ w, long long hidden, float eps) {
    __shared__ float shared[32];
    SCALAR* xr = x + blockIdx.x * x_row_stride;
    SCALAR* rr = res + blockIdx.x * res_row_stride;
    float ss = 0.0f;
    for (long long i = threadIdx.x; i < hidden; i += blockDim.x) {
        const float r = rnd(to_f(xr[i]) + to_f(rr[i]));   // residual <- x + residual, rounded to dtype
        rr[i] = from_f<SCALAR>(r);
        ss += r * r;
    }
    const float rstd = rsqrtf(block_sum(ss, shared) / (float)hidden + eps);
    for (long long i = threadIdx.x; i < hidden; i += blockDim.x)   // each thread re-reads its own writes
        xr[i] = from_f<SCALAR>(rnd(to_f(rr[i]) * rstd) * to_f(w[i]));
}
"""


def _threads(hidden: int) -> int:
    return 1024 if hidden >= 4096 else 512 if hidden >= 1024 else 128


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> torch.Tensor:
    rows, hidden = x.shape
    if rows == 0:
        return out
    fn = module(_SOURCE, SCALAR_TYPES[x.dtype]).get_function("rms_norm")
    with stream(x.device):
        fn((rows,), (_threads(hidden),),
           (as_cupy(x), np.int64(x.stride(0)), as_cupy(weight), as_cupy(out), np.int64(hidden), np.float32(eps)))
    return out


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    rows, hidden = x.shape
    if rows == 0:
        return
    fn = module(_SOURCE, SCALAR_TYPES[x.dtype]).get_function("fused_add_rms_norm")
    with stream(x.device):
        fn((rows,), (_threads(hidden),), (as_cupy(x), np.int64(x.stride(0)), as_cupy(residual),
                                         np.int64(residual.stride(0)), as_cupy(weight), np.int64(hidden),
                                         np.float32(eps)))


_CAP = Capability(*base_constraints(), DTYPES)
IMPLEMENTATIONS = [
    Implementation("rms_norm", "cupy", "cupy.rms_norm", _CAP, PRIORITY, rms_norm),
    Implementation("fused_add_rms_norm", "cupy", "cupy.fused_add_rms_norm", _CAP, PRIORITY, fused_add_rms_norm),
]
