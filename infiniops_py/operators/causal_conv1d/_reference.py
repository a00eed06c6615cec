"""causal_conv1d's literal references: the oracle of the conformance suite (on float64 copies of the inputs)
and the ``reference`` provider's implementations; `run_ids`, the sequence runs of ``seq_idx``, which the
providers share."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py.operators.causal_conv1d._checks import ConvVarlen

__all__ = ["reference", "reference_update", "run_ids"]


def _work(dtype: torch.dtype) -> torch.dtype:
    """The dtype the references compute in: float64 for float64 weights, else float32 (x is first cast to the
    weight dtype, as the peer's reference does); each output is rounded once, when it is written (issue #30)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def run_ids(seq_idx: torch.Tensor) -> torch.Tensor:
    """int64 [B, L] run numbers: ``r[t] == r[s]`` exactly when `seq_idx` does not change between s and t."""
    changes = (seq_idx[:, 1:] != seq_idx[:, :-1]).long()
    first = torch.zeros(seq_idx.shape[0], min(seq_idx.shape[1], 1), dtype=torch.long, device=seq_idx.device)
    return torch.cat([first, changes.cumsum(1)], dim=1)


def reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    out: torch.Tensor,
    final_states: torch.Tensor | None,
    varlen: ConvVarlen | None = None,
) -> None:
    """Literal reference: each output column the masked dot of its W-tap window, summed one tap at a time
    over all columns at once (W steps, not L: the conformance suite runs it at L = 4096 on the GPU). The
    packed form runs `reference_update` per sequence (`_reference_varlen`). Computed in float32 (float64 for
    float64 weights) and rounded once into `out`."""
    if varlen is not None:
        _reference_varlen(x, weight, bias, activation, out, varlen)
        return
    batch, dim, length = x.shape
    width = weight.shape[1]
    work = _work(weight.dtype)
    xw = x.to(weight.dtype).to(work)
    if initial_states is None:
        head = torch.zeros(batch, dim, width - 1, dtype=work, device=x.device)
    else:
        head = initial_states.to(weight.dtype).to(work)
    xp = torch.cat([head, xw], dim=2)  # column p holds position p - (W-1) of the row
    raw = torch.cat([head.to(x.dtype) if initial_states is None else initial_states, x], dim=2)
    run = run_ids(seq_idx) if seq_idx is not None else torch.zeros(batch, length, dtype=torch.long, device=x.device)
    run_p = torch.cat([run[:, :1].expand(batch, width - 1), run], dim=1)  # runs of xp's columns
    zero = torch.zeros((), dtype=xw.dtype, device=x.device)
    y = torch.zeros(batch, dim, length, dtype=work, device=x.device)
    w = weight.to(work)
    for j in range(width):  # tap j of column t reads xp's column t + j (position t - (W-1) + j)
        same = (run_p[:, j:j + length] == run)[:, None, :]  # [B, 1, L]: the same sequence as column t
        y = y + torch.where(same, xp[:, :, j:j + length], zero) * w[:, j, None]
    if bias is not None:
        y = y + bias.to(work)[:, None]
    if activation == "silu":
        y = F.silu(y)
    if seq_idx is not None:
        y = torch.where(seq_idx[:, None, :] < 0, torch.zeros_like(y), y)
    out.copy_(y)
    if final_states is not None:
        keep = (run_p[:, length:] == run[:, -1:])[:, None, :]
        final_states.copy_(torch.where(keep, raw[:, :, length:], torch.zeros_like(raw[:, :, length:])))


def _reference_varlen(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
                      out: torch.Tensor, varlen: ConvVarlen) -> None:
    """Sequence by sequence (bounds read on the host): `reference_update` of its columns against its slot,
    zeroed first unless it has an initial state; a negative (or, unchecked, out-of-range) slot outputs 0."""
    states, starts = varlen.conv_states, varlen.query_start_loc.tolist()
    tokens = x.shape[2]
    for i in range(len(starts) - 1):
        lo, hi = min(max(starts[i], 0), tokens), min(max(starts[i + 1], 0), tokens)
        slot = i if varlen.cache_indices is None else int(varlen.cache_indices[i])
        if not 0 <= slot < states.shape[0]:
            out[:, :, lo:hi] = 0
            continue
        keep = varlen.has_initial_state is not None and bool(varlen.has_initial_state[i])
        state = states[slot:slot + 1].clone() if keep else torch.zeros_like(states[slot:slot + 1])
        if hi > lo:
            reference_update(x[:, :, lo:hi], state, weight, bias, activation, None, out[:, :, lo:hi])
        states[slot] = state[0]


def reference_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    conv_state_indices: torch.Tensor | None,
    out: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
) -> None:
    """Literal reference: row by row, append x to the slot, convolve the new columns, keep the last S; with
    `cache_seqlens`, read the W-1 columns before the write position and write the new columns one at a
    time, circularly (indices and positions are read on the host, one at a time: it synchronizes on CUDA).
    Computed in float32 (float64 for float64 weights) and rounded once into `out`."""
    slots, _, state_len = conv_state.shape
    width = weight.shape[1]
    work = _work(weight.dtype)
    w = weight.to(work)
    b_work = None if bias is None else bias.to(work)
    length = x.shape[2]
    for b in range(x.shape[0]):
        slot = b if conv_state_indices is None else int(conv_state_indices[b])
        if not 0 <= slot < slots:
            out[b] = 0
            continue
        if cache_seqlens is None:
            full = torch.cat([conv_state[slot], x[b]], dim=1)  # [D, S + L], x's dtype
        else:
            pos = int(cache_seqlens[b]) % state_len
            before = [(pos - (width - 1) + k) % state_len for k in range(width - 1)]
            full = torch.cat([conv_state[slot][:, before], x[b]], dim=1)  # [D, W-1 + L]
        fw = full.to(weight.dtype).to(work)
        for t in range(length):
            end = full.shape[1] - length + t + 1
            y = (fw[:, end - width:end] * w).sum(-1)
            if b_work is not None:
                y = y + b_work
            out[b, :, t] = F.silu(y) if activation == "silu" else y
        if cache_seqlens is None:
            conv_state[slot] = full[:, -state_len:]
        else:
            for t in range(length):  # in order: a later column overwrites an earlier one
                conv_state[slot][:, (pos + t) % state_len] = x[b, :, t]
