"""Mamba-2 selective scan in plain PyTorch: the chunked SSD ("minimal SSD") form, in float32.

The sequence is cut into chunks of T steps. Within a chunk the scan is a masked attention-like product,
``y_t = sum_{s<=t} (C_t . B_s) exp(a_{s+1} + ... + a_t) dt_s x_s`` with ``a = dt * A``; each chunk also
leaves a local end state; one small product over the chunks passes the states along (with the initial
states in front), and each chunk adds its entering state's contribution ``exp(a_1 + ... + a_t) C_t . h``.
``seq_idx`` is handled by run numbers (`run_ids`): a term counts only when both of its ends lie in one run.

A packed row (cu_seqlens) is laid on a grid whose chunks never span two sequences (`_Grid`, as vLLM's
varlen SSD cuts its chunks): each sequence starts a chunk, so its initial state is the state entering that
chunk, the state passing restarts there, and its final state is the state after its last chunk. The grid
has at most ``L // T + S`` chunks, a bound known from the shapes, so nothing is read on the host.
The decode step gathers the rows' slots, advances them one step and writes them back without a host sync.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_py.operators.causal_conv1d import run_ids
from infiniops_py.operators.selective_scan import ScanVarlen, process_dt, state_dtype, untied_view
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY
from infiniops_torch.causal_conv1d import gather_rows, scatter_rows

__all__ = ["IMPLEMENTATIONS", "selective_scan", "selective_state_update"]


def _decay(diff: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``exp(diff)`` where `keep`, else 0 (masked before the exp, so no overflow leaks)."""
    return torch.exp(diff.masked_fill(~keep, float("-inf")))


def _skip_and_gate(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None) -> torch.Tensor:
    if D is not None:
        d = D.to(y.dtype)
        y = y + (d[:, None] if d.dim() == 1 else d) * x.to(y.dtype)
    if z is not None:
        y = y * F.silu(z.to(y.dtype))
    return y


class _Grid(NamedTuple):
    """Where a row's tokens sit in a ``[nc, T]`` grid of chunks (the same for every row of a batch).

    Attributes:
        token: int64 [nc, T]: the token of each cell (clamped into range; read through `valid`).
        valid: bool [nc, T]: the cell holds a token (else padding: no step, no input).
        fill: int64 [nc, T]: the token whose run number a cell takes (padding: the chunk's last token).
        before: int64 [nc]: the token whose run the state entering each chunk belongs to.
        first: bool [nc]: the chunk starts a sequence (the state entering it is the sequence's own).
        seq: int64 [nc]: the sequence of each chunk (0 for an unpacked row).
        cell: int64 [L]: the flat cell of each token.
        ends: int64 [S]: for a packed row, the boundary after each sequence's last chunk (its final state).
    """

    token: torch.Tensor
    valid: torch.Tensor
    fill: torch.Tensor
    before: torch.Tensor
    first: torch.Tensor
    seq: torch.Tensor
    cell: torch.Tensor
    ends: torch.Tensor | None


def _regular_grid(length: int, chunk: int, device: torch.device) -> _Grid:
    """Chunk c holds tokens ``c*T .. c*T + T - 1``; the last one is padded."""
    nc = -(-length // chunk)
    flat = torch.arange(nc * chunk, device=device)
    token = flat.clamp(max=length - 1).view(nc, chunk)
    first = torch.zeros(nc, dtype=torch.bool, device=device)
    first[0] = True
    before = (torch.arange(nc, device=device) * chunk - 1).clamp(min=0)
    return _Grid(token, (flat < length).view(nc, chunk), token, before, first, torch.zeros_like(before),
                 flat[:length], None)


def _varlen_grid(cu_seqlens: torch.Tensor, length: int, chunk: int) -> _Grid:
    """Each sequence of `cu_seqlens` [S + 1] takes ``ceil(len / T)`` whole chunks of its own (computed on the
    device: at most ``L // T + S`` chunks, the trailing ones empty)."""
    device = cu_seqlens.device
    # in range and non-decreasing, so that values the checks let through (unchecked mode) give unspecified
    # numbers, never an index out of the grid
    cu = cu_seqlens.long().clamp(0, length).cummax(0).values
    sequences = cu.shape[0] - 1
    lens = (cu[1:] - cu[:-1]).clamp(min=0)
    counts = -(-lens // chunk)  # chunks per sequence
    ends = counts.cumsum(0)  # boundary after each sequence's last chunk
    firsts = ends - counts
    nc = length // chunk + sequences
    c = torch.arange(nc, device=device)
    seq = torch.searchsorted(ends, c, right=True)
    used = seq < sequences
    seq = seq.clamp(max=sequences - 1)
    j = c - firsts[seq]
    start = torch.where(used, cu[seq] + j * chunk, length)
    size = torch.where(used, torch.minimum(cu[seq + 1] - start, torch.full_like(start, chunk)), 0).clamp(min=0)
    k = torch.arange(chunk, device=device)
    raw = start[:, None] + k
    valid = (k < size[:, None]) & (raw >= 0) & (raw < length)
    token = raw.clamp(0, length - 1)
    fill = (start[:, None] + torch.minimum(k, (size - 1).clamp(min=0)[:, None]) - (size == 0)[:, None].long())
    first = used & (j == 0)
    before = torch.where(first, start, start - 1).clamp(0, length - 1)
    t = torch.arange(length, device=device)
    tseq = torch.searchsorted(cu[1:].contiguous(), t, right=True).clamp(max=sequences - 1)
    offset = t - cu[tseq]
    cell = ((firsts[tseq] + offset // chunk) * chunk + offset % chunk).clamp(0, nc * chunk - 1)
    return _Grid(token, valid, fill.clamp(0, length - 1), before, first, seq, cell, ends)


def selective_scan(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    dt_limit: tuple[float, float], initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None,
    chunk_size: int, out: torch.Tensor, final_states: torch.Tensor | None, varlen: ScanVarlen | None = None,
) -> None:
    """x [b, L, H, P], dt [b, L, H], A [H], B/C [b, L, G, N]; fills out and final_states [b, H, P, N]; a
    packed row (`varlen`, b == 1) takes per-sequence initial states [S, H, P, N] and fills the varlen states."""
    batch, length, heads, head_dim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    rep = heads // groups
    cdt = state_dtype(x.dtype)
    if varlen is not None and varlen.cu_seqlens.shape[0] == 1:  # tokens but no sequence (unchecked mode): none
        out.zero_()
        return
    T = min(chunk_size, length)
    grid = _regular_grid(length, T, x.device) if varlen is None else _varlen_grid(varlen.cu_seqlens, length, T)
    nc = grid.token.shape[0]
    flat, keep_cell = grid.token.flatten(), grid.valid.flatten()

    def chunked(t: torch.Tensor) -> torch.Tensor:  # [b, L, ...] -> [b, c, T, ...] in cdt, zero on padding
        g = t.to(cdt).index_select(1, flat)
        g = g.masked_fill(~keep_cell.view(1, -1, *([1] * (t.dim() - 2))), 0.0)
        return g.view(batch, nc, T, *t.shape[2:])

    steps = chunked(process_dt(dt, dt_bias, dt_softplus, dt_limit, cdt))  # [b, c, T, H]; padding: step 0
    xdt = chunked(x).view(batch, nc, T, groups, rep, head_dim) * steps.view(batch, nc, T, groups, rep, 1)
    Bc = chunked(B)  # [b, c, T, G, N]
    Cc = chunked(C)
    acum = (steps * A.to(cdt)).cumsum(dim=2).view(batch, nc, T, groups, rep)  # within each chunk

    # Run numbers (a change of seq_idx starts a run) at each cell, and those of the states entering the chunks
    run = run_ids(seq_idx) if seq_idx is not None else torch.zeros(batch, length, dtype=torch.long, device=x.device)
    run_c = run.index_select(1, grid.fill.flatten()).view(batch, nc, T)
    before = run.index_select(1, grid.before)  # [b, c]
    same_in_chunk = run_c[:, :, :, None] == run_c[:, :, None, :]  # [b, c, t, s]
    to_end = run_c == run_c[:, :, -1:]  # [b, c, s]: s reaches the chunk's end state
    from_start = run_c == before[:, :, None]  # [b, c, t]: the entering state reaches t
    # boundary k (0..nc) is before chunk k; a state sourced there is in run src_run[k], one read there in ends[k]
    ends = torch.cat([before[:, :1], run_c[:, :, -1]], dim=1)  # [b, c+1]
    reset = F.pad(grid.first, (0, 1))  # [c+1]: the state entering chunk k is the sequence's own
    src_run = torch.where(reset, F.pad(before, (0, 1)), ends)

    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    # 1. within chunks: y[t] = sum_{s<=t} (C_t . B_s) exp(acum_t - acum_s) xdt_s
    cb = torch.einsum("bctgn,bcsgn->bcgts", Cc, Bc)
    seg = acum.permute(0, 1, 3, 4, 2)  # [b, c, G, R, T]
    keep = (causal & same_in_chunk)[:, :, None, None]  # [b, c, 1, 1, t, s]
    scores = cb[:, :, :, None] * _decay(seg[..., :, None] - seg[..., None, :], keep)
    y = torch.einsum("bcgrts,bcsgrp->bctgrp", scores, xdt)
    # 2. each chunk's local end state: sum_s exp(acum_end - acum_s) xdt_s B_s^T
    to_end_decay = _decay(seg[..., -1:] - seg, to_end[:, :, None, None])  # [b, c, G, R, s]
    local = torch.einsum("bcgrs,bcsgrp,bcsgn->bcgrpn", to_end_decay, xdt, Bc)
    # 3. pass states across chunks. The state at boundary k, before any restart there:
    #    h_k = local_{k-1} + sum_{j<k} exp(total_j + ... + total_{k-1}) src_j, over the j with no restart in
    #    (j, k) and src_run[j] == ends[k]; src_j is the state entering chunk j: the sequence's initial state
    #    where chunk j starts one (reset), else local_{j-1}.
    shape = (batch, nc + 1, groups, rep, head_dim, d_state)
    if initial_states is None:
        inj = local.new_zeros(1, 1, 1, 1, 1, 1).expand(shape)
    elif varlen is None:
        inj = initial_states.to(cdt).view(batch, 1, groups, rep, head_dim, d_state).expand(shape)
    else:
        inj = initial_states.to(cdt).index_select(0, F.pad(grid.seq, (0, 1))).view(1, *shape[1:])
    diag = torch.cat([inj[:, :1], local], dim=1)  # [b, c+1, G, R, P, N]: local_{k-1}, and inj_0 at k = 0
    src = torch.where(reset.view(1, -1, 1, 1, 1, 1), inj, diag)
    totals = F.pad(seg[..., -1].permute(0, 2, 3, 1), (1, 0)).cumsum(-1)  # [b, G, R, c+1]
    resets = reset.long().cumsum(0)
    no_restart = resets[:, None] - reset.long()[:, None] == resets[None, :]  # [k, j]: none in (j, k)
    strict = torch.ones(nc + 1, nc + 1, dtype=torch.bool, device=x.device).tril(-1)
    chunk_keep = (strict & no_restart)[None] & (src_run[:, None, :] == ends[:, :, None])  # [b, k, j]
    passing = _decay(totals[..., :, None] - totals[..., None, :], chunk_keep[:, None, None])  # [b, G, R, k, j]
    states = diag + torch.einsum("bgrkj,bjgrpn->bkgrpn", passing, src)  # h_k
    entering = torch.where(reset.view(1, -1, 1, 1, 1, 1), inj, states)[:, :-1]
    # 4. the entering state's contribution inside each chunk: exp(acum_t) C_t . h
    from_start_decay = _decay(seg, from_start[:, :, None, None])  # [b, c, G, R, t]
    y = y + torch.einsum("bctgn,bcgrpn,bcgrt->bctgrp", Cc, entering, from_start_decay)
    y = y.reshape(batch, nc * T, heads, head_dim).index_select(1, grid.cell)
    out.copy_(_skip_and_gate(y, x, D, z))
    if final_states is not None:
        final_states.copy_(states[:, -1].reshape(batch, heads, head_dim, d_state))
    if varlen is not None and varlen.varlen_states is not None:
        finals = states[0].index_select(0, grid.ends).reshape(-1, heads, head_dim, d_state)
        empty = (varlen.cu_seqlens[1:] <= varlen.cu_seqlens[:-1]).view(-1, 1, 1, 1)  # their own initial state
        first = torch.zeros_like(finals) if initial_states is None else initial_states.to(cdt)
        varlen.varlen_states.copy_(torch.where(empty, first, finals))


def selective_state_update(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    state_batch_indices: torch.Tensor | None, out: torch.Tensor,
) -> None:
    """state [slots, H, P, N] (any float dtype) in place, x [B, H, P], dt [B, H] or [B, H, P], A [H] or
    [H, P, N], B/C [B, G, N]; fills out [B, H, P]. dt is not clamped (mamba's ``selective_state_update``)."""
    batch, heads, head_dim = x.shape
    groups, d_state = B.shape[1], B.shape[2]
    rep = heads // groups
    cdt = torch.float64 if torch.float64 in (x.dtype, state.dtype) else torch.float32
    rows, valid = gather_rows(state, state_batch_indices)
    s = rows.to(cdt).view(batch, groups, rep, head_dim, d_state)
    if dt.dim() == 2 and A.dim() == 1 and (dt_bias is None or dt_bias.dim() == 1):  # one step per head
        step = process_dt(dt, dt_bias, dt_softplus, None, cdt).view(batch, groups, rep, 1, 1)
        decay = torch.exp(step * A.to(cdt).view(1, groups, rep, 1, 1))
    else:  # mamba's untied layouts: a step per (head, channel), a decay per (head, channel, state)
        dt, A, dt_bias = untied_view(dt, A, dt_bias, head_dim, d_state)
        step = process_dt(dt, dt_bias, dt_softplus, None, cdt).view(batch, groups, rep, head_dim, 1)
        decay = torch.exp(step * A.to(cdt).view(1, groups, rep, head_dim, d_state))
    xs = x.to(cdt).view(batch, groups, rep, head_dim, 1)
    s = decay * s + (step * xs) * B.to(cdt).view(batch, groups, 1, 1, d_state)
    y = (s @ C.to(cdt).view(batch, groups, 1, d_state, 1)).view(batch, heads, head_dim)
    y = _skip_and_gate(y, x, D, z)
    out.copy_(y.masked_fill(~valid[:, None, None], 0.0))
    # reshape: s takes the memory order of a strided A (an untied [H, P, N] view), which view cannot merge
    scatter_rows(state, state_batch_indices, s.reshape(batch, heads, head_dim, d_state), valid)


IMPLEMENTATIONS = [
    Implementation("selective_scan", "torch", "torch.selective_scan_ssd",
                   Capability(DEVICES, FLOAT_DTYPES), PRIORITY, selective_scan),
    Implementation("selective_state_update", "torch", "torch.selective_state_update",
                   Capability(DEVICES, FLOAT_DTYPES), PRIORITY, selective_state_update),
]
