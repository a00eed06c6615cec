"""causal_conv1d_update (decode): one CUDA thread per (batch row, channel), state rolled in place.

Only the decode step with a rolling state is served here; the circular state (``cache_seqlens``) and the
full-sequence `causal_conv1d` are gated to other providers.
"""

from __future__ import annotations

import numpy as np
import torch

from infiniops_cupy._common import DTYPES, PRIORITY, SCALAR_TYPES, as_cupy, base_constraints, module, stream
from infiniops_py import Capability, Implementation, OneOf

__all__ = ["IMPLEMENTATIONS", "causal_conv1d_update"]

_SOURCE = r"""
extern "C" __global__ void conv_update(
        const SCALAR* __restrict__ x, long long x_b, long long x_d, long long x_l,
        SCALAR* __restrict__ state, long long s_b, long long s_d, long long s_s,
        const float* __restrict__ w, long long w_d, long long w_w,   // fp32 copies: exact for any dtype
        const float* __restrict__ bias,                   // may be null
        const int* __restrict__ index,                    // may be null: row b uses state row b
        SCALAR* __restrict__ out, long long o_b, long long o_d, long long o_l,
        long long batch, long long dim, long long seqlen, long long state_len, long long slots,
        int width, int silu) {
    const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= batch * dim) return;
    const long long b = gid / dim, d = gid % dim;
    const long long row = index ? (long long)index[b] : b;
    if (row < 0 || row >= slots) {                     // padded row: output 0, state untouched
        for (long long l = 0; l < seqlen; ++l) out[b * o_b + d * o_d + l * o_l] = from_f<SCALAR>(0.0f);
        return;
    }
    SCALAR* st = state + row * s_b + d * s_d;
    const SCALAR* xs = x + b * x_b + d * x_d;
    float win[4], wt[4];                                   // width <= 4
    for (int k = 0; k < width; ++k) wt[k] = w[d * w_d + k * w_w];
    for (int k = 0; k < width - 1; ++k) win[k] = to_f(st[(state_len - (width - 1) + k) * s_s]);
    const float bv = bias ? bias[d] : 0.0f;
    for (long long l = 0; l < seqlen; ++l) {
        const float xv = to_f(xs[l * x_l]);
        float acc = bv + wt[width - 1] * xv;
        for (int k = 0; k < width - 1; ++k) acc += wt[k] * win[k];
        if (silu) acc = acc / (1.0f + expf(-acc));
        out[b * o_b + d * o_d + l * o_l] = from_f<SCALAR>(acc);
        for (int k = 0; k + 1 < width - 1; ++k) win[k] = win[k + 1];
        if (width > 1) win[width - 2] = xv;
    }
    // state <- concat(state, x)[-state_len:]; ascending s reads positions not yet overwritten
    for (long long s = 0; s < state_len; ++s) {
        const long long src = s + seqlen;
        st[s * s_s] = src < state_len ? st[src * s_s] : xs[(src - state_len) * x_l];
    }
}
"""


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None, activation: str | None,
                         conv_state_indices: torch.Tensor | None, out: torch.Tensor) -> None:
    batch, dim, seqlen = x.shape
    if batch == 0 or seqlen == 0:
        return
    weight = weight.float()
    bias = None if bias is None else bias.float().contiguous()  # the kernel reads bias and index with unit stride
    index = None if conv_state_indices is None else conv_state_indices.to(torch.int32).contiguous()
    fn = module(_SOURCE, SCALAR_TYPES[x.dtype]).get_function("conv_update")
    i64 = np.int64
    threads = 128
    with stream(x.device):
        fn(((batch * dim + threads - 1) // threads,), (threads,), (
            as_cupy(x), i64(x.stride(0)), i64(x.stride(1)), i64(x.stride(2)),
            as_cupy(conv_state), i64(conv_state.stride(0)), i64(conv_state.stride(1)), i64(conv_state.stride(2)),
            as_cupy(weight), i64(weight.stride(0)), i64(weight.stride(1)), as_cupy(bias), as_cupy(index),
            as_cupy(out), i64(out.stride(0)), i64(out.stride(1)), i64(out.stride(2)),
            i64(batch), i64(dim), i64(seqlen), i64(conv_state.shape[2]), i64(conv_state.shape[0]),
            np.int32(weight.shape[1]), np.int32(activation == "silu")))


IMPLEMENTATIONS = [
    Implementation("causal_conv1d_update", "cupy", "cupy.causal_conv1d_update",
                   Capability(*base_constraints(), DTYPES, OneOf("width", (2, 3, 4)),
                              OneOf("has_cache_seqlens", (False,), fix="use the triton or torch provider for a "
                                                                       "circular state")), PRIORITY,
                   causal_conv1d_update),
]
