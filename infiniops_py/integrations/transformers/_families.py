"""What `kernelize` swaps in each model family (`FAMILIES`, keyed by ``config.model_type``): transformers'
classes, by the role each plays, and transformers' hub-kernel layer names (`HUB_ROLES`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

__all__ = ["FAMILIES", "HUB_ROLES", "ROLES", "SwapTargets"]

# What a role's class is (the semantics its swap computes):
ROLES: Final = {
    "rms_norm": "LlamaRMSNorm: weight * (x * rsqrt(mean(x**2) + variance_epsilon)).to(x.dtype), mean in float32",
    "gemma_rms_norm": "Gemma's RMSNorm: ((x * rsqrt(mean(x**2) + eps)) * (1 + weight)) in float32, then cast",
    "layer": "the pre-norm decoder layer: input_layernorm, self_attn, residual add, post_attention_layernorm, mlp, "
             "residual add",
    "sandwich_layer": "GLM-4's decoder layer: the pre-norm layer with post_self_attn_layernorm after the attention "
                      "and post_mlp_layernorm after the MLP",
    "attention": "LlamaAttention: q/k/v projections, apply_rotary_pos_emb, the cache update, the attention "
                 "interface, o_proj",
    "mlp": "LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x))",
    "packed_mlp": "GLM-4's MLP: down_proj(up * activation_fn(gate)), gate and up the halves of gate_up_proj(x)",
    "rotary": "the rotary module: cos and sin of cat((freqs, freqs))",
}

# transformers' ``use_kernel_forward_from_hub(name)`` layer names (set as ``kernel_layer_name`` on a class when the
# ``kernels`` package is installed) whose hub kernels compute the semantics of a role
HUB_ROLES: Final = {"RMSNorm": "rms_norm"}


@dataclass(frozen=True)
class SwapTargets:
    """What `kernelize` swaps in one model family.

    Attributes:
        module: the transformers modeling module whose classes `classes` names.
        classes: class name -> its role (a key of `ROLES`); a module matches a class when its type is the
            class, or a subclass that keeps the class's forward.
        rope: ``"neox"`` (rotate-half pairs over the whole head) or ``"gptj"`` (GLM-4: interleaved pairs over
            the first ``rotary_dim`` channels).
        attention_extra: (keyword, attribute path on the attention module) of what the family's attention forward
            passes its attention function beyond Llama's (``sliding_window``, ``softcap``).
        float32_inputs: module names (last component) of norms that see float32 inputs when the config's
            ``residual_in_fp32`` is set (Mamba-2's ``norm_f`` gets the float32 residual stream).
        left: what always stays in transformers' code, and why.
    """

    module: str
    classes: dict[str, str]
    rope: str = "neox"
    attention_extra: tuple[tuple[str, str], ...] = ()
    float32_inputs: tuple[str, ...] = ()
    left: tuple[str, ...] = field(default=())


def _decoder(prefix: str, module: str, *, rope: str = "neox", extra: tuple[tuple[str, str], ...] = (),
             norm: str = "rms_norm", layer: str = "layer", mlp: str = "mlp",
             left: tuple[str, ...] = ()) -> SwapTargets:
    classes = {f"{prefix}RMSNorm": norm, f"{prefix}Attention": "attention", f"{prefix}MLP": mlp,
               f"{prefix}RotaryEmbedding": "rotary"}
    if layer:
        classes[f"{prefix}DecoderLayer"] = layer
    return SwapTargets(f"transformers.models.{module}.modeling_{module}", classes, rope, extra, left=left)


_SLIDING: Final = (("sliding_window", "sliding_window"),)

FAMILIES: Final[dict[str, SwapTargets]] = {
    "llama": _decoder("Llama", "llama"),
    "qwen2": _decoder("Qwen2", "qwen2", extra=_SLIDING),
    "qwen3": _decoder("Qwen3", "qwen3", extra=_SLIDING),
    "mistral": _decoder("Mistral", "mistral", extra=(("sliding_window", "config.sliding_window"),)),
    "glm4": _decoder("Glm4", "glm4", rope="gptj", layer="sandwich_layer", mlp="packed_mlp"),
    "gemma2": _decoder("Gemma2", "gemma2", norm="gemma_rms_norm", layer="",
                       extra=(*_SLIDING, ("softcap", "attn_logit_softcapping")), left=(
        "Gemma2DecoderLayer: its residual adds stay unfused (Gemma's norms multiply by 1 + weight in float32, "
        "fused_add_rms_norm rounds before its weight)",)),
    "mamba2": SwapTargets("transformers.models.mamba2.modeling_mamba2", {"Mamba2RMSNorm": "rms_norm"},
                     float32_inputs=("norm_f",), left=(
        "MambaRMSNormGated: no operator is its float32 x * silu(gate) followed by a per-group RMSNorm "
        "(silu_and_mul rounds the product to the dtype and takes gate and x packed in one tensor)",
        "Mamba2Mixer: its causal conv and scans stay transformers' own",
    )),
}
