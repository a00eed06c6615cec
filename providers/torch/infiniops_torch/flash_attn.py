"""FlashAttention in plain PyTorch: ``F.scaled_dot_product_attention`` with explicit bottom-right masks.

Two layouts feed one attention routine (`_attend`, on ``[B, S, H, D]`` batches):

- per sequence: host-side lengths (``cu_seqlens`` read on the host: one sync on CUDA, the only host read
  of the varlen path), one SDPA call per sequence; a sequence that needs no mask (no window, and
  non-causal or ``Sq == Sk``, where top-left and bottom-right causal agree) takes SDPA's ``is_causal``
  path, which runs the flash kernel on CUDA. Used for long sequences, except under CUDA-graph capture.
- batched with padding: gather every sequence into ``[B, max_S, H, D]`` on the device (no sync), one
  SDPA call with a ``[B, Sq, Sk]`` mask that also hides padded keys. Used for many short sequences.

The KV-cache entry point appends the new k/v with `put_rows` (rows outside the cache skipped on the
device) and pads to the longest attended length on CPU (read on the host, free there) but to the cache
capacity on CUDA, so that nothing there synchronizes with the host.

Masked calls fold the ``Hq // Hkv`` query heads of each kv head into the query axis (``[B, Hkv, G*Sq, D]``),
so GQA never copies K/V and every SDPA backend applies. Softcap has no SDPA form: it takes a manual path in
fp32, chunked over query rows to bound memory. Keys past a sequence's length are zeroed before they reach
SDPA, so uninitialized (even NaN) cache memory cannot leak through a masked score; rows that see no key
are set to 0 afterwards.
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
_SOFTCAP_CHUNK_BYTES = 1 << 28  # fp32 scores per chunk of the manual softcap path


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


def _softcapped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float,
                softcap: float) -> torch.Tensor:
    """Manual attention with ``softcap * tanh(s / softcap)`` in fp32; ``[B, H, S, D]`` layout, bool mask."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    kf, vf = k.float(), v.float()
    rows = max(1, _SOFTCAP_CHUNK_BYTES // (4 * q.shape[0] * q.shape[1] * max(1, k.shape[2])))
    for r0 in range(0, q.shape[2], rows):
        s = torch.matmul(q[:, :, r0:r0 + rows].float(), kf.transpose(-1, -2)) * scale
        s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~mask[:, :, r0:r0 + rows], -math.inf)
        out[:, :, r0:r0 + rows] = torch.matmul(torch.softmax(s, dim=-1), vf).to(q.dtype)
    return out


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
            scale: float, softcap: float) -> torch.Tensor:
    """q ``[B, Sq, Hq, D]``, k/v ``[B, Sk, Hkv, D]`` -> ``[B, Sq, Hq, D]``.

    `mask` ``[B, Sq, Sk]`` (None: every key visible, top-left causal when `is_causal`).
    """
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    if mask is None and softcap == 0:
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             is_causal=is_causal, scale=scale, enable_gqa=hq != hkv)
        return out.transpose(1, 2)
    if mask is None:
        full = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
        mask = (full.tril() if is_causal else full).expand(b, sq, sk)
    g = hq // hkv
    qf = q.view(b, sq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * sq, d)
    mf = mask[:, None, None].expand(b, 1, g, sq, sk).reshape(b, 1, g * sq, sk)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    if softcap > 0:
        of = _softcapped(qf, kt, vt, mf, scale, softcap)
    else:
        of = F.scaled_dot_product_attention(qf, kt, vt, attn_mask=mf, scale=scale)
    out = of.view(b, hkv, g, sq, d).permute(0, 3, 1, 2, 4).reshape(b, sq, hq, d)
    return torch.where(mask.any(-1)[:, :, None, None], out, 0)  # a row that sees no key outputs 0


def _paged(cache: torch.Tensor, table: torch.Tensor, sk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather logical rows ``0..sk`` of every sequence: ``[B, sk, Hkv, D]`` and ``[B, sk]`` block-id-in-range."""
    num_blocks, block_size = cache.shape[:2]
    blocks = table[:, : -(-sk // block_size)].long()
    present = (blocks >= 0) & (blocks < num_blocks)
    rows = cache[blocks.clamp(0, num_blocks - 1)].flatten(1, 2)[:, :sk]
    return rows, present.repeat_interleave(block_size, dim=1)[:, :sk]


def _zero_absent(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep[:, :, None, None], t, 0)


def _one_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, present: torch.Tensor | None, scale: float,
                  causal: bool, window: tuple[int, int], softcap: float) -> torch.Tensor:
    """q ``[1, Sq, Hq, D]``, k/v ``[1, Sk, Hkv, D]`` with host-known lengths; the mask only where needed."""
    sq, sk = q.shape[1], k.shape[1]
    if sk == 0:
        return torch.zeros_like(q)
    if present is None and window == (-1, -1) and (not causal or sq == sk):
        return _attend(q, k, v, None, causal, scale, softcap)
    lens = torch.tensor([[sq], [sk]], device=q.device)
    mask = _mask(lens[0], lens[1], sq, sk, causal, window, present)
    return _attend(q, k, v, mask, False, scale, softcap)


def _varlen_per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                         scale: float, causal: bool, window: tuple[int, int], softcap: float,
                         block_table: torch.Tensor | None, out: torch.Tensor) -> None:
    cq, ck = cu_q.tolist(), cu_k.tolist()
    checked = is_checked(q.device)
    for b in range(len(cq) - 1):
        if cq[b + 1] <= cq[b]:
            continue
        sk = max(0, ck[b + 1] - ck[b])
        present = None
        if block_table is None:
            kb, vb = k[None, ck[b]:ck[b] + sk], v[None, ck[b]:ck[b] + sk]
        else:
            sk = min(sk, block_table.shape[1] * k.shape[1])
            kb, present = _paged(k, block_table[b:b + 1], sk)
            vb, _ = _paged(v, block_table[b:b + 1], sk)
            if not checked:  # out-of-range block ids are possible only when unchecked
                kb, vb = _zero_absent(kb, present), _zero_absent(vb, present)
            else:
                present = None
        out[cq[b]:cq[b + 1]] = _one_sequence(q[None, cq[b]:cq[b + 1]], kb, vb, present, scale, causal, window,
                                             softcap)[0]


def _varlen_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                   max_q: int, max_k: int, scale: float, causal: bool, window: tuple[int, int], softcap: float,
                   block_table: torch.Tensor | None, out: torch.Tensor) -> None:
    cu_q, cu_k = cu_q.long(), cu_k.long()
    len_q, len_k = (cu_q[1:] - cu_q[:-1]).clamp(min=0), (cu_k[1:] - cu_k[:-1]).clamp(min=0)
    q_rows = (cu_q[:-1, None] + torch.arange(max_q, device=q.device)).clamp(0, q.shape[0] - 1)
    present = None
    if block_table is None:
        k_rows = (cu_k[:-1, None] + torch.arange(max_k, device=q.device)).clamp(0, max(k.shape[0] - 1, 0))
        kp, vp = k[k_rows], v[k_rows]
    else:
        max_k = min(max_k, block_table.shape[1] * k.shape[1])
        (kp, present), (vp, _) = _paged(k, block_table, max_k), _paged(v, block_table, max_k)
    keep = torch.arange(max_k, device=q.device)[None, :] < len_k[:, None]
    keep = keep if present is None else keep & present
    mask = _mask(len_q, len_k, max_q, max_k, causal, window, keep)
    o = _attend(q[q_rows], _zero_absent(kp, keep), _zero_absent(vp, keep), mask, False, scale, softcap)
    t = torch.arange(q.shape[0], device=q.device)
    seq = torch.searchsorted(cu_q[1:], t, right=True).clamp(max=len_q.shape[0] - 1)
    out.copy_(o[seq, (t - cu_q[seq]).clamp(0, max_q - 1)])


def flash_attn_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                      causal: bool, window_size: tuple[int, int], softcap: float, block_table: torch.Tensor | None,
                      out: torch.Tensor) -> torch.Tensor:
    """Varlen attention (contract: `infiniops_py.operators.flash_attn`): per sequence when sequences are
    long or padding would more than double the work (it reads `cu_seqlens_q/k` on the host: one sync on
    CUDA), else, and always during CUDA-graph capture, one padded batch (no host read)."""
    batch = cu_seqlens_q.shape[0] - 1
    if out.numel() == 0 or batch == 0:
        return out
    if max_seqlen_k == 0 or (block_table is None and k.shape[0] == 0):
        return out.zero_()
    padded_q = batch * max_seqlen_q
    padded_k = batch * max_seqlen_k
    per_sequence = (batch == 1 or q.shape[0] >= _PER_SEQUENCE_MIN_LEN * batch or padded_q > 2 * q.shape[0]
                    or (block_table is None and padded_k > 2 * k.shape[0]))
    if per_sequence and q.is_cuda and torch.cuda.is_current_stream_capturing():
        per_sequence = False  # a capture cannot read the lengths on the host
    if per_sequence:
        _varlen_per_sequence(q, k, v, cu_seqlens_q, cu_seqlens_k, softmax_scale, causal, window_size, softcap,
                             block_table, out)
    else:
        _varlen_padded(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                       window_size, softcap, block_table, out)
    return out


def _append(cache: torch.Tensor, new: torch.Tensor, cache_seqlens: torch.Tensor,
            block_table: torch.Tensor | None) -> None:
    """Write ``new`` ``[B, Sq_new, Hkv, D]`` at rows ``cache_seqlens[b] + t``; rows outside the cache (or in
    a block whose id is out of range) are skipped on the device, without a host sync (`put_rows`)."""
    pos = cache_seqlens.long()[:, None] + torch.arange(new.shape[1], device=new.device)
    if block_table is None:
        ok = (pos >= 0) & (pos < cache.shape[1])
        index = (torch.arange(new.shape[0], device=new.device)[:, None].expand_as(pos), pos)
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
                            softcap: float, out: torch.Tensor) -> torch.Tensor:
    """KV-cache attention (contract: `infiniops_py.operators.flash_attn`): append, then one padded batch
    over the longest attended length on CPU (read on the host), over the cache capacity on CUDA (masked:
    no host sync, so it can be captured in a CUDA graph)."""
    new = 0
    if k is not None and v is not None:
        _append(k_cache, k, cache_seqlens, block_table)
        _append(v_cache, v, cache_seqlens, block_table)
        new = k.shape[1]
    if out.numel() == 0:
        return out
    capacity = k_cache.shape[1] if block_table is None else block_table.shape[1] * k_cache.shape[1]
    len_k = (cache_seqlens.long() + new).clamp(0, capacity)
    max_k = capacity if q.is_cuda else int(len_k.max())
    if max_k == 0:
        return out.zero_()
    if block_table is None:
        kp, vp, present = k_cache[:, :max_k], v_cache[:, :max_k], None
    else:
        (kp, present), (vp, _) = _paged(k_cache, block_table, max_k), _paged(v_cache, block_table, max_k)
    keep = torch.arange(max_k, device=q.device)[None, :] < len_k[:, None]
    keep = keep if present is None else keep & present
    len_q = torch.full_like(len_k, q.shape[1])
    mask = _mask(len_q, len_k, q.shape[1], max_k, causal, window_size, keep)
    out.copy_(_attend(q, _zero_absent(kp, keep), _zero_absent(vp, keep), mask, False, softmax_scale, softcap))
    return out


_CAPABILITY = Capability(DEVICES, FLOAT_DTYPES)

IMPLEMENTATIONS = [
    Implementation("flash_attn_varlen", "torch", "torch.flash_attn_varlen_sdpa", _CAPABILITY, PRIORITY,
                   flash_attn_varlen),
    Implementation("flash_attn_with_kvcache", "torch", "torch.flash_attn_with_kvcache_sdpa", _CAPABILITY, PRIORITY,
                   flash_attn_with_kvcache),
]
