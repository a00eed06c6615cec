"""A model's operator problems, from its forward traced once on meta tensors.

`traced_problems` builds the family's model with empty weights on the ``meta`` device (nothing allocated, no
checkpoint read) and runs, under `infiniops_py.dispatch.observing`, the kinds of step the engine runs, at the
sizes that decide the problem fields:

- attention models (a paged KV cache): a prefill of one token and one of ``model_len`` tokens (a window the
  keys can outnumber is local only there), a decode step whose block table holds one block and one that holds
  ``blocks_per_seq`` (the cache capacity a decode sees), and a step mixing a decode with a prefill;
- recurrent models (a state pool): a decode step, a one-token prompt and a longer one, each also as a prefill
  graph's padded prompt (``seq_idx``; a one-token prompt's conv is not channel-last), two prompts packed
  (``cu_seqlens``), and a step mixing a decode with a prompt.

Each step ends with the LM head over its last tokens, as `infinilm.engine.runner.Runner.run` does. Every call runs
the operator's whole contract on meta tensors and the built-in ``meta`` provider (which no ``use(...)`` scope
reaches); the problems are those of the dispatch keys, moved to the options' device, without size bucket. The
gates resolve them, so what they check is what the forward calls: nothing lists the problems by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import torch

from infinilm.config import EngineOptions, ModelConfig
from infinilm.engine.state_pool import StatePool
from infinilm.layers.attention import AttnContext
from infinilm.layers.ssm import SsmContext, prefill_starts
from infinilm.models.family import CausalLM, GatePlan
from infinilm.models.registry import family_of
from infiniops_py import Problem
from infiniops_py.dispatch import Dispatched, observing

__all__ = ["traced_problems"]

_META: Final = "meta"  # the device of the trace: shapes, no memory
_I32: Final = torch.int32
_I64: Final = torch.int64


def _ints(*shape: int, dtype: torch.dtype = _I64) -> torch.Tensor:
    """An index tensor of `shape` on meta (its values are never read)."""
    return torch.empty(shape, dtype=dtype, device=_META)


@dataclass
class _PagedKV:
    """Per-layer meta caches ``[num_blocks, block_size, Hkv, D]``, as `infinilm.engine.kv_cache.KVCache` holds."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]


def _attention_steps(model: Any, config: ModelConfig, options: EngineOptions,
                     dtype: torch.dtype) -> Iterator[Callable[[], torch.Tensor]]:
    """The steps of an attention model (see the module doc), each returning the hidden states of its last tokens."""
    bs, width = options.block_size, options.blocks_per_seq(config)
    shape = (width, bs, config.num_kv_heads, config.head_dim)
    cache = _PagedKV([torch.empty(shape, dtype=dtype, device=_META) for _ in range(config.num_layers)],
                     [torch.empty(shape, dtype=dtype, device=_META) for _ in range(config.num_layers)])

    def step(decodes: int, blocks: int, prompt: int) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            t = decodes + prompt
            ctx = AttnContext(slot_mapping=_ints(t), num_decode=decodes)
            if decodes:
                ctx.context_lens = ctx.cache_seqlens = _ints(decodes, dtype=_I32)
                ctx.block_tables = _ints(decodes, blocks, dtype=_I32)
            if prompt:
                ctx.cu_seqlens, ctx.max_seqlen = _ints(2, dtype=_I32), prompt
            hidden = model.forward(_ints(t), _ints(t), ctx, cache)
            return hidden[-(decodes + (1 if prompt else 0)):]
        return run

    yield step(0, 0, 1)
    yield step(0, 0, options.model_len(config))
    yield step(1, 1, 0)
    yield step(1, width, 0)
    yield step(1, width, 1)


def _recurrent_steps(model: Any, config: ModelConfig, options: EngineOptions,
                     dtype: torch.dtype) -> Iterator[Callable[[], torch.Tensor]]:
    """The steps of a recurrent model (see the module doc), each returning the hidden states of its last tokens."""
    pool = StatePool(config, 2, options.model_len(config), dtype=dtype, device=_META)

    def step(decodes: int, prompts: tuple[int, ...], *, padded: bool = False) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            t = decodes + sum(prompts)
            ctx = SsmContext(num_decode=decodes)
            if decodes:
                ctx.decode_rows = _ints(decodes)
            if prompts:
                ctx.prefill_rows = _ints(len(prompts))
            if len(prompts) > 1:
                ctx.cu_seqlens = _ints(len(prefill_starts(list(prompts))), dtype=_I32)
            if padded:
                ctx.seq_idx = _ints(1, t, dtype=_I32)
            hidden = model.forward(_ints(t), ctx, pool)
            return hidden[-(decodes + len(prompts)):]
        return run

    yield step(1, ())
    yield step(0, (1,))
    yield step(0, (4,))
    yield step(0, (1,), padded=True)
    yield step(0, (4,), padded=True)
    yield step(0, (2, 3))
    yield step(1, (2,))


def traced_problems(config: ModelConfig, options: EngineOptions, plan: GatePlan) -> list[Problem]:
    """Every problem the model of `config` calls under `options` with the path choices of `plan`, in call order,
    each once, on the device of `options` and in its dtype, without size bucket.

    `config` is the one the model is built from (one rank's heads, `TensorParallel.local_config`, when split;
    the collectives of a split are not traced: `infinilm.distributed.parallel.parallel_problems` adds them).
    Reads no weight and allocates no memory.

    Raises:
        ConfigError: no family serves ``config.model_type``. ContractError: the forward calls an operator with
            arguments its contract refuses, whatever the provider (a bug of the model, not a gate rejection).
    """
    family = family_of(config.model_type)
    dtype = options.resolved_dtype(config)
    device_type = torch.device(options.device).type
    model: CausalLM = family.model(config, plan, dtype=dtype, device=torch.device(_META),
                                   max_len=options.model_len(config))
    steps = (_recurrent_steps if family.recurrent else _attention_steps)(model, config, options, dtype)
    seen: dict[Problem, None] = {}

    def record(call: Dispatched) -> None:
        found = call.spec.problem_from_key(call.key)
        seen.setdefault(Problem(found.op, device_type, found.dtype, found.fields))

    with torch.inference_mode(), observing(record):
        for run in steps:
            model.logits(run())
    return list(seen)

