"""FlashAttention's literal references, one sequence at a time in float32 (float64 for float64 inputs), each
output rounded once to the input dtype (flash-attention's ``attention_ref(upcast=True)``): the oracle of the
conformance suite (on float64 copies of the inputs) and the ``reference`` provider's implementations, which
so serve float16/bfloat16 as accurately as the peers (issue #30: in the input dtype they missed
flash-attention's tolerance). They read sequence starts and index tensors on the host (a synchronization on
CUDA).

`in_input_dtype()` scopes the other computation, in the input dtype throughout (``attention_ref(upcast=False)``):
the baseline of flash-attention's low-precision tolerance rule (`infiniops_py.testing.tolerances.LowPrecisionRule`:
a provider's error may be at most 2x or 3x that baseline's), which the testing layer computes under it.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

import torch

__all__ = ["in_input_dtype", "reference_kvcache", "reference_varlen"]

_IN_INPUT_DTYPE: contextvars.ContextVar[bool] = contextvars.ContextVar("infiniops_attention_ref_in_input_dtype",
                                                                       default=False)


@contextlib.contextmanager
def in_input_dtype() -> Iterator[None]:
    """Scope (of this thread or asyncio task) in which the attention references compute in the input dtype, as
    flash-attention's ``attention_ref(upcast=False)``: the low-precision rule's baseline, never for serving."""
    token = _IN_INPUT_DTYPE.set(True)
    try:
        yield
    finally:
        _IN_INPUT_DTYPE.reset(token)


def _work(dtype: torch.dtype) -> torch.dtype:
    """The dtype the references compute in for inputs of `dtype`: float64 for float64, else float32 (`dtype`
    itself inside `in_input_dtype`)."""
    if dtype == torch.float64 or _IN_INPUT_DTYPE.get():
        return dtype
    return torch.float32


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
    """One sequence, in q's dtype (the caller's working dtype): q ``[Sq, Hq, D]``, k/v ``[Sk, Hkv, D]``,
    present ``[Sk]`` bool, slopes ``[Hq]`` or None; returns the output ``[Sq, Hq, D]`` and the log-sum-exp ``[Hq, Sq]``.

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
    """Literal reference, one sequence at a time, in float32 (float64 for float64), rounded once into `out`;
    it reads the sequence starts on the host (a sync on CUDA)."""
    work = _work(q.dtype)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    for b in range(len(cq) - 1):
        sk = max(0, ck[b + 1] - ck[b])
        if used is not None:  # its first seqused_k[b] keys, within its rows (or the block table's capacity)
            sk = min(max(used[b], 0), sk if block_table is None else block_table.shape[1] * k.shape[1])
        keys, values, present = _sequence_kv(k, v, block_table, b, ck[b], sk, work, k_descale, v_descale)
        o, lse = _attend(q[cq[b]:cq[b + 1]].to(work), keys, values, present, softmax_scale, causal, window_size,
                         softcap, None if alibi_slopes is None else alibi_slopes[b].to(work))
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
    """Literal reference: rotate and append the new k/v of every sequence in order (the cache keeps its dtype),
    then attend one sequence at a time in float32 (float64 for float64), rounded once into `out`; it reads
    `cache_seqlens` and the index tensors on the host (a sync on CUDA)."""
    work = _work(q.dtype)
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
            keys, values = _dequant(k_cache[row, start:end], kd, work), _dequant(v_cache[row, start:end], vd, work)
            present = torch.ones(end - start, dtype=torch.bool, device=q.device)
        else:
            keys, values, present = _sequence_kv(k_cache, v_cache, block_table, b, 0, end, work, k_descale,
                                                 v_descale)
        qb = q[b]
        if rotary_cos is not None and rotary_sin is not None:
            offsets = torch.arange(q.shape[1], device=q.device) if rotate_rows else torch.zeros(
                q.shape[1], dtype=torch.long, device=q.device)
            qb = _rotate(qb, n + offsets, rotary_cos, rotary_sin, rotary_interleaved)
        o, lse = _attend(qb.to(work), keys, values, present, softmax_scale, causal, window_size, softcap,
                         None if alibi_slopes is None else alibi_slopes[b].to(work))
        out[b] = o
        if softmax_lse is not None:
            softmax_lse[b] = lse
    return out
