"""Reading and checking ``config.json`` before transformers sees it, so a bad file gives one clear error.

`read_config_json` reads the file as a JSON object; `field_problems` checks the fields a family reads against
the `ConfigLimits` the family declares as data (sizes and head counts positive integers, epsilons and RoPE
theta positive and finite, the query heads a multiple of the KV heads, the ranges the operator contracts set,
the activations the models implement, an even RoPE head dim), naming each field by its ``config.json`` key,
so that every problem goes into one `ConfigError` (`raise_problems`) before any gate runs or any tensor is
allocated. `resolved_problems` checks what only the resolved config (transformers' defaults filled in) can
tell: flags that must be booleans and EOS ids inside the vocabulary; `rope_problems` the parameters of each
RoPE type (transformers only logs a warning for most of them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

__all__ = ["ROPE_NUMBERS", "ConfigError", "ConfigLimits", "field_problems", "hf_error_reason", "raise_problems",
           "read_config_json", "resolved_problems", "rope_problems"]


@dataclass(frozen=True)
class ConfigLimits:
    """The limits a family puts on the ``config.json`` fields it reads, each field named by its key.

    Attributes:
        positive_ints: fields that must be positive integers.
        positive_floats: fields that must be positive finite numbers.
        multiples: ``(a, b)`` pairs: field a must be a multiple of field b.
        even: fields that must be even (of those that are positive integers).
        ranges: ``(field, low, high, where the limit comes from)``, inclusive, for positive integer fields.
        choices: ``(field, allowed values)``: the values the model implements (an activation, say).
        bools: flags the model reads, which must be booleans (``bool("false")`` is True).
    """

    positive_ints: tuple[str, ...] = ()
    positive_floats: tuple[str, ...] = ()
    multiples: tuple[tuple[str, str], ...] = ()
    even: tuple[str, ...] = ()
    ranges: tuple[tuple[str, int, int, str], ...] = ()
    choices: tuple[tuple[str, tuple[object, ...]], ...] = ()
    bools: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """Every field these limits read, once each, in declaration order."""
        pairs = (k for pair in self.multiples for k in pair)
        fields = (*self.positive_ints, *self.positive_floats, *pairs, *self.even, *(r[0] for r in self.ranges),
                  *(c[0] for c in self.choices), *self.bools)
        return tuple(dict.fromkeys(fields))


class ConfigError(ValueError):
    """A checkpoint configuration or an engine option the model layer cannot run, with the fix."""


def read_config_json(file: Path) -> dict[str, Any]:
    """The JSON object of `file`.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, is not valid JSON, nests arrays or objects
            deeper than Python's recursion limit, or is not a JSON object; the message names the file (and
            the line and column of a syntax error).
    """
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{file}: cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{file}: not UTF-8 text (expected a JSON object)") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{file}: not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    except RecursionError:  # json's decoder recurses once per nested array or object
        raise ConfigError(f"{file}: nested too deeply to parse (expected a JSON object of config fields)") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: expected a JSON object, got a JSON {type(raw).__name__}")
    return raw


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _positive_float(value: object) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an int of more than 309 digits (10**400): no float holds it (issue #30)
        return False


def field_problems(limits: ConfigLimits, values: Mapping[str, Any]) -> list[str]:
    """Every problem among the fields of `values` (``config.json`` keys) against a family's `limits`.

    A key absent from `values`, or None, is not checked (transformers fills in its default). Returns one
    line per problem naming the key, the value found and what is allowed; empty when all is well.
    """
    problems = [f"{k}={values[k]!r} must be a positive integer" for k in limits.positive_ints
                if values.get(k) is not None and not _positive_int(values[k])]
    problems += [f"{k}={values[k]!r} must be a positive finite number" for k in limits.positive_floats
                 if values.get(k) is not None and not _positive_float(values[k])]
    for a, b in limits.multiples:
        if _positive_int(values.get(a)) and _positive_int(values.get(b)) and values[a] % values[b]:
            problems.append(f"{a}={values[a]} must be a multiple of {b}={values[b]}")
    problems += [f"{k}={values[k]} must be even (rotate-half RoPE pairs dim i with dim i + {k}/2)"
                 for k in limits.even if _positive_int(values.get(k)) and values[k] % 2]
    problems += [f"{k}={values[k]} is out of range: need {lo} <= {k} <= {hi} ({why})"
                 for k, lo, hi, why in limits.ranges if _positive_int(values.get(k)) and not lo <= values[k] <= hi]
    problems += [f"{k}={values[k]!r} is not supported; allowed: {', '.join(map(repr, allowed))}"
                 for k, allowed in limits.choices if values.get(k) is not None and values[k] not in allowed]
    return problems


def resolved_problems(limits: ConfigLimits, values: Mapping[str, Any]) -> list[str]:
    """Every problem among the resolved flags and token ids of `values` (transformers' defaults filled in).

    The `ConfigLimits.bools` of `limits` must be booleans (None: absent, not checked); ``eos_token_id`` must be None,
    an integer or a list of integers, each in ``[0, vocab_size)`` (an id outside can never be sampled, so
    generation would never stop on it). Returns one line per problem naming the key, the value and what is
    allowed.
    """
    problems = [f"{k}={values[k]!r} must be true or false" for k in limits.bools
                if values.get(k) is not None and not isinstance(values[k], bool)]
    eos, vocab = values.get("eos_token_id"), values.get("vocab_size")
    ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list | tuple) else None
    if eos is not None and (ids is None or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        problems.append(f"eos_token_id={eos!r} must be an integer or a list of integers")
    elif ids and _positive_int(vocab) and not all(0 <= i < vocab for i in ids):
        problems.append(f"eos_token_id={eos!r} must be token ids in [0, vocab_size={vocab})")
    return problems


# rope_type -> (required, optional) numeric parameters, as transformers' ROPE_INIT_FUNCTIONS read them
ROPE_NUMBERS: Final[Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]] = MappingProxyType({
    "default": ((), ()),
    "linear": (("factor",), ()),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"), ()),
    "yarn": ((), ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                  "mscale", "mscale_all_dim")),
})


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _rope_limit(key: str, value: object) -> str | None:
    """What `value` of RoPE parameter `key` must be, or None when it is allowed."""
    if key == "factor":  # transformers' own rule (it only warns): a scaling factor below 1 is no scaling
        return None if _number(value) and value >= 1 else "a finite number >= 1"
    if key == "original_max_position_embeddings":
        return None if _positive_int(value) else "a positive integer"
    if key in ("mscale", "mscale_all_dim"):
        return None if _number(value) else "a finite number"
    return None if _positive_float(value) else "a positive finite number"


def rope_problems(model_type: str, rope_type: str, rope: Mapping[str, Any], *,
                  partial_rotary: bool = False) -> list[str]:
    """Every problem among the RoPE parameters `rope` (``rope_scaling``/``rope_parameters``) of `rope_type`.

    A model rotates the whole head unless `partial_rotary` (``partial_rotary_factor`` must then be 1 or
    absent; with `partial_rotary` a number in ``(0, 1]``); each parameter of
    `ROPE_NUMBERS` is checked when present, the required ones must be present; llama3 needs
    ``high_freq_factor > low_freq_factor`` (its smoothing divides by the difference), yarn
    ``beta_fast >= beta_slow`` (defaults 32 and 1) and a boolean ``truncate``. Returns one line per problem
    naming the key, the value and what is allowed.
    """
    problems = []
    partial = rope.get("partial_rotary_factor")
    if partial_rotary and partial is not None and not (_positive_float(partial) and partial <= 1):
        problems.append(f"partial_rotary_factor={partial!r} must be a number in (0, 1] (the rotated share of "
                        "head_dim)")
    elif not partial_rotary and partial is not None and partial != 1:
        problems.append(f"partial_rotary_factor={partial!r} is not supported: {model_type} rotates the whole "
                        "head_dim (allowed: 1.0, or leave it out)")
    required, optional = ROPE_NUMBERS.get(rope_type, ((), ()))
    problems += [f"rope_scaling.{k} is missing ({rope_type} RoPE needs it)" for k in required if rope.get(k) is None]
    for k in required + optional:
        limit = None if rope.get(k) is None else _rope_limit(k, rope[k])
        if limit is not None:
            problems.append(f"rope_scaling.{k}={rope[k]!r} must be {limit} ({rope_type} RoPE)")
    low, high = rope.get("low_freq_factor"), rope.get("high_freq_factor")
    if rope_type == "llama3" and _positive_float(low) and _positive_float(high) and not high > low:
        problems.append(f"rope_scaling.high_freq_factor={high!r} must be greater than low_freq_factor={low!r} "
                        "(llama3 RoPE)")
    fast, slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1
    if rope_type == "yarn" and _positive_float(fast) and _positive_float(slow) and fast < slow:
        problems.append(f"rope_scaling.beta_fast={fast!r} must be >= beta_slow={slow!r} (yarn RoPE; they default "
                        "to 32 and 1)")
    if rope_type == "yarn" and rope.get("truncate") is not None and not isinstance(rope["truncate"], bool):
        problems.append(f"rope_scaling.truncate={rope['truncate']!r} must be true or false (yarn RoPE)")
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
