"""Mamba-2 selective scan in plain PyTorch: the chunked SSD ("minimal SSD") form, in float32.

The sequence is cut into chunks of T steps. Within a chunk the scan is a masked attention-like product,
``y_t = sum_{s<=t} (C_t . B_s) exp(a_{s+1} + ... + a_t) dt_s x_s`` with ``a = dt * A``; each chunk also
leaves a local end state; one small product over the chunks passes the states along (with the initial
states in front), and each chunk adds its entering state's contribution ``exp(a_1 + ... + a_t) C_t . h``.
``seq_idx`` is handled by run numbers (`run_ids`): a term counts only when both of its ends lie in one run.
The decode step gathers the rows' slots, advances them one step and writes them back without a host sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py import Capability, Implementation
from infiniops_py.operators.causal_conv1d import run_ids
from infiniops_py.operators.selective_scan import process_dt, state_dtype
from infiniops_torch._common import DEVICES, FLOAT_DTYPES, PRIORITY
from infiniops_torch.causal_conv1d import gather_rows, scatter_rows

__all__ = ["IMPLEMENTATIONS", "selective_scan", "selective_state_update"]

_NO_LIMIT = (0.0, float("inf"))


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


def selective_scan(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    dt_limit: tuple[float, float], initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None,
    chunk_size: int, out: torch.Tensor, final_states: torch.Tensor | None,
) -> None:
    """x [b, L, H, P], dt [b, L, H], A [H], B/C [b, L, G, N]; fills out and final_states [b, H, P, N]."""
    batch, length, heads, head_dim = x.shape
    groups, d_state = B.shape[2], B.shape[3]
    rep = heads // groups
    cdt = state_dtype(x.dtype)
    T = min(chunk_size, length)
    nc = -(-length // T)
    pad = nc * T - length

    def chunked(t: torch.Tensor) -> torch.Tensor:  # [b, L, ...] -> [b, c, T, ...], zero-padded, in cdt
        t = t.to(cdt)
        if pad:
            t = torch.cat([t, t.new_zeros(batch, pad, *t.shape[2:])], dim=1)
        return t.reshape(batch, nc, T, *t.shape[2:])

    steps = chunked(process_dt(dt, dt_bias, dt_softplus, dt_limit, cdt))  # [b, c, T, H]; padding: step 0
    xdt = chunked(x).view(batch, nc, T, groups, rep, head_dim) * steps.view(batch, nc, T, groups, rep, 1)
    Bc = chunked(B)  # [b, c, T, G, N]
    Cc = chunked(C)
    acum = (steps * A.to(cdt)).cumsum(dim=2).view(batch, nc, T, groups, rep)  # within each chunk

    if seq_idx is None:
        same_in_chunk = torch.ones(1, 1, T, T, dtype=torch.bool, device=x.device)
        to_end = torch.ones(1, 1, T, dtype=torch.bool, device=x.device)
        from_start = to_end
        bounds_same = torch.ones(1, nc + 1, nc + 1, dtype=torch.bool, device=x.device)
    else:
        run = run_ids(seq_idx)
        if pad:  # padded steps continue the last run, so they change nothing
            run = torch.cat([run, run[:, -1:].expand(batch, pad)], dim=1)
        run_c = run.view(batch, nc, T)
        # run of the position just before each chunk (chunk 0: the initial state, the first run)
        before = torch.cat([run[:, :1], run_c[:, :-1, -1]], dim=1)  # [b, c]
        same_in_chunk = run_c[:, :, :, None] == run_c[:, :, None, :]  # [b, c, t, s]
        to_end = run_c == run_c[:, :, -1:]  # [b, c, s]: s reaches the chunk's end state
        from_start = run_c == before[:, :, None]  # [b, c, t]: the entering state reaches t
        ends = torch.cat([before[:, :1], run_c[:, :, -1]], dim=1)  # [b, c+1]: run at each chunk boundary
        bounds_same = ends[:, :, None] == ends[:, None, :]

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
    # 3. pass states across chunks: h_k = sum_{j<=k} exp(total_j + ... + total_{k-1}) h'_j
    if initial_states is None:
        first = local.new_zeros(batch, 1, groups, rep, head_dim, d_state)
    else:
        first = initial_states.to(cdt).view(batch, 1, groups, rep, head_dim, d_state)
    starts = torch.cat([first, local], dim=1)  # [b, c+1, G, R, P, N]
    totals = F.pad(seg[..., -1].permute(0, 2, 3, 1), (1, 0)).cumsum(-1)  # [b, G, R, c+1]
    chunk_keep = (torch.ones(nc + 1, nc + 1, dtype=torch.bool, device=x.device).tril() & bounds_same)
    passing = _decay(totals[..., :, None] - totals[..., None, :], chunk_keep[:, None, None])  # [b, G, R, k, j]
    states = torch.einsum("bgrkj,bjgrpn->bkgrpn", passing, starts)  # state after chunk k-1
    # 4. the entering state's contribution inside each chunk: exp(acum_t) C_t . h
    from_start_decay = _decay(seg, from_start[:, :, None, None])  # [b, c, G, R, t]
    y = y + torch.einsum("bctgn,bcgrpn,bcgrt->bctgrp", Cc, states[:, :-1], from_start_decay)
    y = y.reshape(batch, nc * T, heads, head_dim)[:, :length]
    out.copy_(_skip_and_gate(y, x, D, z))
    if final_states is not None:
        final_states.copy_(states[:, -1].reshape(batch, heads, head_dim, d_state))


def selective_state_update(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    state_batch_indices: torch.Tensor | None, out: torch.Tensor,
) -> None:
    """state [slots, H, P, N] in place, x [B, H, P], dt [B, H], B/C [B, G, N]; fills out [B, H, P]."""
    batch, heads, head_dim = x.shape
    groups, d_state = B.shape[1], B.shape[2]
    rep = heads // groups
    cdt = torch.float64 if torch.float64 in (x.dtype, state.dtype) else torch.float32
    rows, valid = gather_rows(state, state_batch_indices)
    s = rows.to(cdt).view(batch, groups, rep, head_dim, d_state)
    step = process_dt(dt, dt_bias, dt_softplus, _NO_LIMIT, cdt).view(batch, groups, rep, 1, 1)
    decay = torch.exp(step * A.to(cdt).view(1, groups, rep, 1, 1))
    xs = x.to(cdt).view(batch, groups, rep, head_dim, 1)
    s = decay * s + (step * xs) * B.to(cdt).view(batch, groups, 1, 1, d_state)
    y = (s @ C.to(cdt).view(batch, groups, 1, d_state, 1)).view(batch, heads, head_dim)
    y = _skip_and_gate(y, x, D, z)
    out.copy_(y.masked_fill(~valid[:, None, None], 0.0))
    scatter_rows(state, state_batch_indices, s.view(batch, heads, head_dim, d_state), valid)


IMPLEMENTATIONS = [
    Implementation("selective_scan", "torch", "torch.selective_scan_ssd",
                   Capability(DEVICES, FLOAT_DTYPES), PRIORITY, selective_scan),
    Implementation("selective_state_update", "torch", "torch.selective_state_update",
                   Capability(DEVICES, FLOAT_DTYPES), PRIORITY, selective_state_update),
]
