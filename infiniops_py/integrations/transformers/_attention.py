"""Attention through InfiniOps-Py: the ``"infiniops"`` entry of transformers' ``AttentionInterface`` and
``AttentionMaskInterface`` (`register`, run when the integration is imported), over `flash_attn_varlen` (prefill)
and `flash_attn_with_kvcache` (decode, padded batches, static caches). One query per row over a cache that every
row fills (an unpadded ``DynamicCache`` decode step, no softcap, no window narrower than the keys) has no mask to
apply: that goes to torch's ``scaled_dot_product_attention``, whose call costs the host a fraction of a
`flash_attn_with_kvcache` call's time (the eager decode step is bound by host time).

No host reads in the attention: what the host needs comes from shapes and arguments, and what is the same for
every layer of a forward is derived once. The mask entry (`padding_mask`, once per forward) turns transformers'
``[B, L]`` padding mask into the per-row key spans the kvcache entry takes (``cache_seqlens``, the end of the
keys, and ``cache_leftpad``, the first real key) with tensor operations. Eagerly it keeps transformers'
flash-attention rule (no mask when no token is padded, one ``mask.all()`` per forward, which transformers' own
mask function also reads); while tracing (``torch.compile``) the spans are always kept. The one host read left is
`_packed`'s, eagerly only: whether the ``position_ids`` of a one-row prefill hold several sequences (once per
forward; the exact ``cu_seqlens`` keeps the varlen grid at the real sequence count). While tracing, the packed
sequences are found with tensor operations (``cu_seqlens`` of ``S + 1`` entries, the unused ones empty).
"""

from __future__ import annotations

import itertools
from typing import Any, Final

import torch
import torch.nn.functional as F

from infiniops_py import flash_attn_varlen, flash_attn_with_kvcache
from infiniops_py.integrations.transformers._memo import PerForward, forget

__all__ = ["ATTENTION", "attention", "padding_mask", "register"]

ATTENTION: Final = "infiniops"  # the name registered in transformers' AttentionInterface / AttentionMaskInterface

_PACKED: Final = PerForward()  # position_ids -> cu_seqlens, one entry per forward
_ROWS: Final = PerForward()  # (batch, seq, device) -> cu_seqlens of equal rows
_HELD: Final = PerForward()  # (batch, keys, device) -> cache_seqlens of a decode step


def register() -> bool:
    """Register `ATTENTION` (`attention` and `padding_mask`) with transformers' attention and mask interfaces,
    so that ``from_pretrained(..., attn_implementation="infiniops")`` and ``model.set_attn_implementation``
    find it. Returns False (and registers nothing) where transformers is not installed."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:
        return False
    AttentionInterface.register(ATTENTION, attention)
    AttentionMaskInterface.register(ATTENTION, padding_mask)
    return True


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                 attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """The mask `attention` gets (transformers calls this once per forward, or in ``generate`` before a compiled
    forward): None when every key of every row is attended, else the int32 key spans ``[k, B, 1, 1]`` (4-D,
    so that transformers passes them on as a prepared mask): row 0 the end of each row's keys (the 2-D mask's
    length, or ``q_offset + q_length``, the tokens a static cache holds), row 1, when ``k == 2``, the first real
    key (left padding). Only left or right padding (one run of real tokens per row, as tokenizers and
    ``generate`` pad) is kept apart; a mask with holes is read as its span. Also starts a new forward for the
    values the layers share (`forget`)."""
    forget()
    device = kwargs.get("device")
    if attention_mask is None:
        if kv_offset != 0 or (isinstance(q_offset, int) and q_offset + q_length >= kv_length):
            return None  # every key the cache hands over is a token
        held = torch.as_tensor(q_offset + q_length, device=device).to(torch.int32)
        return held.reshape(1, 1, 1, 1).expand(1, batch_size, 1, 1).contiguous()
    mask = attention_mask[:, -kv_length:].to(device=device, dtype=torch.bool)
    length = mask.shape[1]
    if not torch.compiler.is_compiling() and bool(mask.all()):  # transformers' flash-attention rule, eagerly
        if length == kv_length:
            return None
        return torch.full((1, batch_size, 1, 1), length, dtype=torch.int32, device=mask.device)
    end = torch.full((batch_size,), length, dtype=torch.int32, device=mask.device)
    start = mask.to(torch.uint8).argmax(dim=1).to(torch.int32)  # the first real token (0 for a padding-only row)
    return torch.stack((end, start)).view(2, batch_size, 1, 1)


def _packed(position_ids: Any, sq: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """``cu_seqlens`` int32 and the longest sequence of the one row of `sq` tokens whose positions are
    `position_ids`: a new sequence starts where the position does not follow the previous one (transformers'
    `find_packed_sequence_indices` rule). Eagerly exact (one host read per forward); while tracing ``sq + 1``
    entries, the unused ones at the end empty, and `sq` as the longest."""
    if not isinstance(position_ids, torch.Tensor) or position_ids.numel() != sq or sq < 2:
        return _rows(1, sq, device), sq

    def make() -> tuple[torch.Tensor, int]:
        pos = position_ids.detach().reshape(sq)
        start = torch.ones(sq, dtype=torch.bool, device=pos.device)
        start[1:] = pos[1:] != pos[:-1] + 1
        if torch.compiler.is_compiling():
            at = torch.arange(sq + 1, dtype=torch.int32, device=pos.device)
            ends = torch.where(torch.cat((start, start.new_ones(1))), at, sq)
            return torch.sort(ends).values.to(torch.int32), sq
        bounds = [*start.nonzero().flatten().tolist(), sq]  # the one host read, eagerly
        cu = torch.tensor(bounds, dtype=torch.int32, device=device)
        return cu, max(b - a for a, b in itertools.pairwise(bounds))

    return _PACKED.get((position_ids, sq), make)


def _rows(b: int, s: int, device: torch.device) -> torch.Tensor:
    """``cu_seqlens`` int32 ``[b + 1]`` of `b` rows of `s` tokens each."""
    return _ROWS.get((b, s, device), lambda: torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=device))


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over `flash_attn_varlen` / `flash_attn_with_kvcache`.

    `query` ``[B, Hq, Sq, D]``, `key`/`value` ``[B, Hkv, Sk, D]`` (the cache included), `attention_mask` None or
    the key spans of `padding_mask`. Returns ``([B, Sq, Hq, D], None)``. The causal mask is bottom-right aligned,
    as transformers' masks are for queries that follow a cache; a sliding window of ``w`` keys is
    ``window_size=(w - 1, 0)``; the scale is `scaling`. A left-padding query row is 0; a right-padding one is
    whatever its keys give (transformers' logits there are meaningless too).

    Raises:
        ValueError: `dropout` > 0 (call ``model.eval()``), more queries than keys, a mask that is not
            `padding_mask`'s (a 4-D float mask made for another attention implementation).
    """
    if dropout:
        raise ValueError(f"infiniops attention: dropout={dropout}, but the operators have no dropout: call "
                         "model.eval() before running a kernelized model")
    b, hq, sq, d = query.shape
    hkv, sk = key.shape[1], key.shape[2]
    if sq > sk:
        raise ValueError(f"infiniops attention: {sq} queries but only {sk} keys")
    causal = bool(module.is_causal if is_causal is None else is_causal)
    window = (-1, -1) if not sliding_window else (int(sliding_window) - 1, 0 if causal else int(sliding_window) - 1)
    options = {"softmax_scale": scaling, "causal": causal, "window_size": window, "softcap": float(softcap or 0.0)}
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, S, H, D] views, no copy
    if attention_mask is not None:
        if attention_mask.dtype != torch.int32 or attention_mask.dim() != 4 or attention_mask.shape[0] not in (1, 2):
            raise ValueError(f"infiniops attention: expected the key spans of its own mask function (int32 [1 or 2, "
                             f"B, 1, 1]), got a {attention_mask.dtype} mask of shape {list(attention_mask.shape)}: "
                             "let transformers build the mask (pass the 2-D padding mask)")
        left = attention_mask[1].view(b) if attention_mask.shape[0] == 2 else None
        out = flash_attn_with_kvcache(q, k, v, cache_seqlens=attention_mask[0].view(b), cache_leftpad=left,
                                      **options)
        return out, None
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:  # packed sequences described by the caller (padding-free batches)
        max_q, max_k = (kwargs.get(n) for n in ("max_length_q", "max_length_k"))
        out = flash_attn_varlen(q.reshape(b * sq, hq, d), k.reshape(b * sk, hkv, d), v.reshape(b * sk, hkv, d),
                                cu_q.to(torch.int32), cu_k.to(torch.int32),
                                max_q if isinstance(max_q, int) else b * sq,
                                max_k if isinstance(max_k, int) else b * sk, **options)
        return out.view(b, sq, hq, d), None
    if sq == 1 and not softcap and (not sliding_window or sliding_window >= sk):
        # one query per row over a cache every row fills: no mask, so torch's SDPA computes exactly this, at a
        # fraction of the host time of a flash_attn_with_kvcache call (transformers' eager decode is host-bound)
        out = F.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=hq != hkv)
        return out.transpose(1, 2), None
    if sq < sk:  # decode over transformers' cache (every row holds all sk keys): a view, no copy
        held = _HELD.get((b, sk, query.device),
                         lambda: torch.full((b,), sk, dtype=torch.int32, device=query.device))
        return flash_attn_with_kvcache(q, k, v, cache_seqlens=held, **options), None
    if b == 1:  # one row: one sequence, or several packed back to back; [S, H, D] views, no copy
        cu, longest = _packed(kwargs.get("position_ids"), sq, query.device)
        out = flash_attn_varlen(q[0], k[0], v[0], cu, cu, longest, longest, **options)
    else:
        cu = _rows(b, sq, query.device)
        out = flash_attn_varlen(q.reshape(b * sq, hq, d), k.reshape(b * sk, hkv, d), v.reshape(b * sk, hkv, d),
                                cu, cu, sq, sq, **options)
    return out.view(b, sq, hq, d), None
