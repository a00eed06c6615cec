"""Rotary position embedding through `infiniops_py.rotary_embedding`, or `fused_qk_norm_rope` with Qwen3's q/k norms.

The table is vLLM's ``cos_sin_cache`` ``[max_len, rotary_dim]``: for each position, the cosines then the sines
of its ``rotary_dim / 2`` angles. As Hugging Face computes them, ``freqs = position * inv_freq`` and
``cos``/``sin`` (times the RoPE type's attention scaling) are computed in fp32 on the target device and cast
to the activation dtype, so a row holds HF's numbers; ``inv_freq`` for scaled variants (linear, llama3, yarn)
comes from transformers' own ``ROPE_INIT_FUNCTIONS``. The rotation itself is the operator's: each pair turned
in fp32 and rounded once (HF rounds ``x * cos``, ``rotate_half(x) * sin`` and their sum in the dtype: the
results differ by those roundings). Pairs are GPT-NeoX's rotate-half channels ``(i, i + R/2)`` by default
(Llama, Qwen, Mistral, Gemma 2), GPT-J's interleaved ``(2i, 2i + 1)`` with ``is_neox=False`` (GLM-4), over the
first ``rotary_dim`` channels of each head.
"""

from __future__ import annotations

from typing import Any

import torch

from infinilm.config import ModelConfig
from infinilm.layers.norm import QKNorm
from infiniops_py import fused_qk_norm_rope, rotary_embedding

__all__ = ["RotaryEmbedding", "inverse_frequencies", "qk_norm_rope_fields"]


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


def qk_norm_rope_fields(config: ModelConfig, num_q_heads: int, num_kv_heads: int) -> dict[str, Any]:
    """The `fused_qk_norm_rope` problem fields of a q/k-norm model of `config` (Qwen3: NeoX pairs over the whole
    head, the `RotaryEmbedding` defaults) with `num_q_heads` / `num_kv_heads` heads."""
    return {"head_dim": config.head_dim, "num_q_heads": num_q_heads, "num_kv_heads": num_kv_heads,
            "rotary_dim": config.head_dim, "is_neox": True}


class RotaryEmbedding:
    """Applies RoPE in place to q ``[T, Hq, D]`` and k ``[T, Hkv, D]`` at int64 positions ``[T]``.

    Attributes:
        cos_sin_cache: ``[max_len, rotary_dim]`` in the activation dtype: cosines, then sines, per position.
        head_dim, rotary_dim, is_neox: the heads' width, the channels turned, the pair layout.
    """

    __slots__ = ("cos_sin_cache", "head_dim", "is_neox", "rotary_dim")

    def __init__(self, config: ModelConfig, max_len: int, *, dtype: torch.dtype, device: torch.device,
                 rotary_dim: int | None = None, is_neox: bool = True) -> None:
        """The table of positions ``0 .. max_len - 1`` for `rotary_dim` channels (default: the whole head)."""
        inv, scaling = inverse_frequencies(config, rotary_dim)
        positions = torch.arange(max_len, device=device, dtype=torch.int64).float()
        freqs = positions[:, None] * inv.to(device)[None, :]
        self.cos_sin_cache = torch.cat(((freqs.cos() * scaling).to(dtype), (freqs.sin() * scaling).to(dtype)), dim=-1)
        self.head_dim = config.head_dim
        self.rotary_dim = config.head_dim if rotary_dim is None else rotary_dim
        self.is_neox = is_neox

    def __call__(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Turn `q` and `k` (views of the packed projection, or tensors of their own) in place; returns them."""
        rotary_embedding(positions, q, k, self.head_dim, self.cos_sin_cache, self.is_neox)
        return q, k

    def with_qk_norm(self, positions: torch.Tensor, qkv: torch.Tensor, norm: QKNorm
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`norm`'s per-head RMSNorms of the Q and K heads of the packed `qkv` ``[T, (Hq + 2 Hkv) * D]``, then this
        RoPE, in one `fused_qk_norm_rope` call in place; returns the q ``[T, Hq, D]``, k and untouched v views."""
        t, d, hq, hkv = qkv.shape[0], norm.head_dim, norm.num_heads, norm.num_kv_heads
        fused_qk_norm_rope(qkv, norm.q_weight, norm.k_weight, self.cos_sin_cache, positions, num_q_heads=hq,
                           num_kv_heads=hkv, head_dim=d, eps=norm.eps, is_neox=self.is_neox)
        q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
        return q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
