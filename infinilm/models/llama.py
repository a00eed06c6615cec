"""Llama, Qwen2 and Qwen3 (HF ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``): one model,
`DecoderModel`, three families that differ as data.

Llama: optional attention biases (``attention_bias``: q, k, v and o) and MLP biases (``mlp_bias``).
Qwen2: a bias on q, k and v only, ``head_dim = hidden_size / num_attention_heads``. Qwen3: per-head q/k
RMSNorms before RoPE, its own ``head_dim``, optional attention biases.
"""

from __future__ import annotations

from typing import Any, Final

from infinilm.config import ModelConfig
from infinilm.models.decoder import DecoderModel
from infinilm.models.decoder_config import decoder_config, decoder_limits
from infinilm.models.family import ModelFamily

__all__ = ["LLAMA", "QWEN2", "QWEN3"]

_LLAMA_LIMITS: Final = decoder_limits(("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window"))
_QWEN2_LIMITS: Final = decoder_limits(("tie_word_embeddings", "use_sliding_window"))
_QWEN3_LIMITS: Final = decoder_limits(("tie_word_embeddings", "attention_bias", "use_sliding_window"))


def _llama(hf: Any) -> ModelConfig:
    """A Llama `ModelConfig` (see `decoder_config` for what is checked and raised)."""
    bias = bool(getattr(hf, "attention_bias", False))
    return decoder_config(hf, _LLAMA_LIMITS, qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(hf, "mlp_bias", False)),
                          qk_norm=False)


def _qwen2(hf: Any) -> ModelConfig:
    """A Qwen2 `ModelConfig`: q, k and v carry a bias, o and the MLP none."""
    return decoder_config(hf, _QWEN2_LIMITS, qkv_bias=True, o_bias=False, mlp_bias=False, qk_norm=False)


def _qwen3(hf: Any) -> ModelConfig:
    """A Qwen3 `ModelConfig`: per-head q/k norms; ``attention_bias`` on q, k, v and o."""
    bias = bool(getattr(hf, "attention_bias", False))
    return decoder_config(hf, _QWEN3_LIMITS, qkv_bias=bias, o_bias=bias, mlp_bias=False, qk_norm=True)


LLAMA: Final = ModelFamily("llama", _LLAMA_LIMITS, _llama, DecoderModel)
QWEN2: Final = ModelFamily("qwen2", _QWEN2_LIMITS, _qwen2, DecoderModel)
QWEN3: Final = ModelFamily("qwen3", _QWEN3_LIMITS, _qwen3, DecoderModel)
