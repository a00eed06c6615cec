"""The whole pre-norm decoder layer in one forward (`layer_forward`): Llama's, Qwen2's, Qwen3's, Mistral's.

transformers' eager decode step is bound by host time, much of it spent in module calls (a Qwen3 layer calls
thirteen modules: norms, projections, the attention and the MLP) and in the operations between them. Where
`kernelize` swaps every part of a layer (its two norms, Qwen3's q/k norms, the RoPE, the gated MLP), the layer's
forward becomes one function over the layer's parameters, with as few calls as the layer allows:

1. a copy of the input (the residual; the caller may still hold the input), `rms_norm` of it;
2. one q|k|v projection (``F.linear`` over the three weights packed once at kernelize time, `pack_rows`);
3. RoPE in place on the packed projection: with Qwen3's q/k norms one `fused_qk_norm_rope`, else one
   `rotary_embedding` of the q and k column blocks; the positions and ``cos_sin_cache`` are made once per forward
   for every layer (`_rope._table`);
4. the cache update and the attention function of the model's attention implementation, as transformers'
   attention forward calls them (the same arguments), then ``o_proj``;
5. `fused_add_rms_norm` of the attention output into the residual (``post_attention_layernorm``);
6. the gate|up projection (packed once), `silu_and_mul`, ``down_proj``, added in place to the residual.

The projections and the submodules' forwards are not called as modules: their hooks do not run (the layer's own
hooks do; transformers records hidden states there). The attention weights that transformers' output capture
records on the attention module are None under SDPA, flash attention and the ``"infiniops"`` implementation; under
transformers' eager attention, which returns them, the layer runs its parts' swaps (`fused_layer_forward`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from infiniops_py import fused_add_rms_norm, fused_qk_norm_rope, rotary_embedding, silu_and_mul
from infiniops_py.integrations.transformers._memo import PerForward
from infiniops_py.integrations.transformers._rope import _table
from infiniops_py.integrations.transformers._swaps import (
    _layer_arguments,
    fused_layer_forward,
    packed_rows,
    rms_norm_forward,
)

__all__ = ["QKV", "layer_forward"]

QKV = ("q_proj", "k_proj", "v_proj")
_GATE_UP = ("gate_proj", "up_proj")
_INTERFACE = PerForward()  # the model's attention function, looked up once per forward (its config is slow to read)


def _linears(module: torch.nn.Module, names: tuple[str, ...], x: torch.Tensor) -> torch.Tensor:
    """`x` through `module`'s linears `names`, their outputs side by side: one ``F.linear`` over the packed
    weights, or (weights no longer packed: a ``model.to(...)`` or a parameter replaced since) one per linear."""
    packed = packed_rows(module, names)
    if packed is not None:
        return F.linear(x, *packed)
    return torch.cat([F.linear(x, m.weight, m.bias) for m in (getattr(module, n) for n in names)], dim=-1)


def layer_forward(self: torch.nn.Module, *args: Any, qk_norm: bool, is_neox: bool, extra: dict[str, Any],
                  interfaces: Any, eager: Any, **kwargs: Any) -> torch.Tensor:
    """The pre-norm decoder layer `self` (``hidden_states`` ``[B, S, H]`` and transformers' keywords, as its
    forward takes them) in one function: the steps of the module docstring. `qk_norm`: Qwen3's per-head norms
    (one `fused_qk_norm_rope`); `is_neox`: rotate-half pairs; `extra`, `interfaces`, `eager`: as `rope_forward`
    binds them (the keywords the attention forward adds, the modeling module's attention functions and its eager
    attention). Returns the layer's output ``[B, S, H]``.

    Raises:
        ValueError: no ``position_embeddings`` (transformers' model forward always passes them).
    """
    modules = self._modules  # the submodules and parameters read from their dicts, not through __getattr__
    attn, mlp = modules["self_attn"], modules["mlp"]
    config = attn.config
    interface = _INTERFACE.get((id(config),), lambda: interfaces.get_interface(config._attn_implementation, eager))
    if interface is eager:  # it returns the attention weights, which transformers records on the attention module
        return fused_layer_forward(self, *args, **kwargs)
    hidden_states, named = _layer_arguments(self, args, kwargs)
    position_embeddings = named.pop("position_embeddings", None)
    attention_mask = named.pop("attention_mask", None)
    cache = named.pop("cache", None)
    legacy = named.pop("past_key_values", None)  # the name transformers' forward still takes, deprecated
    cache = legacy if cache is None else cache
    if position_embeddings is None:
        raise ValueError(f"{type(self).__name__}: position_embeddings (cos, sin) is required")
    b, s = hidden_states.shape[:2]
    d = attn.head_dim
    residual = hidden_states.clone(memory_format=torch.contiguous_format)
    qkv = _linears(attn, QKV, rms_norm_forward(modules["input_layernorm"], hidden_states))
    projs = attn._modules
    widths = [projs[n]._parameters["weight"].shape[0] for n in QKV]
    positions, table = _table(*position_embeddings, b, s, d)
    if qk_norm:
        q_norm, k_norm = projs["q_norm"], projs["k_norm"]
        fused_qk_norm_rope(qkv.view(b * s, -1), q_norm._parameters["weight"], k_norm._parameters["weight"], table,
                           positions, num_q_heads=widths[0] // d, num_kv_heads=widths[1] // d, head_dim=d,
                           eps=q_norm.variance_epsilon, is_neox=is_neox)
        q, k, v = qkv.split(widths, dim=-1)
    else:
        q, k, v = qkv.split(widths, dim=-1)
        rotary_embedding(positions, q.view(b * s, -1), k.view(b * s, -1), d, table, is_neox)
    q, k, v = (t.view(b, s, -1, d).transpose(1, 2) for t in (q, k, v))
    if cache is not None:
        k, v = cache.update(k, v, attn.layer_idx, kwargs=named)
    out, _ = interface(attn, q, k, v, attention_mask, dropout=0.0 if not attn.training else attn.attention_dropout,
                       scaling=attn.scaling, **extra, **named)
    o_proj = projs["o_proj"]._parameters
    x = F.linear(out.reshape(b, s, -1), o_proj["weight"], o_proj["bias"])
    post = modules["post_attention_layernorm"]
    fused_add_rms_norm(x, residual, post._parameters["weight"], post.variance_epsilon)  # residual += x; x = norm
    down = mlp._modules["down_proj"]._parameters
    return residual.add_(F.linear(silu_and_mul(_linears(mlp, _GATE_UP, x)), down["weight"], down["bias"]))
