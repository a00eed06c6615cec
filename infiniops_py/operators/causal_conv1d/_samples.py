"""The sample calls of the conv and its decode step (`Operator.sample_inputs`): for the tuner, the benchmarks and
the conformance suite."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from infiniops_py.operators._declare import Sampler

__all__ = ["sample_conv", "sample_update"]


def sample_conv(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``x [1, dim, tokens]`` (a channel-last view when asked) and a weight ``[dim, width]``; two sequences cut by
    seq_idx, initial states, or vLLM's packed prefill of 4 sequences, as the fields ask."""
    r, f = Sampler(generator, dtype, device), values
    tokens, dim, width = f["tokens"], f["dim"], f["width"]
    weight = r(dim, width, scale=width ** -0.5)
    kwargs: dict[str, Any] = {"activation": "silu" if f["silu"] else None}
    if f["has_bias"]:
        kwargs["bias"] = r(dim)
    if f["varlen"]:  # vLLM's packed prefill: 4 sequences in one row, each with its own state slot
        n = min(4, tokens)
        x = r(dim, tokens)
        kwargs.update(conv_states=r(n, dim, width - 1), cache_indices=torch.arange(n, dtype=torch.int32,
                                                                                   device=r.device),
                      query_start_loc=torch.linspace(0, tokens, n + 1).round().to(torch.int32).to(r.device),
                      has_initial_state=torch.ones(n, dtype=torch.bool, device=r.device))
        return (x, weight), kwargs
    x = r(1, tokens, dim).transpose(1, 2) if f["channel_last"] else r(1, dim, tokens)
    if f["has_seq_idx"]:  # two sequences in the row
        kwargs["seq_idx"] = (torch.arange(tokens, device=r.device) >= tokens // 2).to(torch.int32).view(1, tokens)
    if f["has_initial_states"]:
        kwargs["initial_states"] = r(1, width - 1, dim).transpose(1, 2)
    kwargs["return_final_states"] = f["return_final_states"]
    return (x, weight), kwargs


def sample_update(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """a decode step ``x [batch, dim]`` over conv states (twice as many slots, picked by conv_state_indices, when
    asked)."""
    r, f = Sampler(generator, dtype, device), values
    batch, dim, width = f["batch"], f["dim"], f["width"]
    slots = 2 * batch if f["has_indices"] else batch
    kwargs: dict[str, Any] = {"activation": "silu" if f["silu"] else None}
    if f["has_bias"]:
        kwargs["bias"] = r(dim)
    if f["has_indices"]:
        kwargs["conv_state_indices"] = r.index(batch, slots).to(torch.int32)
    if f["has_cache_seqlens"]:
        kwargs["cache_seqlens"] = torch.full((batch,), 7, dtype=torch.int32, device=r.device)
    return (r(batch, dim), r(slots, dim, f["state_len"]), r(dim, width, scale=width ** -0.5)), \
        kwargs
