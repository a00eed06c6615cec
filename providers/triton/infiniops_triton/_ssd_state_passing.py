"""SSD step 2 of 3: pass the state from chunk to chunk, in place.

``S_{-1}`` is the initial state (or 0) and ``S_c = carry[c] * S_{c-1} + local[c]`` (both from step 1),
or ``S_c = local[c]`` where ``carry[c] < 0`` (a ``seq_idx`` restart inside chunk ``c``). The kernel
overwrites each chunk's local state with ``S_c``, the state at the chunk's end (the chunk-scan kernel
reads ``S_{c-1}`` there, and the initial state itself for the first chunk), and writes the last ``S`` as
the final state. States stay fp32 throughout. Each program owns one block of the flattened ``P * N``
state of one (row, head) and takes the chunks ``CHUNKS_PER_STEP`` at a time: one load of that many
chunks' blocks (so many loads are in flight even at batch 1), a linear-recurrence scan over them in
registers, one store.

For 16-bit inputs (``SPLIT_OUT``) the states entering the chunks go to a separate buffer instead, each split
in a 16-bit high part and the 16-bit rest (`split_f32`): the chunk scan's products with C then need no
per-program split of an fp32 tile (the bytes written are the same; half of them without ``STORE_LO``, when the
chunk scan rounds the state to 16 bits and reads the high part alone).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_triton._common import cdiv, next_power_of_2
from infiniops_triton._ssd_common import interpreting, split_f32

__all__ = ["state_passing"]


@triton.jit
def _linear_combine(a1, b1, a2, b2):
    # (a1, b1) then (a2, b2), as maps S -> a * S + b, where a < 0 stands for S -> b (a restart).
    a = tl.where((a1 < 0) | (a2 < 0), -1.0, a1 * a2)
    b = tl.where(a2 < 0, b2, a2 * b1 + b2)
    return a, b


@triton.jit(do_not_specialize=["H", "nchunks"])
def _state_passing_kernel(
    states_ptr,  # in/out: [Bt, nchunks, H, P, N] fp32 contiguous: each chunk's local end state -> S_c
    carry_ptr,  # [Bt, H, nchunks] fp32 contiguous
    init_ptr,  # [Bt, H, P, N] fp32 initial states (read when HAS_INIT), any strides
    final_ptr,  # out: [Bt, H, P, N] fp32 final states (written when HAS_FINAL), any strides
    hilo_ptr,  # out: [Bt, nchunks, H, 2, P, N] 16-bit, contiguous: S_{c-1} split in hi and lo (when SPLIT_OUT)
    H, P, N, nchunks,
    stride_init_b, stride_init_h, stride_init_p, stride_init_n,
    stride_final_b, stride_final_h, stride_final_p, stride_final_n,
    HAS_INIT: tl.constexpr,
    HAS_FINAL: tl.constexpr,
    SPLIT_OUT: tl.constexpr,  # write the state entering each chunk split (hilo), not S_c in place
    STORE_LO: tl.constexpr,  # with SPLIT_OUT: the low halves too (else the high ones alone)
    CHUNKS_PER_STEP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    h = tl.program_id(2)
    size = P * N
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < size
    p = offs // N
    n = offs % N
    if HAS_INIT:
        init = init_ptr + b * stride_init_b + h * stride_init_h + p * stride_init_p + n * stride_init_n
        state = tl.load(init, mask=mask, other=0.0).to(tl.float32)
    else:
        state = tl.zeros((BLOCK,), dtype=tl.float32)
    row_stride = H * size  # from one chunk to the next (< 2^31; products with it are int64)
    base = (b * nchunks * H + h) * size + offs
    rows = tl.arange(0, CHUNKS_PER_STEP)
    split_base = (b * nchunks * H + h) * 2 * size + offs  # slot c holds the state entering chunk c
    if SPLIT_OUT and HAS_INIT:  # slot 0: the initial state (read by the chunk scan only when given)
        hi, lo = split_f32(state, hilo_ptr.dtype.element_ty)
        tl.store(hilo_ptr + split_base, hi, mask=mask)
        if STORE_LO:
            tl.store(hilo_ptr + split_base + size, lo, mask=mask)
    for c0 in range(0, nchunks, CHUNKS_PER_STEP):
        chunk = c0 + rows
        valid = (chunk < nchunks)[:, None] & mask[None, :]
        tile = base[None, :] + chunk[:, None].to(tl.int64) * row_stride
        local = tl.load(states_ptr + tile, mask=valid, other=0.0)
        carry = tl.load(carry_ptr + (b * H + h) * nchunks + chunk, mask=chunk < nchunks, other=1.0)  # padding: identity
        carry = tl.broadcast_to(carry[:, None], (CHUNKS_PER_STEP, BLOCK))
        carry, local = tl.associative_scan((carry, local), 0, _linear_combine)
        ends = tl.where(carry < 0, local, carry * state[None, :] + local)  # S_c for each chunk c of the step
        if SPLIT_OUT:  # S_c enters chunk c + 1; the last one only leaves as the final state
            split_tile = split_base[None, :] + (chunk[:, None] + 1).to(tl.int64) * (2 * row_stride)
            ends_hi, ends_lo = split_f32(ends, hilo_ptr.dtype.element_ty)
            into = valid & (chunk + 1 < nchunks)[:, None]
            tl.store(hilo_ptr + split_tile, ends_hi, mask=into)
            if STORE_LO:
                tl.store(hilo_ptr + split_tile + size, ends_lo, mask=into)
        else:
            tl.store(states_ptr + tile, ends, mask=valid)
        state = tl.sum(tl.where(rows[:, None] == CHUNKS_PER_STEP - 1, ends, 0.0), axis=0)
    if HAS_FINAL:
        final = final_ptr + b * stride_final_b + h * stride_final_h + p * stride_final_p + n * stride_final_n
        tl.store(final, state, mask=mask)


def state_passing(
    states: torch.Tensor,
    carry: torch.Tensor,
    initial_states: torch.Tensor | None,
    final_states: torch.Tensor | None,
    config: dict[str, int] | None = None,
    hilo: torch.Tensor | None = None,
    store_lo: bool = True,
) -> None:
    """Turn each chunk's local state in `states` into the state at the chunk's end, in place; fill
    `final_states` (when given) with the last one.

    `states` fp32 contiguous ``[Bt, nchunks, H, P, N]``; `carry` fp32 ``[Bt, H, nchunks]``;
    `initial_states`/`final_states` fp32 ``[Bt, H, P, N]`` (any strides) or None. `config`: fixed
    ``BLOCK`` (states per program), ``CHUNKS_PER_STEP`` and ``num_warps`` (benchmarks/gpu_sweep_scan.py).
    `hilo` (16-bit ``[Bt, nchunks, H, 2, P, N]`` contiguous): instead of `states`, each chunk's entering state
    (the initial one for chunk 0, when given) goes there split in a high and a low part, for the chunk scan;
    the low parts are left unwritten unless `store_lo`.
    """
    bt, nchunks, nheads, headdim, dstate = states.shape
    size = headdim * dstate
    if interpreting():
        block, step = 64, 4
    else:
        # 8 chunks x 512 states = 16 KB loaded per step and program: at batch 1 and H=24 (P 64, N 128) that
        # is 384 programs keeping ~6 MB in flight, enough to cover the memory latency of the serial walk
        # (blocks of 512 the fastest in benchmarks/gpu_ssd_parity.py's sweep on the H200).
        block, step = min(512, next_power_of_2(size)), 8
    meta = {"BLOCK": block, "CHUNKS_PER_STEP": step, "num_warps": 4, **(config or {})}
    init = initial_states if initial_states is not None else states
    final = final_states if final_states is not None else states
    init_strides = initial_states.stride() if initial_states is not None else (0, 0, 0, 0)
    final_strides = final_states.stride() if final_states is not None else (0, 0, 0, 0)
    grid = (cdiv(size, meta["BLOCK"]), bt, nheads)
    _state_passing_kernel[grid](
        states, carry, init, final, hilo if hilo is not None else states,
        nheads, headdim, dstate, nchunks,
        *init_strides, *final_strides,
        HAS_INIT=initial_states is not None,
        HAS_FINAL=final_states is not None,
        SPLIT_OUT=hilo is not None,
        STORE_LO=store_lo,
        **meta,
    )
