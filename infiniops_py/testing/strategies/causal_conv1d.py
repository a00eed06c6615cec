"""Strategies for causal_conv1d and its decode step, after causal-conv1d's ``tests/test_causal_conv1d.py``.

The peer's grid scaled down: dims up to 128 (odd ones too), lengths 1..300 with the peer's odd ones (129,
151), widths {2, 3, 4} (and a few wider ones the contract allows), bias, silu, channel-last views,
initial/final states (now and then into a caller's ``final_states_out``, possibly a transposed view),
``seq_idx`` packing several sequences with trailing -1 padding; vLLM's packed form (``query_start_loc``:
up to 5 sequences, empty ones included, over slots of ``conv_states`` with state lengths in [W-1, W+3],
-1 padded ``cache_indices`` or none, random ``has_initial_state``); the update with a state length in
[W-1, W+3], one or a few new tokens, slots gathered through indices with -1 padding, the vLLM state
layout (a transposed view), and causal-conv1d's circular state (``cache_seqlens`` up to 3 S, so L > S
happens too). Final and updated conv states are copies of inputs: exact.

On `CaseContext.large` (GPU) runs, the peer's own sizes: dims up to 4128 (Mamba-2's 1792 among them),
lengths up to 4096 (1134 among them) with up to 4 rows, at most 2**25 elements per input, widths {2, 3, 4}
favored; the update with up to 64 rows over up to 128 slots, state lengths up to W+10.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES", "cut", "padded_indices", "segments"]

_WIDTHS = (2, 3, 4, 5, 8, 16)
_DIMS = (1, 8, 48, 64, 96, 127, 128)
_LENGTHS = (1, 2, 3, 8, 31, 64, 129, 151, 300)
_FLAGS = (False, True)
# large (GPU) runs
_PEER_WIDTHS = (2, 3, 4)
_LARGE_DIMS = (*_DIMS, 768, 1536, 1792, 2048, 4096, 4128)
_LARGE_LENGTHS = (*_LENGTHS, 512, 1134, 2048, 4096)
_LARGE_ELEMENTS = 2**25


def segments(gen: torch.Generator, batch: int, length: int, count: int, padding: bool) -> torch.Tensor:
    """int32 [batch, length] sequence ids: `count` runs per row cut at random points, numbered from 0;
    with `padding`, up to a quarter of each row's tail is -1."""
    rows = []
    for _ in range(batch):
        ids = torch.zeros(length, dtype=torch.int32)
        for start in (torch.randperm(max(length - 1, 0), generator=gen)[: count - 1] + 1).tolist():
            ids[start:] += 1
        if padding:
            pad = int(torch.randint(0, length // 4 + 1, (1,), generator=gen))
            ids[length - pad:] = -1
        rows.append(ids)
    return torch.stack(rows)


def padded_indices(gen: torch.Generator, batch: int, slots: int, padding: float) -> torch.Tensor:
    """int64 [batch] distinct slots in [0, slots), each replaced by -1 with probability `padding`."""
    index = torch.randperm(slots, generator=gen)[:batch]
    return index.masked_fill(torch.rand(batch, generator=gen) < padding, -1)


def cut(gen: torch.Generator, total: int, count: int) -> list[int]:
    """`count` lengths summing to `total`, cut at random points (some may be 0)."""
    points = sorted(torch.randint(0, total + 1, (count - 1,), generator=gen).tolist())
    return [b - a for a, b in zip([0, *points], [*points, total], strict=True)]


def _packed_case(ctx: CaseContext, gen: torch.Generator, width: int, has_bias: bool, silu: bool,
                 channel_last: bool) -> Case:
    """vLLM's continuous-batching prefill: sequences packed along x [D, T], states in conv_states slots."""
    dim = ctx.draw(st.sampled_from(_LARGE_DIMS if ctx.large else _DIMS))
    nseq = ctx.draw(st.integers(1, 5))
    lengths = cut(gen, ctx.draw(st.integers(0, 2048 if ctx.large else 160)), nseq)
    tokens = sum(lengths)
    ctx.record("max_length", max(lengths))
    state_len = ctx.draw(st.integers(width - 1, width + 3))
    slots = nseq + ctx.draw(st.integers(0, 3))

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return randn(*shape, dtype=ctx.dtype, device=ctx.device, scale=scale, generator=gen)

    x = rand(tokens, dim).t() if channel_last else rand(dim, tokens)
    states = rand(slots, state_len, dim).transpose(1, 2) if ctx.draw(st.booleans()) else rand(slots, dim, state_len)
    starts = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    kwargs: dict[str, object] = {"activation": "silu" if silu else None, "conv_states": states,
                                 "query_start_loc": starts.to(ctx.device),
                                 "has_initial_state": (torch.rand(nseq, generator=gen) < 0.5).to(ctx.device)}
    note = f"packed D={dim} lengths={lengths} W={width} S={state_len} slots={slots}"
    if slots > nseq or ctx.draw(st.booleans()):
        index = padded_indices(gen, nseq, slots, ctx.draw(st.sampled_from((0.0, 0.25))))
        kwargs["cache_indices"] = index.to(ctx.draw(st.sampled_from((torch.int32, torch.int64)))).to(ctx.device)
        note += f" padding={int((index < 0).sum())}"
    weight = rand(dim, width, scale=width**-0.5)
    bias = rand(dim) if has_bias else None
    return Case((x, weight, bias), kwargs, mutated=("conv_states",), exact=(1,), note=note)


def causal_conv1d_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    width = ctx.pick("width", _WIDTHS, _PEER_WIDTHS)
    has_bias, silu = ctx.pick("has_bias", _FLAGS), ctx.pick("silu", _FLAGS)
    channel_last = ctx.pick("channel_last", _FLAGS)
    if ctx.pick("varlen", _FLAGS):
        return _packed_case(ctx, gen, width, has_bias, silu, channel_last)
    has_seq_idx, has_init = ctx.pick("has_seq_idx", _FLAGS), ctx.pick("has_initial_states", _FLAGS)
    final = ctx.pick("return_final_states", _FLAGS)
    if ctx.large:
        dim = ctx.draw(st.sampled_from(_LARGE_DIMS))
        length = ctx.draw(st.one_of(st.sampled_from(_LARGE_LENGTHS), st.integers(1, 4096)))
        batch = ctx.draw(st.integers(1, max(1, min(4, _LARGE_ELEMENTS // (dim * length)))))
    else:
        batch, dim = ctx.draw(st.integers(1, 3)), ctx.draw(st.sampled_from(_DIMS))
        length = ctx.draw(st.one_of(st.sampled_from(_LENGTHS), st.integers(1, 300)))
    ctx.record("max_length", length)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return randn(*shape, dtype=ctx.dtype, device=ctx.device, scale=scale, generator=gen)

    x = rand(batch, length, dim).transpose(1, 2) if channel_last else rand(batch, dim, length)
    weight = rand(dim, width, scale=width**-0.5)
    bias = rand(dim) if has_bias else None
    kwargs: dict[str, object] = {"activation": "silu" if silu else None}
    note = f"B={batch} D={dim} L={length} W={width}{' channel-last' if channel_last else ''}"
    if has_seq_idx:
        count = ctx.draw(st.integers(1, 4))
        kwargs["seq_idx"] = segments(gen, batch, length, count, ctx.draw(st.booleans())).to(ctx.device)
        note += f" seq_idx({count} runs)"
    if has_init:
        init = rand(batch, width - 1, dim).transpose(1, 2) if channel_last else rand(batch, dim, width - 1)
        kwargs["initial_states"] = init
        note += " initial_states"
    mutated: tuple[str, ...] = ()
    if final:
        kwargs["return_final_states"] = True
        note += " final_states"
        if ctx.draw(st.booleans()):  # causal-conv1d's buffer, written and returned
            transposed = ctx.draw(st.booleans())
            buffer = torch.full((batch, width - 1, dim) if transposed else (batch, dim, width - 1), math.nan,
                                dtype=ctx.dtype, device=ctx.device)
            kwargs["final_states_out"] = buffer.transpose(1, 2) if transposed else buffer
            mutated = ("final_states_out",)
            note += " into final_states_out"
    return Case((x, weight, bias), kwargs, mutated=mutated, exact=(1, 2) if final else (), note=note)


def causal_conv1d_update_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    width = ctx.pick("width", _WIDTHS, _PEER_WIDTHS)
    state_len = ctx.pick("state_len", tuple(range(width - 1, width + (11 if ctx.large else 4))))
    has_bias, silu = ctx.pick("has_bias", _FLAGS), ctx.pick("silu", _FLAGS)
    has_indices = ctx.pick("has_indices", _FLAGS)
    circular = ctx.pick("has_cache_seqlens", _FLAGS)
    if ctx.large:
        batch, dim = ctx.draw(st.integers(1, 64)), ctx.draw(st.sampled_from(_LARGE_DIMS))
    else:
        batch, dim = ctx.draw(st.integers(1, 4)), ctx.draw(st.sampled_from(_DIMS))
    length = ctx.draw(st.sampled_from((None, None, 1, 2, 4)))  # None: one token, x [B, D]
    slots = batch + (ctx.draw(st.integers(0, 64 if ctx.large else 4)) if has_indices else 0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return randn(*shape, dtype=ctx.dtype, device=ctx.device, scale=scale, generator=gen)

    x = rand(batch, dim) if length is None else rand(batch, dim, length)
    vllm_layout = ctx.draw(st.booleans())
    conv_state = rand(slots, state_len, dim).transpose(1, 2) if vllm_layout else rand(slots, dim, state_len)
    weight = rand(dim, width, scale=width**-0.5)
    bias = rand(dim) if has_bias else None
    kwargs: dict[str, object] = {"activation": "silu" if silu else None}
    note = (f"B={batch} D={dim} L={length or '-'} W={width} S={state_len} slots={slots}"
            f"{' state[slots, S, D]^T' if vllm_layout else ''}")
    if has_indices:
        index = padded_indices(gen, batch, slots, ctx.draw(st.sampled_from((0.0, 0.25, 0.5))))
        kwargs["conv_state_indices"] = index.to(torch.int32).to(ctx.device)
        note += f" padding={int((index < 0).sum())}"
    if circular:
        seqlens = torch.randint(0, 3 * state_len + 1, (batch,), generator=gen)
        kwargs["cache_seqlens"] = seqlens.to(ctx.draw(st.sampled_from((torch.int32, torch.int64)))).to(ctx.device)
        note += f" cache_seqlens={seqlens.tolist()}"
    return Case((x, conv_state, weight, bias), kwargs, mutated=(1,), exact=(1,), note=note)


STRATEGIES = {"causal_conv1d": causal_conv1d_case, "causal_conv1d_update": causal_conv1d_update_case}
