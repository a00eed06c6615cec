"""FlashAttention: varlen prefill and decode with a (paged) KV cache (DESIGN.md operator 6).

Semantics follow flash-attention's ``flash_attn_varlen_func`` / ``flash_attn_with_kvcache`` (and vLLM's use
of them): scale ``D**-0.5`` by default; query head h reads kv head ``h // (Hq // Hkv)``; the causal mask is
aligned bottom-right (key j visible to query i when ``j <= i + Sk - Sq``); ``window_size=(left, right)``
keeps keys in ``[i + Sk - Sq - left, i + Sk - Sq + right]``, -1 meaning unbounded; ``softcap > 0`` means
``s = softcap * tanh(s / softcap)``; a query row that sees no key outputs 0, never NaN.

Implementation calling conventions (the public functions normalize arguments first):
  flash_attn_varlen: fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
    causal, window_size, softcap, block_table, out) -> out; softmax_scale a float (default D**-0.5
    filled in), window_size (left, right) with -1 unbounded, softcap 0.0 = off, block_table None or
    int32 [B, max_blocks] with k/v then paged caches [num_blocks, block_size, Hkv, D]; out [total_q, Hq, D].
  flash_attn_with_kvcache: fn(q, k_cache, v_cache, cache_seqlens, block_table, k, v, softmax_scale, causal,
    window_size, softcap, out) -> out; q [B, Sq, Hq, D]; caches [B, S_max, Hkv, D] or paged; cache_seqlens
    int32 [B]; k/v None or [B, Sq_new, Hkv, D], written into the cache at cache_seqlens[b] first (in place),
    attention then sees cache_seqlens[b] + Sq_new keys; out [B, Sq, Hq, D].
  Normalized values: window entries are -1 or in [0, max_seqlen_k) (values >= max_seqlen_k become -1, as
  flash-attention does; for the kvcache entry max_seqlen_k is the cache capacity per sequence); under
  causal the right window is -1 (the causal mask is tighter than any right window >= 0). Paged sequence b
  uses the first ceil(Sk_b / block_size) entries of block_table[b]; later entries are ignored (any value,
  e.g. 0 or -1 padding). Keys past a sequence's length are never attended (cache memory there may be
  uninitialized, even NaN). In unchecked mode an out-of-range index is skipped: a key in a block whose id
  is out of range is not attended, a new k/v row whose position falls outside the cache is not written.
Problem fields (both): head_dim, gqa_ratio (Hq // Hkv), causal, local (window given), softcap (bool),
  paged (bool), block_size (0 when not paged); kvcache adds append (bool, k/v given).
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

__all__ = ["SPECS", "flash_attn_varlen", "flash_attn_with_kvcache"]

_VARLEN = "flash_attn_varlen"
_KVCACHE = "flash_attn_with_kvcache"
_INT32 = (torch.int32,)


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
    block_table: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention over packed variable-length sequences (flash-attention ``flash_attn_varlen_func``).

    Args:
        q: ``[total_q, Hq, D]``, float16/bfloat16/float32/float64, last stride 1.
        k, v: ``[total_k, Hkv, D]``, or paged caches ``[num_blocks, block_size, Hkv, D]`` when `block_table`
            is given; same dtype and device as `q`, last stride 1, ``Hq % Hkv == 0``.
        cu_seqlens_q, cu_seqlens_k: int32 ``[B + 1]``: sequence b is rows ``cu[b]:cu[b+1]``; they start at 0,
            never decrease and end at ``total_q`` (``total_k`` unless paged). Checked in checked mode.
        max_seqlen_q, max_seqlen_k: at least the longest query / key sequence (ints >= 0).
        softmax_scale: multiplies ``q @ k^T``, any finite number (flash-attention does not restrict its
            sign); None (the default) means ``D**-0.5``.
        causal: bottom-right aligned causal mask (a bool).
        window_size: ``(left, right)``, a pair of ints >= -1; -1 is unbounded. Keys of query i lie in
            ``[i + Sk - Sq - left, i + Sk - Sq + right]``, except that a value >= `max_seqlen_k` is
            unbounded too (-1), even when ``Sq > Sk`` would make DESIGN.md's literal formula clip: this is
            flash-attention's own rule (``flash_api.cpp`` sets ``window_size_left/right >= seqlen_k`` to
            -1), and PEERS.md lists "window sizes >= Sk mean unbounded" among the settled semantics.
        softcap: a finite number >= 0; ``s = softcap * tanh(s / softcap)`` when > 0.
        block_table: int32 ``[B, max_blocks]`` of block ids into the paged k/v; sequence b reads its first
            ``ceil(Sk_b / block_size)`` entries, which must be in ``[0, num_blocks)`` (checked mode). A
            block id may appear in several rows (blocks of a shared prefix): they are only read.

    Returns:
        ``[total_q, Hq, D]`` in q's dtype; rows that see no key are 0.

    Raises:
        ContractError: a non-tensor, a shape, dtype, device, stride, index or scalar argument that breaks
            the contract, or a tensor that requires grad while grad mode is on.
    """
    if lowered(q):  # torch.compile / torch.export / FakeTensor: the custom operator
        return torch.ops.infiniops.flash_attn_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                                     softmax_scale, causal, list(window_size), softcap, block_table)
    op = _VARLEN
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(op, name, t)
    check_tensor(op, "block_table", block_table, optional=True)
    check_no_grad(op, {"q": q, "k": k, "v": v, "cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k,
                       "block_table": block_table})
    paged = block_table is not None
    hq, d = _check_q(op, q, 3)
    hkv = _check_kv(op, q, k, v, ("k", "v"), 4 if paged else 3, hq, d)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_dtype(op, name, cu, _INT32)
        check_device(op, name, cu, q.device)
        check_shape(op, name, cu, [None], " ([B + 1])")
        if cu.shape[0] < 1:
            raise ContractError(op, name, "expected B + 1 >= 1 entries, got none")
    n = cu_seqlens_q.shape[0]
    check_shape(op, "cu_seqlens_k", cu_seqlens_k, [n], " ([B + 1], same as cu_seqlens_q)")
    max_seqlen_q = _non_negative_int(op, "max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _non_negative_int(op, "max_seqlen_k", max_seqlen_k)
    block_size = 0
    if block_table is not None:
        block_size = k.shape[1]
        _check_block_table(op, block_table, n - 1, q.device)
    if is_checked(q.device):
        _check_seqlens(op, "cu_seqlens_q", cu_seqlens_q, q.shape[0], "total_q (q.shape[0])", max_seqlen_q)
        total_k = (None, "") if paged else (k.shape[0], "total_k (k.shape[0])")
        lengths = _check_seqlens(op, "cu_seqlens_k", cu_seqlens_k, *total_k, max_seqlen_k)
        if block_table is not None:
            _check_used_blocks(op, block_table, lengths, k.shape[0], block_size)
    scale, window, softcap = _normalize(op, d, softmax_scale, causal, window_size, softcap, max_seqlen_k)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    key = (q.device.type, q.dtype, d, hq // hkv, bool(causal), window != (-1, -1), softcap > 0, paged, block_size)
    VARLEN_SPEC.call(key, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                     bool(causal), window, softcap, block_table, out)
    return out  # what the implementation wrote, whatever it returned


def flash_attn_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None = None,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """Attention of a batch of queries over a KV cache, appending new k/v first (flash-attention
    ``flash_attn_with_kvcache``, as vLLM's decode uses it).

    Args:
        q: ``[B, Sq, Hq, D]``, float16/bfloat16/float32/float64, last stride 1.
        k_cache, v_cache: ``[B, S_max, Hkv, D]``, or paged ``[num_blocks, block_size, Hkv, D]`` when
            `block_table` is given; same dtype and device as `q`, last stride 1, ``Hq % Hkv == 0``.
            Updated in place when `k`/`v` are given: then they must not share memory (by address) with
            each other, with `q`, the new `k`/`v`, `cache_seqlens` or `block_table`, nor have a
            zero-stride (expanded) or self-overlapping dim
            (only read otherwise: one tensor may then serve as both).
        cache_seqlens: int32 ``[B]``: tokens already in the cache per sequence (>= 0, checked mode).
        block_table: int32 ``[B, max_blocks]``; sequence b uses its first ``ceil(Sk_b / block_size)``
            entries, which must be in ``[0, num_blocks)`` (checked mode). Sequences may share blocks they
            only read (a common prefix), but no two new k/v rows may land in one cache slot: in checked
            mode that raises; unchecked, which row lands there is undefined.
        k, v: both or neither; ``[B, Sq_new, Hkv, D]``, written at positions ``cache_seqlens[b] + t``;
            ``cache_seqlens[b] + Sq_new`` must fit in the cache capacity (``S_max`` or
            ``max_blocks * block_size``; checked mode).
        softmax_scale, causal, window_size, softcap: as in `flash_attn_varlen`. Sequence b attends to
            ``Sk_b = cache_seqlens[b] + Sq_new`` keys, the causal mask aligned bottom-right; a window value
            >= the cache capacity (``S_max``, or ``max_blocks * block_size`` when paged: the
            ``seqlen_k`` flash-attention's ``flash_api.cpp`` compares with) is unbounded (-1), as there,
            even where ``Sq > Sk_b`` would make DESIGN.md's literal formula clip (PEERS.md: "window
            sizes >= Sk mean unbounded").

    Returns:
        ``[B, Sq, Hq, D]`` in q's dtype; rows that see no key are 0.

    Raises:
        ContractError: a non-tensor, a shape, dtype, device, stride, index or scalar argument that breaks
            the contract, caches written in place that overlap, a tensor that requires grad while grad mode
            is on, or (checked mode) two new k/v rows landing in one paged-cache slot.
    """
    if lowered(q):  # torch.compile / torch.export / FakeTensor: the custom operator
        return torch.ops.infiniops.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, k, v,
                                                           softmax_scale, causal, list(window_size), softcap)
    op = _KVCACHE
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", cache_seqlens)):
        check_tensor(op, name, t)
    for name, t in (("block_table", block_table), ("k", k), ("v", v)):
        check_tensor(op, name, t, optional=True)
    check_no_grad(op, {"q": q, "k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": cache_seqlens,
                       "block_table": block_table, "k": k, "v": v})
    paged = block_table is not None
    hq, d = _check_q(op, q, 4)
    b = q.shape[0]
    hkv = _check_kv(op, q, k_cache, v_cache, ("k_cache", "v_cache"), 4, hq, d)
    if not paged and k_cache.shape[0] != b:
        raise ContractError(op, "k_cache", f"expected {b} sequences (q.shape[0]) in dim 0, got {k_cache.shape[0]}"
                                           " (pass block_table for a paged cache)")
    check_dtype(op, "cache_seqlens", cache_seqlens, _INT32)
    check_device(op, "cache_seqlens", cache_seqlens, q.device)
    check_shape(op, "cache_seqlens", cache_seqlens, [b], " (B = q.shape[0])")
    if (k is None) != (v is None):
        raise ContractError(op, "k" if k is None else "v", "k and v must be given together (or neither)")
    new = 0
    if k is not None and v is not None:
        _check_kv(op, q, k, v, ("k", "v"), 4, hq, d, expect_hkv=hkv)
        check_shape(op, "k", k, [b, None, hkv, d], " (B, Sq_new, Hkv, D)")
        new = k.shape[1]
        _check_cache_writes(op, q, k_cache, v_cache, k, v, cache_seqlens, block_table)
    if block_table is not None:
        _check_block_table(op, block_table, b, q.device)
        block_size = k_cache.shape[1]
        capacity = block_table.shape[1] * block_size
    else:
        block_size, capacity = 0, k_cache.shape[1]
    if is_checked(q.device):
        lengths = _check_cache_seqlens(op, cache_seqlens, new, capacity)
        if block_table is not None:
            _check_used_blocks(op, block_table, lengths, k_cache.shape[0], block_size)
            _check_append_slots(op, block_table, lengths, new, block_size)
    scale, window, softcap = _normalize(op, d, softmax_scale, causal, window_size, softcap, capacity)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    key = (q.device.type, q.dtype, d, hq // hkv, bool(causal), window != (-1, -1), softcap > 0, paged,
           block_size, k is not None)
    KVCACHE_SPEC.call(key, q, k_cache, v_cache, cache_seqlens, block_table, k, v, scale, bool(causal),
                      window, softcap, out)
    return out  # what the implementation wrote, whatever it returned


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
              hq: int, d: int, expect_hkv: int | None = None) -> int:
    """Check a k/v pair against q; returns Hkv."""
    layout = " ([total_k, Hkv, D])" if rank == 3 else " ([num_blocks or B, block_size or S, Hkv, D])"
    for name, t in zip(names, (k, v)):
        if t.dtype != q.dtype:
            raise ContractError(op, name, f"expected dtype {q.dtype} (same as q), got {t.dtype}")
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


def _check_cache_writes(op: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        k: torch.Tensor, v: torch.Tensor, cache_seqlens: torch.Tensor,
                        block_table: torch.Tensor | None) -> None:
    """The caches receive k/v in place: each must be writable, and no input (the index tensors included:
    a reinterpreting ``.view(torch.int32)`` could place them in a cache) may share their memory."""
    check_writable(op, "k_cache", k_cache)
    check_writable(op, "v_cache", v_cache)
    check_no_overlap(op, "v_cache", v_cache, "k_cache", k_cache)
    for name, t in (("k", k), ("v", v), ("q", q), ("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if t is not None:
            check_no_overlap(op, name, t, "k_cache", k_cache)
            check_no_overlap(op, name, t, "v_cache", v_cache)


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
                   max_seqlen: int) -> list[int]:
    """Check cumulative sequence starts; returns the lengths."""
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
    if longest > max_seqlen:
        which = "max_seqlen_q" if name.endswith("_q") else "max_seqlen_k"
        raise ContractError(op, which, f"{max_seqlen} is below the longest sequence of {name} ({longest})")
    return lengths


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
    """Check the scalars, fill in the scale and canonicalize the window; see the module docstring."""
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
            window: tuple[int, int], softcap: float) -> torch.Tensor:
    """One sequence, in the input dtype: q ``[Sq, Hq, D]``, k/v ``[Sk, Hkv, D]``, present ``[Sk]`` bool.

    Long sequences go in blocks of query rows (each row's softmax is its own), so that the scores stay
    under `_SCORES_PER_BLOCK` elements: the conformance suite runs this at 8192 tokens on the GPU.
    """
    heads = torch.arange(q.shape[1], device=q.device) // (q.shape[1] // k.shape[1])
    k, v = k[:, heads], v[:, heads]  # query head h reads kv head h // (Hq // Hkv)
    visible = _visible(q.shape[0], k.shape[0], causal, window, q.device) & present
    rows = max(1, _SCORES_PER_BLOCK // max(1, q.shape[1] * k.shape[0]))
    if q.shape[0] <= rows:
        return _attend_rows(q, k, v, visible, scale, softcap)
    return torch.cat([_attend_rows(q[i:i + rows], k, v, visible[i:i + rows], scale, softcap)
                      for i in range(0, q.shape[0], rows)])


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float,
                 softcap: float) -> torch.Tensor:
    """Query rows ``[rows, Hq, D]`` against keys and values already expanded to Hq heads."""
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    p = torch.softmax(s.masked_fill(~visible, -math.inf), dim=-1)
    p = p.masked_fill(~visible.any(-1, keepdim=True), 0.0)  # a row that sees no key outputs 0
    return torch.einsum("hij,jhd->ihd", p, v)


def _paged_rows(cache: torch.Tensor, table_row: torch.Tensor, sk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logical rows ``0..sk`` of one sequence's paged cache, and which of them exist (block id in range)."""
    num_blocks, block_size = cache.shape[:2]
    pos = torch.arange(sk, device=cache.device)
    blocks = table_row[pos // block_size].long()
    present = (blocks >= 0) & (blocks < num_blocks)
    rows = cache[blocks.clamp(0, num_blocks - 1), pos % block_size]
    return torch.where(present[:, None, None], rows, 0), present


def _sequence_kv(k: torch.Tensor, v: torch.Tensor, block_table: torch.Tensor | None, b: int, start: int,
                 sk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if block_table is None:
        keys, values = k[start:start + sk], v[start:start + sk]
        return keys, values, torch.ones(keys.shape[0], dtype=torch.bool, device=k.device)
    sk = min(sk, block_table.shape[1] * k.shape[1])
    keys, present = _paged_rows(k, block_table[b], sk)
    values, _ = _paged_rows(v, block_table[b], sk)
    return keys, values, present


def reference_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                     causal: bool, window_size: tuple[int, int], softcap: float, block_table: torch.Tensor | None,
                     out: torch.Tensor) -> torch.Tensor:
    """Literal reference, one sequence at a time, in the input dtype (flash-attention's
    ``attention_ref(upcast=False)``); it reads the sequence starts on the host (a sync on CUDA)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        keys, values, present = _sequence_kv(k, v, block_table, b, ck[b], max(0, ck[b + 1] - ck[b]))
        out[cq[b]:cq[b + 1]] = _attend(q[cq[b]:cq[b + 1]], keys, values, present, softmax_scale, causal,
                                       window_size, softcap)
    return out


def _append(cache: torch.Tensor, new: torch.Tensor, block_table: torch.Tensor | None, b: int, start: int) -> None:
    """Write ``new`` ``[Sq_new, Hkv, D]`` at logical rows ``start..`` of sequence b; rows outside are skipped."""
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
                      out: torch.Tensor) -> torch.Tensor:
    """Literal reference: append the new k/v of every sequence in order, then attend one sequence at a time;
    it reads `cache_seqlens` on the host (a sync on CUDA)."""
    lengths = cache_seqlens.tolist()
    new = 0 if k is None else k.shape[1]
    for b, n in enumerate(lengths):
        if k is not None and v is not None:
            _append(k_cache, k[b], block_table, b, n)
            _append(v_cache, v[b], block_table, b, n)
    for b, n in enumerate(lengths):
        capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
        sk = min(max(0, n + new), capacity)
        if block_table is None:
            keys, values = k_cache[b, :sk], v_cache[b, :sk]
            present = torch.ones(sk, dtype=torch.bool, device=q.device)
        else:
            keys, values, present = _sequence_kv(k_cache, v_cache, block_table, b, 0, sk)
        out[b] = _attend(q[b], keys, values, present, softmax_scale, causal, window_size, softcap)
    return out


_FIELDS = {"head_dim": 128, "gqa_ratio": 1, "causal": False, "local": False, "softcap": False, "paged": False,
           "block_size": 0}

VARLEN_SPEC = OpSpec(
    name=_VARLEN,
    fields=_FIELDS,
    function=flash_attn_varlen,
    reference=reference_varlen,
    doc="attention over packed variable-length sequences: causal (bottom-right), GQA, window, softcap, paged K/V",
)
KVCACHE_SPEC = OpSpec(
    name=_KVCACHE,
    fields={**_FIELDS, "causal": True, "append": False},
    function=flash_attn_with_kvcache,
    reference=reference_kvcache,
    doc="decode attention over a contiguous or paged KV cache, appending new k/v in place first",
)
SPECS = (VARLEN_SPEC, KVCACHE_SPEC)
