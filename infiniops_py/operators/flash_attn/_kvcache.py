"""`flash_attn_with_kvcache`: decode attention over a (paged) KV cache, appending new k/v first, its checks
and its `OpSpec`."""

from __future__ import annotations

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    ContractError,
    check_bool,
    check_index_range,
    check_no_grad,
    check_shape,
    check_tensor,
    check_unique_indices,
    is_checked,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import Operator, Overload, Param
from infiniops_py.operators.flash_attn._call import FIELDS, lse_dtype, set_kwargs
from infiniops_py.operators.flash_attn._checks import (
    FP8,
    as_seqlens_tensor,
    check_alibi,
    check_block_table,
    check_cache_writes,
    check_descale,
    check_kv,
    check_per_sequence,
    check_q,
    check_rotary,
    normalize,
    seqlens_argument,
)
from infiniops_py.operators.flash_attn._reference import reference_kvcache
from infiniops_py.operators.flash_attn._samples import sample_kvcache
from infiniops_py.operators.flash_attn._values import (
    check_append_slots,
    check_cache_seqlens,
    check_leftpad,
    check_rotary_positions,
    check_used_blocks,
)

__all__ = ["KVCACHE_SPEC", "flash_attn_with_kvcache"]

_KVCACHE = "flash_attn_with_kvcache"


def _fake_lse(q: torch.Tensor, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=lse_dtype(q))


KVCACHE_SPEC = Operator(
    sample_inputs=sample_kvcache,
    tune_sizes={"q_tokens": 1, "k_len": 1024, "num_kv_heads": 8},
    name=_KVCACHE,
    fields={**FIELDS, "append": False, "cache_batch_idx": False, "cache_leftpad": False, "rotary": False},
    buckets=("q_tokens", "k_len"),  # B * Sq and the cache's capacity per sequence
    reference=reference_kvcache,
    doc="decode attention over a contiguous or paged (or fp8) KV cache, rotating and appending new k/v in place "
        "first",
    overloads=(Overload(when={"return_softmax_lse": False}, fake=lambda q, **_: q.new_empty(q.shape)),
               Overload("with_lse", when={"return_softmax_lse": True}, outputs=2, fake=_fake_lse)),
    mutates=("k_cache", "v_cache"),
    params={"cache_seqlens": Param("Tensor?", to_schema=lambda seqlens, call: seqlens_argument(seqlens, call["q"]))},
)


@KVCACHE_SPEC.define
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
    op = _KVCACHE
    # The checks run on every call: the common case is tested in one pass, the per-argument helpers (which
    # name the bad argument) run when it fails.
    if not (strided(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table,
                    alibi_slopes, k_descale, v_descale) and q is not None and k_cache is not None
            and v_cache is not None):
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            check_tensor(op, name, t)
        for name, t in _optional(k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table,
                                 alibi_slopes, k_descale, v_descale).items():
            check_tensor(op, name, t, optional=True)
    seqlens_tensor = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
    if wants_grad(q, k_cache, v_cache, seqlens_tensor, k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad,
                  block_table, alibi_slopes, k_descale, v_descale):
        check_no_grad(op, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": seqlens_tensor,
                           **_optional(k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table,
                                       alibi_slopes, k_descale, v_descale)})
    if return_softmax_lse is not True and return_softmax_lse is not False:
        check_bool(op, "return_softmax_lse", return_softmax_lse)
    if rotary_interleaved is not True and rotary_interleaved is not False:
        check_bool(op, "rotary_interleaved", rotary_interleaved)
    paged = block_table is not None
    hq, d = check_q(op, q, 4)
    b = q.shape[0]
    hkv = check_kv(op, q, k_cache, v_cache, ("k_cache", "v_cache"), 4, hq, d)
    fp8 = k_cache.dtype == FP8
    for name, t in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            if paged:
                raise ContractError(op, name, "is not supported with a paged cache (block_table), as in "
                                              "flash-attention")
            check_per_sequence(op, name, t, b, q.device)
    if not paged and cache_batch_idx is None and k_cache.shape[0] != b:
        raise ContractError(op, "k_cache", f"expected {b} sequences (q.shape[0]) in dim 0, got {k_cache.shape[0]}"
                                           " (pass cache_batch_idx to pick cache rows, or block_table for a "
                                           "paged cache)")
    if (k is None) != (v is None):
        raise ContractError(op, "k" if k is None else "v", "k and v must be given together (or neither)")
    new = 0
    if k is not None and v is not None:
        check_kv(op, q, k, v, ("k", "v"), 4, hq, d, expect_hkv=hkv, dtype=k_cache.dtype)
        check_shape(op, "k", k, [b, None, hkv, d], " (B, Sq_new, Hkv, D)")
        new = k.shape[1]
    if block_table is not None:
        check_block_table(op, block_table, b, q.device)
        block_size = k_cache.shape[1]
        capacity = block_table.shape[1] * block_size
    else:
        block_size, capacity = 0, k_cache.shape[1]
    seqlens = as_seqlens_tensor(op, cache_seqlens, b, capacity, q.device, appending=k is not None)
    seqlen_ro = check_rotary(op, rotary_cos, rotary_sin, q, k, capacity, fp8)
    slopes = check_alibi(op, alibi_slopes, b, hq, q.device)
    k_descale = check_descale(op, "k_descale", k_descale, b, hkv, k_cache, "k_cache")
    v_descale = check_descale(op, "v_descale", v_descale, b, hkv, v_cache, "v_cache")
    if k is not None and v is not None:
        optional = _optional(k, v, rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table, alibi_slopes,
                             k_descale, v_descale)
        check_cache_writes(op, k_cache, v_cache, {"k": k, "v": v, "q": q, "cache_seqlens": seqlens_tensor,
                                                  **{n: t for n, t in optional.items() if n not in ("k", "v")}})
    scale, window, softcap = normalize(op, d, softmax_scale, causal, window_size, softcap, capacity)
    if is_checked(q.device):
        lengths = check_cache_seqlens(op, seqlens, new, capacity)
        if cache_leftpad is not None:
            check_leftpad(op, cache_leftpad, [n - new for n in lengths])
        if cache_batch_idx is not None:
            check_index_range(op, "cache_batch_idx", cache_batch_idx, k_cache.shape[0], allow_negative=False)
            if new:
                check_unique_indices(op, "cache_batch_idx", cache_batch_idx, "cache row")
        if block_table is not None:
            check_used_blocks(op, block_table, lengths, k_cache.shape[0], block_size)
            check_append_slots(op, block_table, lengths, new, block_size)
        if seqlen_ro and (causal or window != (-1, -1)):
            check_rotary_positions(op, [n - new + q.shape[1] - 1 for n in lengths], seqlen_ro)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    extras = set_kwargs(cache_batch_idx=cache_batch_idx, cache_leftpad=cache_leftpad, rotary_cos=rotary_cos,
                        rotary_sin=rotary_sin, alibi_slopes=slopes, k_descale=k_descale, v_descale=v_descale)
    if rotary_cos is not None:
        extras["rotary_interleaved"] = rotary_interleaved
    if return_softmax_lse:
        extras["softmax_lse"] = torch.empty((b, hq, q.shape[1]), dtype=lse_dtype(q), device=q.device)
    key = KVCACHE_SPEC.key(q.device.type, q.dtype, head_dim=d, gqa_ratio=hq // hkv, causal=bool(causal),
                           local=window != (-1, -1), softcap=softcap > 0, paged=paged, block_size=block_size,
                           alibi=slopes is not None, return_softmax_lse=return_softmax_lse, fp8_kv=fp8,
                           append=k is not None, cache_batch_idx=cache_batch_idx is not None,
                           cache_leftpad=cache_leftpad is not None, rotary=rotary_cos is not None,
                           q_tokens=b * q.shape[1], k_len=capacity)
    dispatch(KVCACHE_SPEC, key, q, k_cache, v_cache, seqlens, block_table, k, v, scale, bool(causal), window, softcap,
             out, **extras)
    return (out, extras["softmax_lse"]) if return_softmax_lse else out  # what the implementation wrote


def _optional(k: torch.Tensor | None, v: torch.Tensor | None, rotary_cos: torch.Tensor | None,
              rotary_sin: torch.Tensor | None, cache_batch_idx: torch.Tensor | None,
              cache_leftpad: torch.Tensor | None, block_table: torch.Tensor | None, alibi_slopes: torch.Tensor | None,
              k_descale: torch.Tensor | None, v_descale: torch.Tensor | None) -> dict[str, torch.Tensor | None]:
    """The optional tensor arguments by name, in the order their checks name them."""
    return {"k": k, "v": v, "rotary_cos": rotary_cos, "rotary_sin": rotary_sin, "cache_batch_idx": cache_batch_idx,
            "cache_leftpad": cache_leftpad, "block_table": block_table, "alibi_slopes": alibi_slopes,
            "k_descale": k_descale, "v_descale": v_descale}
