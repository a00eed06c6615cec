"""The checks the engine runs before the gates and before any weight is read; the CLI runs them too.

`check_options` checks the engine options against the model config, `check_prompt` a prompt's token ids,
`max_positions` bounds ``max_model_len``; `cache_class` is the cache kind of a config's family (a paged KV
cache, or the recurrent state pool) and `describe` the line ``infinilm check`` prints about the model.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

import torch

from infinilm.config import ConfigError, EngineOptions, ModelConfig
from infinilm.distributed.parallel import TensorParallel, check_split
from infinilm.engine.kv_cache import KVCache
from infinilm.engine.memory import cache_units, check_cache_fits, check_fits
from infinilm.engine.state_pool import StatePool, describe_state
from infinilm.models.registry import family_of

__all__ = ["cache_class", "check_options", "check_prompt", "describe", "max_positions"]


def cache_class(config: ModelConfig) -> type[KVCache] | type[StatePool]:
    """The cache of `config`'s family: the recurrent `StatePool`, else the paged `KVCache`.

    Raises:
        ConfigError: no family serves ``config.model_type``.
    """
    return StatePool if family_of(config.model_type).recurrent else KVCache


def describe(config: ModelConfig, options: EngineOptions) -> str:
    """What ``infinilm check`` says about the model: its layers and heads, or, for a recurrent model, its
    state per request."""
    if cache_class(config) is StatePool:
        return describe_state(config, options.resolved_dtype(config))
    return (f"{config.model_type}, {config.num_layers} layers, head_dim {config.head_dim}, "
            f"{config.num_heads}/{config.num_kv_heads} heads")


def check_prompt(prompt: Iterable[int], vocab_size: int, what: str = "prompt") -> list[int]:
    """`prompt` as a list of Python ints, each a token id in ``[0, vocab_size)``.

    An id is an ``int`` or an integer scalar with ``__index__`` (a NumPy integer, a 0-d integer tensor); a
    bool or a float (``1.7``) is refused, never truncated.

    Raises:
        ValueError: `prompt` is empty, or holds ids that are not integers or lie outside the vocabulary (the
            first five are named, after `what`).
    """
    ids: list[int] = []
    not_ints: list[object] = []
    for t in prompt:
        try:
            if isinstance(t, bool):
                raise TypeError
            ids.append(operator.index(t))
        except TypeError:
            not_ints.append(t)
    if not_ints:
        raise ValueError(f"{what}: token id(s) {not_ints[:5]} are not integers (a token id is an int in "
                         f"[0, {vocab_size}))")
    if not ids:
        raise ValueError(f"{what}: needs at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{what}: token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})")
    return ids


def max_positions(config: ModelConfig) -> int:
    """The longest sequence the model's positions serve: the bound of an explicit ``max_model_len``.

    As vLLM derives it: ``max_position_embeddings``, times the RoPE ``factor`` of ``linear`` and ``yarn``
    scaling (yarn: ``original_max_position_embeddings x factor`` when the config gives the original length);
    ``default`` and ``llama3`` RoPE configs list their full length. A recurrent (Mamba-2) model has no position
    table: its bound is `infinilm.models.mamba2.NO_POSITION_LIMIT`. A product too large for a float (a finite
    factor such as ``1e308``) is ``positions x int(factor)``, exact.
    """
    limit = config.max_position_embeddings
    hf = config.hf_config
    rope = (getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {}) if hf is not None else {}
    factor = rope.get("factor")
    if config.rope_type in ("linear", "yarn") and isinstance(factor, int | float) and factor >= 1:
        original = rope.get("original_max_position_embeddings")
        if config.rope_type == "yarn" and isinstance(original, int):
            limit = original
        scaled = limit * factor
        limit = int(scaled) if math.isfinite(scaled) else limit * int(factor)
    return limit


def check_options(config: ModelConfig, options: EngineOptions) -> None:
    """The engine options checked against the model config, before the gates run and any weight is read.

    Raises:
        ConfigError: ``max_model_len`` beyond `max_positions`; a CUDA device index this machine does not have;
            ``num_blocks`` that cannot hold one sequence of ``max_model_len``, or, with ``num_blocks`` None, a
            KV cache budget that cannot (off CUDA: ``kv_cache_memory``; on CUDA: the device's total memory); a
            KV cache (Mamba-2: a state pool) of ``num_blocks`` larger than the device's total memory, with the
            bytes it would need (of one rank's heads when split across ``tensor_parallel_size`` ranks);
            ``prefill_graph_lengths`` for a model that is not recurrent; a model that does not split across
            ``tensor_parallel_size`` ranks.
    """
    limit = max_positions(config)
    if options.max_model_len is not None and options.max_model_len > limit:
        scaled = f" x its {config.rope_type} RoPE factor" if limit != config.max_position_embeddings else ""
        raise ConfigError(f"max_model_len={options.max_model_len} exceeds the {limit} positions this "
                          f"{config.model_type} model serves (max_position_embeddings="
                          f"{config.max_position_embeddings} in config.json{scaled}); lower max_model_len")
    device = torch.device(options.device)
    count = torch.cuda.device_count() if device.type == "cuda" and torch.cuda.is_available() else 0
    if count and device.index is not None and device.index >= count:
        raise ConfigError(f"device={options.device!r}: this machine has {count} CUDA device(s), cuda:0 .. "
                          f"cuda:{count - 1}")
    cache = cache_class(config)
    if options.num_blocks is not None:
        if cache is KVCache:
            KVCache.check_blocks(config, options, options.num_blocks)
        check_split(config, options)  # each rank's cache holds its heads alone (one rank: all of them)
        local = TensorParallel(options.tensor_parallel_size).local_config(config)
        check_cache_fits(cache.WHAT, options.num_blocks, cache.unit_bytes(local, options), options, device, now=False)
    elif cache is KVCache:  # sized once the weights are in: its budget must hold one sequence of max_model_len
        local = TensorParallel(options.tensor_parallel_size).local_config(config)
        per_block, per_seq = KVCache.unit_bytes(local, options), options.blocks_per_seq(config)
        if device.type != "cuda":  # the budget is kv_cache_memory, known now
            KVCache.check_blocks(config, options, cache_units(options, device, per_block, per_seq))
        check_fits(f"one sequence of max_model_len={options.model_len(config)}: the {KVCache.WHAT} ({per_seq} x "
                   f"{per_block} bytes)", per_seq * per_block, device, now=False, fix="lower max_model_len")
    if options.prefill_graph_lengths and cache is not StatePool:
        raise ConfigError(f"prefill_graph_lengths={options.prefill_graph_lengths}: prefill graphs serve recurrent "
                          f"(Mamba-2) models only, not {config.model_type}")
