"""`selective_state_update`: one Mamba-2 decode step on states gathered by slot, in place.

For each row ``b`` with slot ``i = state_batch_indices[b]`` (or ``b``), head ``h`` (group ``g``)::

    dt = softplus(dt[b, h] + dt_bias[h])  (softplus and bias when asked; never clamped)
    state[i, h] = exp(dt * A[h]) * state[i, h] + dt * x[b, h] (outer) B[b, g]
    out[b, h]   = state[i, h] @ C[b, g] + D[h] * x[b, h],  times silu(z[b, h]) when z is given

It is state-spaces/mamba's ``selective_state_update``: like it, dt is not clamped (a negative step stays
negative), so for dt >= 0 it is one step of `selective_scan`. With mamba's untied layouts (``UNTIED``: dt
[B, H, P], A [H, P, N], dt_bias [H, P], any of them, the per-head ones read through zero strides) each
channel has its own step and each (channel, state) its own decay. The state may be float16, bfloat16 or
float32 (mamba's kernel keeps any): it is read once, updated in fp32 and written once, rounded to its
dtype; the output comes from the unrounded fp32 state. A row whose slot is negative (padding) or out of
range (only possible with unchecked indices) reads and writes no state and gets a zero output. The kernel
is bound by the state's bytes, so each program streams one contiguous ``BLOCK_P x N`` tile of one (row, head).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from infiniops_py import Between, Capability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints, cdiv, next_power_of_2
from infiniops_triton._fastlaunch import Launcher

__all__ = ["IMPLEMENTATIONS", "MAX_D_STATE", "launch", "selective_state_update", "update_config"]

MAX_D_STATE = 256  # one program holds a whole state row (N values) in registers


@triton.jit
def _state_update_kernel(
    state_ptr,  # [slots, H, P, N] fp16/bf16/fp32, updated in place; any strides
    x_ptr,  # [B, H, P]
    dt_ptr,  # [B, H] or [B, H, P]
    a_ptr,  # [H] or [H, P, N] fp32
    b_ptr,  # [B, G, N]
    c_ptr,  # [B, G, N]
    d_ptr,  # [H] or [H, P] (read when HAS_D; stride_d_p is 0 for [H])
    z_ptr,  # [B, H, P] (read when HAS_Z)
    dt_bias_ptr,  # [H] or [H, P] (read when HAS_DT_BIAS)
    index_ptr,  # [B] int32/int64 slots (read when HAS_INDICES)
    out_ptr,  # out: [B, H, P] in x's dtype
    slots, H, P, N, heads_per_group,
    stride_s_slot, stride_s_h, stride_s_p, stride_s_n,
    stride_x_b, stride_x_h, stride_x_p,
    stride_dt_b, stride_dt_h, stride_dt_p,  # stride_dt_p: 0 for dt [B, H] (read when UNTIED)
    stride_a_h, stride_a_p, stride_a_n,  # A [H] or [H, P, N]: 0 for the dims A lacks
    stride_bias_h, stride_bias_p,  # dt_bias [H] or [H, P]: stride_bias_p 0 for [H]
    stride_b_b, stride_b_g, stride_b_n,
    stride_c_b, stride_c_g, stride_c_n,
    stride_d_h, stride_d_p,
    stride_z_b, stride_z_h, stride_z_p,
    stride_o_b, stride_o_h, stride_o_p,
    stride_index,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    UNTIED: tl.constexpr,  # a step per (head, channel) and a decay per (head, channel, state)
    EVEN: tl.constexpr,  # BLOCK_P divides P and BLOCK_N == N: no masks on the state tile
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # One flat axis, P blocks fastest, then heads, then rows: consecutive programs stream one slot's
    # contiguous [H, P, N] state.
    p_tiles = tl.cdiv(P, BLOCK_P)
    pid = tl.program_id(0)
    pid_p = pid % p_tiles
    h = (pid // p_tiles) % H
    b = (pid // (p_tiles * H)).to(tl.int64)
    g = h // heads_per_group
    # The slot first: the state load waits on it, everything else can be in flight meanwhile.
    slot = tl.load(index_ptr + b * stride_index).to(tl.int64) if HAS_INDICES else b
    live = (slot >= 0) & (slot < slots)
    slot = tl.where(live, slot, 0)  # never form an address outside the state tensor

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    mask_p = offs_p < P
    mask_n = offs_n < N
    mask = live if EVEN else mask_p[:, None] & mask_n[None, :] & live
    s_ptrs = (state_ptr + slot * stride_s_slot + h * stride_s_h
              + (offs_p[:, None] * stride_s_p + offs_n[None, :] * stride_s_n))
    s = tl.load(s_ptrs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)

    if UNTIED:  # [BLOCK_P] steps, [BLOCK_P, BLOCK_N] decays (zero strides for the per-head arguments)
        dt = tl.load(dt_ptr + b * stride_dt_b + h * stride_dt_h + offs_p * stride_dt_p, mask=mask_p,
                     other=0.0).to(tl.float32)
        if HAS_DT_BIAS:
            dt += tl.load(dt_bias_ptr + h * stride_bias_h + offs_p * stride_bias_p, mask=mask_p,
                          other=0.0).to(tl.float32)
    else:
        dt = tl.load(dt_ptr + b * stride_dt_b + h * stride_dt_h).to(tl.float32)
        if HAS_DT_BIAS:
            dt += tl.load(dt_bias_ptr + h * stride_bias_h).to(tl.float32)
    if DT_SOFTPLUS:
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    if UNTIED:
        a = tl.load(a_ptr + h * stride_a_h + offs_p[:, None] * stride_a_p + offs_n[None, :] * stride_a_n,
                    mask=mask_p[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
        decay = tl.exp2(dt[:, None] * a * 1.4426950408889634)  # exp via one ex2
    else:
        decay = tl.exp2(dt * tl.load(a_ptr + h * stride_a_h).to(tl.float32) * 1.4426950408889634)

    x = tl.load(x_ptr + b * stride_x_b + h * stride_x_h + offs_p * stride_x_p, mask=mask_p, other=0.0)
    x = x.to(tl.float32)
    bv = tl.load(b_ptr + b * stride_b_b + g * stride_b_g + offs_n * stride_b_n, mask=mask_n, other=0.0)
    cv = tl.load(c_ptr + b * stride_c_b + g * stride_c_g + offs_n * stride_c_n, mask=mask_n, other=0.0)
    s = s * decay + (dt * x)[:, None] * bv.to(tl.float32)[None, :]
    tl.store(s_ptrs, s.to(state_ptr.dtype.element_ty), mask=mask)

    y = tl.sum(s * cv.to(tl.float32)[None, :], axis=1)
    if HAS_D:
        y += x * tl.load(d_ptr + h * stride_d_h + offs_p * stride_d_p, mask=mask_p, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + b * stride_z_b + h * stride_z_h + offs_p * stride_z_p, mask=mask_p, other=0.0)
        z = z.to(tl.float32)
        y *= z * tl.sigmoid(z)
    y = tl.where(live, y, 0.0)
    tl.store(out_ptr + b * stride_o_b + h * stride_o_h + offs_p * stride_o_p,
             y.to(out_ptr.dtype.element_ty), mask=mask_p)


_STATE_UPDATE = Launcher(_state_update_kernel)


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state_batch_indices: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """One decode step: update `state` in place and write `out`, with the operator's calling convention.

    Shapes: state fp16/bf16/fp32 ``[slots, H, P, N]``; x, z, out ``[B, H, P]``; dt ``[B, H]`` or
    ``[B, H, P]``; A ``[H]`` or ``[H, P, N]`` fp32; B, C ``[B, G, N]``; D ``[H]`` or ``[H, P]``; dt_bias
    ``[H]`` or ``[H, P]``; state_batch_indices int ``[B]``. Any strides, including zero strides (a "tied"
    dt, D or z). dt is never clamped. Peer: mamba_ssm's ``selective_state_update``.

    Raises:
        ValueError: N above `MAX_D_STATE` (the capability gates it first).
    """
    batch, headdim, dstate = x.shape[0], x.shape[2], B.shape[2]
    if dstate > MAX_D_STATE:
        raise ValueError(f"triton selective_state_update: d_state={dstate} above {MAX_D_STATE}")
    if batch == 0:
        return
    block_p, num_warps = update_config(headdim, dstate)
    launch(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, out, block_p, num_warps)


@functools.lru_cache(maxsize=1024)  # a pure function of a model's few head shapes (issue #25: host cost)
def update_config(head_dim: int, d_state: int) -> tuple[int, int]:
    """``(BLOCK_P, num_warps)``: 4096-value fp32 tiles (16 KB read, 16 KB written; 32 values per thread,
    eight 16-byte loads in flight each) over 4 warps: 3072 programs at batch 64, H=24, P=64, N=128."""
    block_n = max(16, next_power_of_2(d_state))
    return max(1, min(next_power_of_2(head_dim), 4096 // block_n)), 4


def launch(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
           C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
           dt_softplus: bool, state_batch_indices: torch.Tensor | None, out: torch.Tensor, block_p: int,
           num_warps: int) -> None:
    """`selective_state_update` with an explicit tile height `block_p` (a power of two) and warp count, for
    benchmarks that sweep them; same arguments and checks as the public launcher otherwise."""
    batch, nheads, headdim = x.shape
    ngroups, dstate = B.shape[1], B.shape[2]
    block_n = max(16, next_power_of_2(dstate))
    d, d_strides = (x, (0, 0)) if D is None else (D, (D.stride(0), D.stride(1) if D.dim() == 2 else 0))
    zt = z if z is not None else x
    index = state_batch_indices if state_batch_indices is not None else dt
    untied = dt.dim() == 3 or A.dim() == 3 or (dt_bias is not None and dt_bias.dim() == 2)
    dt_strides = (*dt.stride(), 0) if dt.dim() == 2 else dt.stride()
    a_strides = (A.stride(0), 0, 0) if A.dim() == 1 else A.stride()
    bias = dt_bias if dt_bias is not None else A
    bias_strides = (0, 0) if dt_bias is None else (dt_bias.stride(0), dt_bias.stride(1) if dt_bias.dim() == 2 else 0)
    grid = (cdiv(headdim, block_p) * nheads * batch,)
    _STATE_UPDATE(grid,
        state, x, dt, A, B, C, d, zt, bias, index, out,
        state.shape[0], nheads, headdim, dstate, nheads // ngroups,
        *state.stride(), *x.stride(), *dt_strides, *a_strides, *bias_strides, *B.stride(), *C.stride(),
        *d_strides, *zt.stride(), *out.stride(), index.stride(0),
        HAS_D=D is not None,
        HAS_Z=z is not None,
        HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus),
        HAS_INDICES=state_batch_indices is not None,
        UNTIED=untied,
        EVEN=headdim % block_p == 0 and dstate == block_n,
        BLOCK_P=block_p,
        BLOCK_N=block_n,
        num_warps=num_warps,
    )


IMPLEMENTATIONS = [
    Implementation(
        "selective_state_update", "triton", "triton.state_update",
        Capability(
            *base_constraints(),
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("d_state", 1, MAX_D_STATE, fix="use the torch provider for d_state > 256"),
            OneOf("state_dtype", ("float16", "bfloat16", "float32"), fix="use the torch provider for float64 "
                                                                         "states"),
        ),
        PRIORITY,
        selective_state_update,
    ),
]
