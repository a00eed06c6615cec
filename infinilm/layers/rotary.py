"""Rotary position embedding, rotate-half (GPT-NeoX) form, as Hugging Face computes it.

HF computes ``freqs = position * inv_freq`` and ``cos``/``sin`` (times the RoPE type's attention
scaling) in fp32, casts them to the activation dtype, then ``x * cos + rotate_half(x) * sin`` in that
dtype. The tables here hold those cast values for every position up to ``max_len``, computed on the
target device, so a lookup gives HF's numbers. ``inv_freq`` for scaled variants (linear, llama3, yarn)
comes from transformers' own ``ROPE_INIT_FUNCTIONS``.
"""

from __future__ import annotations

import torch

from infinilm.config import ModelConfig

__all__ = ["RotaryEmbedding", "inverse_frequencies"]


def inverse_frequencies(config: ModelConfig, rotary_dim: int | None = None) -> tuple[torch.Tensor, float]:
    """``inv_freq`` ``[R/2]`` (fp32, CPU) and the attention scaling of the config's RoPE type.

    R is `rotary_dim`, the channels RoPE turns (default: the whole ``head_dim``); for the scaled types
    transformers derives it from the config's own ``partial_rotary_factor``.
    """
    if config.rope_type == "default":
        d = config.head_dim if rotary_dim is None else rotary_dim
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv, scaling = ROPE_INIT_FUNCTIONS[config.rope_type](config.hf_config, None)
    return inv.float(), float(scaling)


class RotaryEmbedding:
    """Applies RoPE to q ``[T, Hq, D]`` and k ``[T, Hkv, D]`` at int64 positions ``[T]``."""

    __slots__ = ("cos", "half", "sin")

    def __init__(self, config: ModelConfig, max_len: int, *, dtype: torch.dtype, device: torch.device) -> None:
        inv, scaling = inverse_frequencies(config)
        positions = torch.arange(max_len, device=device, dtype=torch.int64).float()
        freqs = positions[:, None] * inv.to(device)[None, :]
        self.cos = (freqs.cos() * scaling).to(dtype)
        self.sin = (freqs.sin() * scaling).to(dtype)
        self.half = config.head_dim // 2

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., : self.half], x[..., self.half :]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
