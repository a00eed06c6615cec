"""Llama, Qwen2 and Qwen3 decoder-only models (HF ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``).

The families differ only in data from `ModelConfig`: Qwen2 has a q/k/v bias, Qwen3 per-head q/k norms,
Llama optional attention and MLP biases; any of them may tie the LM head to the embedding. Every Gemm,
Add, RmsNorm, FusedQkNorm, cache write and attention runs through `infiniops_py`; RoPE, the embedding
lookup and SiLU-and-multiply are plain PyTorch. Weights are allocated empty here and filled by the loader
through `targets()`, which maps each checkpoint tensor name to the view it loads into.
"""

from __future__ import annotations

import torch

from infinilm.config import ModelConfig
from infinilm.engine.gates import GatePlan
from infinilm.engine.kv_cache import KVCache
from infinilm.layers.activation import silu_and_mul
from infinilm.layers.attention import Attention, AttnContext
from infinilm.layers.embedding import Embedding, LMHead
from infinilm.layers.linear import Linear
from infinilm.layers.norm import QKNorm, RMSNorm
from infinilm.layers.rotary import RotaryEmbedding

__all__ = ["DecoderLayer", "LlamaModel"]


class DecoderLayer:
    """Pre-norm attention block then pre-norm SwiGLU MLP, with the residual stream kept apart."""

    __slots__ = ("attn", "down_proj", "gate_up_proj", "input_layernorm", "kv", "o_proj", "post_attention_layernorm",
                 "qk_norm", "qkv_proj")

    def __init__(self, c: ModelConfig, plan: GatePlan, dtype: torch.dtype, device: torch.device) -> None:
        new = {"dtype": dtype, "device": device}
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **new)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, **new)
        self.qkv_proj = Linear(c.hidden_size, {"q_proj": c.q_size, "k_proj": c.kv_size, "v_proj": c.kv_size},
                               bias=c.qkv_bias, fuse_bias=plan.fused_bias, **new)
        self.o_proj = Linear(c.q_size, c.hidden_size, bias=c.o_bias, fuse_bias=plan.fused_bias, **new)
        self.qk_norm = (QKNorm(c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps, fused=plan.fused_qk_norm,
                               **new) if c.qk_norm else None)
        self.gate_up_proj = Linear(c.hidden_size, {"gate_proj": c.intermediate_size, "up_proj": c.intermediate_size},
                                   bias=c.mlp_bias, fuse_bias=plan.fused_bias, **new)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias, fuse_bias=plan.fused_bias, **new)
        self.attn = Attention(c.num_heads, c.num_kv_heads, c.head_dim)
        self.kv = (c.num_heads, c.num_kv_heads, c.head_dim)

    def targets(self, prefix: str) -> dict[str, torch.Tensor]:
        out = {f"{prefix}.input_layernorm.weight": self.input_layernorm.weight,
               f"{prefix}.post_attention_layernorm.weight": self.post_attention_layernorm.weight}
        out.update(self.qkv_proj.targets(f"{prefix}.self_attn"))
        out.update(self.o_proj.targets(f"{prefix}.self_attn.o_proj"))
        if self.qk_norm is not None:
            out[f"{prefix}.self_attn.q_norm.weight"] = self.qk_norm.q_weight
            out[f"{prefix}.self_attn.k_norm.weight"] = self.qk_norm.k_weight
        out.update(self.gate_up_proj.targets(f"{prefix}.mlp"))
        out.update(self.down_proj.targets(f"{prefix}.mlp.down_proj"))
        return out

    def __call__(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None, rope: RotaryEmbedding,
        k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: AttnContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm.add_norm(hidden, residual)
        qkv = self.qkv_proj(hidden)
        hq, hkv, d = self.kv
        if self.qk_norm is not None:
            q, k, v = self.qk_norm(qkv)
        else:
            q, k, v = qkv.split((hq * d, hkv * d, hkv * d), dim=-1)
            q, k, v = q.view(-1, hq, d), k.view(-1, hkv, d), v.view(-1, hkv, d)
        q, k = rope(positions, q, k)
        hidden = self.o_proj(self.attn(q, k, v, k_cache, v_cache, ctx))
        hidden, residual = self.post_attention_layernorm.add_norm(hidden, residual)
        return self.down_proj(silu_and_mul(self.gate_up_proj(hidden))), residual


class LlamaModel:
    """A causal LM: ``forward`` gives hidden states ``[T, H]``, ``logits`` the LM head's ``[B, V]``."""

    def __init__(self, config: ModelConfig, plan: GatePlan, *, dtype: torch.dtype, device: torch.device,
                 max_len: int) -> None:
        self.config = config
        self.embed = Embedding(config.vocab_size, config.hidden_size, dtype=dtype, device=device)
        self.layers = [DecoderLayer(config, plan, dtype, device) for _ in range(config.num_layers)]
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, device=device)
        head = self.embed.weight if config.tie_word_embeddings else torch.empty_like(self.embed.weight)
        self.lm_head = LMHead(head)
        self.rope = RotaryEmbedding(config, max_len, dtype=dtype, device=device)

    def targets(self) -> dict[str, torch.Tensor]:
        """Every checkpoint tensor name the model loads -> the view it loads into."""
        out = {"model.embed_tokens.weight": self.embed.weight, "model.norm.weight": self.norm.weight}
        for i, layer in enumerate(self.layers):
            out.update(layer.targets(f"model.layers.{i}"))
        if not self.config.tie_word_embeddings:
            out["lm_head.weight"] = self.lm_head.weight
        return out

    @staticmethod
    def ignored(name: str, tied: bool) -> bool:
        """Checkpoint tensors that may be present and are not loaded: RoPE buffers, a tied head's copy."""
        return name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight")

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: AttnContext, cache: KVCache
    ) -> torch.Tensor:
        """input_ids, positions int64 ``[T]`` -> final hidden states ``[T, H]``."""
        hidden, residual = self.embed(input_ids), None
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(positions, hidden, residual, self.rope, cache.keys[i], cache.values[i], ctx)
        return self.norm.add_norm(hidden, residual)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[B, H]`` -> logits ``[B, V]`` in the model dtype."""
        return self.lm_head(hidden)
