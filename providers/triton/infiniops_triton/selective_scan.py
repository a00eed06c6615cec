"""Selective scan (Mamba-2 chunked SSD) in four Triton launches, and the one-step state update.

The prefill follows the state-space-duality algorithm of Mamba-2 (the semantics of state-spaces/mamba's
``mamba_chunk_scan_combined``), with its dt/cumsum kernel folded into the chunk-state one:

1. `_ssd_chunk_state`: dt processing, the decay cumsum and each chunk's local end state (one kernel);
2. `_ssd_state_passing`: the state entering each chunk, and the final state;
   `_ssd_bmm`: ``C B^T`` within each chunk, once per group;
3. `_ssd_chunk_scan`: the outputs, D and the z gate fused.

``seq_idx`` resets the state wherever it changes between neighbouring tokens (any int32 values, not only
non-decreasing ones). ``chunk_size`` is a performance knob (the result does not depend on it beyond
rounding): a power of two in [16, 256] is used as given, any other value as the largest power of two
below it, kept within [16, 256] (`kernel_chunk`).

Inputs with an inf or NaN: they propagate within their sequence as in the reference; across a
``seq_idx`` restart the entering state is dropped (never multiplied by 0), but a non-finite x of one
sequence can still reach the later rows of another sequence in the same chunk (``0 * inf`` inside the
chunk scan's tile product).
"""

from __future__ import annotations

import torch

from infiniops_py import Between, Capability, ComputeCapability, Implementation, OneOf
from infiniops_triton._common import PRIORITY, base_constraints
from infiniops_triton._ssd_bmm import chunk_cb
from infiniops_triton._ssd_chunk_scan import chunk_scan
from infiniops_triton._ssd_chunk_state import chunk_state
from infiniops_triton._ssd_state_passing import state_passing
from infiniops_triton.state_update import IMPLEMENTATIONS as STATE_UPDATE_IMPLEMENTATIONS

__all__ = ["IMPLEMENTATIONS", "MAX_D_STATE", "MAX_HEAD_DIM", "kernel_chunk", "selective_scan"]

MIN_CHUNK, MAX_CHUNK = 16, 256  # 16: tl.dot's smallest tile; 256: the largest tuned
MAX_D_STATE = 256  # the chunk-scan kernel holds all of N in one tile
MAX_HEAD_DIM = 256


def kernel_chunk(chunk_size: int) -> int:
    """The chunk length the kernels run for a requested `chunk_size` (see the module docstring)."""
    return min(MAX_CHUNK, max(MIN_CHUNK, 1 << (max(1, chunk_size).bit_length() - 1)))


def selective_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    initial_states: torch.Tensor | None,
    seq_idx: torch.Tensor | None,
    chunk_size: int,
    out: torch.Tensor,
    final_states: torch.Tensor | None,
) -> None:
    """Mamba-2 SSD prefill into `out` (and `final_states`), with the operator's calling convention.

    Shapes: x, z, out ``[Bt, L, H, P]``; dt ``[Bt, L, H]``; A ``[H]`` fp32; B, C ``[Bt, L, G, N]``;
    D ``[H]`` or ``[H, P]``; dt_bias ``[H]``; seq_idx int32 ``[Bt, L]``; states fp32 ``[Bt, H, P, N]``.
    Any strides; `chunk_size` goes through `kernel_chunk`.

    Raises:
        ValueError: N or P above 256 (the capability gates them first).
    """
    bt, seqlen, nheads, headdim = x.shape
    dstate = B.shape[-1]
    if dstate > MAX_D_STATE or headdim > MAX_HEAD_DIM:
        raise ValueError(f"triton selective_scan: d_state={dstate} or head_dim={headdim} above 256")
    if bt == 0 or seqlen == 0:
        if final_states is not None:
            if initial_states is None:
                final_states.zero_()
            else:
                final_states.copy_(initial_states)
        return
    chunk_size = kernel_chunk(chunk_size)
    nchunks = -(-seqlen // chunk_size)
    dev = x.device
    f32 = torch.float32
    local = torch.empty((bt, nchunks, nheads, headdim, dstate), device=dev, dtype=f32)
    prev = torch.empty_like(local, dtype=x.dtype)  # the scan multiplies it in x's dtype (as mamba_ssm)
    cb = torch.empty((bt, nchunks, B.shape[2], chunk_size, chunk_size), device=dev, dtype=f32)
    per_token = torch.empty((2, bt, nheads, nchunks, chunk_size), device=dev, dtype=f32)  # dt, cumsum
    carry = torch.empty((bt, nheads, nchunks), device=dev, dtype=f32)
    seg = None if seq_idx is None else torch.empty((bt, nchunks, chunk_size), device=dev, dtype=torch.int32)
    chunk_state(x, dt, A, B, dt_bias, dt_softplus, dt_limit, seq_idx, chunk_size,
                local, per_token[0], per_token[1], seg if seg is not None else carry, carry)
    state_passing(local, carry, initial_states, prev, final_states)
    chunk_cb(C, B, chunk_size, cb)
    chunk_scan(x, z, C, D, cb, prev, per_token[0], per_token[1], seg, chunk_size, out)


IMPLEMENTATIONS = [
    Implementation(
        "selective_scan", "triton", "triton.ssd_chunked",
        Capability(
            *base_constraints(),
            ComputeCapability((8, 0)),  # bf16 and TF32 tensor cores (fp32 runs as tf32x3)
            OneOf("dtype", ("float16", "bfloat16", "float32")),
            Between("head_dim", 1, MAX_HEAD_DIM),
            Between("d_state", 1, MAX_D_STATE, fix="use the torch provider for d_state > 256"),
        ),
        PRIORITY,
        selective_scan,
    ),
    *STATE_UPDATE_IMPLEMENTATIONS,
]
