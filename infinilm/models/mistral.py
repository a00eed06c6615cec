"""Mistral (HF ``MistralForCausalLM``): the Llama decoder, without biases, attending over a sliding window.

With ``sliding_window`` set, a query sees itself and the ``sliding_window - 1`` tokens before it, in prefill
and in decode (transformers' ``create_sliding_window_causal_mask``); attention passes it to flash-attention
as ``window_size=(sliding_window - 1, 0)``. The KV cache still keeps every token of a sequence (keys outside
the window are not read). ``sliding_window: null`` attends over every key, as Llama does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

from infinilm.config import ModelConfig
from infinilm.layers.attention import Attention
from infinilm.models.decoder import DecoderModel
from infinilm.models.decoder_config import decoder_config, decoder_limits
from infinilm.models.family import ModelFamily

__all__ = ["MISTRAL", "MistralConfig", "MistralModel"]

_LIMITS: Final = decoder_limits(("tie_word_embeddings",), ints=("sliding_window",))


@dataclass(frozen=True)
class MistralConfig(ModelConfig):
    """A Mistral `ModelConfig`; `sliding_window`: tokens a query sees, itself included (None: all)."""

    sliding_window: int | None = None


def _translate(hf: Any) -> ModelConfig:
    """A `MistralConfig` (see `decoder_config` for what is checked; ``sliding_window`` a positive integer)."""
    return decoder_config(hf, _LIMITS, qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False,
                          config_class=MistralConfig, sliding_window=getattr(hf, "sliding_window", None))


class MistralModel(DecoderModel):
    """`DecoderModel` whose every layer attends over the config's sliding window."""

    def attention(self, config: ModelConfig, index: int) -> Attention:
        """Causal attention over the last ``sliding_window`` keys."""
        return Attention(config.num_heads, config.num_kv_heads, config.head_dim,
                         sliding_window=cast(MistralConfig, config).sliding_window)


MISTRAL: Final = ModelFamily("mistral", _LIMITS, _translate, MistralModel)
