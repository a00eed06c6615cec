"""RoPE through `rotary_embedding` in transformers' attention layer (`rope_attention`, checked by `rope_unsupported`).

The attention forward of Llama, Qwen2 and Qwen3 with ``apply_rotary_pos_emb`` (``q * cos + rotate_half(q) *
sin``: GPT-NeoX pairs ``(i, i + D/2)`` over the whole head) replaced by one in-place `rotary_embedding` call on
the ``[T, H, D]`` views of the q/k projections. Its ``cos_sin_cache`` holds the model's own ``(cos, sin)`` of
the forward (the rotary module's ``cat((freqs, freqs))``, so each row's first half is the pair's value), one
row per token, and ``positions`` index those rows: the values are transformers' for every RoPE type (default,
linear, dynamic, llama3, yarn, ...), scaling included. The rotation is computed in fp32 and rounded once, where
transformers rounds ``q * cos``, ``rotate_half(q) * sin`` and their sum in the dtype: in float32 the two round
alike; in float16/bfloat16 they differ by those roundings (within `rotary_embedding`'s tolerance).
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
from typing import Any, Final

import torch

from infiniops_py import rotary_embedding
from infiniops_py.integrations.transformers._source import code_of

__all__ = ["forget_tables", "rope_attention", "rope_unsupported"]

# The table of the last (cos, sin) seen: every layer of a forward shares it. Emptied before each forward of a
# kernelized model (`forget_tables`, from the attention's pre-hook), so a (cos, sin) rewritten in place is read
# again.
_LAST_TABLE: list[tuple[torch.Tensor, torch.Tensor, int, tuple[torch.Tensor, torch.Tensor]]] = []


def forget_tables() -> None:
    """Drop the ``(positions, cos_sin_cache)`` built so far (run before each forward of a kernelized model)."""
    _LAST_TABLE.clear()


def _table(cos: torch.Tensor, sin: torch.Tensor, batch: int, seq: int, head_dim: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 positions ``[batch * seq]`` and the ``[rows * seq, head_dim]`` cos_sin_cache of transformers'
    `cos`/`sin` ``[rows, seq, head_dim]`` (rows 1, broadcast over the batch, or `batch`).

    Raises:
        ValueError: `cos`/`sin` of another shape (a RoPE over fewer channels than the head, say).
    """
    for held_cos, held_sin, held_batch, found in _LAST_TABLE:
        if held_cos is cos and held_sin is sin and held_batch == batch:
            return found
    if cos.shape != sin.shape or cos.dim() != 3 or cos.shape[0] not in (1, batch) or cos.shape[1:] != (seq, head_dim):
        raise ValueError(f"kernelize's RoPE: expected cos and sin of shape [{batch} or 1, {seq}, {head_dim}] "
                         f"(batch, tokens, head_dim), got {list(cos.shape)} and {list(sin.shape)}")
    half, rows = head_dim // 2, cos.shape[0]
    cache = torch.cat((cos[..., :half], sin[..., :half]), dim=-1).view(rows * seq, head_dim)
    positions = torch.arange(rows * seq, dtype=torch.int64, device=cos.device).view(rows, seq).expand(batch, seq)
    found = (positions.reshape(batch * seq), cache)
    _LAST_TABLE[:] = [(cos, sin, batch, found)]
    return found


def _forward(self: torch.nn.Module, hidden_states: torch.Tensor,
             position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
             attention_mask: torch.Tensor | None = None, cache: Any = None, *, qk_norm: bool, sliding: bool,
             interfaces: Any, eager: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """``LlamaAttention.forward`` (`qk_norm`: Qwen3's per-head norms of q and k; `sliding`: Qwen2's and Qwen3's
    ``sliding_window`` argument) with RoPE by `rotary_embedding`. `interfaces` and `eager` are the modeling
    module's ``ALL_ATTENTION_FUNCTIONS`` and ``eager_attention_forward``."""
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
    rotary_embedding(positions, q3, k3, d, table, True)  # in place
    q, k = q3.view(*input_shape, -1, d).transpose(1, 2), k3.view(*input_shape, -1, d).transpose(1, 2)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx, kwargs=kwargs)
    interface = interfaces.get_interface(self.config._attn_implementation, eager)
    extra = {"sliding_window": self.sliding_window} if sliding else {}
    out, weights = interface(self, q, k, v, attention_mask, dropout=0.0 if not self.training else
                             self.attention_dropout, scaling=self.scaling, **extra, **kwargs)
    return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


@functools.cache
def rope_attention(cls: type) -> functools.partial[tuple[torch.Tensor, Any]]:
    """The forward that `swap_forward` gives an attention module of `cls` (a class `rope_unsupported` passed)."""
    code = code_of(cls.forward)
    modeling = sys.modules[cls.__module__]
    return functools.partial(_forward, qk_norm="self.q_norm(" in code, sliding="sliding_window=" in code,
                             interfaces=modeling.ALL_ATTENTION_FUNCTIONS, eager=modeling.eager_attention_forward)


# LlamaAttention.forward's body (transformers 5), whitespace and comments removed; Qwen3 wraps the q and k views in
# q_norm / k_norm, Qwen2 and Qwen3 pass sliding_window
_BODY: Final = (
    "input_shape=hidden_states.shape[:-1]hidden_shape=(*input_shape,-1,self.head_dim)"
    "query_states=self.q_proj(hidden_states).view(hidden_shape).transpose(1,2)"
    "key_states=self.k_proj(hidden_states).view(hidden_shape).transpose(1,2)"
    "value_states=self.v_proj(hidden_states).view(hidden_shape).transpose(1,2)"
    "cos,sin=position_embeddingsquery_states,key_states=apply_rotary_pos_emb(query_states,key_states,cos,sin)"
    "ifcacheisnotNone:key_states,value_states=cache.update(key_states,value_states,self.layer_idx,kwargs=kwargs)"
    "attention_interface:Callable=ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,"
    "eager_attention_forward)attn_output,attn_weights=attention_interface(self,query_states,key_states,value_states,"
    "attention_mask,dropout=0.0ifnotself.trainingelseself.attention_dropout,scaling=self.scaling,**kwargs,)"
    "attn_output=attn_output.reshape(*input_shape,-1).contiguous()attn_output=self.o_proj(attn_output)"
    "returnattn_output,attn_weights"
)
_QK_NORM: Final = (("self.q_proj(hidden_states).view(hidden_shape).transpose", "self.q_norm(self.q_proj("
                    "hidden_states).view(hidden_shape)).transpose"),
                   ("self.k_proj(hidden_states).view(hidden_shape).transpose", "self.k_norm(self.k_proj("
                    "hidden_states).view(hidden_shape)).transpose"))
_SLIDING: Final = ("scaling=self.scaling,", "scaling=self.scaling,sliding_window=self.sliding_window,")
_BODIES: Final = tuple(functools.reduce(lambda body, swap: body.replace(*swap), swaps, _BODY)
                       for swaps in ((), (_SLIDING,), (*_QK_NORM, _SLIDING)))
_DECORATOR: Final = re.compile(r'(@deprecate_kwarg\("past_key_values","[\d.]+",new_name="cache"\))?')
_PARAMETERS: Final = ("self", "hidden_states", "position_embeddings", "attention_mask", "cache", "kwargs")
_APPLY: Final = ("cos=cos.unsqueeze(unsqueeze_dim)sin=sin.unsqueeze(unsqueeze_dim)q_embed=(q*cos)+(rotate_half(q)*"
                 "sin)k_embed=(k*cos)+(rotate_half(k)*sin)returnq_embed,k_embed")
_ROTATE_HALF: Final = "x1=x[...,:x.shape[-1]//2]x2=x[...,x.shape[-1]//2:]returntorch.cat((-x2,x1),dim=-1)"
_CAT_FREQS: Final = "emb=torch.cat((freqs,freqs),dim=-1)"


@functools.cache
def rope_unsupported(cls: type, rotary: frozenset[type]) -> str:
    """Why the RoPE of attention class `cls` cannot run through `rotary_embedding` ('' when it can): its forward
    is not ``LlamaAttention.forward`` (or Qwen2's, Qwen3's) statement for statement, its modeling module's
    ``apply_rotary_pos_emb`` / ``rotate_half`` are not the rotate-half rotation, or the model's rotary module
    classes `rotary` (none, or one that does not duplicate its frequencies, ``cat((freqs, freqs))``)."""
    code = code_of(cls.forward)
    head, _, body = code.partition("defforward(")
    try:
        parameters = tuple(inspect.signature(cls.forward).parameters)
    except (TypeError, ValueError):
        parameters = ()
    if (parameters != _PARAMETERS or not _DECORATOR.fullmatch(head)
            or body.partition(")->")[2].partition(":")[2] not in _BODIES):
        return f"{cls.__name__}.forward is not the attention forward whose RoPE kernelize replaces"
    modeling = sys.modules.get(cls.__module__)
    apply, rotate = (getattr(modeling, n, None) for n in ("apply_rotary_pos_emb", "rotate_half"))
    if not code_of(apply).endswith(_APPLY) or not code_of(rotate).endswith(_ROTATE_HALF):
        return f"{cls.__module__}.apply_rotary_pos_emb is not q * cos + rotate_half(q) * sin over the whole head"
    if not rotary or not all(_CAT_FREQS in code_of(c.forward) for c in rotary):
        return "the model's rotary module does not compute cos/sin as cat((freqs, freqs)), the pairs (i, i + D/2)"
    return ""
