"""Paged attention over a batch that mixes decode tokens and prefill sequences.

Every step first writes the new keys and values of all tokens into the paged caches with
`infiniops_py.reshape_and_cache_flash`. The batch holds the decode tokens first (one per sequence) and
then the prefill sequences, packed: decode rows attend over their whole cached history through
`flash_attn_with_kvcache` with the block table; prefill rows attend causally over their own fresh keys
through `flash_attn_varlen` (no prefix caching, so a prefill's keys are all in hand).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infiniops_py import flash_attn_varlen, flash_attn_with_kvcache, reshape_and_cache_flash

__all__ = ["Attention", "AttnContext"]


@dataclass
class AttnContext:
    """The per-step metadata attention needs (built by the model runner, passed down explicitly).

    Attributes:
        slot_mapping: int64 ``[T]``, the cache slot of each token (-1: padding, not written).
        num_decode: the first `num_decode` tokens are decode tokens, one per sequence.
        context_lens: int32 ``[num_decode]``, each decode sequence's length including its new token.
        block_tables: int32 ``[num_decode, max_blocks]`` (unused entries 0).
        cu_seqlens: int32 ``[P + 1]`` over the prefill tokens, or None without prefills.
        max_seqlen: the longest prefill.
    """

    slot_mapping: torch.Tensor
    num_decode: int = 0
    context_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0


class Attention:
    """Multi-head attention with GQA (query head h reads kv head ``h // (Hq // Hkv)``), causal, scale D**-0.5."""

    __slots__ = ("head_dim", "num_heads", "num_kv_heads", "scale")

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim**-0.5

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
        ctx: AttnContext,
    ) -> torch.Tensor:
        """q ``[T, Hq, D]``, k/v ``[T, Hkv, D]``, caches ``[num_blocks, block_size, Hkv, D]`` -> ``[T, Hq * D]``."""
        reshape_and_cache_flash(k, v, k_cache, v_cache, ctx.slot_mapping)
        nd = ctx.num_decode
        parts = []
        if nd:
            out = flash_attn_with_kvcache(
                q[:nd].unsqueeze(1), k_cache, v_cache, cache_seqlens=ctx.context_lens,
                block_table=ctx.block_tables, softmax_scale=self.scale, causal=True,
            )
            parts.append(out.squeeze(1))
        if ctx.cu_seqlens is not None:
            parts.append(flash_attn_varlen(
                q[nd:], k[nd:], v[nd:], ctx.cu_seqlens, ctx.cu_seqlens, ctx.max_seqlen, ctx.max_seqlen,
                softmax_scale=self.scale, causal=True,
            ))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.reshape(out.shape[0], self.num_heads * self.head_dim)
