"""GLM-4 (HF ``Glm4ForCausalLM``): the Llama decoder with sandwich norms and interleaved partial RoPE.

Each layer (transformers' ``Glm4DecoderLayer``): ``h = x + post_self_attn_layernorm(attn(input_layernorm(x)))``,
then ``h + post_mlp_layernorm(mlp(post_attention_layernorm(h)))``; q, k and v carry a bias when
``attention_bias`` (the default), o_proj never; the MLP's gate and up projections are one checkpoint tensor,
``mlp.gate_up_proj`` (gate rows first). RoPE turns the first ``rotary_dim = head_dim * partial_rotary_factor``
channels of each head (default factor 0.5) as interleaved pairs ``(x[2i], x[2i + 1])`` (GPT-J style), with
frequency i of ``rotary_dim / 2``; the other channels pass through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, cast

import torch

from infinilm.config import ModelConfig
from infinilm.layers.rotary import RotaryEmbedding
from infinilm.models.decoder import DecoderModel, SandwichLayer
from infinilm.models.decoder_config import decoder_config, decoder_limits
from infinilm.models.family import ModelFamily

__all__ = ["GLM4", "Glm4Config", "Glm4Layer", "Glm4Model", "InterleavedRotary"]

_LIMITS: Final = decoder_limits(("tie_word_embeddings", "attention_bias"))


@dataclass(frozen=True)
class Glm4Config(ModelConfig):
    """A GLM-4 `ModelConfig`; `rotary_dim`: the leading channels of each head that RoPE turns."""

    rotary_dim: int = 0


def _translate(hf: Any) -> ModelConfig:
    """A `Glm4Config` (see `decoder_config` for what is checked; ``partial_rotary_factor`` in ``(0, 1]``)."""
    bias = bool(getattr(hf, "attention_bias", True))
    return decoder_config(hf, _LIMITS, qkv_bias=bias, o_bias=False, mlp_bias=False, qk_norm=False,
                          partial_rotary=True, config_class=Glm4Config)


class InterleavedRotary(RotaryEmbedding):
    """RoPE on the first `rotary_dim` channels of q ``[T, Hq, D]`` and k ``[T, Hkv, D]``, pairing channels
    ``2i`` and ``2i + 1`` (`rotary_embedding` with ``is_neox=False``); cos/sin tables computed in fp32 and cast
    to the model dtype, as transformers does."""

    __slots__ = ()

    def __init__(self, config: ModelConfig, rotary_dim: int, max_len: int, *, dtype: torch.dtype,
                 device: torch.device) -> None:
        super().__init__(config, max_len, dtype=dtype, device=device, rotary_dim=rotary_dim, is_neox=False)


class Glm4Layer(SandwichLayer):
    """`SandwichLayer` under GLM-4's names, its gate and up projection loading from one ``mlp.gate_up_proj``."""

    __slots__ = ()
    NORM_NAMES = (("input_layernorm", "input_layernorm"), ("attn_out_norm", "post_self_attn_layernorm"),
                  ("post_attention_layernorm", "post_attention_layernorm"), ("mlp_out_norm", "post_mlp_layernorm"))

    def targets(self, prefix: str) -> dict[str, torch.Tensor]:
        """`DecoderLayer.targets`, the packed gate and up projection loading from one ``mlp.gate_up_proj``."""
        out = super().targets(prefix)
        del out[f"{prefix}.mlp.gate_proj.weight"], out[f"{prefix}.mlp.up_proj.weight"]
        out[f"{prefix}.mlp.gate_up_proj.weight"] = self.gate_up_proj.packed_target()
        return out


class Glm4Model(DecoderModel):
    """`DecoderModel` of `Glm4Layer`s with interleaved partial RoPE."""

    layer_class = Glm4Layer

    def rotary(self, config: ModelConfig, max_len: int, dtype: torch.dtype, device: torch.device) -> RotaryEmbedding:
        """Interleaved RoPE over the config's `Glm4Config.rotary_dim` leading channels."""
        return InterleavedRotary(config, cast(Glm4Config, config).rotary_dim, max_len, dtype=dtype, device=device)


GLM4: Final = ModelFamily("glm4", _LIMITS, _translate, Glm4Model)
