"""Gemma 2 (HF ``Gemma2ForCausalLM``): sandwich norms scaled by ``1 + weight``, attention logit softcapping,
sliding-window layers alternating with full ones, and a final logit softcap.

As transformers' ``modeling_gemma2``:
  - the embedding is scaled by ``sqrt(hidden_size)`` (the factor cast to the model dtype first);
  - every RMSNorm multiplies by ``1 + weight`` (the checkpoint stores the offset from 1); four per layer:
    ``h = x + post_attention_layernorm(attn(input_layernorm(x)))``, then
    ``h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))``;
  - attention scales scores by ``query_pre_attn_scalar**-0.5``, softcaps them to
    ``attn_logit_softcapping * tanh(s / attn_logit_softcapping)`` (flash-attention's ``softcap``), and a layer
    whose ``layer_types`` entry is ``sliding_attention`` sees only the last ``sliding_window`` keys;
  - the MLP is ``down(gelu_tanh(gate) * up)``;
  - the logits are softcapped to ``final_logit_softcapping * tanh(logits / final_logit_softcapping)``.
transformers computes each norm in float32 and casts after the ``1 + weight`` product; here the normalized
value is cast to the model dtype before it (the `rms_norm` contract), which differs in low-precision rounding
only (bit-equal in float32).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Final, cast

import torch
import torch.nn.functional as F

from infinilm.config import ConfigError, ModelConfig
from infinilm.layers.attention import Attention
from infinilm.layers.derived import Derived
from infinilm.layers.norm import RMSNorm
from infinilm.models.decoder import DecoderModel, SandwichLayer
from infinilm.models.decoder_config import decoder_config, decoder_limits
from infinilm.models.family import GatePlan, ModelFamily
from infiniops_py import fused_add_rms_norm, rms_norm

__all__ = ["GEMMA2", "Gemma2Config", "Gemma2Layer", "Gemma2Model", "OffsetRMSNorm"]

_BASE: Final = decoder_limits(("tie_word_embeddings", "attention_bias", "use_bidirectional_attention"),
                              ints=("sliding_window",), choices=(("hidden_activation", ("gelu_pytorch_tanh",)),))
_LIMITS: Final = dataclasses.replace(_BASE, positive_floats=(
    *_BASE.positive_floats, "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"))
_LAYER_TYPES: Final = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class Gemma2Config(ModelConfig):
    """A Gemma 2 `ModelConfig`: transformers' fields of the same names (a softcap of None: none)."""

    query_pre_attn_scalar: float = 1.0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()

    def window(self, index: int) -> int | None:
        """The sliding window of layer `index`, None for a full-attention layer."""
        return self.sliding_window if self.layer_types[index] == "sliding_attention" else None


def _translate(hf: Any) -> ModelConfig:
    """A `Gemma2Config` (see `decoder_config` for the shared checks).

    Raises:
        ConfigError: besides `decoder_config`'s: no ``query_pre_attn_scalar``, ``use_bidirectional_attention``
            (the engine's attention is causal), or ``layer_types`` that is not one of sliding_attention or
            full_attention per layer.
    """
    bias = bool(getattr(hf, "attention_bias", False))
    config = decoder_config(
        hf, _LIMITS, qkv_bias=bias, o_bias=bias, mlp_bias=False, qk_norm=False, config_class=Gemma2Config,
        **{k: getattr(hf, k, None) for k in ("query_pre_attn_scalar", "attn_logit_softcapping",
                                             "final_logit_softcapping", "sliding_window")})
    if cast(Gemma2Config, config).query_pre_attn_scalar is None:
        raise ConfigError("gemma2: query_pre_attn_scalar is missing (the attention scale is its inverse square root)")
    if getattr(hf, "use_bidirectional_attention", None):
        raise ConfigError("gemma2: use_bidirectional_attention=True is not supported (the engine's attention is "
                          "causal; fix: set it to false)")
    types = getattr(hf, "layer_types", None)
    if types is None:  # transformers' default: even layers slide
        types = [_LAYER_TYPES[i % 2] for i in range(config.num_layers)]
    if not isinstance(types, list | tuple) or len(types) != config.num_layers or not set(types) <= set(_LAYER_TYPES):
        raise ConfigError(f"gemma2: layer_types={types!r} must name one of {', '.join(_LAYER_TYPES)} for each of the "
                          f"num_hidden_layers={config.num_layers} layers")
    return dataclasses.replace(cast(Gemma2Config, config), layer_types=tuple(types))


class OffsetRMSNorm(RMSNorm):
    """RMSNorm scaled by ``1 + weight``: `weight` holds the checkpoint's offset from 1."""

    __slots__ = ("scale",)

    def __init__(self, hidden_size: int, eps: float, *, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__(hidden_size, eps, dtype=dtype, device=device)
        self.scale = Derived(self.weight, lambda w: w + 1.0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.scale.get(), self.eps)

    def add_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """In place: ``residual <- x + residual``, ``x <- rms_norm(residual) * (1 + weight)``."""
        return fused_add_rms_norm(x, residual, self.scale.get(), self.eps)


class Gemma2Layer(SandwichLayer):
    """`SandwichLayer` of `OffsetRMSNorm`s under Gemma 2's names, with a GELU (tanh) MLP."""

    __slots__ = ()
    norm_class = OffsetRMSNorm
    NORM_NAMES = (("input_layernorm", "input_layernorm"), ("attn_out_norm", "post_attention_layernorm"),
                  ("post_attention_layernorm", "pre_feedforward_layernorm"),
                  ("mlp_out_norm", "post_feedforward_layernorm"))

    def mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        """``down(gelu_tanh(gate) * up)``."""
        gate, up = self.gate_up_proj(hidden).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class Gemma2Model(DecoderModel):
    """`DecoderModel` of `Gemma2Layer`s: scaled embeddings, per-layer windows and softcaps, capped logits."""

    layer_class = Gemma2Layer

    def __init__(self, config: ModelConfig, plan: GatePlan, *, dtype: torch.dtype, device: torch.device,
                 max_len: int) -> None:
        super().__init__(config, plan, dtype=dtype, device=device, max_len=max_len)
        self.normalizer = torch.tensor(config.hidden_size**0.5, dtype=torch.float32, device=device).to(dtype)
        self.final_softcap = cast(Gemma2Config, config).final_logit_softcapping

    def attention(self, config: ModelConfig, index: int) -> Attention:
        """Scale ``query_pre_attn_scalar**-0.5``, the scores softcapped, the layer's window."""
        c = cast(Gemma2Config, config)
        return Attention(c.num_heads, c.num_kv_heads, c.head_dim, scale=c.query_pre_attn_scalar**-0.5,
                         sliding_window=c.window(index), softcap=c.attn_logit_softcapping or 0.0)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings times ``sqrt(hidden_size)``."""
        return self.embed(input_ids) * self.normalizer

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's logits ``[B, V]``, softcapped by ``final_logit_softcapping``."""
        logits = self.lm_head(hidden)
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


GEMMA2: Final = ModelFamily("gemma2", _LIMITS, _translate, Gemma2Model)
