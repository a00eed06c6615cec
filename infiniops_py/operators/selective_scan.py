"""Selective scan with Mamba-2 SSD semantics, prefill and one decode step (DESIGN.md op 8).

Implementation calling conventions:
  selective_scan: fn(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, seq_idx,
    chunk_size, out, final_states) -> None; out like x [Bt, L, H, P] in x.dtype; final_states None or fp32
    [Bt, H, P, N] to fill.
  selective_state_update: fn(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, out)
    -> None; state fp32 [slots, H, P, N] in place; out [B, H, P] in x.dtype.
Problem fields: selective_scan: head_dim (P), d_state (N), n_groups, chunk_size, has_D, has_z,
  has_dt_bias, dt_softplus, has_seq_idx, has_initial_states, return_final_states;
  selective_state_update: head_dim, d_state, n_groups, has_D, has_z, has_dt_bias, dt_softplus, has_indices.
"""

from __future__ import annotations

SPECS = ()  # placeholder: the contract module is being written
