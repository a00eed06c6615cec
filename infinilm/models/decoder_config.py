"""What the attention decoder families share: their config limits, config translation and gate problems.

`decoder_limits` builds a family's `ConfigLimits` from the fields every attention decoder reads;
`decoder_config` translates a transformers config (LlamaConfig, Qwen2Config, MistralConfig, ...) into a
`ModelConfig`, checking every resolved size, flag, RoPE parameter and the RoPE frequencies themselves, so
that nothing about the config can fail after the gates.
"""

from __future__ import annotations

import math
from typing import Any, Final

import torch

from infinilm.config import ConfigError, ModelConfig, parse_dtype, token_ids
from infinilm.config_checks import (
    ConfigLimits,
    field_problems,
    hf_error_reason,
    raise_problems,
    resolved_problems,
    rope_problems,
)
from infinilm.layers.rotary import inverse_frequencies

__all__ = ["MAX_HEAD_DIM", "MAX_LAYERS", "STATIC_ROPE_TYPES", "decoder_config", "decoder_limits",
           "rope_parameters"]

STATIC_ROPE_TYPES: Final = ("default", "linear", "llama3", "yarn")
_INTS: Final = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings")
_SILU: Final = (("hidden_act", ("silu",)),)  # the MLP's activation is SiLU, written in the model
# Far above released models (head_dim at most 512, layers a few hundred), low enough that the RoPE frequencies
# computed while reading the config and the per-layer work of the weight checks stay small.
MAX_HEAD_DIM: Final = 4096
MAX_LAYERS: Final = 1024
_HEAD_DIM_WHY: Final = ("released models use at most 512; the triton kernels take at most 256 (flash-attention) "
                        "to 1024 (rotary, paged cache)")
_RANGES: Final = (("head_dim", 2, MAX_HEAD_DIM, _HEAD_DIM_WHY),
                  ("num_hidden_layers", 1, MAX_LAYERS, "released models have at most a few hundred layers"))


def decoder_limits(bools: tuple[str, ...], *, ints: tuple[str, ...] = (),
                   choices: tuple[tuple[str, tuple[object, ...]], ...] = _SILU) -> ConfigLimits:
    """The `ConfigLimits` of an attention decoder: its sizes positive integers (plus `ints`), ``rms_norm_eps``
    and ``rope_theta`` positive, the query heads a multiple of the KV heads, an even ``head_dim`` of at most
    `MAX_HEAD_DIM`, at most `MAX_LAYERS` layers, the activation in `choices` (default SiLU) and the flags
    `bools` booleans."""
    return ConfigLimits(positive_ints=(*_INTS, *ints), positive_floats=("rms_norm_eps", "rope_theta"),
                        multiples=(("num_attention_heads", "num_key_value_heads"),), even=("head_dim",),
                        ranges=_RANGES, choices=choices, bools=bools)


def rope_parameters(hf: Any) -> dict[str, Any]:
    """The RoPE settings of a transformers config: ``rope_parameters`` (transformers 5 normalizes them there),
    else 4.x's ``rope_theta`` with ``rope_scaling``."""
    params = getattr(hf, "rope_parameters", None)
    if params:
        return dict(params)
    return {"rope_theta": getattr(hf, "rope_theta", 10000.0), **(getattr(hf, "rope_scaling", None) or {})}


def decoder_config(hf: Any, limits: ConfigLimits, *, qkv_bias: bool, o_bias: bool, mlp_bias: bool, qk_norm: bool,
                   partial_rotary: bool = False, config_class: type[ModelConfig] = ModelConfig,
                   **extra: Any) -> ModelConfig:
    """A `config_class` from the transformers config `hf` of an attention decoder; `extra` are the fields
    `config_class` adds to `ModelConfig`.

    With `partial_rotary`, RoPE turns the first ``head_dim * partial_rotary_factor`` channels of each head
    (transformers' ``partial_rotary_factor``, default 1) and `config_class` takes that as ``rotary_dim``;
    else the whole head turns and a factor other than 1 is refused.

    Raises:
        ConfigError: an unsupported RoPE type or ``use_sliding_window=True``; non-positive sizes, head counts,
            epsilon or RoPE theta, a head layout that does not divide, an odd head_dim or rotary dim, a head_dim
            above `MAX_HEAD_DIM` or more than `MAX_LAYERS` layers, an activation outside `limits`, a flag that
            is not a boolean, an EOS id outside the vocabulary (all listed in one error); RoPE parameters out of
            their limits or from which the frequencies cannot be computed
            (`infinilm.config_checks.rope_problems`).
    """
    mt = getattr(hf, "model_type", "?")
    rope = rope_parameters(hf)
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    heads, kv_heads, head_dim = _head_layout(mt, hf, theta, limits)
    if getattr(hf, "use_sliding_window", False):
        raise ConfigError(f"{mt}: use_sliding_window=True is not supported (fix: set it to false)")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        raise ConfigError(f"{mt}: rope_type={rope_type!r} is not supported; supported: {STATIC_ROPE_TYPES}")
    partial = rope.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None))
    raise_problems(mt, rope_problems(mt, rope_type, {**rope, "partial_rotary_factor": partial},
                                     partial_rotary=partial_rotary))
    rotary_dim = int(head_dim * (partial if partial is not None else 1.0))
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ConfigError(f"{mt}: head_dim={head_dim} x partial_rotary_factor={partial} gives {rotary_dim} rotated "
                          "channels; need a positive even number (RoPE turns channel pairs)")
    if partial_rotary:
        extra["rotary_dim"] = rotary_dim
    # transformers 5 keeps `dtype` (its `torch_dtype` property logs a deprecation warning), 4.x `torch_dtype`
    dtype = hf.dtype if hasattr(hf, "dtype") else getattr(hf, "torch_dtype", None)
    config = config_class(
        model_type=mt, vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, intermediate_size=hf.intermediate_size,
        num_layers=hf.num_hidden_layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=float(hf.rms_norm_eps), rope_type=rope_type, rope_theta=float(theta),
        max_position_embeddings=hf.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)), qkv_bias=qkv_bias, o_bias=o_bias,
        mlp_bias=mlp_bias, qk_norm=qk_norm, dtype=parse_dtype(dtype) if dtype is not None else torch.float32,
        eos_token_ids=token_ids(getattr(hf, "eos_token_id", None)), hf_config=hf, **extra,
    )
    _check_frequencies(config, rope, rotary_dim)
    return config


def _head_layout(mt: str, hf: Any, rope_theta: object, limits: ConfigLimits) -> tuple[int, int, int]:
    """``(num_heads, num_kv_heads, head_dim)`` of an attention config, after checking every field `limits` reads.

    A config without ``head_dim`` (Qwen2) takes ``hidden_size / num_attention_heads``, which must then divide
    and be even. The activation, the flags and the EOS ids are checked here too, so that one error lists
    every problem.

    Raises:
        ConfigError: every problem at once (`infinilm.config_checks.field_problems` and `resolved_problems`).
    """
    heads = hf.num_attention_heads
    kv_heads = getattr(hf, "num_key_value_heads", None)
    kv_heads = heads if kv_heads is None else kv_heads
    head_dim = getattr(hf, "head_dim", None)
    values = {k: getattr(hf, k, None) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                "num_hidden_layers", "max_position_embeddings", "rms_norm_eps")}
    values |= {"num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
               "rope_theta": rope_theta}
    problems = [f"{k} is missing" for k, v in values.items() if v is None and k != "head_dim"]
    others = {k: getattr(hf, k, None) for k in (*limits.keys, "eos_token_id") if k not in values}
    problems += field_problems(limits, values | others) + resolved_problems(limits, values | others)
    if head_dim is None and not problems and values["hidden_size"] % heads:
        problems.append(f"hidden_size={values['hidden_size']} must be a multiple of num_attention_heads={heads} "
                        f"(without head_dim, {mt} takes head_dim = hidden_size / num_attention_heads)")
    elif head_dim is None and not problems and (values["hidden_size"] // heads) % 2:
        problems.append(f"head_dim = hidden_size / num_attention_heads = {values['hidden_size'] // heads} must be "
                        "even (rotate-half RoPE pairs dim i with dim i + head_dim/2)")
    elif head_dim is None and not problems and values["hidden_size"] // heads > MAX_HEAD_DIM:
        problems.append(f"head_dim = hidden_size / num_attention_heads = {values['hidden_size'] // heads} is out of "
                        f"range: need head_dim <= {MAX_HEAD_DIM} ({_HEAD_DIM_WHY})")
    raise_problems(mt, problems)
    return heads, kv_heads, head_dim if head_dim is not None else values["hidden_size"] // heads


def _check_frequencies(config: ModelConfig, rope: dict[str, Any], rotary_dim: int) -> None:
    """Compute the RoPE frequencies now (what the model will build), so that they cannot fail after the gates.

    Raises:
        ConfigError: transformers cannot compute them from `rope`, or they are not ``rotary_dim / 2`` finite
            numbers with a finite positive attention scaling.
    """
    what = f"{config.model_type}: the {config.rope_type} RoPE parameters {rope}"
    try:
        inv, scaling = inverse_frequencies(config, rotary_dim)
    except (ArithmeticError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"{what}: the frequencies cannot be computed ({type(err).__name__}: "
                          f"{hf_error_reason(err)})") from None
    if tuple(inv.shape) != (rotary_dim // 2,) or not bool(inv.isfinite().all()):
        raise ConfigError(f"{what} give {list(inv.shape)} frequencies ({inv.isfinite().sum()} finite); need "
                          f"{'head_dim' if rotary_dim == config.head_dim else 'rotary_dim'}/2 = {rotary_dim // 2} "
                          "finite ones")
    if not (math.isfinite(scaling) and scaling > 0):
        raise ConfigError(f"{what} give an attention scaling of {scaling}; need a positive finite number")

