"""Paged attention over a batch that mixes decode tokens and prefill sequences.

The batch holds the decode tokens first (one per sequence) and then the prefill sequences, packed. Decode
rows attend over their whole cached history through `flash_attn_with_kvcache` with the block table, which
also appends their new keys and values at ``cache_seqlens[b]`` (flash-attention's ``k``/``v`` arguments: a
provider can write them in the attention kernel itself, with no launch of its own); the prefill tokens'
keys and values are written with `infiniops_py.reshape_and_cache_flash`, and prefill rows attend causally
over their own fresh keys through `flash_attn_varlen` (no prefix caching, so a prefill's keys are all in
hand). Without `AttnContext.cache_seqlens` every token is written with the cache write first.

A sliding window (Mistral, Gemma 2) is Hugging Face's: a query sees itself and the ``sliding_window - 1``
keys before it (``kv_idx > q_idx - sliding_window`` in transformers' masks), which is flash-attention's
``window_size=(sliding_window - 1, 0)`` under the causal mask. Logit softcapping is flash-attention's
``softcap``: ``s = softcap * tanh(s / softcap)`` on the scaled scores, before the mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from infiniops_py import flash_attn_varlen, flash_attn_with_kvcache, reshape_and_cache_flash

__all__ = ["Attention", "AttnContext", "PagedKV"]


class PagedKV(Protocol):
    """Per-layer paged caches ``[num_blocks, block_size, Hkv, D]`` (`infinilm.engine.kv_cache.KVCache`)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass
class AttnContext:
    """The per-step metadata attention needs (built by the model runner, passed down explicitly).

    Attributes:
        slot_mapping: int64 ``[T]``, the cache slot of each token (-1: padding, not written).
        num_decode: the first `num_decode` tokens are decode tokens, one per sequence.
        context_lens: int32 ``[num_decode]``, each decode sequence's length including its new token.
        cache_seqlens: int32 ``[num_decode]``, the tokens each decode sequence has in the cache before its new
            one (``context_lens - 1``; -1 for a padding row: nothing written, no key seen); when set, the
            attention appends the decode tokens' keys and values.
        block_tables: int32 ``[num_decode, max_blocks]`` (unused entries 0).
        cu_seqlens: int32 ``[P + 1]`` over the prefill tokens, or None without prefills.
        max_seqlen: the longest prefill.
    """

    slot_mapping: torch.Tensor
    num_decode: int = 0
    context_lens: torch.Tensor | None = None
    cache_seqlens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0


class Attention:
    """Causal multi-head attention with GQA (query head h reads kv head ``h // (Hq // Hkv)``).

    Attributes:
        scale: the softmax scale, ``head_dim**-0.5`` unless given.
        window: flash-attention's ``window_size``: ``(sliding_window - 1, 0)``, or ``(-1, -1)`` (unbounded).
        softcap: the logit softcap, 0.0 for none.
    """

    __slots__ = ("head_dim", "num_heads", "num_kv_heads", "scale", "softcap", "window")

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, *, scale: float | None = None,
                 sliding_window: int | None = None, softcap: float = 0.0) -> None:
        """`sliding_window`: keys a query sees, itself included (None: all); `softcap`: 0.0 for none.

        Raises:
            ValueError: a `sliding_window` below 1 or a negative `softcap`.
        """
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window={sliding_window} must be >= 1 (or None: no window)")
        if not softcap >= 0:
            raise ValueError(f"softcap={softcap} must be >= 0 (0: none)")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
        self.softcap = softcap

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        ctx: AttnContext,
    ) -> torch.Tensor:
        """q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``, caches ``[num_blocks, block_size, Hkv, D]`` -> ``[T, Hq * D]``."""
        nd = ctx.num_decode
        append = nd > 0 and ctx.cache_seqlens is not None
        if not append:
            reshape_and_cache_flash(k, v, k_cache, v_cache, ctx.slot_mapping)
        elif ctx.cu_seqlens is not None:  # the prefill tokens' keys; the decode tokens' go with their attention
            reshape_and_cache_flash(k[nd:], v[nd:], k_cache, v_cache, ctx.slot_mapping[nd:])
        parts = []
        if nd:
            new_k, new_v = (k[:nd].unsqueeze(1), v[:nd].unsqueeze(1)) if append else (None, None)
            out = flash_attn_with_kvcache(
                q[:nd].unsqueeze(1), k_cache, v_cache, new_k, new_v,
                cache_seqlens=ctx.cache_seqlens if append else ctx.context_lens,
                block_table=ctx.block_tables, softmax_scale=self.scale, causal=True, window_size=self.window,
                softcap=self.softcap,
            )
            parts.append(out.squeeze(1))
        if ctx.cu_seqlens is not None:
            parts.append(flash_attn_varlen(
                q[nd:], k[nd:], v[nd:], ctx.cu_seqlens, ctx.cu_seqlens, ctx.max_seqlen, ctx.max_seqlen,
                softmax_scale=self.scale, causal=True, window_size=self.window, softcap=self.softcap,
            ))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.reshape(out.shape[0], self.num_heads * self.head_dim)
