"""SSD step 1 of 3: per-chunk dt processing, decay cumsum and the chunk's own end state, in one kernel.

For chunk ``c`` of row ``b`` and head ``h`` (tokens ``t`` of the chunk, ``e`` its last token; the tokens
``c * CHUNK ..``, or for a packed row those a chunk table names, each chunk within one sequence):

- ``dt[t] = clamp(softplus(dt[t] + dt_bias[h]), lo, hi)`` (softplus passes values above 20 through);
- ``cs[t] = sum_{u <= t, u in chunk} dt[u] * A[h]`` (the chunk-relative decay cumsum);
- ``seg[t]``: how many ``seq_idx`` changes lie in ``[chunk start, t]`` (a change at the row's first token
  does not count), so tokens ``s <= t`` are in one sequence exactly when ``seg[s] == seg[t]``;
- ``local[p, n] = sum_{t: seg[t] == seg[e]} exp(cs[e] - cs[t]) * dt[t] * x[t, p] * B[t, n]``: the state
  at the chunk's end when the chunk starts from zero;
- ``carry = exp(cs[e])``, the factor by which the state entering the chunk survives to its end, or -1
  when a ``seq_idx`` change lies in the chunk (the entering state is dropped, not multiplied by 0, so
  an inf or NaN of an earlier sequence stays there).

The chunk is walked in blocks of tokens, rescaling the running state by each block's decay, so every
exponent is a decay over tokens already seen (never a growth that could overflow). The per-token weight
multiplies the tile of x (``WEIGHT_X``) or of B in fp32; that product with the other operand takes the
``PRODUCT`` form for 16-bit inputs (`_ssd_common`: split in two tensor-core products by default,
`dot_f32_left`, `dot_f32_right`). ``dt``, ``cs`` and ``seg``
per token are stored for the chunk-scan kernel by the programs of the first (p, n) tile only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from infiniops_triton._common import cdiv
from infiniops_triton._ssd_common import (
    SPLIT,
    autotune_configs,
    dot_f32_left,
    dot_f32_right,
    dot_precision,
    fast_exp,
    fit_to_chunk,
)

__all__ = ["CONFIGS", "PRODUCT", "chunk_state"]


# The fastest of 8 in benchmarks/gpu_sweep_scan.py on the H200 (2026-11-30: 0.078 ms at 8 x 2048, the
# previous default 0.196 ms), 128 registers per thread; one configuration, so nothing is timed at run time
# (chunks under 64 tokens mask the rest of the K block).
CONFIGS = [
    {"BLOCK_P": 64, "BLOCK_N": 64, "BLOCK_K": 64, "WEIGHT_X": True, "num_warps": 4, "num_stages": 2, "maxnreg": 128},
]
# The product form per 16-bit input dtype (`_ssd_common`); a launch configuration's "PRODUCT" overrides it.
PRODUCT: dict[torch.dtype, int] = {torch.float16: SPLIT, torch.bfloat16: SPLIT}


@triton.autotune(
    configs=autotune_configs(
        CONFIGS, interpreter={"BLOCK_P": 16, "BLOCK_N": 16, "BLOCK_K": 16, "WEIGHT_X": True, "num_warps": 4,
                              "num_stages": 1},
    ),
    key=["CHUNK", "P", "N", "WORK"],
    prune_configs_by={"early_config_prune": fit_to_chunk},
)
@triton.jit(do_not_specialize=["L", "H", "nchunks", "heads_per_group", "WORK"])
def _chunk_state_kernel(
    x_ptr,  # [Bt, L, H, P] input, any strides
    dt_ptr,  # [Bt, L, H] raw dt
    a_ptr,  # [H] fp32
    b_ptr,  # [Bt, L, G, N]
    dt_bias_ptr,  # [H] (read when HAS_DT_BIAS)
    seq_idx_ptr,  # [Bt, L] int32 (read when HAS_SEQ_IDX)
    states_ptr,  # out: [Bt, nchunks, H, P, N] fp32 contiguous, each chunk's local end state
    dt_out_ptr,  # out: [Bt, H, nchunks, CHUNK] fp32 contiguous, processed dt
    cs_out_ptr,  # out: [Bt, H, nchunks, CHUNK] fp32 contiguous, chunk-relative cumsum of dt * A
    seg_out_ptr,  # out: [Bt, nchunks, CHUNK] int32 contiguous (written when HAS_SEQ_IDX)
    carry_ptr,  # out: [Bt, H, nchunks] fp32 contiguous
    table_ptr,  # [4, nchunks] int32 contiguous: start, length, first-of-a-sequence, sequence (read when VARLEN)
    L, H, P, N, nchunks, heads_per_group,
    stride_x_b, stride_x_l, stride_x_h, stride_x_p,
    stride_dt_b, stride_dt_l, stride_dt_h,
    stride_b_b, stride_b_l, stride_b_g, stride_b_n,
    stride_si_b, stride_si_l,
    dt_lo, dt_hi,
    WORK,  # autotune key only: log2 of the number of (row, chunk, head) triples
    CHUNK: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    DT_SOFTPLUS: tl.constexpr,
    HAS_SEQ_IDX: tl.constexpr,
    VARLEN: tl.constexpr,  # chunks from table_ptr (each within one packed sequence), not c * CHUNK
    DOT_PRECISION: tl.constexpr,
    WEIGHT_X: tl.constexpr,  # the weight multiplies x (else B): a tuning choice, both exact in fp32
    PRODUCT: tl.constexpr,  # the fp32-by-16-bit product form (_ssd_common: SPLIT, TF32, ROUND)
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # One flat axis, heads before chunks: the heads of one chunk run together and share B in L2.
    n_tiles = tl.cdiv(N, BLOCK_N)
    pn_tiles = tl.cdiv(P, BLOCK_P) * n_tiles
    pid = tl.program_id(0)
    pid_pn = pid % pn_tiles
    h = (pid // pn_tiles) % H
    pid_bc = pid // (pn_tiles * H)
    b = pid_bc // nchunks
    c = pid_bc % nchunks
    pid_p = pid_pn // n_tiles
    pid_n = pid_pn % n_tiles
    g = h // heads_per_group
    if VARLEN:
        start = tl.load(table_ptr + c)
        chunk_len = tl.load(table_ptr + nchunks + c)
        opens = tl.load(table_ptr + 2 * nchunks + c) != 0  # the chunk starts a sequence
    else:
        start = c * CHUNK
        chunk_len = tl.minimum(CHUNK, L - start)
    first_tile = pid_pn == 0

    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    b64 = b.to(tl.int64)
    x_base = x_ptr + b64 * stride_x_b + start.to(tl.int64) * stride_x_l + h * stride_x_h
    dt_base = dt_ptr + b64 * stride_dt_b + start.to(tl.int64) * stride_dt_l + h * stride_dt_h
    b_base = b_ptr + b64 * stride_b_b + start.to(tl.int64) * stride_b_l + g * stride_b_g
    si_base = seq_idx_ptr + b64 * stride_si_b + start.to(tl.int64) * stride_si_l
    tok_base = ((b64 * H + h) * nchunks + c) * CHUNK  # into dt_out / cs_out
    a = tl.load(a_ptr + h).to(tl.float32)
    if HAS_DT_BIAS:
        bias = tl.load(dt_bias_ptr + h).to(tl.float32)

    mask_p = offs_p < P
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    cs_prefix = 0.0
    seg_prefix = 0
    for k0 in range(0, CHUNK, BLOCK_K):  # a static trip count; a short last chunk masks its tail
        tok = k0 + offs_k
        mask_k = tok < chunk_len
        dt = tl.load(dt_base + tok * stride_dt_l, mask=mask_k, other=0.0).to(tl.float32)
        if HAS_DT_BIAS:
            dt += bias
        if DT_SOFTPLUS:
            dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
        dt = tl.maximum(dt, dt_lo, propagate_nan=tl.PropagateNan.ALL)
        dt = tl.minimum(dt, dt_hi, propagate_nan=tl.PropagateNan.ALL)
        dt = tl.where(mask_k, dt, 0.0)
        cs = cs_prefix + tl.cumsum(dt * a, axis=0)
        cs_end = cs_prefix + tl.sum(dt * a, axis=0)
        tl.store(dt_out_ptr + tok_base + tok, dt, mask=mask_k & first_tile)
        tl.store(cs_out_ptr + tok_base + tok, cs, mask=mask_k & first_tile)
        acc *= fast_exp(cs_end - cs_prefix)  # the running state decays across this block
        live = mask_k  # tokens whose contribution reaches the chunk's end
        if HAS_SEQ_IDX:
            # A change at token t: seq_idx[t] != seq_idx[t - 1] (never at the row's first token).
            cur = tl.load(si_base + tok * stride_si_l, mask=mask_k, other=0)
            prev_ok = mask_k & (start + tok > 0)
            if VARLEN:  # a change at a sequence's first token is no restart: the sequence's state enters
                prev_ok = prev_ok & ((tok > 0) | ~opens)
            prev = tl.load(si_base + (tok - 1) * stride_si_l, mask=prev_ok, other=0)
            change = (prev_ok & (cur != prev)).to(tl.int32)
            seg = seg_prefix + tl.cumsum(change, axis=0)
            seg_end = seg_prefix + tl.sum(change, axis=0)
            tl.store(seg_out_ptr + (b64 * nchunks + c) * CHUNK + tok, seg, mask=mask_k & first_tile & (h == 0))
            live &= seg == seg_end
            acc = tl.where(seg_end == seg_prefix, acc, 0.0)  # a restart in this block drops the past
            seg_prefix = seg_end
        weight = tl.where(live, fast_exp(cs_end - cs) * dt, 0.0)
        cs_prefix = cs_end
        # Dead tokens are not even loaded: an inf or NaN of an earlier sequence stays out of the dot.
        xt = tl.load(  # [BLOCK_P, BLOCK_K]: x transposed
            x_base + tok[None, :] * stride_x_l + offs_p[:, None] * stride_x_p,
            mask=mask_p[:, None] & live[None, :], other=0.0,
        )
        bm = tl.load(  # [BLOCK_K, BLOCK_N]
            b_base + tok[:, None] * stride_b_l + offs_n[None, :] * stride_b_n,
            mask=live[:, None] & mask_n[None, :], other=0.0,
        )
        if WEIGHT_X:  # the weight on x (fewer elements to split when BLOCK_P < BLOCK_N), else on B
            acc = dot_f32_left(xt.to(tl.float32) * weight[None, :], bm, acc, DOT_PRECISION, PRODUCT)
        else:
            acc = dot_f32_right(xt, bm.to(tl.float32) * weight[:, None], acc, DOT_PRECISION, PRODUCT)

    st_base = states_ptr + ((b64 * nchunks + c) * H + h) * P * N  # int64 base, int32 tile offsets
    tl.store(st_base + (offs_p[:, None] * N + offs_n[None, :]), acc, mask=mask_p[:, None] & mask_n[None, :])
    carry = fast_exp(cs_prefix)
    if HAS_SEQ_IDX:
        carry = tl.where(seg_prefix == 0, carry, -1.0)  # -1: the entering state does not survive
    tl.store(carry_ptr + (b64 * H + h) * nchunks + c, carry, mask=first_tile)


def chunk_state(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    dt_limit: tuple[float, float],
    seq_idx: torch.Tensor | None,
    chunk_size: int,
    states: torch.Tensor,
    dt_out: torch.Tensor,
    cs_out: torch.Tensor,
    seg_out: torch.Tensor,
    carry: torch.Tensor,
    config: dict[str, int] | None = None,
    table: torch.Tensor | None = None,
) -> None:
    """Launch step 1 over every (chunk, row, head); fills `states`, `dt_out`, `cs_out`, `seg_out`, `carry`.

    Shapes: x ``[Bt, L, H, P]``, dt ``[Bt, L, H]``, A ``[H]`` fp32, B ``[Bt, L, G, N]``, seq_idx int32
    ``[Bt, L]``; outputs fp32 as in the kernel's pointer comments (`seg_out` int32, unused without seq_idx).
    `config`: fixed ``BLOCK_P``, ``BLOCK_N``, ``BLOCK_K`` (at most the chunk), ``WEIGHT_X``, ``num_warps``,
    ``num_stages`` (optionally ``maxnreg``) instead of the autotuner's pick (benchmarks/gpu_sweep_scan.py);
    ``PRODUCT`` in it (alone or with the rest) overrides `PRODUCT`.
    `table` (a packed row, Bt == 1): int32 ``[4, nchunks]`` chunk starts, lengths, first-of-a-sequence
    flags and sequences (`varlen_table`); chunk c is then tokens ``start[c] .. start[c] + length[c] - 1``.
    """
    bt, seqlen, nheads, headdim = x.shape
    ngroups, dstate = B.shape[2], B.shape[3]
    nchunks = states.shape[1]
    si = seq_idx if seq_idx is not None else seg_out
    si_strides = (si.stride(0), si.stride(1)) if seq_idx is not None else (0, 0)

    def grid(meta: dict) -> tuple[int]:
        tiles = cdiv(headdim, meta["BLOCK_P"]) * cdiv(dstate, meta["BLOCK_N"])
        return (tiles * nheads * bt * nchunks,)

    config = dict(config or {})
    product = config.pop("PRODUCT", PRODUCT.get(x.dtype, SPLIT))
    kernel = _chunk_state_kernel if not config else _chunk_state_kernel.fn
    kernel[grid](
        x, dt, A, B, dt_bias if dt_bias is not None else A, si,
        states, dt_out, cs_out, seg_out, carry, table if table is not None else seg_out,
        seqlen, nheads, headdim, dstate, nchunks, nheads // ngroups,
        *x.stride(), *dt.stride(), *B.stride(), *si_strides,
        float(dt_limit[0]), float(dt_limit[1]),
        (bt * nchunks * nheads).bit_length(),
        CHUNK=chunk_size,
        HAS_DT_BIAS=dt_bias is not None,
        DT_SOFTPLUS=bool(dt_softplus),
        HAS_SEQ_IDX=seq_idx is not None,
        VARLEN=table is not None,
        DOT_PRECISION=dot_precision(x.dtype),
        PRODUCT=product,
        **config,
    )
