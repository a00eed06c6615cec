"""The selective scan's literal references, one time step at a time in float32 (float64 for float64 inputs):
the oracle of the conformance suite (on float64 copies of the inputs) and the ``reference`` provider's
implementations. They read cu_seqlens and the state indices on the host (a synchronization on CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infiniops_py.operators.selective_scan._common import ScanVarlen, d_term, process_dt, state_dtype, untied_view

__all__ = ["reference", "reference_update"]


def reference(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    dt_limit: tuple[float, float], initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None,
    chunk_size: int, out: torch.Tensor, final_states: torch.Tensor | None, varlen: ScanVarlen | None = None,
) -> None:
    """Literal reference: the sequential recurrence, one time step at a time (`chunk_size` is unused); a
    packed row restarts at each sequence start from that sequence's initial state (cu_seqlens is read on
    the host: it synchronizes on CUDA)."""
    batch, length, heads, head_dim = x.shape
    d_state = B.shape[3]
    cdt = state_dtype(x.dtype)
    rep = heads // B.shape[2]
    xs = x.to(cdt)
    steps = process_dt(dt, dt_bias, dt_softplus, dt_limit, cdt)  # [Bt, L, H]
    a = A.to(cdt)
    bh = B.to(cdt).repeat_interleave(rep, dim=2)  # [Bt, L, H, N]
    ch = C.to(cdt).repeat_interleave(rep, dim=2)
    zeros = torch.zeros(batch, heads, head_dim, d_state, dtype=cdt, device=x.device)
    if varlen is None:
        state = zeros if initial_states is None else initial_states.to(cdt)
        starts: dict[int, int] = {}
        ends: dict[int, int] = {}
    else:  # sequence i begins at token cu[i] and ends at cu[i + 1] - 1 (the last of equal starts wins)
        cu = varlen.cu_seqlens.tolist()
        starts = {cu[i]: i for i in range(len(cu) - 1) if cu[i] < cu[i + 1]}
        ends = {cu[i + 1] - 1: i for i in range(len(cu) - 1) if cu[i] < cu[i + 1]}
        state = zeros

    def initial(i: int) -> torch.Tensor:
        return zeros[0] if initial_states is None else initial_states[i].to(cdt)

    if varlen is not None and varlen.varlen_states is not None:
        for i in range(varlen.varlen_states.shape[0]):  # empty sequences keep their initial state
            varlen.varlen_states[i] = initial(i)
    ys = []
    for t in range(length):
        if t in starts:
            state = initial(starts[t])[None]
        elif seq_idx is not None and t > 0:
            restart = (seq_idx[:, t] != seq_idx[:, t - 1])[:, None, None, None]
            state = torch.where(restart, torch.zeros_like(state), state)
        step = steps[:, t, :, None, None]  # [Bt, H, 1, 1]
        state = torch.exp(step * a[:, None, None]) * state + step * xs[:, t, :, :, None] * bh[:, t, :, None, :]
        ys.append((state * ch[:, t, :, None, :]).sum(-1))  # [Bt, H, P]
        if t in ends and varlen is not None and varlen.varlen_states is not None:
            varlen.varlen_states[ends[t]] = state[0]
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + d_term(D, xs)
    if z is not None:
        y = y * F.silu(z.to(cdt))
    out.copy_(y)
    if final_states is not None:
        final_states.copy_(state)


def reference_update(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    state_batch_indices: torch.Tensor | None, out: torch.Tensor,
) -> None:
    """Literal reference: row by row, one unclamped step of the recurrence on the row's slot, in the untied
    form (the indices are read on the host, one at a time: it synchronizes on CUDA)."""
    slots, _, head_dim, d_state = state.shape
    cdt = torch.float64 if torch.float64 in (x.dtype, state.dtype) else torch.float32
    rep = x.shape[1] // B.shape[1]
    dt, A, dt_bias = untied_view(dt, A, dt_bias, head_dim, d_state)
    steps = process_dt(dt, dt_bias, dt_softplus, None, cdt)  # [B, H, P]
    a = A.to(cdt)  # [H, P, N]
    for b in range(x.shape[0]):
        slot = b if state_batch_indices is None else int(state_batch_indices[b])
        if not 0 <= slot < slots:
            out[b] = 0
            continue
        xb = x[b].to(cdt)
        bh = B[b].to(cdt).repeat_interleave(rep, dim=0)  # [H, N]
        ch = C[b].to(cdt).repeat_interleave(rep, dim=0)
        step = steps[b, :, :, None]  # [H, P, 1]
        s = torch.exp(step * a) * state[slot].to(cdt) + step * xb[:, :, None] * bh[:, None, :]
        y = (s * ch[:, None, :]).sum(-1)
        if D is not None:
            y = y + d_term(D, xb)
        if z is not None:
            y = y * F.silu(z[b].to(cdt))
        state[slot] = s
        out[b] = y
