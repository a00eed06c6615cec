"""Reading and checking ``config.json`` before transformers sees it, so a bad file gives one clear error.

`read_config_json` reads the file as a JSON object; `field_problems` checks the numbers the model layer
uses (sizes and head counts positive integers, epsilons and RoPE theta positive and finite, the query
heads a multiple of the KV heads), naming each field by its ``config.json`` key, so that every problem goes
into one `ConfigError` (`raise_problems`) before any gate runs or any tensor is allocated.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

__all__ = ["POSITIVE_FLOATS", "POSITIVE_INTS", "ConfigError", "field_problems", "hf_error_reason", "raise_problems",
           "read_config_json"]

_ATTENTION_INTS: Final = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")
_MAMBA2_INTS: Final = ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "state_size",
                       "n_groups", "conv_kernel", "chunk_size", "expand")
POSITIVE_INTS: Final[dict[str, tuple[str, ...]]] = {
    "llama": _ATTENTION_INTS, "qwen2": _ATTENTION_INTS, "qwen3": _ATTENTION_INTS, "mamba2": _MAMBA2_INTS,
}
POSITIVE_FLOATS: Final[dict[str, tuple[str, ...]]] = {
    "llama": ("rms_norm_eps", "rope_theta"), "qwen2": ("rms_norm_eps", "rope_theta"),
    "qwen3": ("rms_norm_eps", "rope_theta"), "mamba2": ("layer_norm_epsilon",),
}
# (a, b): a must be a multiple of b
_MULTIPLES: Final[dict[str, tuple[tuple[str, str], ...]]] = {
    "llama": (("num_attention_heads", "num_key_value_heads"),),
    "qwen2": (("num_attention_heads", "num_key_value_heads"),),
    "qwen3": (("num_attention_heads", "num_key_value_heads"),),
    "mamba2": (),  # n_groups | num_heads: `infinilm.models.mamba2.mamba2_config` checks it with the fix
}


class ConfigError(ValueError):
    """A checkpoint configuration or an engine option the model layer cannot run, with the fix."""


def read_config_json(file: Path) -> dict[str, Any]:
    """The JSON object of `file`.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, is not valid JSON or is not a JSON object; the
            message names the file (and the line and column of a syntax error).
    """
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{file}: cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{file}: not UTF-8 text (expected a JSON object)") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{file}: not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: expected a JSON object, got a JSON {type(raw).__name__}")
    return raw


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive_float(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def field_problems(model_type: str, values: Mapping[str, Any]) -> list[str]:
    """Every problem among the fields of `values` (``config.json`` keys) that `model_type` reads.

    A key absent from `values`, or None, is not checked (transformers fills in its default). Returns one
    line per problem naming the key, the value found and what is allowed; empty when all is well.
    """
    problems = [f"{k}={values[k]!r} must be a positive integer" for k in POSITIVE_INTS.get(model_type, ())
                if values.get(k) is not None and not _positive_int(values[k])]
    problems += [f"{k}={values[k]!r} must be a positive finite number" for k in POSITIVE_FLOATS.get(model_type, ())
                 if values.get(k) is not None and not _positive_float(values[k])]
    for a, b in _MULTIPLES.get(model_type, ()):
        if _positive_int(values.get(a)) and _positive_int(values.get(b)) and values[a] % values[b]:
            problems.append(f"{a}={values[a]} must be a multiple of {b}={values[b]}")
    return problems


def raise_problems(model_type: str, problems: list[str], where: str | Path | None = None) -> None:
    """Raise one `ConfigError` listing every problem, prefixed by `where` (nothing when `problems` is empty)."""
    if problems:
        prefix = f"{where}: " if where is not None else ""
        raise ConfigError(f"{prefix}the {model_type} model config has {len(problems)} problem(s) (fix: correct "
                          "them in config.json):\n  " + "\n  ".join(problems))


def hf_error_reason(err: Exception) -> str:
    """transformers' (or huggingface_hub's strict dataclass) error on one line, without the traceback."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines) or type(err).__name__
