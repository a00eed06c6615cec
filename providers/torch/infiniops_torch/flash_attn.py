"""FlashAttention in plain PyTorch: ``F.scaled_dot_product_attention`` with explicit bottom-right masks.

Two layouts feed one attention routine (`_attend`, on ``[B, S, H, D]`` batches):

- per sequence: host-side lengths (``cu_seqlens`` and ``seqused_k`` read on the host: one sync on CUDA,
  the only host read of the varlen path), one SDPA call per sequence; a sequence that needs no mask (no
  window, and non-causal or ``Sq == Sk``, where top-left and bottom-right causal agree) takes SDPA's
  ``is_causal`` path, which runs the flash kernel on CUDA. Used for long sequences, except under CUDA-graph
  capture.
- batched with padding: gather every sequence into ``[B, max_S, H, D]`` on the device (no sync), one
  SDPA call with a ``[B, Sq, Sk]`` mask that also hides padded keys. Used for many short sequences.

The KV-cache entry point rotates the new k (rotary tables), appends the new k/v with `put_rows` (rows
outside the cache skipped on the device), gathers each sequence's rows (its cache row, from its left
padding) and pads to the longest attended length on CPU (read on the host, free there) but to the cache
capacity on CUDA, so that nothing there synchronizes with the host.

Masked calls fold the ``Hq // Hkv`` query heads of each kv head into the query axis (``[B, Hkv, G*Sq, D]``),
so GQA never copies K/V and every SDPA backend applies. Softcap, ALiBi and the log-sum-exp have no SDPA
form: they take a manual path in fp32, chunked over query rows to bound memory. An fp8 KV cache is read in
fp32 (times its descales), q with it. Keys past a sequence's length are zeroed before they reach SDPA, so
uninitialized (even NaN) cache memory cannot leak through a masked score; rows that see no key are set to 0
afterwards (their log-sum-exp to +inf).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_py.operators._base import is_checked
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY, put_rows

__all__ = ["IMPLEMENTATIONS", "flash_attn_varlen", "flash_attn_with_kvcache"]

_PER_SEQUENCE_MIN_LEN = 256  # mean query length from which one SDPA call per sequence beats padding
_MANUAL_CHUNK_BYTES = 1 << 28  # fp32 scores per chunk of the manual (softcap, ALiBi, log-sum-exp) path
_FP8 = torch.float8_e4m3fn


def _mask(len_q: torch.Tensor, len_k: torch.Tensor, sq: int, sk: int, causal: bool, window: tuple[int, int],
          present: torch.Tensor | None) -> torch.Tensor:
    """``[B, sq, sk]`` bool: key j exists and is visible to query row i (diagonal aligned bottom-right)."""
    i = torch.arange(sq, device=len_q.device)[None, :, None]
    j = torch.arange(sk, device=len_q.device)[None, None, :]
    diag = i + (len_k - len_q)[:, None, None]
    ok = j < len_k[:, None, None]
    left, right = window
    if causal:
        ok = ok & (j <= diag)
    if right >= 0:
        ok = ok & (j <= diag + right)
    if left >= 0:
        ok = ok & (j >= diag - left)
    if present is not None:
        ok = ok & present[:, None, :]
    return ok


def _distance(len_q: torch.Tensor, len_k: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """``[B, sq, sk]`` fp32 ``|i + Sk - Sq - j|``: the ALiBi distance of query row i and key j."""
    i = torch.arange(sq, device=len_q.device)[None, :, None]
    j = torch.arange(sk, device=len_q.device)[None, None, :]
    return (i + (len_k - len_q)[:, None, None] - j).abs().float()


def _manual(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float, softcap: float,
            slopes: torch.Tensor | None, dist: torch.Tensor | None, lse: torch.Tensor | None) -> torch.Tensor:
    """Attention in fp32 on the folded ``[B, Hkv, G * Sq, D]`` layout (row ``g * Sq + i``), bool mask
    ``[B, 1, G * Sq, Sk]``: the score is ``softcap * tanh(s / softcap)`` when softcap > 0, less
    ``slope * dist`` with ALiBi (slopes ``[B, Hkv, G]``, dist ``[B, Sq, Sk]``, expanded chunk by chunk);
    `lse` ``[B, Hkv, G * Sq]`` receives the log-sum-exp when given."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    kf, vf = k.float(), v.float()
    rows = max(1, _MANUAL_CHUNK_BYTES // (4 * q.shape[0] * q.shape[1] * max(1, k.shape[2])))
    for r0 in range(0, q.shape[2], rows):
        r1 = min(r0 + rows, q.shape[2])
        s = torch.matmul(q[:, :, r0:r1].float(), kf.transpose(-1, -2)) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if slopes is not None and dist is not None:
            at = torch.arange(r0, r1, device=q.device)
            sq = dist.shape[1]
            s = s - slopes.float()[:, :, at // sq, None] * dist[:, None, at % sq]
        s = s.masked_fill(~mask[:, :, r0:r1], -math.inf)
        if lse is not None:
            lse[:, :, r0:r1] = torch.logsumexp(s, dim=-1)
        out[:, :, r0:r1] = torch.matmul(torch.softmax(s, dim=-1), vf).to(q.dtype)
    return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
            scale: float, softcap: float, *, slopes: torch.Tensor | None = None, dist: torch.Tensor | None = None,
            want_lse: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hkv, D]`` -> ``[B, Sq, Hq, D]`` and, when `want_lse`, the
    log-sum-exp ``[B, Hq, Sq]`` in fp32 (+inf for a row that sees no key).

    `mask` ``[B, Sq, Sk]`` (None: every key visible, top-left causal when `is_causal`); `slopes` ``[B, Hq]``
    and `dist` ``[B, Sq, Sk]`` (`_distance`) add ALiBi.
    """
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    manual = softcap > 0 or slopes is not None or want_lse
    if mask is None and not manual:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=is_causal, scale=scale, enable_gqa=hq != hkv)
        return out.transpose(1, 2), None
    if mask is None:
        full = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
        mask = (full.tril() if is_causal else full).expand(b, sq, sk)
    g = hq // hkv
    qf = q.view(b, sq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * sq, d)
    mf = mask[:, None, None].expand(b, 1, g, sq, sk).reshape(b, 1, g * sq, sk)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    lse = None
    if manual:
        slopes_f = None if slopes is None else slopes.reshape(b, hkv, g)
        lse_f = torch.empty((b, hkv, g * sq), dtype=torch.float32, device=q.device) if want_lse else None
        of = _manual(qf, kt, vt, mf, scale, softcap, slopes_f, dist, lse_f)
        if lse_f is not None:
            seen = mask.any(-1)[:, None, :]  # [B, 1, Sq]
            lse = torch.where(seen, lse_f.view(b, hq, sq), math.inf)
    else:
        of = F.scaled_dot_product_attention(qf, kt, vt, attn_mask=mf, scale=scale)
    out = of.view(b, hkv, g, sq, d).permute(0, 3, 1, 2, 4).reshape(b, sq, hq, d)
    return torch.where(mask.any(-1)[:, :, None, None], out, 0), lse  # a row that sees no key outputs 0


def _paged(cache: torch.Tensor, table: torch.Tensor, sk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather logical rows ``0..sk`` of every sequence: ``[B, sk, Hkv, D]`` and ``[B, sk]`` block-id-in-range."""
    num_blocks, block_size = cache.shape[:2]
    blocks = table[:, : -(-sk // block_size)].long()
    present = (blocks >= 0) & (blocks < num_blocks)
    rows = cache[blocks.clamp(0, num_blocks - 1)].flatten(1, 2)[:, :sk]
    return rows, present.repeat_interleave(block_size, dim=1)[:, :sk]


def _zero_absent(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep[:, :, None, None], t, 0)


def _readable(t: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
    """K or V rows ``[B, S, Hkv, D]`` ready for attention: an fp8 cache in fp32 times its descale
    ``[B, Hkv]``, anything else as it is."""
    if t.dtype != _FP8:
        return t
    t = t.float()
    return t if descale is None else t * descale.float()[:, None, :, None]


def _rotate(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            interleaved: bool) -> torch.Tensor:
    """Rotary embedding of x ``[B, S, H, D]`` at positions ``[B, S]`` (contract: the first ``2 *
    cos.shape[1]`` dims, pairs ``(2j, 2j + 1)`` or ``(j, j + rotary_dim / 2)``, fp32, rounded once; a
    position past the tables leaves its row unrotated)."""
    half = cos.shape[1]
    ok = ((positions >= 0) & (positions < cos.shape[0]))[..., None]
    at = positions.clamp(0, cos.shape[0] - 1).long()
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    c = torch.where(ok, cos[at].to(work), 1.0)[:, :, None, :]  # [B, S, 1, half]
    s = torch.where(ok, sin[at].to(work), 0.0)[:, :, None, :]
    xr = x[..., :2 * half].to(work)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        rot = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _one_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, present: torch.Tensor | None, scale: float,
                  causal: bool, window: tuple[int, int], softcap: float, slopes: torch.Tensor | None,
                  want_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q ``[1, Sq, Hq, D]``, k/v ``[1, Sk, Hkv, D]`` with host-known lengths; the mask only where needed."""
    sq, sk = q.shape[1], k.shape[1]
    if sk == 0:
        lse = torch.full((1, q.shape[2], sq), math.inf, device=q.device) if want_lse else None
        return torch.zeros_like(q), lse
    lens = torch.tensor([[sq], [sk]], device=q.device)
    dist = None if slopes is None else _distance(lens[0], lens[1], sq, sk)
    if present is None and window == (-1, -1) and (not causal or sq == sk) and dist is None:
        return _attend(q, k, v, None, causal, scale, softcap, want_lse=want_lse)
    mask = _mask(lens[0], lens[1], sq, sk, causal, window, present)
    return _attend(q, k, v, mask, False, scale, softcap, slopes=slopes, dist=dist, want_lse=want_lse)


def _varlen_per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                         scale: float, causal: bool, window: tuple[int, int], softcap: float,
                         block_table: torch.Tensor | None, out: torch.Tensor, seqused_k: torch.Tensor | None,
                         alibi_slopes: torch.Tensor | None, descales: tuple[torch.Tensor | None, torch.Tensor | None],
                         softmax_lse: torch.Tensor | None) -> None:
    cq, ck = cu_q.tolist(), cu_k.tolist()
    used = None if seqused_k is None else seqused_k.tolist()
    checked = is_checked(q.device)
    fp8 = k.dtype == _FP8
    qw = q.float() if fp8 else q
    for b in range(len(cq) - 1):
        if cq[b + 1] <= cq[b]:
            continue
        sk = max(0, ck[b + 1] - ck[b])
        if used is not None:
            sk = min(max(used[b], 0), sk if block_table is None else block_table.shape[1] * k.shape[1])
        present = None
        if block_table is None:
            kb, vb = k[None, ck[b]:ck[b] + sk], v[None, ck[b]:ck[b] + sk]
        else:
            sk = min(sk, block_table.shape[1] * k.shape[1])
            kb, present = _paged(k, block_table[b:b + 1], sk)
            vb, _ = _paged(v, block_table[b:b + 1], sk)
        kb = _readable(kb, None if descales[0] is None else descales[0][b:b + 1])
        vb = _readable(vb, None if descales[1] is None else descales[1][b:b + 1])
        if present is not None:
            if not checked:  # out-of-range block ids are possible only when unchecked
                kb, vb = _zero_absent(kb, present), _zero_absent(vb, present)
            else:
                present = None
        slopes = None if alibi_slopes is None else alibi_slopes[b:b + 1]
        o, lse = _one_sequence(qw[None, cq[b]:cq[b + 1]], kb, vb, present, scale, causal, window, softcap, slopes,
                               softmax_lse is not None)
        out[cq[b]:cq[b + 1]] = o[0]
        if softmax_lse is not None and lse is not None:
            softmax_lse[:, cq[b]:cq[b + 1]] = lse[0]


def _varlen_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                   max_q: int, max_k: int, scale: float, causal: bool, window: tuple[int, int], softcap: float,
                   block_table: torch.Tensor | None, out: torch.Tensor, seqused_k: torch.Tensor | None,
                   alibi_slopes: torch.Tensor | None, descales: tuple[torch.Tensor | None, torch.Tensor | None],
                   softmax_lse: torch.Tensor | None) -> None:
    cu_q, cu_k = cu_q.long(), cu_k.long()
    max_q = max(max_q, 1)  # 0 with query rows (unchecked metadata): the row gathers below stay in range
    len_q, len_k = (cu_q[1:] - cu_q[:-1]).clamp(min=0), (cu_k[1:] - cu_k[:-1]).clamp(min=0)
    q_rows = (cu_q[:-1, None] + torch.arange(max_q, device=q.device)).clamp(0, q.shape[0] - 1)
    present = None
    if block_table is None:
        if seqused_k is not None:  # its first seqused_k[b] rows
            len_k = torch.minimum(seqused_k.long().clamp(min=0), len_k)
        k_rows = (cu_k[:-1, None] + torch.arange(max_k, device=q.device)).clamp(0, max(k.shape[0] - 1, 0))
        kp, vp = k[k_rows], v[k_rows]
    else:
        max_k = min(max_k, block_table.shape[1] * k.shape[1])
        if seqused_k is not None:
            len_k = seqused_k.long().clamp(0, block_table.shape[1] * k.shape[1])
        (kp, present), (vp, _) = _paged(k, block_table, max_k), _paged(v, block_table, max_k)
    kp, vp = _readable(kp, descales[0]), _readable(vp, descales[1])
    keep = torch.arange(max_k, device=q.device)[None, :] < len_k[:, None]
    keep = keep if present is None else keep & present
    mask = _mask(len_q, len_k, max_q, max_k, causal, window, keep)
    dist = None if alibi_slopes is None else _distance(len_q, len_k, max_q, max_k)
    qp = q[q_rows].float() if k.dtype == _FP8 else q[q_rows]
    o, lse = _attend(qp, _zero_absent(kp, keep), _zero_absent(vp, keep), mask, False, scale, softcap,
                     slopes=alibi_slopes, dist=dist, want_lse=softmax_lse is not None)
    t = torch.arange(q.shape[0], device=q.device)
    seq = torch.searchsorted(cu_q[1:], t, right=True).clamp(max=len_q.shape[0] - 1)
    at = (t - cu_q[seq]).clamp(0, max_q - 1)
    out.copy_(o[seq, at])
    if softmax_lse is not None and lse is not None:
        softmax_lse.copy_(lse.transpose(1, 2)[seq, at].transpose(0, 1))


def flash_attn_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                      causal: bool, window_size: tuple[int, int], softcap: float, block_table: torch.Tensor | None,
                      out: torch.Tensor, *, seqused_k: torch.Tensor | None = None,
                      alibi_slopes: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                      v_descale: torch.Tensor | None = None, softmax_lse: torch.Tensor | None = None) -> torch.Tensor:
    """Varlen attention (contract: `infiniops_py.operators.flash_attn`): per sequence when sequences are
    long or padding would more than double the work (it reads `cu_seqlens_q/k` and `seqused_k` on the host:
    one sync on CUDA), else, and always during CUDA-graph capture, one padded batch (no host read)."""
    batch = cu_seqlens_q.shape[0] - 1
    if out.numel() == 0 or batch == 0:
        return out
    if max_seqlen_k == 0 or (block_table is None and k.shape[0] == 0):
        if softmax_lse is not None:
            softmax_lse.fill_(math.inf)
        return out.zero_()
    padded_q = batch * max_seqlen_q
    padded_k = batch * max_seqlen_k
    per_sequence = (batch == 1 or q.shape[0] >= _PER_SEQUENCE_MIN_LEN * batch or padded_q > 2 * q.shape[0]
                    or (block_table is None and padded_k > 2 * k.shape[0]))
    if per_sequence and q.is_cuda and torch.cuda.is_current_stream_capturing():
        per_sequence = False  # a capture cannot read the lengths on the host
    run = _varlen_per_sequence if per_sequence else _varlen_padded
    sizes = () if per_sequence else (max_seqlen_q, max_seqlen_k)
    run(q, k, v, cu_seqlens_q, cu_seqlens_k, *sizes, softmax_scale, causal, window_size, softcap,  # type: ignore[operator]
        block_table, out, seqused_k, alibi_slopes, (k_descale, v_descale), softmax_lse)
    return out


def _append(cache: torch.Tensor, new: torch.Tensor, cache_seqlens: torch.Tensor, block_table: torch.Tensor | None,
            rows: torch.Tensor | None, row_ok: torch.Tensor | None) -> None:
    """Write ``new`` ``[B, Sq_new, Hkv, D]`` at rows ``cache_seqlens[b] + t`` of cache row ``rows[b]`` (b
    when None); rows outside the cache (or in a block whose id is out of range, or of a cache row out of
    range) are skipped on the device, without a host sync (`put_rows`)."""
    pos = cache_seqlens.long()[:, None] + torch.arange(new.shape[1], device=new.device)
    if block_table is None:
        ok = (pos >= 0) & (pos < cache.shape[1])
        row = torch.arange(new.shape[0], device=new.device) if rows is None else rows
        if row_ok is not None:
            ok = ok & row_ok[:, None]
        index = (row[:, None].expand_as(pos), pos)
    else:
        num_blocks, block_size = cache.shape[:2]
        slot = pos // block_size
        blocks = block_table.gather(1, slot.clamp(0, block_table.shape[1] - 1)).long()
        ok = (pos >= 0) & (slot < block_table.shape[1]) & (blocks >= 0) & (blocks < num_blocks)
        index = (blocks, pos % block_size)
    put_rows(cache, tuple(i.flatten() for i in index), new.flatten(0, 1), ok.flatten())


def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_seqlens: torch.Tensor, block_table: torch.Tensor | None, k: torch.Tensor | None,
                            v: torch.Tensor | None, softmax_scale: float, causal: bool, window_size: tuple[int, int],
                            softcap: float, out: torch.Tensor, *, cache_batch_idx: torch.Tensor | None = None,
                            cache_leftpad: torch.Tensor | None = None, rotary_cos: torch.Tensor | None = None,
                            rotary_sin: torch.Tensor | None = None, rotary_interleaved: bool = True,
                            alibi_slopes: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                            v_descale: torch.Tensor | None = None,
                            softmax_lse: torch.Tensor | None = None) -> torch.Tensor:
    """KV-cache attention (contract: `infiniops_py.operators.flash_attn`): rotate and append, then one padded
    batch over the longest attended length on CPU (read on the host), over the cache capacity on CUDA
    (masked: no host sync, so it can be captured in a CUDA graph)."""
    batch, sq = q.shape[:2]
    seqlens = cache_seqlens.long()
    rows = row_ok = None
    if cache_batch_idx is not None:
        rows = cache_batch_idx.long()
        row_ok = (rows >= 0) & (rows < k_cache.shape[0])
        rows = torch.where(row_ok, rows, 0)
    new = 0
    if k is not None and v is not None:
        new = k.shape[1]
        if rotary_cos is not None and rotary_sin is not None:
            pos = seqlens[:, None] + torch.arange(new, device=q.device)
            k = _rotate(k, pos, rotary_cos, rotary_sin, rotary_interleaved)
        _append(k_cache, k, seqlens, block_table, rows, row_ok)
        _append(v_cache, v, seqlens, block_table, rows, row_ok)
    if out.numel() == 0:
        return out
    capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
    end = (seqlens + new).clamp(0, capacity)
    if row_ok is not None:
        end = torch.where(row_ok, end, 0)
    start = torch.zeros_like(end) if cache_leftpad is None else torch.minimum(cache_leftpad.long().clamp(min=0), end)
    len_k = end - start
    max_k = capacity if q.is_cuda else int(len_k.max())
    if max_k == 0:
        if softmax_lse is not None:
            softmax_lse.fill_(math.inf)
        return out.zero_()
    present = None
    if block_table is not None:
        (kp, present), (vp, _) = _paged(k_cache, block_table, max_k), _paged(v_cache, block_table, max_k)
    elif rows is None and cache_leftpad is None:
        kp, vp = k_cache[:, :max_k], v_cache[:, :max_k]
    else:  # each sequence's own cache row, from its left padding on
        row = torch.arange(batch, device=q.device) if rows is None else rows
        at = (start[:, None] + torch.arange(max_k, device=q.device)).clamp(max=k_cache.shape[1] - 1)
        kp, vp = k_cache[row[:, None], at], v_cache[row[:, None], at]
    kp, vp = _readable(kp, k_descale), _readable(vp, v_descale)
    keep = torch.arange(max_k, device=q.device)[None, :] < len_k[:, None]
    keep = keep if present is None else keep & present
    qw = q.float() if k_cache.dtype == _FP8 else q
    if rotary_cos is not None and rotary_sin is not None:
        offsets = torch.arange(sq, device=q.device) if causal or window_size != (-1, -1) else torch.zeros(
            sq, dtype=torch.long, device=q.device)  # non-causal, non-local: every query at cache_seqlens[b]
        qw = _rotate(qw, seqlens[:, None] + offsets, rotary_cos, rotary_sin, rotary_interleaved)
    len_q = torch.full_like(len_k, sq)
    mask = _mask(len_q, len_k, sq, max_k, causal, window_size, keep)
    dist = None if alibi_slopes is None else _distance(len_q, len_k, sq, max_k)
    o, lse = _attend(qw, _zero_absent(kp, keep), _zero_absent(vp, keep), mask, False, softmax_scale, softcap,
                     slopes=alibi_slopes, dist=dist, want_lse=softmax_lse is not None)
    out.copy_(o)
    if softmax_lse is not None and lse is not None:
        softmax_lse.copy_(lse)
    return out


_CAPABILITY = Capability(DEVICES, FLOAT_DTYPES)

IMPLEMENTATIONS = [
    Implementation("flash_attn_varlen", "torch", "torch.flash_attn_varlen_sdpa", _CAPABILITY, PRIORITY,
                   flash_attn_varlen),
    Implementation("flash_attn_with_kvcache", "torch", "torch.flash_attn_with_kvcache_sdpa", _CAPABILITY, PRIORITY,
                   flash_attn_with_kvcache),
]
