"""SSD step 2b: ``C B^T`` within each chunk, once per group (not per head), for the chunk-scan kernel.

``cb[b, c, g, t, s] = C[t] . B[s]`` for the tokens ``t, s`` of chunk ``c``, fp32. Only the tiles that hold
some ``s <= t`` are written: the chunk scan reads nothing above the diagonal. With G=1 and H=24 this
saves the scan kernel two thirds of its flops for 16 MB of fp32 (8 x 2048 tokens, chunk 256) that stay in
L2 while the heads of one chunk run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_triton._common import next_power_of_2
from infiniops_triton._ssd_common import dot_precision

__all__ = ["chunk_cb"]


@triton.jit(do_not_specialize=["L", "G", "nchunks"])
def _chunk_cb_kernel(
    c_ptr,  # [Bt, L, G, N], any strides
    b_ptr,  # [Bt, L, G, N], any strides
    cb_ptr,  # out: [Bt, nchunks, G, CHUNK, CHUNK] fp32 contiguous (tiles above the diagonal untouched)
    table_ptr,  # [4, nchunks] int32: chunk starts, then lengths (read when VARLEN)
    L, G, N, nchunks,
    stride_c_b, stride_c_l, stride_c_g, stride_c_n,
    stride_b_b, stride_b_l, stride_b_g, stride_b_n,
    CHUNK: tl.constexpr,
    VARLEN: tl.constexpr,  # chunks from table_ptr, not c * CHUNK
    DOT_PRECISION: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_N: tl.constexpr,  # >= N
):
    tiles = CHUNK // BLOCK
    pid = tl.program_id(0)  # one flat axis (the y axis of a grid stops at 65535): (row, chunk, m, k)
    g = tl.program_id(1)
    pid_bc = pid // (tiles * tiles)
    pid_m = (pid // tiles) % tiles
    pid_k = pid % tiles
    if pid_k > pid_m:  # wholly above the diagonal
        return
    b = (pid_bc // nchunks).to(tl.int64)
    c = pid_bc % nchunks
    if VARLEN:
        start = tl.load(table_ptr + c).to(tl.int64)
        chunk_len = tl.load(table_ptr + nchunks + c)
    else:
        start = (c * CHUNK).to(tl.int64)
        chunk_len = tl.minimum(CHUNK, L - c * CHUNK)
    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)
    offs_k = pid_k * BLOCK + tl.arange(0, BLOCK)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    cm = tl.load(
        c_ptr + b * stride_c_b + (start + offs_m[:, None]) * stride_c_l + g * stride_c_g + offs_n[None, :] * stride_c_n,
        mask=(offs_m[:, None] < chunk_len) & mask_n[None, :], other=0.0,
    )
    bt = tl.load(  # [BLOCK_N, BLOCK]: B transposed
        b_ptr + b * stride_b_b + (start + offs_k[None, :]) * stride_b_l + g * stride_b_g + offs_n[:, None] * stride_b_n,
        mask=mask_n[:, None] & (offs_k[None, :] < chunk_len), other=0.0,
    )
    cb = tl.dot(cm, bt, input_precision=DOT_PRECISION)
    out = cb_ptr + (((b * nchunks + c) * G + g) * CHUNK + offs_m[:, None]) * CHUNK + offs_k[None, :]
    tl.store(out, cb)


def chunk_cb(C: torch.Tensor, B: torch.Tensor, chunk_size: int, cb: torch.Tensor,
             table: torch.Tensor | None = None) -> None:
    """Fill the on-or-below-diagonal tiles of `cb` ``[Bt, nchunks, G, chunk, chunk]`` fp32 with ``C B^T``.

    `C`, `B` ``[Bt, L, G, N]`` with N <= 256; `table` (a packed row): the int32 ``[4, nchunks]`` chunk table
    of `_ssd_chunk_state.chunk_state`.
    """
    bt, seqlen, ngroups, dstate = B.shape
    nchunks = cb.shape[1]
    block = min(64, chunk_size)
    grid = ((chunk_size // block) ** 2 * bt * nchunks, ngroups)
    _chunk_cb_kernel[grid](
        C, B, cb, table if table is not None else cb, seqlen, ngroups, dstate, nchunks, *C.stride(), *B.stride(),
        CHUNK=chunk_size,
        VARLEN=table is not None,
        DOT_PRECISION=dot_precision(C.dtype),
        BLOCK=block,
        BLOCK_N=max(16, next_power_of_2(dstate)),
        num_warps=4,
    )
