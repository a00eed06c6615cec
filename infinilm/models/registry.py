"""The model families infinilm runs, and reading a checkpoint's config through the family it names.

`FAMILIES` lists every family (one line each); `family_of` finds the one of a ``model_type``. `read_config`
reads ``<checkpoint>/config.json``: the raw JSON is checked against the family's `ConfigLimits` first, then
transformers' `AutoConfig` reads it, then the family translates it into a `ModelConfig`, checking the
resolved values (defaults filled in) again, and the sizes of its largest weights (each must fit a torch
tensor). Reading a config never touches the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import torch

from infinilm.config import ConfigError, ModelConfig, parse_dtype
from infinilm.config_checks import field_problems, hf_error_reason, raise_problems, read_config_json
from infinilm.models.family import ModelFamily
from infinilm.models.gemma2 import GEMMA2
from infinilm.models.glm4 import GLM4
from infinilm.models.llama import LLAMA, QWEN2, QWEN3
from infinilm.models.mamba2 import MAMBA2
from infinilm.models.mistral import MISTRAL

__all__ = ["FAMILIES", "config_from_hf", "family_of", "model_types", "read_config"]

FAMILIES: Final[tuple[ModelFamily, ...]] = (
    LLAMA,
    QWEN2,
    QWEN3,
    MAMBA2,
    MISTRAL,
    GLM4,
    GEMMA2,
)


def model_types() -> tuple[str, ...]:
    """The ``model_type`` of every family, in `FAMILIES` order."""
    return tuple(f.model_type for f in FAMILIES)


def family_of(model_type: object) -> ModelFamily:
    """The family serving `model_type`.

    Raises:
        ConfigError: no family serves it (or it is None), naming the supported types.
    """
    for family in FAMILIES:
        if family.model_type == model_type:
            return family
    supported = ", ".join(model_types())
    if model_type is None:
        raise ConfigError(f"no model_type (fix: set it to one of {supported})")
    raise ConfigError(f"model_type={model_type!r} is not supported; supported: {supported}")


def _dtype_problems(raw: dict[str, Any]) -> list[str]:
    """The problems of config.json's ``dtype`` and ``torch_dtype`` (None or absent: float32, not checked).

    Each must be the name of a torch dtype the model layer runs (``float32``, ``bfloat16``, ``float16``, or
    the torch aliases ``float`` and ``half``): transformers turns it into ``getattr(torch, name)``, and ends in
    an AttributeError on any other name (``"banana"``, also ``"bf16"``). Returns one line per problem.
    """
    problems = []
    for key in ("dtype", "torch_dtype"):
        value = raw.get(key)
        if value is None:
            continue
        dtype = getattr(torch, value, None) if isinstance(value, str) else None
        try:
            if not isinstance(dtype, torch.dtype):
                raise ConfigError(key)
            parse_dtype(dtype)
        except ConfigError:
            problems.append(f"{key}={value!r} is not supported; allowed: 'float32', 'bfloat16', 'float16' (torch "
                            "dtype names)")
    return problems


_TENSOR_BYTES = 2**63 - 1  # the most bytes one torch tensor holds (its size in bytes is an int64)
_WIDEST = 4  # bytes of float32, the widest dtype the model layer runs


def _check_sizes(config: ModelConfig) -> ModelConfig:
    """`config`, after checking that a torch tensor can hold each of its largest weights in float32: a size no
    real model has passes every field's limit and would end the meta build of the model (to compare the
    checkpoint's headers) in torch's overflow error.

    Raises:
        ConfigError: the first weight of more than 2**63 - 1 bytes, named with the ``config.json`` fields of its
            shape and their values.
    """
    h = config.hidden_size
    if config.ssm is None:
        shapes = [("the embedding and LM head [vocab_size x hidden_size", config.vocab_size, h),
                  ("the q/k/v projection [(num_attention_heads + 2 x num_key_value_heads) x head_dim x hidden_size",
                   config.q_size + 2 * config.kv_size, h),
                  ("the output projection [hidden_size x num_attention_heads x head_dim", h, config.q_size),
                  ("the gate/up projection [2 x intermediate_size x hidden_size", 2 * config.intermediate_size, h)]
    else:
        s = config.ssm
        shapes = [("the embedding and LM head [vocab_size x hidden_size", config.vocab_size, h),
                  ("the in_proj [(2 x expand x hidden_size + 2 x n_groups x state_size + num_heads) x hidden_size",
                   s.proj_size, h),
                  ("the conv1d [(expand x hidden_size + 2 x n_groups x state_size) x conv_kernel", s.conv_dim,
                   s.conv_kernel)]
    for name, rows, cols in shapes:
        if rows * cols * _WIDEST > _TENSOR_BYTES:
            raise ConfigError(f"{name} = {rows} x {cols}] needs {rows * cols * _WIDEST} bytes in float32, more "
                              "than a torch tensor holds (2**63 - 1 bytes); the sizes in config.json are not a real "
                              "model's")
    return config


def read_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of checkpoint directory `path`, from ``<path>/config.json`` alone; every error names
    the file.

    Raises:
        ConfigError: `path` is not a directory or holds no config.json; a file that is not a JSON object; a
            missing or unsupported ``model_type``; fields outside the family's limits, or a ``dtype`` /
            ``torch_dtype`` that is not a supported torch dtype name (all listed in one error); a value
            transformers rejects; whatever the family's translation refuses; sizes whose weights no torch tensor
            can hold.
    """
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    path = Path(path)
    file = path / "config.json"
    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        raise ConfigError(f"{path} {what} (expected a Hugging Face checkpoint directory holding config.json)")
    if not file.is_file():
        raise ConfigError(f"{path}: no config.json (expected a Hugging Face checkpoint directory)")
    raw = read_config_json(file)
    try:
        family = family_of(raw.get("model_type"))
    except ConfigError as err:
        raise ConfigError(f"{file}: {err}") from None
    raise_problems(family.model_type, field_problems(family.limits, raw) + _dtype_problems(raw), file)
    try:
        hf = AutoConfig.from_pretrained(str(path))
    except (StrictDataclassError, ValueError, TypeError, KeyError, ArithmeticError) as err:
        raise ConfigError(f"{file}: transformers rejects it: {hf_error_reason(err)}") from None
    try:
        return _check_sizes(family.translate(hf))
    except ConfigError as err:
        raise ConfigError(f"{file}: {err}") from None


def config_from_hf(hf: Any) -> ModelConfig:
    """The `ModelConfig` of a transformers config object (or any object with its attributes), through the
    family of its ``model_type``.

    Raises:
        ConfigError: an unsupported ``model_type``; whatever the family's translation refuses; sizes whose
            weights no torch tensor can hold.
    """
    return _check_sizes(family_of(getattr(hf, "model_type", "?")).translate(hf))
