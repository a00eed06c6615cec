"""Attention through InfiniOps-Py: the ``"infiniops"`` entry registered in transformers' ``AttentionInterface``
and ``AttentionMaskInterface`` (`swap_attention`), and the attention function it names, over
`flash_attn_varlen` (prefill, padded and packed batches) and `flash_attn_with_kvcache` (decode)."""

from __future__ import annotations

import itertools
from typing import Any, Final, NamedTuple

import torch

from infiniops_py import flash_attn_varlen, flash_attn_with_kvcache
from infiniops_py.integrations.transformers._report import Kernelized
from infiniops_py.integrations.transformers._rope import forget_tables

__all__ = ["ATTENTION", "padding_mask", "swap_attention"]

ATTENTION: Final = "infiniops"  # the name registered in transformers' AttentionInterface / AttentionMaskInterface


def swap_attention(report: Kernelized, model: Any) -> None:
    """Register `ATTENTION` (the attention function and `padding_mask`) with transformers, set it as `model`'s
    attention implementation, and add to `report` the undo that sets the previous one."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, padding_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION)
    report._undo.append(lambda: model.set_attn_implementation(previous))
    report._undo.append(model.register_forward_pre_hook(forget).remove)


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
                 attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """The mask `ATTENTION` gets: transformers' flash-attention mask (the ``[B, L]`` padding mask, None when no
    token is padded), or, where it is None and the cache hands over more keys than the tokens it holds (a static
    cache: ``kv_length`` is its capacity, ``q_offset + q_length`` the tokens written), the all-true ``[B,
    q_offset + q_length]`` mask of those tokens, so that the unwritten keys are not attended to. (transformers keeps
    generate's padding mask for a static cache only for implementations named ``flash...``.) Reads `q_offset` on
    the host when it is a tensor."""
    from transformers.masking_utils import flash_attention_mask

    mask = flash_attention_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                                kv_offset=kv_offset, attention_mask=attention_mask, **kwargs)
    held = int(q_offset) + q_length
    if mask is None and kv_offset == 0 and held < kv_length:
        mask = torch.ones(batch_size, held, dtype=torch.bool, device=kwargs.get("device"))
    return mask


class _Unpadded(NamedTuple):
    """Where the valid rows of a padded batch go: query and key (batch, position) pairs, in sequence order."""

    q_batch: torch.Tensor
    q_pos: torch.Tensor
    k_batch: torch.Tensor
    k_pos: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


# One entry each: every layer of a forward shares its mask and its position ids, so the host reads them (one
# synchronization on CUDA) once per forward, not once per layer.
# A forward pre-hook of the kernelized model empties both (`forget`): a tensor rewritten in place between forwards
# (a static buffer) is read again.
_LAST_MASK: list[tuple[torch.Tensor, int, int, _Unpadded]] = []
_LAST_POSITIONS: list[tuple[torch.Tensor, int, list[int] | None]] = []


def forget(*_: Any) -> None:
    """Drop the masks and position ids read on the host so far, and the RoPE tables built (run before each forward
    of a kernelized model)."""
    _LAST_MASK.clear()
    _LAST_POSITIONS.clear()
    forget_tables()


def _cu(lengths: list[int], device: torch.device) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def _unpad(mask: torch.Tensor, sq: int, sk: int) -> _Unpadded:
    """The valid rows of a ``[B, L]`` padding mask (nonzero = a real token; ``L <= Sk``, the queries being its
    last `sq` positions). Reads the mask on the host (one synchronization per step on CUDA).

    Raises:
        ValueError: a row whose real tokens are not one contiguous run (left or right padding only).
    """
    for held, q, k, found in _LAST_MASK:
        if held is mask and (q, k) == (sq, sk):
            return found
    valid = mask.detach().to("cpu", torch.bool)
    length = valid.shape[1]
    if length > sk:
        raise ValueError(f"infiniops attention: the padding mask covers {length} positions, more than the "
                         f"{sk} keys")
    qb, qp, kb, kp, lq, lk = [], [], [], [], [], []
    for b, row in enumerate(valid):
        where = row.nonzero().flatten()
        start, stop = (int(where[0]), int(where[-1]) + 1) if len(where) else (0, 0)
        if stop - start != len(where):
            raise ValueError(f"infiniops attention: row {b} of the padding mask has holes; only left or right "
                             "padding (one run of real tokens per row) maps to varlen sequences")
        first_q = max(start, length - sq)
        n_q = max(0, stop - first_q)
        qb += [b] * n_q
        qp += range(first_q - (length - sq), stop - (length - sq))
        kb += [b] * (stop - start)
        kp += range(start, stop)
        lq.append(n_q)
        lk.append(stop - start)
    device = mask.device
    found = _Unpadded(*(torch.tensor(x, dtype=torch.long, device=device) for x in (qb, qp, kb, kp)),
                      _cu(lq, device), _cu(lk, device), max(lq, default=0), max(lk, default=0))
    _LAST_MASK[:] = [(mask, sq, sk, found)]
    return found


def _packed(position_ids: Any, b: int, sq: int) -> list[int] | None:
    """The lengths of the sequences packed in one row, as transformers reads them from `position_ids`
    (a sequence starts where the position is the row's minimum), or None when the row is one sequence. Reads
    `position_ids` on the host once per tensor (the layers of a forward share it)."""
    if b != 1 or sq < 2 or not isinstance(position_ids, torch.Tensor) or position_ids.numel() != sq:
        return None
    for held, held_sq, found in _LAST_POSITIONS:
        if held is position_ids and held_sq == sq:
            return found
    pos = position_ids.detach().reshape(-1).cpu()
    lengths: list[int] | None = None
    if not bool((pos[1:] - pos[:-1] == 1).all()):
        starts = [*(pos == pos.min()).nonzero().flatten().tolist(), sq]
        lengths = [e - s for s, e in itertools.pairwise(starts)]
    _LAST_POSITIONS[:] = [(position_ids, sq, lengths)]
    return lengths


def _longest(cu: torch.Tensor, given: Any) -> int:
    """`given` (the caller's max length), else the longest sequence of `cu` (read on the host)."""
    return int(given) if given is not None else int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over `flash_attn_varlen` / `flash_attn_with_kvcache`.

    `query` ``[B, Hq, Sq, D]``, `key`/`value` ``[B, Hkv, Sk, D]`` (the cache included), `attention_mask` None
    or the ``[B, L]`` padding mask (``AttentionMaskInterface``'s flash-attention mask). Returns
    ``([B, Sq, Hq, D], None)``; a padding query row is 0.

    Raises:
        ValueError: `dropout` > 0 (call ``model.eval()``), a mask that is not 2-D, more queries than keys.
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
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, S, H, D] views
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"infiniops attention: expected a 2-D padding mask, got shape {list(attention_mask.shape)}")
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:  # packed sequences described by the caller (padding-free batches)
        max_q, max_k = (kwargs.get(n) for n in ("max_length_q", "max_length_k"))
        out = flash_attn_varlen(q.reshape(b * sq, hq, d), k.reshape(b * sk, hkv, d), v.reshape(b * sk, hkv, d),
                                cu_q.to(torch.int32), cu_k.to(torch.int32), _longest(cu_q, max_q),
                                _longest(cu_k, max_k), **options)
        return out.view(b, sq, hq, d), None
    if attention_mask is None and sq < sk:  # decode over transformers' cache: a view, no copy
        seqlens = torch.full((b,), sk, dtype=torch.int32, device=query.device)
        return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **options), None
    if attention_mask is None:  # prefill: each row one sequence, or the sequences packed in one row
        rows = _packed(kwargs.get("position_ids"), b, sq) or [sq] * b
        cu = _cu(rows, query.device)
        if b == 1:  # [S, H, D] strided views of transformers' [1, H, S, D]: no copy
            q, k, v = q[0], k[0], v[0]
        else:
            q, k, v = q.reshape(b * sq, hq, d), k.reshape(b * sk, hkv, d), v.reshape(b * sk, hkv, d)
        out = flash_attn_varlen(q, k, v, cu, cu, max(rows), max(rows), **options)
        return out.view(b, sq, hq, d), None
    u = _unpad(attention_mask, sq, sk)
    found = flash_attn_varlen(q[u.q_batch, u.q_pos], k[u.k_batch, u.k_pos], v[u.k_batch, u.k_pos], u.cu_q, u.cu_k,
                              u.max_q, u.max_k, **options)
    out = query.new_zeros(b, sq, hq, d)
    out[u.q_batch, u.q_pos] = found
    return out, None
