"""causal_conv1d and its decode step in plain PyTorch: a depthwise ``F.conv1d`` in float32.

The prefill pads each row on the left with its initial states (zeros when None) and runs one grouped
convolution; with ``seq_idx`` it instead sums the W shifted columns, each masked where the tap would cross
a change of sequence. The packed form (vLLM's) sums the W shifted columns too, a tap before its sequence's
first column reading the sequence's state slot instead. The decode step gathers the rows' slots, convolves
the appended columns (or, with ``cache_seqlens``, the columns before the circular write position) and
writes the slots back without a host synchronization (`scatter_rows`), so it can run under CUDA-graph
capture.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Between, Capability, Implementation
from infiniops_py.operators.causal_conv1d import MAX_WIDTH, MIN_WIDTH, ConvVarlen, run_ids
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY, put_rows

__all__ = ["IMPLEMENTATIONS", "causal_conv1d", "causal_conv1d_update", "scatter_rows"]


def _compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in dtypes else torch.float32


def causal_conv1d(
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
    """x [B, D, L] (either layout), weight [D, W]; fills out [B, D, L] and final_states [B, D, W-1]; the
    packed form (`varlen`) fills out [1, D, T] and the sequences' state slots (`_varlen`)."""
    if varlen is not None:
        _varlen(x[0], weight, bias, activation, out[0], varlen)
        return
    batch, dim, length = x.shape
    width = weight.shape[1]
    cdt = _compute_dtype(x.dtype, weight.dtype)
    if initial_states is None:
        head = torch.zeros(batch, dim, width - 1, dtype=x.dtype, device=x.device)
    else:
        head = initial_states
    raw = torch.cat([head, x], dim=2)  # [B, D, W-1+L], column p is position p - (W-1)
    xp = raw.to(cdt)
    w = weight.to(cdt)
    b = None if bias is None else bias.to(cdt)
    if seq_idx is None:
        y = F.conv1d(xp, w.unsqueeze(1), b, groups=dim)
    else:
        run = run_ids(seq_idx)
        run_p = torch.cat([run[:, :1].expand(batch, width - 1), run], dim=1)
        y = torch.zeros(batch, dim, length, dtype=cdt, device=x.device)
        if b is not None:
            y += b[:, None]
        for k in range(width):  # tap k reads position t - (W-1-k), masked across a change of sequence
            keep = (run_p[:, k:k + length] == run)[:, None, :]
            tap = torch.where(keep, xp[:, :, k:k + length], torch.zeros((), dtype=cdt, device=x.device))
            y.addcmul_(tap, w[:, k, None])
    if activation == "silu":
        y = F.silu(y)
    if seq_idx is not None:
        y = y.masked_fill((seq_idx < 0)[:, None, :], 0.0)
    out.copy_(y)
    if final_states is not None:
        tail = raw[:, :, length:]
        if seq_idx is not None:
            tail = tail.masked_fill((run_p[:, length:] != run[:, -1:])[:, None, :], 0)
        final_states.copy_(tail)


def _varlen(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
            out: torch.Tensor, varlen: ConvVarlen) -> None:
    """x and out [D, T]: sequence i's columns convolved after its slot's last W-1 columns (zeros without an
    initial state); then each valid slot takes the last S columns of [slot (or zeros) | its columns]."""
    dim, tokens = x.shape
    width = weight.shape[1]
    states_all = varlen.conv_states
    slots, _, state_len = states_all.shape
    cu = varlen.query_start_loc.long()
    nseq = cu.shape[0] - 1
    slot = varlen.cache_indices if varlen.cache_indices is not None else torch.arange(nseq, device=x.device)
    slot_ok = (slot >= 0) & (slot < slots)
    states, _ = gather_rows(states_all, torch.where(slot_ok, slot, -1))  # [nseq, D, S]: zeros where padded
    if varlen.has_initial_state is None:
        states = torch.zeros_like(states)
    else:
        states = states.masked_fill(~(varlen.has_initial_state & slot_ok)[:, None, None], 0)
    cdt = _compute_dtype(x.dtype, weight.dtype)
    if tokens:
        t = torch.arange(tokens, device=x.device)
        tseq = torch.searchsorted(cu[1:].contiguous(), t, right=True).clamp(max=nseq - 1)
        start = cu[tseq]
        xw, w = x.to(cdt), weight.to(cdt)
        y = torch.zeros(dim, tokens, dtype=cdt, device=x.device)
        if bias is not None:
            y += bias.to(cdt)[:, None]
        for k in range(width):  # tap k reads position t - (W-1-k); before the sequence, its slot's columns
            pos = t - (width - 1 - k)
            from_state = states[tseq, :, (state_len + pos - start).clamp(0, state_len - 1)].T.to(cdt)  # [D, T]
            tap = torch.where((pos >= start)[None, :], xw[:, pos.clamp(min=0)], from_state)
            y.addcmul_(tap, w[:, k, None])
        if activation == "silu":
            y = F.silu(y)
        out.copy_(y.masked_fill(~slot_ok[tseq][None, :], 0.0))
    # new slot column c holds position p = end - S + c: x when inside the sequence, else old column c + len
    c = torch.arange(state_len, device=x.device)
    lens = (cu[1:] - cu[:-1]).clamp(min=0)
    keep_old = states.gather(2, (c[None, :] + lens[:, None]).clamp(max=state_len - 1)[:, None, :]
                             .expand(nseq, dim, state_len))
    if tokens:
        p = cu[1:, None] - state_len + c  # [nseq, S]
        from_x = x[:, p.clamp(0, tokens - 1)].permute(1, 0, 2)  # [nseq, D, S]
        new = torch.where((p >= cu[:-1, None])[:, None, :], from_x, keep_old)
    else:
        new = keep_old
    scatter_rows(states_all, torch.where(slot_ok, slot, -1), new, slot_ok)


def scatter_rows(dst: torch.Tensor, index: torch.Tensor | None, rows: torch.Tensor, valid: torch.Tensor) -> None:
    """``dst[index[b]] = rows[b]`` for each b where `valid[b]`, skipping the rest, without a host sync
    (`put_rows`; all of `dst` when `index` is None). Rows are gathered before any is written, so two rows
    naming one slot (rejected in checked mode) both read its old state, and which write lands is undefined.
    """
    if index is None:
        dst.copy_(rows)
        return
    put_rows(dst, (index,), rows, valid)


def gather_rows(src: torch.Tensor, index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src[index], valid)``: rows at invalid indices (negative or >= slots) are zeros; valid is bool [B]."""
    if index is None:
        return src, torch.ones(src.shape[0], dtype=torch.bool, device=src.device)
    valid = (index >= 0) & (index < src.shape[0])
    if src.shape[0] == 0:
        return src.new_zeros(index.shape[0], *src.shape[1:]), valid
    rows = src.index_select(0, torch.where(valid, index.long(), 0))
    return rows.masked_fill(~valid.view(-1, *([1] * (src.dim() - 1))), 0), valid


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    conv_state_indices: torch.Tensor | None,
    out: torch.Tensor,
    cache_seqlens: torch.Tensor | None = None,
) -> None:
    """x [B, D, L], conv_state [slots, D, S] in place (circular with `cache_seqlens` [B]), weight [D, W];
    fills out [B, D, L]."""
    batch, dim, length = x.shape
    state_len = conv_state.shape[2]
    width = weight.shape[1]
    cdt = _compute_dtype(x.dtype, weight.dtype)
    state, valid = gather_rows(conv_state, conv_state_indices)
    if cache_seqlens is None:
        full = torch.cat([state, x], dim=2)  # [B, D, S + L] in x's dtype
        window = full[:, :, state_len + 1 - width:]  # the W-1 columns before the new ones, then them
        new_state = full[:, :, length:]
    else:  # circular: the W-1 columns before the write position, then the new ones written from there on
        pos = cache_seqlens.long().remainder(state_len)[:, None]  # [B, 1]
        before = (pos - (width - 1) + torch.arange(width - 1, device=x.device)).remainder(state_len)
        window = torch.cat([state.gather(2, before[:, None, :].expand(batch, dim, width - 1)), x], dim=2)
        offset = (torch.arange(state_len, device=x.device) - pos).remainder(state_len)  # [B, S]: t of column c
        last = offset + state_len * ((length - 1 - offset).clamp(min=0) // state_len)  # the last such t wins
        written = x.gather(2, last.clamp(max=length - 1)[:, None, :].expand(batch, dim, state_len))
        new_state = torch.where((offset < length)[:, None, :], written, state)
    y = F.conv1d(window.to(cdt), weight.to(cdt).unsqueeze(1), None if bias is None else bias.to(cdt), groups=dim)
    if activation == "silu":
        y = F.silu(y)
    out.copy_(y.masked_fill(~valid[:, None, None], 0.0))
    scatter_rows(conv_state, conv_state_indices, new_state, valid)


IMPLEMENTATIONS = [
    Implementation("causal_conv1d", "torch", "torch.causal_conv1d",
                   Capability(DEVICES, FLOAT_DTYPES, Between("width", MIN_WIDTH, MAX_WIDTH)), PRIORITY, causal_conv1d),
    Implementation("causal_conv1d_update", "torch", "torch.causal_conv1d_update",
                   Capability(DEVICES, FLOAT_DTYPES, Between("width", MIN_WIDTH, MAX_WIDTH)), PRIORITY,
                   causal_conv1d_update),
]
