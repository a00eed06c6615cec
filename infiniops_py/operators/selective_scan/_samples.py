"""The sample calls of the scan and its decode step (`Operator.sample_inputs`): for the tuner, the benchmarks and
the conformance suite."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from infiniops_py.operators._declare import Sampler

__all__ = ["sample_scan", "sample_update"]


def _scan_inputs(r: Sampler, f: Mapping[str, Any], rows: int, length: int, heads: int) -> tuple[tuple, dict]:
    """x, dt, A, B, C (``[rows, length, ...]``, or ``[rows, ...]`` when `length` is 0: a decode step) and the
    optional D, z, dt_bias of the fields."""
    p, n, g = f["head_dim"], f["d_state"], f["n_groups"]
    lead = (rows, length) if length else (rows,)
    kwargs: dict[str, Any] = {"dt_softplus": f["dt_softplus"]}
    if f["has_D"]:
        kwargs["D"] = r(heads).float()
    if f["has_z"]:
        kwargs["z"] = r(*lead, heads, p)
    if f["has_dt_bias"]:
        kwargs["dt_bias"] = r(heads, scale=0.1).float()
    dt = (r(*lead, heads, scale=0.1).float().abs() + 0.01).to(r.dtype)  # dt >= 0 (the scan clamps, the step not)
    a = -(torch.rand(heads, generator=r.generator) + 0.5).to(r.device)
    return (r(*lead, heads, p), dt, a, r(*lead, g, n), r(*lead, g, n)), kwargs


def sample_scan(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``tokens`` steps of ``num_heads`` heads in one row (two sequences cut by seq_idx or cu_seqlens when asked),
    dt >= 0, A < 0."""
    r, f = Sampler(generator, dtype, device), values
    tokens, heads = f["tokens"], f["num_heads"]
    args, kwargs = _scan_inputs(r, f, 1, tokens, heads)
    kwargs["chunk_size"] = f["chunk_size"]
    n_seq = 2 if tokens >= 2 else 1
    if f["has_seq_idx"] or f["varlen"]:
        cut = tokens // n_seq
        if f["has_seq_idx"]:
            kwargs["seq_idx"] = (torch.arange(tokens, device=r.device) >= cut).to(torch.int32).view(1, tokens)
        if f["varlen"]:
            kwargs["cu_seqlens"] = torch.tensor([0, cut, tokens][-(n_seq + 1):], dtype=torch.int32, device=r.device)
    if f["has_initial_states"]:
        kwargs["initial_states"] = r(n_seq if f["varlen"] else 1, heads, f["head_dim"], f["d_state"]).float()
    kwargs.update(return_final_states=f["return_final_states"], return_varlen_states=f["return_varlen_states"])
    return args, kwargs


def sample_update(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """a decode step of ``batch`` rows of ``num_heads`` heads over states (twice as many slots, picked by
    state_batch_indices, when asked); mamba's untied layouts when asked."""
    r, f = Sampler(generator, dtype, device), values
    batch, heads, p, n = f["batch"], f["num_heads"], f["head_dim"], f["d_state"]
    (x, dt, a, b, c), kwargs = _scan_inputs(r, f, batch, 0, heads)
    if f["untied"]:  # mamba's own layouts, one value per channel: dt [B, H, P], A [H, P, N], dt_bias and D [H, P]
        # (views that only repeat a value per head would be taken as the tied form)
        dt = (r(batch, heads, p, scale=0.1).float().abs() + 0.01).to(r.dtype)
        a = -(torch.rand(heads, p, n, generator=r.generator) + 0.5).to(r.device)
        if "dt_bias" in kwargs:
            kwargs["dt_bias"] = r(heads, p, scale=0.1).float()
        if "D" in kwargs:
            kwargs["D"] = r(heads, p).float()
    slots = 2 * batch if f["has_indices"] else batch
    if f["has_indices"]:
        kwargs["state_batch_indices"] = r.index(batch, slots)
    state = r(slots, heads, p, n).to(getattr(torch, f["state_dtype"]))
    return (state, x, dt, a, b, c), kwargs
