"""FlashAttention: varlen prefill and decode with a (paged) KV cache (flash-attention semantics).

Semantics follow flash-attention's ``flash_attn_varlen_func`` / ``flash_attn_with_kvcache`` (the flash_attn 2
package's signatures and defaults; ``seqused_k``, ``return_softmax_lse`` and ``k_descale``/``v_descale`` of
varlen are vLLM's ``vllm_flash_attn`` and flash-attention 3's): scale ``D**-0.5`` by default; query head h
reads kv head ``h // (Hq // Hkv)``; the causal mask is aligned bottom-right (key j visible to query i when
``j <= i + Sk - Sq``); ``window_size=(left, right)`` keeps keys in ``[i + Sk - Sq - left, i + Sk - Sq +
right]``, -1 meaning unbounded, after flash-attention's normalization (``flash_api.cpp``: a side >=
``max_seqlen_k`` becomes -1; then, when exactly one side is bounded, the other becomes ``max_seqlen_k``, so
the first query rows stay clipped when ``Sq > max_seqlen_k + 1``); ``softcap > 0`` means ``s = softcap *
tanh(s / softcap)``; ALiBi adds ``-slope * |i + Sk - Sq - j|`` to the (scaled, softcapped) score; a query row
that sees no key outputs 0, never NaN, and its log-sum-exp is +inf (flash-attention 2 writes +inf there).

Implementation calling conventions (the public functions normalize arguments first). The positional
arguments always come; the keyword arguments only when set (an implementation that does not declare the
feature's problem field never receives them):
  flash_attn_varlen: fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
    causal, window_size, softcap, block_table, out, *, seqused_k, alibi_slopes, k_descale, v_descale,
    softmax_lse) -> out; softmax_scale a float (default D**-0.5 filled in), window_size (left, right) as
    normalized below, softcap 0.0 = off, block_table None or int32 [B, max_blocks] with k/v then paged
    caches [num_blocks, block_size, Hkv, D]; out [total_q, Hq, D]; seqused_k int32 [B]: sequence b attends
    to its first seqused_k[b] keys (clamped to [0, its cu_seqlens_k length], or to [0, capacity] when
    paged); alibi_slopes float [B, Hq] (a [Hq] argument expanded); k_descale/v_descale float [B, Hkv] with
    float8_e4m3fn k/v (keys read as ``k * k_descale[b, h]``); softmax_lse float32 (float64 for float64 q)
    [Hq, total_q] to fill.
  flash_attn_with_kvcache: fn(q, k_cache, v_cache, cache_seqlens, block_table, k, v, softmax_scale, causal,
    window_size, softcap, out, *, cache_batch_idx, cache_leftpad, rotary_cos, rotary_sin, rotary_interleaved,
    alibi_slopes, k_descale, v_descale, softmax_lse) -> out; q [B, Sq, Hq, D]; caches [B_cache, S_max, Hkv, D]
    or paged; cache_seqlens int32 [B] (an int or None already made a tensor); k/v None or [B, Sq_new, Hkv, D],
    rotated (rotary_cos/sin [seqlen_ro, rotary_dim / 2], rotary_dim <= D) and then written into the cache at
    cache_seqlens[b] + t first (in place); attention then sees, of cache row cache_batch_idx[b] (b when not
    given), rows cache_leftpad[b] (0 when not given) to cache_seqlens[b] + Sq_new; softmax_lse [B, Hq, Sq];
    out [B, Sq, Hq, D].
  Normalized window: -1 or in [0, max_seqlen_k] (for the kvcache entry max_seqlen_k is the cache capacity
  per sequence: S_max, or max_blocks * block_size when paged); under causal the right window is -1 (the
  causal mask is the right window 0); otherwise both sides are -1 or both >= 0. Paged sequence b uses the
  first ceil(Sk_b / block_size) entries of block_table[b]; later entries are ignored (any value, e.g. 0 or
  -1 padding). Keys past a sequence's length are never attended (cache memory there may be uninitialized,
  even NaN). In unchecked mode an out-of-range index is skipped: a key in a block whose id is out of range
  is not attended, a new k/v row whose position falls outside the cache is not written, a sequence whose
  cache_batch_idx is out of range sees no key and writes nothing, a rotary position past the cos/sin table
  is not rotated.
Problem fields (both): head_dim, gqa_ratio (Hq // Hkv), causal, local (window given), softcap (bool),
  paged (bool), block_size (0 when not paged), alibi, return_softmax_lse, fp8_kv (float8_e4m3fn k/v); varlen
  adds seqused_k; kvcache adds append (k/v given), cache_batch_idx, cache_leftpad, rotary (bools).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from itertools import pairwise

import torch

from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    OpSpec,
    check_bool,
    check_device,
    check_dtype,
    check_index_range,
    check_no_grad,
    check_no_overlap,
    check_real,
    check_shape,
    check_tensor,
    check_unique_indices,
    check_writable,
    is_checked,
)
from infiniops_py.operators._torch_library import lowered

__all__ = ["FP8", "SPECS", "flash_attn_varlen", "flash_attn_with_kvcache"]

_VARLEN = "flash_attn_varlen"
_KVCACHE = "flash_attn_with_kvcache"
_INT32 = (torch.int32,)
FP8 = torch.float8_e4m3fn  # the fp8 KV-cache dtype (vLLM's "fp8" / "fp8_e4m3", flash-attention 3's e4m3)
_SCALES = (torch.float32, torch.float64)  # ALiBi slopes and descales: float32 (float64 in the oracle's copies)


# --- public functions -------------------------------------------------------------------------------


def flash_attn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    return_softmax_lse: bool = False,
    block_table: torch.Tensor | None = None,
    seqused_k: torch.Tensor | None = None,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention over packed variable-length sequences (flash-attention ``flash_attn_varlen_func``).

    Args:
        q: ``[total_q, Hq, D]``, float16/bfloat16/float32/float64, last stride 1.
        k, v: ``[total_k, Hkv, D]``, or paged caches ``[num_blocks, block_size, Hkv, D]`` when `block_table`
            is given; q's dtype, or both float8_e4m3fn (an fp8 KV cache, read through `k_descale` and
            `v_descale`); q's device, last stride 1, ``Hq % Hkv == 0``.
        cu_seqlens_q, cu_seqlens_k: int32 ``[B + 1]``: sequence b is rows ``cu[b]:cu[b+1]``; they start at 0,
            never decrease and end at ``total_q`` (``total_k`` unless paged). Checked in checked mode.
        max_seqlen_q, max_seqlen_k: at least the longest query / key sequence (ints >= 0).
        softmax_scale: multiplies ``q @ k^T``, any finite number (flash-attention does not restrict its
            sign); None (the default) means ``D**-0.5``.
        causal: bottom-right aligned causal mask (a bool).
        window_size: ``(left, right)``, a pair of ints >= -1; -1 is unbounded. Keys of query i lie in
            ``[i + Sk - Sq - left, i + Sk - Sq + right]`` after flash-attention's normalization
            (``flash_api.cpp``): a side >= `max_seqlen_k` becomes -1, then, when exactly one side is
            bounded, the other becomes `max_seqlen_k`. So ``window_size=(0, 6)`` over Sq=6 queries and
            Sk=4 keys lets query 0 see keys 0 to 2 (right = 4), not all four.
        softcap: a finite number >= 0; ``s = softcap * tanh(s / softcap)`` when > 0.
        alibi_slopes: float32 ``[Hq]`` or ``[B, Hq]``: adds ``-slope * |i + Sk - Sq - j|`` to the score
            of query i and key j, after the scale and the softcap (flash-attention's ALiBi).
        return_softmax_lse: also return the log-sum-exp of each query row's scores (a bool).
        block_table: int32 ``[B, max_blocks]`` of block ids into the paged k/v; sequence b reads its first
            ``ceil(Sk_b / block_size)`` entries, which must be in ``[0, num_blocks)`` (checked mode). A
            block id may appear in several rows (blocks of a shared prefix): they are only read.
        seqused_k: int32 ``[B]`` (vLLM's ``vllm_flash_attn``): sequence b attends to its first
            ``seqused_k[b]`` keys instead of its `cu_seqlens_k` length, which bounds it when not paged
            (paged: the block table's capacity); checked mode also requires it <= `max_seqlen_k`.
        k_descale, v_descale: float32 ``[B, Hkv]`` (flash-attention 3's descales), with float8_e4m3fn k/v
            only: keys and values are read as ``k * k_descale[b, h]``; None means 1.

    Returns:
        ``[total_q, Hq, D]`` in q's dtype; rows that see no key are 0. With `return_softmax_lse`, the pair
        ``(out, lse)``: lse float32 (float64 for float64 q) ``[Hq, total_q]`` (flash-attention's layout),
        ``log(sum_j exp(s_ij))`` over the keys row i sees, +inf for a row that sees none.

    Raises:
        ContractError: a non-tensor, a shape, dtype, device, stride, index or scalar argument that breaks
            the contract, or a tensor that requires grad while grad mode is on.
    """
    if lowered(q):  # torch.compile / torch.export / FakeTensor: the custom operator
        lib = torch.ops.infiniops.flash_attn_varlen
        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                list(window_size), softcap, block_table, seqused_k, alibi_slopes, k_descale, v_descale)
        return tuple(lib.with_lse(*args)) if return_softmax_lse is True else lib(*args)  # type: ignore[return-value]
    op = _VARLEN
    tensors = {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}
    optional = {"block_table": block_table, "seqused_k": seqused_k, "alibi_slopes": alibi_slopes,
                "k_descale": k_descale, "v_descale": v_descale}
    for name, t in tensors.items():
        check_tensor(op, name, t)
    for name, t in optional.items():
        check_tensor(op, name, t, optional=True)
    check_no_grad(op, {**tensors, **optional})
    check_bool(op, "return_softmax_lse", return_softmax_lse)
    paged = block_table is not None
    hq, d = _check_q(op, q, 3)
    hkv = _check_kv(op, q, k, v, ("k", "v"), 4 if paged else 3, hq, d)
    fp8 = k.dtype == FP8
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_dtype(op, name, cu, _INT32)
        check_device(op, name, cu, q.device)
        check_shape(op, name, cu, [None], " ([B + 1])")
        if cu.shape[0] < 1:
            raise ContractError(op, name, "expected B + 1 >= 1 entries, got none")
    n = cu_seqlens_q.shape[0]
    check_shape(op, "cu_seqlens_k", cu_seqlens_k, [n], " ([B + 1], same as cu_seqlens_q)")
    if seqused_k is not None:
        _check_per_sequence(op, "seqused_k", seqused_k, n - 1, q.device)
    slopes = _check_alibi(op, alibi_slopes, n - 1, hq, q.device)
    k_descale = _check_descale(op, "k_descale", k_descale, n - 1, hkv, k, "k")
    v_descale = _check_descale(op, "v_descale", v_descale, n - 1, hkv, v, "v")
    max_seqlen_q = _non_negative_int(op, "max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _non_negative_int(op, "max_seqlen_k", max_seqlen_k)
    block_size = 0
    if block_table is not None:
        block_size = k.shape[1]
        _check_block_table(op, block_table, n - 1, q.device)
    if is_checked(q.device):
        _check_seqlens(op, "cu_seqlens_q", cu_seqlens_q, q.shape[0], "total_q (q.shape[0])", max_seqlen_q)
        total_k = (None, "") if paged else (k.shape[0], "total_k (k.shape[0])")
        lengths = _check_seqlens(op, "cu_seqlens_k", cu_seqlens_k, *total_k,
                                 max_seqlen_k if seqused_k is None else None)
        if seqused_k is not None:
            lengths = _check_seqused(op, seqused_k, None if paged else lengths, max_seqlen_k)
        if block_table is not None:
            _check_used_blocks(op, block_table, lengths, k.shape[0], block_size)
    scale, window, softcap = _normalize(op, d, softmax_scale, causal, window_size, softcap, max_seqlen_k)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    extras = _set(seqused_k=seqused_k, alibi_slopes=slopes, k_descale=k_descale, v_descale=v_descale)
    if return_softmax_lse:
        extras["softmax_lse"] = torch.empty((hq, q.shape[0]), dtype=_lse_dtype(q), device=q.device)
    key = (q.device.type, q.dtype, d, hq // hkv, bool(causal), window != (-1, -1), softcap > 0, paged, block_size,
           slopes is not None, return_softmax_lse, fp8, seqused_k is not None)
    VARLEN_SPEC.call(key, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                     bool(causal), window, softcap, block_table, out, **extras)
    return (out, extras["softmax_lse"]) if return_softmax_lse else out  # what the implementation wrote


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    *,
    rotary_cos: torch.Tensor | None = None,
    rotary_sin: torch.Tensor | None = None,
    cache_seqlens: torch.Tensor | int | None = None,
    cache_batch_idx: torch.Tensor | None = None,
    cache_leftpad: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    rotary_interleaved: bool = True,
    alibi_slopes: torch.Tensor | None = None,
    return_softmax_lse: bool = False,
    k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of a batch of queries over a KV cache, appending new k/v first (flash-attention
    ``flash_attn_with_kvcache``: its argument order, with `k` and `v` positional after the caches, and its
    defaults, ``causal=False`` included).

    Args:
        q: ``[B, Sq, Hq, D]``, float16/bfloat16/float32/float64, last stride 1.
        k_cache, v_cache: ``[B_cache, S_max, Hkv, D]`` (``B_cache == B`` unless `cache_batch_idx` is given),
            or paged ``[num_blocks, block_size, Hkv, D]`` when `block_table` is given; q's dtype, or both
            float8_e4m3fn (read through `k_descale`/`v_descale`); q's device, last stride 1,
            ``Hq % Hkv == 0``. Updated in place when `k`/`v` are given: then they must not share memory (by
            address) with each other or any other argument, nor have a zero-stride (expanded) or
            self-overlapping dim (only read otherwise: one tensor may then serve as both).
        k, v: both or neither; ``[B, Sq_new, Hkv, D]`` in the caches' dtype, written at positions
            ``cache_seqlens[b] + t`` of cache row ``cache_batch_idx[b]``; ``cache_seqlens[b] + Sq_new`` must
            fit in the cache capacity (``S_max`` or ``max_blocks * block_size``; checked mode).
        rotary_cos, rotary_sin: both or neither, q's dtype, ``[seqlen_ro, rotary_dim / 2]`` with
            ``rotary_dim <= D`` and ``seqlen_ro >= capacity``; need `k`/`v` and caches in q's dtype. The
            first `rotary_dim` dims of the new k are rotated at positions ``cache_seqlens[b] + t`` before
            they are written, and those of q at ``cache_seqlens[b] + i`` when causal or local, else all at
            ``cache_seqlens[b]`` (flash-attention's rule; q itself is not modified). `rotary_interleaved`
            pairs dims ``(2j, 2j + 1)`` (GPT-J), else ``(j, j + rotary_dim / 2)`` (GPT-NeoX). Computed in
            float32 (float64 for float64 q), rounded once. Checked mode: every q position < seqlen_ro.
        cache_seqlens: int32 ``[B]``, or one int for every sequence: tokens already in the cache
            (>= 0, checked mode); None (flash-attention's default) means every cache is full (capacity
            tokens), which leaves no room for `k`/`v`.
        cache_batch_idx: int32 ``[B]``, not with a paged cache: sequence b uses cache row
            ``cache_batch_idx[b]`` (in ``[0, B_cache)``, and unique when appending: checked mode).
        cache_leftpad: int32 ``[B]``, not with a paged cache: sequence b's keys start at cache row
            ``cache_leftpad[b]`` (in ``[0, cache_seqlens[b]]``, checked mode; clamped unchecked), so it
            attends to ``Sk_b = cache_seqlens[b] + Sq_new - cache_leftpad[b]`` keys.
        block_table: int32 ``[B, max_blocks]``; sequence b uses its first ``ceil(Sk_b / block_size)``
            entries, which must be in ``[0, num_blocks)`` (checked mode). Sequences may share blocks they
            only read (a common prefix), but no two new k/v rows may land in one cache slot: in checked
            mode that raises; unchecked, which row lands there is undefined.
        softmax_scale, causal, window_size, softcap, alibi_slopes, k_descale, v_descale: as in
            `flash_attn_varlen`, with ``Sk_b = cache_seqlens[b] + Sq_new`` keys (less the left padding)
            and the cache capacity per sequence as `max_seqlen_k` of the window rule (flash-attention's
            ``seqlen_k``).
        return_softmax_lse: also return the log-sum-exp, ``[B, Hq, Sq]`` (flash-attention's layout).

    Returns:
        ``[B, Sq, Hq, D]`` in q's dtype; rows that see no key are 0. With `return_softmax_lse`, the pair
        ``(out, lse)``: lse float32 (float64 for float64 q) ``[B, Hq, Sq]``, +inf for a row that sees no key.

    Raises:
        ContractError: a non-tensor, a shape, dtype, device, stride, index or scalar argument that breaks
            the contract, caches written in place that overlap, a tensor that requires grad while grad mode
            is on, or (checked mode) two new k/v rows landing in one cache slot.
    """
    if lowered(q):  # torch.compile / torch.export / FakeTensor: the custom operator
        lib = torch.ops.infiniops.flash_attn_with_kvcache
        seqlens = _seqlens_argument(cache_seqlens, q)
        args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, seqlens, cache_batch_idx, cache_leftpad,
                block_table, softmax_scale, causal, list(window_size), softcap, rotary_interleaved, alibi_slopes,
                k_descale, v_descale)
        return tuple(lib.with_lse(*args)) if return_softmax_lse is True else lib(*args)  # type: ignore[return-value]
    op = _KVCACHE
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(op, name, t)
    optional = {"k": k, "v": v, "rotary_cos": rotary_cos, "rotary_sin": rotary_sin,
                "cache_batch_idx": cache_batch_idx, "cache_leftpad": cache_leftpad, "block_table": block_table,
                "alibi_slopes": alibi_slopes, "k_descale": k_descale, "v_descale": v_descale}
    for name, t in optional.items():
        check_tensor(op, name, t, optional=True)
    seqlens_tensor = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
    check_no_grad(op, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": seqlens_tensor, **optional})
    check_bool(op, "return_softmax_lse", return_softmax_lse)
    check_bool(op, "rotary_interleaved", rotary_interleaved)
    paged = block_table is not None
    hq, d = _check_q(op, q, 4)
    b = q.shape[0]
    hkv = _check_kv(op, q, k_cache, v_cache, ("k_cache", "v_cache"), 4, hq, d)
    fp8 = k_cache.dtype == FP8
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            if paged:
                raise ContractError(op, name, "is not supported with a paged cache (block_table), as in "
                                              "flash-attention")
            _check_per_sequence(op, name, t, b, q.device)
    if not paged and cache_batch_idx is None and k_cache.shape[0] != b:
        raise ContractError(op, "k_cache", f"expected {b} sequences (q.shape[0]) in dim 0, got {k_cache.shape[0]}"
                                           " (pass cache_batch_idx to pick cache rows, or block_table for a "
                                           "paged cache)")
    if (k is None) != (v is None):
        raise ContractError(op, "k" if k is None else "v", "k and v must be given together (or neither)")
    new = 0
    if k is not None and v is not None:
        _check_kv(op, q, k, v, ("k", "v"), 4, hq, d, expect_hkv=hkv, dtype=k_cache.dtype)
        check_shape(op, "k", k, [b, None, hkv, d], " (B, Sq_new, Hkv, D)")
        new = k.shape[1]
    if block_table is not None:
        _check_block_table(op, block_table, b, q.device)
        block_size = k_cache.shape[1]
        capacity = block_table.shape[1] * block_size
    else:
        block_size, capacity = 0, k_cache.shape[1]
    seqlens = _seqlens_tensor(op, cache_seqlens, b, capacity, q.device, appending=k is not None)
    seqlen_ro = _check_rotary(op, rotary_cos, rotary_sin, q, k, capacity, fp8)
    slopes = _check_alibi(op, alibi_slopes, b, hq, q.device)
    k_descale = _check_descale(op, "k_descale", k_descale, b, hkv, k_cache, "k_cache")
    v_descale = _check_descale(op, "v_descale", v_descale, b, hkv, v_cache, "v_cache")
    if k is not None and v is not None:
        _check_cache_writes(op, k_cache, v_cache, {"k": k, "v": v, "q": q, "cache_seqlens": seqlens_tensor,
                                                   **{n: t for n, t in optional.items() if n not in ("k", "v")}})
    scale, window, softcap = _normalize(op, d, softmax_scale, causal, window_size, softcap, capacity)
    if is_checked(q.device):
        lengths = _check_cache_seqlens(op, seqlens, new, capacity)
        if cache_leftpad is not None:
            _check_leftpad(op, cache_leftpad, [n - new for n in lengths])
        if cache_batch_idx is not None:
            check_index_range(op, "cache_batch_idx", cache_batch_idx, k_cache.shape[0], allow_negative=False)
            if new:
                check_unique_indices(op, "cache_batch_idx", cache_batch_idx, "cache row")
        if block_table is not None:
            _check_used_blocks(op, block_table, lengths, k_cache.shape[0], block_size)
            _check_append_slots(op, block_table, lengths, new, block_size)
        if seqlen_ro and (causal or window != (-1, -1)):
            _check_rotary_positions(op, [n - new + q.shape[1] - 1 for n in lengths], seqlen_ro)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    extras = _set(cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, rotary_cos=rotary_cos,
                  rotary_sin=rotary_sin, alibi_slopes=slopes, k_descale=k_descale, v_descale=v_descale)
    if rotary_cos is not None:
        extras["rotary_interleaved"] = rotary_interleaved
    if return_softmax_lse:
        extras["softmax_lse"] = torch.empty((b, hq, q.shape[1]), dtype=_lse_dtype(q), device=q.device)
    key = (q.device.type, q.dtype, d, hq // hkv, bool(causal), window != (-1, -1), softcap > 0, paged, block_size,
           slopes is not None, return_softmax_lse, fp8, k is not None, cache_batch_idx is not None,
           cache_leftpad is not None, rotary_cos is not None)
    KVCACHE_SPEC.call(key, q, k_cache, v_cache, seqlens, block_table, k, v, scale, bool(causal), window, softcap,
                      out, **extras)
    return (out, extras["softmax_lse"]) if return_softmax_lse else out  # what the implementation wrote


# --- argument checks ---------------------------------------------------------------------------------


def _check_last_stride(op: str, name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ContractError(op, name, f"expected last-dim stride 1 (contiguous head dim), got strides {t.stride()}")


def _check_q(op: str, q: torch.Tensor, rank: int) -> tuple[int, int]:
    check_dtype(op, "q", q, FLOAT_DTYPES)
    check_shape(op, "q", q, [None] * rank, " ([total_q, Hq, D])" if rank == 3 else " ([B, Sq, Hq, D])")
    _check_last_stride(op, "q", q)
    hq, d = q.shape[-2], q.shape[-1]
    if hq < 1 or d < 1:
        raise ContractError(op, "q", f"needs at least one head and head_dim >= 1, got shape {list(q.shape)}")
    return hq, d


def _check_kv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, names: tuple[str, str], rank: int,
              hq: int, d: int, expect_hkv: int | None = None, dtype: torch.dtype | None = None) -> int:
    """Check a k/v pair against q; returns Hkv. Their dtype is `dtype` when given (new k/v: the caches'),
    else q's or float8_e4m3fn (an fp8 KV cache), the same for both."""
    layout = " ([total_k, Hkv, D])" if rank == 3 else " ([num_blocks or B, block_size or S, Hkv, D])"
    if dtype is not None and k.dtype != dtype:
        raise ContractError(op, names[0], f"expected dtype {dtype} (same as the caches), got {k.dtype}")
    if k.dtype not in (q.dtype, FP8):
        raise ContractError(op, names[0], f"expected dtype {q.dtype} (same as q) or {FP8} (an fp8 KV cache), "
                                          f"got {k.dtype}")
    if v.dtype != k.dtype:
        raise ContractError(op, names[1], f"expected dtype {k.dtype} (same as {names[0]}), got {v.dtype}")
    for name, t in zip(names, (k, v)):
        check_device(op, name, t, q.device)
        check_shape(op, name, t, [None] * rank, layout)
        _check_last_stride(op, name, t)
    if v.shape != k.shape:
        raise ContractError(op, names[1], f"expected the shape of {names[0]} {list(k.shape)}, got {list(v.shape)}")
    hkv, dk = k.shape[-2], k.shape[-1]
    if dk != d:
        raise ContractError(op, names[0], f"expected head_dim {d} (same as q), got {dk}")
    if expect_hkv is not None and hkv != expect_hkv:
        raise ContractError(op, names[0], f"expected {expect_hkv} kv heads (same as the cache), got {hkv}")
    if hkv < 1 or hq % hkv:
        raise ContractError(op, names[0], f"{hkv} kv heads do not divide the {hq} query heads (Hq % Hkv != 0)")
    if rank == 4 and k.shape[1] < 1:
        raise ContractError(op, names[0], f"expected block_size (or S_max) >= 1 in dim 1, got {list(k.shape)}")
    return hkv


def _check_cache_writes(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        inputs: dict[str, torch.Tensor | None]) -> None:
    """The caches receive k/v in place: each must be writable, and no other argument (the index tensors
    included: a reinterpreting ``.view(torch.int32)`` could place them in a cache) may share their memory."""
    check_writable(op, "k_cache", k_cache)
    check_writable(op, "v_cache", v_cache)
    check_no_overlap(op, "v_cache", v_cache, "k_cache", k_cache)
    for name, t in inputs.items():
        if t is not None:
            check_no_overlap(op, name, t, "k_cache", k_cache)
            check_no_overlap(op, name, t, "v_cache", v_cache)


def _check_per_sequence(op: str, name: str, t: torch.Tensor, b: int, device: torch.device) -> None:
    """An int32 ``[B]`` index tensor on q's device (seqused_k, cache_batch_idx, cache_leftpad)."""
    check_dtype(op, name, t, _INT32)
    check_device(op, name, t, device)
    check_shape(op, name, t, [b], " ([B])")


def _check_alibi(op: str, slopes: torch.Tensor | None, b: int, hq: int, device: torch.device
                 ) -> torch.Tensor | None:
    """ALiBi slopes ``[Hq]`` or ``[B, Hq]``, returned as ``[B, Hq]`` (a ``[Hq]`` argument expanded)."""
    if slopes is None:
        return None
    check_dtype(op, "alibi_slopes", slopes, _SCALES, " (float32, as flash-attention)")
    check_device(op, "alibi_slopes", slopes, device)
    if slopes.dim() == 1 and slopes.shape[0] == hq:
        return slopes.expand(b, hq)
    check_shape(op, "alibi_slopes", slopes, [b, hq], " ([B, Hq], or [Hq] for every sequence)")
    return slopes


def _check_descale(op: str, name: str, scale: torch.Tensor | None, b: int, hkv: int, cache: torch.Tensor,
                   cache_name: str) -> torch.Tensor | None:
    """A descale ``[B, Hkv]`` (flash-attention 3's layout) of an fp8 `cache`."""
    if scale is None:
        return None
    if cache.dtype != FP8:
        raise ContractError(op, name, f"dequantizes a {FP8} {cache_name}, but {cache_name} is {cache.dtype}: pass "
                                      "it only with an fp8 KV cache")
    check_dtype(op, name, scale, _SCALES, " (float32)")
    check_device(op, name, scale, cache.device)
    check_shape(op, name, scale, [b, hkv], " ([B, Hkv], as flash-attention 3)")
    return scale


def _seqlens_argument(cache_seqlens: object, q: torch.Tensor) -> object:
    """`cache_seqlens` for the custom operator: an int becomes an int32 ``[B]`` tensor (a tensor or None, or
    anything else for the eager checks to refuse, passes)."""
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    return cache_seqlens


def _seqlens_tensor(op: str, cache_seqlens: object, b: int, capacity: int, device: torch.device, *,
                    appending: bool) -> torch.Tensor:
    """`cache_seqlens` as an int32 ``[B]`` tensor: as given, one int for every sequence, or None for full
    caches (flash-attention's meaning; then nothing can be appended)."""
    if isinstance(cache_seqlens, torch.Tensor):
        check_dtype(op, "cache_seqlens", cache_seqlens, _INT32)
        check_device(op, "cache_seqlens", cache_seqlens, device)
        check_shape(op, "cache_seqlens", cache_seqlens, [b], " (B = q.shape[0])")
        return cache_seqlens
    if cache_seqlens is None:
        if appending:
            raise ContractError(op, "cache_seqlens", "is needed to append k/v: None means every cache is full "
                                                     "(as in flash-attention)")
        return torch.full((b,), capacity, dtype=torch.int32, device=device)
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int):
        raise ContractError(op, "cache_seqlens", f"expected a torch.Tensor (int32), an int or None, got "
                                                 f"{type(cache_seqlens).__name__}")
    if not 0 <= cache_seqlens < 2**31:
        raise ContractError(op, "cache_seqlens", f"expected an int in [0, 2**31), got {cache_seqlens}")
    return torch.full((b,), cache_seqlens, dtype=torch.int32, device=device)


def _check_rotary(op: str, cos: torch.Tensor | None, sin: torch.Tensor | None, q: torch.Tensor,
                  k: torch.Tensor | None, capacity: int, fp8: bool) -> int:
    """Check the rotary tables; returns seqlen_ro (0 without rotary)."""
    if cos is None and sin is None:
        return 0
    if cos is None or sin is None:
        missing = "rotary_cos" if cos is None else "rotary_sin"
        raise ContractError(op, missing, "rotary_cos and rotary_sin must be given together (or neither)")
    if k is None:
        raise ContractError(op, "rotary_cos", "rotates the new k before the append: pass k and v too (as "
                                              "flash-attention requires)")
    if fp8:
        raise ContractError(op, "rotary_cos", f"needs the caches and new k/v in q's dtype, not {FP8}")
    d = q.shape[-1]
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if t.dtype != q.dtype:
            raise ContractError(op, name, f"expected dtype {q.dtype} (same as q), got {t.dtype}")
        check_device(op, name, t, q.device)
        check_shape(op, name, t, [None, None], " ([seqlen_ro, rotary_dim / 2])")
    if sin.shape != cos.shape:
        raise ContractError(op, "rotary_sin", f"expected the shape of rotary_cos {list(cos.shape)}, got "
                                              f"{list(sin.shape)}")
    seqlen_ro, half = cos.shape
    if half < 1 or 2 * half > d:
        raise ContractError(op, "rotary_cos", f"rotary_dim = 2 * {half} must be in [2, head_dim {d}]")
    if seqlen_ro < capacity:
        raise ContractError(op, "rotary_cos", f"has {seqlen_ro} positions, fewer than the cache capacity "
                                              f"{capacity} per sequence (flash-attention needs seqlen_ro >= it)")
    return seqlen_ro


def _check_rotary_positions(op: str, last: Sequence[int], seqlen_ro: int) -> None:
    """Each sequence's last rotated query position (``cache_seqlens[b] + Sq - 1``) must be in the table."""
    for i, p in enumerate(last):
        if p >= seqlen_ro:
            raise ContractError(op, "rotary_cos", f"sequence {i} rotates query position {p}, but the table has "
                                                  f"{seqlen_ro} positions")


def _check_leftpad(op: str, leftpad: torch.Tensor, cached: Sequence[int]) -> None:
    for i, (p, n) in enumerate(zip(leftpad.tolist(), cached)):
        if not 0 <= p <= n:
            raise ContractError(op, "cache_leftpad", f"cache_leftpad[{i}]={p} must be in [0, cache_seqlens[{i}]"
                                                     f"={n}]")


def _set(**extras: object) -> dict[str, object]:
    """The keyword arguments of an implementation call that are set (see the module docstring)."""
    return {name: value for name, value in extras.items() if value is not None}


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _non_negative_int(op: str, name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ContractError(op, name, f"expected an int, got bool {value!r}")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ContractError(op, name, f"expected an int, got {type(value).__name__}") from None
    if n < 0:
        raise ContractError(op, name, f"expected >= 0, got {n}")
    return n


def _check_block_table(op: str, table: torch.Tensor, b: int, device: torch.device) -> None:
    check_dtype(op, "block_table", table, _INT32)
    check_device(op, "block_table", table, device)
    check_shape(op, "block_table", table, [b, None], " ([B, max_blocks])")


def _check_seqlens(op: str, name: str, cu: torch.Tensor, total: int | None, total_text: str,
                   max_seqlen: int | None) -> list[int]:
    """Check cumulative sequence starts (and, unless `max_seqlen` is None, that no length exceeds it);
    returns the lengths."""
    starts = cu.tolist()
    if starts[0] != 0:
        raise ContractError(op, name, f"must start at 0, got {starts[0]}")
    lengths = [b - a for a, b in pairwise(starts)]
    for i, n in enumerate(lengths):
        if n < 0:
            raise ContractError(op, name, f"must not decrease: {name}[{i + 1}]={starts[i + 1]} < {starts[i]}")
    if total is not None and starts[-1] != total:
        raise ContractError(op, name, f"must end at {total_text}={total}, got {starts[-1]}")
    longest = max(lengths, default=0)
    if max_seqlen is not None and longest > max_seqlen:
        which = "max_seqlen_q" if name.endswith("_q") else "max_seqlen_k"
        raise ContractError(op, which, f"{max_seqlen} is below the longest sequence of {name} ({longest})")
    return lengths


def _check_seqused(op: str, seqused_k: torch.Tensor, rows: Sequence[int] | None, max_seqlen_k: int) -> list[int]:
    """Check the keys used per sequence: >= 0, <= its `rows` (its cu_seqlens_k length; None when paged, where
    the block table bounds it) and <= `max_seqlen_k`; returns them."""
    used = seqused_k.tolist()
    for i, n in enumerate(used):
        if n < 0 or (rows is not None and n > rows[i]):
            bound = "" if rows is None else f", <= its {rows[i]} keys in cu_seqlens_k"
            raise ContractError(op, "seqused_k", f"seqused_k[{i}]={n} must be >= 0{bound}")
        if n > max_seqlen_k:
            raise ContractError(op, "max_seqlen_k", f"{max_seqlen_k} is below seqused_k[{i}]={n}")
    return used


def _check_cache_seqlens(op: str, cache_seqlens: torch.Tensor, new: int, capacity: int) -> list[int]:
    """Check cached lengths; returns the attended lengths ``cache_seqlens[b] + new``."""
    lengths = []
    for i, n in enumerate(cache_seqlens.tolist()):
        if n < 0:
            raise ContractError(op, "cache_seqlens", f"cache_seqlens[{i}]={n} is negative")
        if n + new > capacity:
            raise ContractError(op, "cache_seqlens", f"cache_seqlens[{i}]={n} plus {new} new tokens exceeds the "
                                                     f"cache capacity {capacity} per sequence")
        lengths.append(n + new)
    return lengths


def _check_used_blocks(op: str, table: torch.Tensor, lengths: Sequence[int], num_blocks: int,
                       block_size: int) -> None:
    """Every block id a sequence uses must be in [0, num_blocks); capacity must hold the sequence."""
    capacity = table.shape[1] * block_size
    for i, n in enumerate(lengths):
        if n > capacity:
            raise ContractError(op, "block_table", f"sequence {i} has {n} keys but {table.shape[1]} blocks of "
                                                   f"{block_size} hold {capacity}")
    used = torch.arange(table.shape[1], device=table.device)[None, :] < torch.tensor(
        [-(-n // block_size) for n in lengths], device=table.device, dtype=torch.long)[:, None]
    check_index_range(op, "block_table", table[used], num_blocks, allow_negative=False)


def _check_append_slots(op: str, table: torch.Tensor, lengths: Sequence[int], new: int, block_size: int) -> None:
    """No two new k/v rows may land in one paged-cache slot (sequences whose tables share the block they
    append to): which write would land is undefined. Sequences may share the blocks they only read."""
    if not new:
        return
    pos = (torch.tensor(lengths, dtype=torch.long, device=table.device)[:, None] - new
           + torch.arange(new, device=table.device))  # [B, new]: cache_seqlens[b] + t, < capacity (checked)
    blocks = table.gather(1, pos // block_size).long()
    check_unique_indices(op, "block_table", (blocks * block_size + pos % block_size).flatten(),
                         "new k/v rows' cache slot (block * block_size + offset)")


def _normalize(op: str, d: int, softmax_scale: float | None, causal: bool, window_size: Sequence[int],
               softcap: float, max_seqlen_k: int) -> tuple[float, tuple[int, int], float]:
    """Check the scalars, fill in the scale and normalize the window as flash-attention's ``flash_api.cpp``
    does (``mha_varlen_fwd``/``mha_fwd_kvcache``, then ``set_params_fprop``): a side >= `max_seqlen_k` is
    -1; under causal the right side is the causal mask (-1 here); otherwise, when exactly one side is
    bounded, the other becomes `max_seqlen_k` (a left side of `max_seqlen_k` hides no key, a right one does
    when ``Sq > max_seqlen_k + 1``)."""
    check_bool(op, "causal", causal)
    # any finite scale, as flash-attention accepts; None means D**-0.5
    scale = d**-0.5 if softmax_scale is None else check_real(op, "softmax_scale", softmax_scale)
    try:
        if any(isinstance(w, bool) for w in window_size):
            raise TypeError
        left, right = (operator.index(w) for w in window_size)
    except (TypeError, ValueError):
        raise ContractError(op, "window_size", f"expected a pair of ints (left, right), got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ContractError(op, "window_size", f"expected values >= -1 (-1 = unbounded), got {(left, right)}")
    left = -1 if left >= max_seqlen_k else left
    right = -1 if right >= max_seqlen_k or causal else right
    if not causal and (left < 0) != (right < 0):
        left, right = (max_seqlen_k, right) if left < 0 else (left, max_seqlen_k)
    cap = check_real(op, "softcap", softcap, low=0.0)
    return scale, (left, right), cap


# --- reference ---------------------------------------------------------------------------------------


def _visible(sq: int, sk: int, causal: bool, window: tuple[int, int], device: torch.device) -> torch.Tensor:
    """``[sq, sk]`` bool: key j visible to query i, the diagonal aligned bottom-right."""
    diag = torch.arange(sq, device=device)[:, None] + (sk - sq)
    j = torch.arange(sk, device=device)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool, device=device)
    left, right = window
    if causal:
        ok &= j <= diag
    if right >= 0:
        ok &= j <= diag + right
    if left >= 0:
        ok &= j >= diag - left
    return ok


_SCORES_PER_BLOCK = 2**26  # the reference's [Hq, rows, Sk] scores per block of query rows (8192-token cases)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, present: torch.Tensor, scale: float, causal: bool,
            window: tuple[int, int], softcap: float, slopes: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence, in the input dtype: q ``[Sq, Hq, D]``, k/v ``[Sk, Hkv, D]``, present ``[Sk]`` bool,
    slopes ``[Hq]`` or None; returns the output ``[Sq, Hq, D]`` and the log-sum-exp ``[Hq, Sq]``.

    Long sequences go in blocks of query rows (each row's softmax is its own), so that the scores stay
    under `_SCORES_PER_BLOCK` elements: the conformance suite runs this at 8192 tokens on the GPU.
    """
    sq, sk = q.shape[0], k.shape[0]
    heads = torch.arange(q.shape[1], device=q.device) // (q.shape[1] // k.shape[1])
    k, v = k[:, heads], v[:, heads]  # query head h reads kv head h // (Hq // Hkv)
    visible = _visible(sq, sk, causal, window, q.device) & present
    rows = max(1, _SCORES_PER_BLOCK // max(1, q.shape[1] * sk))
    parts = [_attend_rows(q[i:i + rows], k, v, visible[i:i + rows], scale, softcap, _alibi(slopes, i, rows, sq, sk))
             for i in range(0, max(sq, 1), rows)]
    return torch.cat([o for o, _ in parts]), torch.cat([lse for _, lse in parts], dim=1)


def _alibi(slopes: torch.Tensor | None, first: int, rows: int, sq: int, sk: int) -> torch.Tensor | None:
    """ALiBi's bias ``-slope * |i + Sk - Sq - j|`` ``[Hq, rows, Sk]`` of query rows ``first..first + rows``, in
    the slopes' dtype (None without ALiBi)."""
    if slopes is None:
        return None
    i = torch.arange(first, min(first + rows, sq), device=slopes.device)[:, None]
    dist = (i + (sk - sq) - torch.arange(sk, device=slopes.device)).abs()
    return -slopes[:, None, None] * dist.to(slopes.dtype)


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
                 softcap: float, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Query rows ``[rows, Hq, D]`` against keys and values already expanded to Hq heads."""
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~visible, -math.inf)
    seen = visible.any(-1)
    p = torch.softmax(s, dim=-1).masked_fill(~seen[:, None], 0.0)  # a row that sees no key outputs 0
    lse = torch.logsumexp(s, dim=-1).masked_fill(~seen, math.inf)  # +inf there, as flash-attention 2
    return torch.einsum("hij,jhd->ihd", p, v), lse


def _dequant(rows: torch.Tensor, descale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows ``[Sk, Hkv, D]`` in `dtype`, times their kv head's descale (fp8 caches)."""
    rows = rows.to(dtype)
    return rows if descale is None else rows * descale.to(dtype)[None, :, None]


def _paged_rows(cache: torch.Tensor, table_row: torch.Tensor, sk: int, dtype: torch.dtype,
                descale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logical rows ``0..sk`` of one sequence's paged cache in `dtype`, and which of them exist (block id in
    range)."""
    num_blocks, block_size = cache.shape[:2]
    pos = torch.arange(sk, device=cache.device)
    blocks = table_row[pos // block_size].long()
    present = (blocks >= 0) & (blocks < num_blocks)
    rows = _dequant(cache[blocks.clamp(0, num_blocks - 1), pos % block_size], descale, dtype)
    return torch.where(present[:, None, None], rows, 0), present


def _sequence_kv(k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor | None, b: int, start: int, sk: int,
                 dtype: torch.dtype, k_descale: torch.Tensor | None, v_descale: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequence b's keys and values (rows ``start..start + sk``, or its paged rows ``0..sk``), dequantized."""
    kd = None if k_descale is None else k_descale[b]
    vd = None if v_descale is None else v_descale[b]
    if block_table is None:
        keys, values = _dequant(k[start:start + sk], kd, dtype), _dequant(v[start:start + sk], vd, dtype)
        return keys, values, torch.ones(keys.shape[0], dtype=torch.bool, device=k.device)
    sk = min(sk, block_table.shape[1] * k.shape[1])
    keys, present = _paged_rows(k, block_table[b], sk, dtype, kd)
    values, _ = _paged_rows(v, block_table[b], sk, dtype, vd)
    return keys, values, present


def reference_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                     causal: bool, window_size: tuple[int, int], softcap: float, block_table: torch.Tensor | None,
                     out: torch.Tensor, *, seqused_k: torch.Tensor | None = None,
                     alibi_slopes: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                     v_descale: torch.Tensor | None = None, softmax_lse: torch.Tensor | None = None) -> torch.Tensor:
    """Literal reference, one sequence at a time, in the input dtype (flash-attention's
    ``attention_ref(upcast=False)``); it reads the sequence starts on the host (a sync on CUDA)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    for b in range(len(cq) - 1):
        sk = max(0, ck[b + 1] - ck[b])
        if used is not None:  # its first seqused_k[b] keys, within its rows (or the block table's capacity)
            sk = min(max(used[b], 0), sk if block_table is None else block_table.shape[1] * k.shape[1])
        keys, values, present = _sequence_kv(k, v, block_table, b, ck[b], sk, q.dtype, k_descale, v_descale)
        o, lse = _attend(q[cq[b]:cq[b + 1]], keys, values, present, softmax_scale, causal, window_size, softcap,
                         None if alibi_slopes is None else alibi_slopes[b].to(q.dtype))
        out[cq[b]:cq[b + 1]] = o
        if softmax_lse is not None:
            softmax_lse[:, cq[b]:cq[b + 1]] = lse
    return out


def _rotate(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           interleaved: bool) -> torch.Tensor:
    """Rotary embedding of ``x`` ``[S, H, D]`` at integer ``positions`` ``[S]`` (flash-attention's
    ``apply_rotary_emb``): the first ``rotary_dim = 2 * cos.shape[1]`` dims in pairs ``(2j, 2j + 1)`` when
    `interleaved`, else ``(j, j + rotary_dim / 2)``, by the angle whose cos/sin are row ``positions[s]`` of
    the tables; the other dims pass through. Computed in float32 (float64 for float64 x), rounded once to
    x's dtype; a position outside the tables leaves its row unrotated."""
    half = cos.shape[1]
    ok = (positions >= 0) & (positions < cos.shape[0])
    at = positions.clamp(0, max(cos.shape[0] - 1, 0)).long()
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = torch.where(ok[:, None], cos[at].to(work), 1.0)[:, None, :]  # [S, 1, half]
    s = torch.where(ok[:, None], sin[at].to(work), 0.0)[:, None, :]
    xr = x[..., :2 * half].to(work)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        rot = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _append(cache: torch.Tensor, new: torch.Tensor, block_table: torch.Tensor | None, b: int, start: int) -> None:
    """Write ``new`` ``[Sq_new, Hkv, D]`` at logical rows ``start..`` of cache row b (of table row b when
    paged); rows outside are skipped."""
    pos = start + torch.arange(new.shape[0], device=cache.device)
    if block_table is None:
        ok = (pos >= 0) & (pos < cache.shape[1])
        cache[b, pos[ok]] = new[ok]
        return
    num_blocks, block_size = cache.shape[:2]
    slot = pos // block_size
    blocks = block_table[b, slot.clamp(0, block_table.shape[1] - 1)].long()
    ok = (pos >= 0) & (slot < block_table.shape[1]) & (blocks >= 0) & (blocks < num_blocks)
    cache[blocks[ok], (pos % block_size)[ok]] = new[ok]


def reference_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
                      block_table: torch.Tensor | None, k: torch.Tensor | None, v: torch.Tensor | None,
                      softmax_scale: float, causal: bool, window_size: tuple[int, int], softcap: float,
                      out: torch.Tensor, *, cache_batch_idx: torch.Tensor | None = None,
                      cache_leftpad: torch.Tensor | None = None, rotary_cos: torch.Tensor | None = None,
                      rotary_sin: torch.Tensor | None = None, rotary_interleaved: bool = True,
                      alibi_slopes: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                      v_descale: torch.Tensor | None = None, softmax_lse: torch.Tensor | None = None) -> torch.Tensor:
    """Literal reference: rotate and append the new k/v of every sequence in order, then attend one sequence
    at a time; it reads `cache_seqlens` and the index tensors on the host (a sync on CUDA)."""
    lengths = cache_seqlens.tolist()
    new = 0 if k is None else k.shape[1]
    rows = list(range(len(lengths))) if cache_batch_idx is None else cache_batch_idx.tolist()
    exists = [block_table is not None or 0 <= r < k_cache.shape[0] for r in rows]  # else: padding
    for b, n in enumerate(lengths):
        if k is not None and v is not None and exists[b]:
            kb = k[b]
            if rotary_cos is not None and rotary_sin is not None:
                pos = n + torch.arange(new, device=q.device)
                kb = _rotate(kb, pos, rotary_cos, rotary_sin, rotary_interleaved)
            _append(k_cache, kb, block_table, rows[b], n)
            _append(v_cache, v[b], block_table, rows[b], n)
    capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
    pads = [0] * len(lengths) if cache_leftpad is None else cache_leftpad.tolist()
    rotate_rows = causal or window_size != (-1, -1)  # else every query sits at position cache_seqlens[b]
    for b, n in enumerate(lengths):
        end = min(max(0, n + new), capacity) if exists[b] else 0
        start = min(max(pads[b], 0), end)
        if block_table is None:
            kd = None if k_descale is None else k_descale[b]
            vd = None if v_descale is None else v_descale[b]
            row = rows[b] if exists[b] else 0
            keys, values = _dequant(k_cache[row, start:end], kd, q.dtype), _dequant(v_cache[row, start:end], vd,
                                                                                     q.dtype)
            present = torch.ones(end - start, dtype=torch.bool, device=q.device)
        else:
            keys, values, present = _sequence_kv(k_cache, v_cache, block_table, b, 0, end, q.dtype, k_descale,
                                                 v_descale)
        qb = q[b]
        if rotary_cos is not None and rotary_sin is not None:
            offsets = torch.arange(q.shape[1], device=q.device) if rotate_rows else torch.zeros(
                q.shape[1], dtype=torch.long, device=q.device)
            qb = _rotate(qb, n + offsets, rotary_cos, rotary_sin, rotary_interleaved)
        o, lse = _attend(qb, keys, values, present, softmax_scale, causal, window_size, softcap,
                         None if alibi_slopes is None else alibi_slopes[b].to(q.dtype))
        out[b] = o
        if softmax_lse is not None:
            softmax_lse[b] = lse
    return out


_FIELDS = {"head_dim": 128, "gqa_ratio": 1, "causal": False, "local": False, "softcap": False, "paged": False,
           "block_size": 0, "alibi": False, "return_softmax_lse": False, "fp8_kv": False}

VARLEN_SPEC = OpSpec(
    name=_VARLEN,
    fields={**_FIELDS, "seqused_k": False},
    function=flash_attn_varlen,
    reference=reference_varlen,
    doc="attention over packed variable-length sequences: causal (bottom-right), GQA, window, softcap, ALiBi, "
        "paged or fp8 K/V, seqused_k, log-sum-exp",
)
KVCACHE_SPEC = OpSpec(
    name=_KVCACHE,
    fields={**_FIELDS, "append": False, "cache_batch_idx": False, "cache_leftpad": False, "rotary": False},
    function=flash_attn_with_kvcache,
    reference=reference_kvcache,
    doc="decode attention over a contiguous or paged (or fp8) KV cache, rotating and appending new k/v in place "
        "first",
)
SPECS = (VARLEN_SPEC, KVCACHE_SPEC)
