"""FusedQkNorm: one CUDA block per (token, Q-or-K head) of the packed QKV; V columns are never touched."""

from __future__ import annotations

import numpy as np
import torch

from infiniops_cupy._common import DTYPES, PRIORITY, SCALAR_TYPES, as_cupy, base_constraints, module, stream
from infiniops_py import Capability, Implementation

__all__ = ["IMPLEMENTATIONS", "fused_qk_norm"]

_SOURCE = r"""
extern "C" __global__ void fused_qk_norm(SCALAR* __restrict__ qkv, long long row_stride,
                                         const SCALAR* __restrict__ q_w, const SCALAR* __restrict__ k_w,
                                         long long num_q_heads, long long head_dim, float eps) {
    __shared__ float shared[32];
    const long long head = blockIdx.y;                 // K heads follow the Q heads in the packed layout
    SCALAR* v = qkv + blockIdx.x * row_stride + head * head_dim;
    const SCALAR* w = head < num_q_heads ? q_w : k_w;
    float ss = 0.0f;
    for (long long i = threadIdx.x; i < head_dim; i += blockDim.x) { float e = to_f(v[i]); ss += e * e; }
    const float rstd = rsqrtf(block_sum(ss, shared) / (float)head_dim + eps);
    for (long long i = threadIdx.x; i < head_dim; i += blockDim.x)
        v[i] = from_f<SCALAR>(rnd(to_f(v[i]) * rstd) * to_f(w[i]));
}
"""


def fused_qk_norm(qkv: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, num_q_heads: int,
                  num_kv_heads: int, head_dim: int, eps: float) -> None:
    tokens = qkv.shape[0]
    if tokens == 0:
        return
    fn = module(_SOURCE, SCALAR_TYPES[qkv.dtype]).get_function("fused_qk_norm")
    threads = 128 if head_dim > 64 else 64
    with stream(qkv.device):
        fn((tokens, num_q_heads + num_kv_heads), (threads,),
           (as_cupy(qkv), np.int64(qkv.stride(0)), as_cupy(q_weight), as_cupy(k_weight), np.int64(num_q_heads),
            np.int64(head_dim), np.float32(eps)))


IMPLEMENTATIONS = [
    Implementation("fused_qk_norm", "cupy", "cupy.fused_qk_norm",
                   Capability(*base_constraints(), DTYPES), PRIORITY, fused_qk_norm),
]
