"""What `kernelize` swaps in each model family (`FAMILIES`, keyed by ``config.model_type``), by class name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["FAMILIES", "SwapTargets"]

@dataclass(frozen=True)
class SwapTargets:
    """What `kernelize` swaps in one model family, by transformers class name.

    Attributes:
        norms: RMSNorm classes whose forward is ``weight * (x * rsqrt(mean(x**2) + eps)).to(x.dtype)``
            with the mean in float32 (``LlamaRMSNorm``), the semantics of `rms_norm`.
        layers: pre-norm decoder layers whose attention residual add and ``post_attention_layernorm`` fuse.
        attention: attention classes that call ``ALL_ATTENTION_FUNCTIONS.get_interface``.
        mlps: gated MLP classes whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``
            (``LlamaMLP``), swapped where ``act_fn`` is SiLU (the semantics of `silu_and_mul`).
        float32_inputs: module names (last component) of norms that see float32 inputs when the config's
            ``residual_in_fp32`` is set (Mamba-2's ``norm_f`` gets the float32 residual stream).
        left: what stays in transformers' code, and why.
    """

    norms: tuple[str, ...]
    layers: tuple[str, ...] = ()
    attention: tuple[str, ...] = ()
    mlps: tuple[str, ...] = ()
    float32_inputs: tuple[str, ...] = ()
    left: tuple[str, ...] = ()


FAMILIES: Final[dict[str, SwapTargets]] = {
    "llama": SwapTargets(("LlamaRMSNorm",), ("LlamaDecoderLayer",), ("LlamaAttention",), ("LlamaMLP",)),
    "qwen2": SwapTargets(("Qwen2RMSNorm",), ("Qwen2DecoderLayer",), ("Qwen2Attention",), ("Qwen2MLP",)),
    "qwen3": SwapTargets(("Qwen3RMSNorm",), ("Qwen3DecoderLayer",), ("Qwen3Attention",), ("Qwen3MLP",)),
    "mamba2": SwapTargets(("Mamba2RMSNorm",), float32_inputs=("norm_f",), left=(
        "MambaRMSNormGated: no operator is its float32 x * silu(gate) followed by a per-group RMSNorm "
        "(silu_and_mul rounds the product to the dtype and takes gate and x packed in one tensor)",
        "Mamba2Mixer: its causal conv and scans stay transformers' own",
    )),
}
