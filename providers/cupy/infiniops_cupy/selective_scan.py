"""selective_state_update (Mamba-2 decode step): one CUDA block per (batch row, head), a warp per P row.

Only the decode step is served here, for float32 states and one step and decay per head (dt [B, H], A [H],
dt_bias [H]); mamba's untied layouts and 16-bit or float64 states are gated to other providers, as is the
chunked prefill scan. dt is not clamped (mamba's ``selective_state_update`` has no ``dt_limit``).
"""

from __future__ import annotations

import numpy as np
import torch

from infiniops_cupy._common import DTYPES, PRIORITY, SCALAR_TYPES, as_cupy, base_constraints, module, stream
from infiniops_py import Capability, Implementation, OneOf

__all__ = ["IMPLEMENTATIONS", "selective_state_update"]

_SOURCE = r"""
extern "C" __global__ void state_update(
        float* __restrict__ state, long long st_b, long long st_h, long long st_p,    // n stride 1
        const SCALAR* __restrict__ x, long long x_b, long long x_h,                  // p stride 1
        const float* __restrict__ dt, long long dt_b, long long dt_h,                // fp32 copy: any dtype
        const float* __restrict__ A,
        const SCALAR* __restrict__ Bm, long long b_b, long long b_g,                 // n stride 1
        const SCALAR* __restrict__ Cm, long long c_b, long long c_g,
        const float* __restrict__ Dv, long long d_h, long long d_p,                  // may be null
        const SCALAR* __restrict__ z, long long z_b, long long z_h,                  // may be null
        const float* __restrict__ dt_bias,                                           // may be null
        const int* __restrict__ index,                                               // may be null
        SCALAR* __restrict__ out, long long o_b, long long o_h,
        long long P, long long N, long long heads_per_group, long long slots, int softplus) {
    const long long b = blockIdx.x, h = blockIdx.y, g = h / heads_per_group;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const long long row = index ? (long long)index[b] : b;
    if (row < 0 || row >= slots) {                    // padded row: output 0, state untouched
        for (long long p = threadIdx.x; p < P; p += blockDim.x) out[b * o_b + h * o_h + p] = from_f<SCALAR>(0.0f);
        return;
    }
    float dtv = to_f(dt[b * dt_b + h * dt_h]) + (dt_bias ? dt_bias[h] : 0.0f);
    if (softplus && dtv <= 20.0f) dtv = log1pf(expf(dtv));   // never clamped: a negative step stays
    const float dA = expf(dtv * A[h]);
    float* st = state + row * st_b + h * st_h;
    const SCALAR* bv = Bm + b * b_b + g * b_g;
    const SCALAR* cv = Cm + b * c_b + g * c_g;
    for (long long p = warp; p < P; p += warps) {
        const float xv = to_f(x[b * x_b + h * x_h + p]);
        float acc = 0.0f;
        for (long long n = lane; n < N; n += 32) {
            const float s = st[p * st_p + n] * dA + dtv * to_f(bv[n]) * xv;
            st[p * st_p + n] = s;
            acc += s * to_f(cv[n]);
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffff, acc, o);
        if (lane == 0) {
            float y = acc + (Dv ? Dv[h * d_h + p * d_p] * xv : 0.0f);
            if (z) { const float zv = to_f(z[b * z_b + h * z_h + p]); y *= zv / (1.0f + expf(-zv)); }
            out[b * o_b + h * o_h + p] = from_f<SCALAR>(y);
        }
    }
}
"""


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
                           dt_bias: torch.Tensor | None, dt_softplus: bool,
                           state_batch_indices: torch.Tensor | None, out: torch.Tensor) -> None:
    batch, heads, head_dim = x.shape
    if batch == 0:
        return
    groups, d_state = B.shape[1], B.shape[2]
    d_f = None if D is None else (D.float() if D.dim() == 2 else D.float()[:, None].expand(heads, head_dim))
    # the kernel indexes A, dt_bias and the slots with unit stride, and reads dt as fp32 (any dtype may come)
    bias_f = None if dt_bias is None else dt_bias.float().contiguous()
    dt_f = dt.float()
    index = None if state_batch_indices is None else state_batch_indices.to(torch.int32).contiguous()
    i64 = np.int64
    fn = module(_SOURCE, SCALAR_TYPES[x.dtype]).get_function("state_update")
    with stream(x.device):
        fn((batch, heads), (128,), (
            as_cupy(state), i64(state.stride(0)), i64(state.stride(1)), i64(state.stride(2)),
            as_cupy(x), i64(x.stride(0)), i64(x.stride(1)), as_cupy(dt_f), i64(dt_f.stride(0)), i64(dt_f.stride(1)),
            as_cupy(A.float().contiguous()), as_cupy(B), i64(B.stride(0)), i64(B.stride(1)),
            as_cupy(C), i64(C.stride(0)), i64(C.stride(1)),
            as_cupy(d_f), i64(0 if d_f is None else d_f.stride(0)), i64(0 if d_f is None else d_f.stride(1)),
            as_cupy(z), i64(0 if z is None else z.stride(0)), i64(0 if z is None else z.stride(1)),
            as_cupy(bias_f), as_cupy(index), as_cupy(out), i64(out.stride(0)), i64(out.stride(1)),
            i64(head_dim), i64(d_state), i64(heads // groups), i64(state.shape[0]), np.int32(dt_softplus)))


IMPLEMENTATIONS = [
    Implementation("selective_state_update", "cupy", "cupy.selective_state_update",
                   Capability(*base_constraints(), DTYPES,
                              OneOf("untied", (False,), fix="use the triton or torch provider for a per-channel "
                                                            "dt, A or dt_bias"),
                              OneOf("state_dtype", ("float32",), fix="use the triton or torch provider for "
                                                                     "16-bit states")),
                   PRIORITY, selective_state_update),
]
