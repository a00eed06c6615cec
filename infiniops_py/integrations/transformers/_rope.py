"""RoPE through `rotary_embedding` in transformers' attention layers (`rope_forward`).

The attention forward of Llama, Qwen2, Qwen3, Mistral, GLM-4 and Gemma 2 (``LlamaAttention.forward`` and its
copies: q/k/v projections, Qwen3's per-head ``q_norm``/``k_norm``, ``apply_rotary_pos_emb``, the cache update,
the attention interface, ``o_proj``) with ``apply_rotary_pos_emb`` replaced by one in-place `rotary_embedding`
call on the ``[T, H, D]`` views of the q/k projections: GPT-NeoX pairs ``(i, i + D/2)`` over the whole head
(``q * cos + rotate_half(q) * sin``), or GLM-4's GPT-J pairs ``(2i, 2i + 1)`` over the first ``rotary_dim``
channels (``cos.shape[-1]``, its ``partial_rotary_factor``). Its ``cos_sin_cache`` holds the model's own
``(cos, sin)`` of the forward (the rotary module's ``cat((freqs, freqs))``, so each row's first half is the
pair's value), one row per token, built once per forward for all layers, and ``positions`` index those rows:
the values are transformers' for every RoPE type (default, linear, dynamic, llama3, yarn, ...), scaling
included. The rotation is computed in fp32 and rounded once, where transformers rounds ``q * cos``,
``rotate_half(q) * sin`` and their sum in the dtype: in float32 the two round alike; in float16/bfloat16 they
differ by those roundings (within `rotary_embedding`'s tolerance).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Final

import torch

from infiniops_py import rotary_embedding
from infiniops_py.integrations.transformers._memo import PerForward

__all__ = ["rope_forward"]

_TABLE: Final = PerForward()  # (cos, sin, batch) -> (positions, cos_sin_cache)


def _table(cos: torch.Tensor, sin: torch.Tensor, batch: int, seq: int, head_dim: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 positions ``[batch * seq]`` and the ``[rows * seq, rotary_dim]`` cos_sin_cache of transformers'
    `cos`/`sin` ``[rows, seq, rotary_dim]`` (rows 1, broadcast over the batch, or `batch`; rotary_dim even,
    at most `head_dim`).

    Raises:
        ValueError: `cos`/`sin` of another shape.
    """
    def make() -> tuple[torch.Tensor, torch.Tensor]:
        rot = cos.shape[-1]
        if (cos.shape != sin.shape or cos.dim() != 3 or cos.shape[0] not in (1, batch) or cos.shape[1] != seq
                or rot % 2 or rot > head_dim):
            raise ValueError(f"kernelize's RoPE: expected cos and sin of shape [{batch} or 1, {seq}, rotary_dim <= "
                             f"{head_dim}] (batch, tokens, an even rotary_dim), got {list(cos.shape)} and "
                             f"{list(sin.shape)}")
        half, rows = rot // 2, cos.shape[0]
        cache = torch.cat((cos[..., :half], sin[..., :half]), dim=-1).view(rows * seq, rot)
        positions = torch.arange(rows * seq, dtype=torch.int64, device=cos.device).view(rows, seq)
        return positions.expand(batch, seq).reshape(batch * seq), cache

    return _TABLE.get((cos, sin, batch), make)


def _forward(self: torch.nn.Module, hidden_states: torch.Tensor,
             position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
             attention_mask: torch.Tensor | None = None, cache: Any = None, *, qk_norm: bool, is_neox: bool,
             extra: dict[str, Any], interfaces: Any, eager: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """``LlamaAttention.forward`` with RoPE by `rotary_embedding`. `qk_norm`: Qwen3's per-head norms of q and
    k; `is_neox`: rotate-half pairs (else GLM-4's interleaved ones); `extra`: the keywords the layer's own
    forward hands its attention function (``sliding_window``, ``softcap``); `interfaces` and `eager` are the
    modeling module's ``ALL_ATTENTION_FUNCTIONS`` and ``eager_attention_forward``."""
    if "past_key_values" in kwargs:  # the name transformers' forward still takes, deprecated for `cache`
        legacy = kwargs.pop("past_key_values")
        cache = legacy if cache is None else cache
    if position_embeddings is None:
        raise ValueError(f"{type(self).__name__}: position_embeddings (cos, sin) is required")
    input_shape = hidden_states.shape[:-1]
    d = self.head_dim
    q = self.q_proj(hidden_states).view(*input_shape, -1, d)
    k = self.k_proj(hidden_states).view(*input_shape, -1, d)
    v = self.v_proj(hidden_states).view(*input_shape, -1, d).transpose(1, 2)
    if qk_norm:
        q, k = self.q_norm(q), self.k_norm(k)
    batch, seq = input_shape
    positions, table = _table(*position_embeddings, batch, seq, d)
    q3, k3 = q.reshape(batch * seq, -1, d), k.reshape(batch * seq, -1, d)
    rotary_embedding(positions, q3, k3, d, table, is_neox)  # in place
    q, k = q3.view(*input_shape, -1, d).transpose(1, 2), k3.view(*input_shape, -1, d).transpose(1, 2)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    interface = interfaces.get_interface(self.config._attn_implementation, eager)
    out, weights = interface(self, q, k, v, attention_mask, dropout=0.0 if not self.training else
                             self.attention_dropout, scaling=self.scaling, **extra, **kwargs)
    return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


def rope_forward(module: torch.nn.Module, cls: type, *, is_neox: bool, extra: dict[str, Any]
                 ) -> functools.partial[tuple[torch.Tensor, Any]]:
    """The forward that `kernelize` gives `module`, an attention module of transformers' class `cls`: `extra`
    the keywords its forward passes its attention function, bound once (the same for every call)."""
    modeling = sys.modules[cls.__module__]
    return functools.partial(_forward, qk_norm=hasattr(module, "q_norm") and hasattr(module, "k_norm"),
                             is_neox=is_neox, extra=extra, interfaces=modeling.ALL_ATTENTION_FUNCTIONS,
                             eager=modeling.eager_attention_forward)
