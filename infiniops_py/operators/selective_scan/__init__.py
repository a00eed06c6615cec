"""Selective scan with Mamba-2 SSD semantics, prefill and one decode step.

Implementation calling conventions:
  selective_scan: fn(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, seq_idx,
    chunk_size, out, final_states[, varlen]) -> None; out like x [Bt, L, H, P] in x.dtype; final_states None
    or fp32 [Bt, H, P, N] to fill. The trailing `ScanVarlen` is passed only for a packed call (cu_seqlens;
    then Bt == 1, final_states is None and initial_states is None or per sequence [S, H, P, N]).
  selective_state_update: fn(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, out)
    -> None; state [slots, H, P, N] in place (float32 unless the problem's state_dtype says otherwise);
    out [B, H, P] in x.dtype. With ``untied``, dt may be [B, H, P], A [H, P, N] and dt_bias [H, P]
    (any strides, zero strides included); else dt [B, H], A [H], dt_bias [H].
Problem fields: selective_scan: head_dim (P), d_state (N), n_groups, chunk_size, has_D, has_z,
  has_dt_bias, dt_softplus, has_seq_idx, has_initial_states, return_final_states, varlen (cu_seqlens given),
  return_varlen_states; selective_state_update: head_dim, d_state, n_groups, has_D, has_z, has_dt_bias,
  dt_softplus, has_indices, untied (a per-channel dt, A or dt_bias), state_dtype.
Size bucket: selective_scan: tokens, the `size_class` (power of two at or above) of Bt * L;
  selective_state_update: batch, the `size_class` of B.

Semantics (peers: mamba_ssm's ``mamba_chunk_scan_combined`` and ``selective_state_update``, vLLM's SSD):
  per step t, head h of group ``g = h // (H // G)``::

    dt    <- softplus(dt + dt_bias)     (softplus when asked; it passes values above 20 through)
    dt    <- clamp(dt, *dt_limit)       (selective_scan only)
    state <- exp(dt * A[h]) * state + dt * outer(x[t, h], B[t, g])             state [P, N]
    y[t, h] = state @ C[t, g] + D[h] * x[t, h],  then * silu(z[t, h]) when z is given

  `selective_scan` always clamps, so its default ``dt_limit=(0, inf)`` turns a negative step into 0, as
  mamba's SSD scan does. `selective_state_update` never clamps: mamba's ``selective_state_update`` (its
  reference and its Triton kernel) has no ``dt_limit``, and a negative ``dt + dt_bias`` without softplus
  stays negative; for dt >= 0 it is one step of `selective_scan`. ``seq_idx`` zeroes the state where its
  value changes from t-1 to t; the initial states belong to the row's first sequence and the final states
  to its last. ``cu_seqlens`` packs sequences in one row: each starts from its own initial state (or zero)
  and ``return_varlen_states`` returns each one's final state. States and arithmetic are float32 (float64
  when x is float64, the oracle's precision); outputs have x's dtype.

The package: `_scan` holds `selective_scan` and its spec, `_update` `selective_state_update` and its spec,
`_checks` the checks both share, `_common` what the entry points, the references and the providers share
(the packed form's type, the state dtype, the step-size rule, the untied view, the D term), `_reference` the
literal references.
"""

from __future__ import annotations

from infiniops_py.operators.selective_scan._common import ScanVarlen, process_dt, state_dtype, untied_view
from infiniops_py.operators.selective_scan._reference import reference, reference_update
from infiniops_py.operators.selective_scan._scan import SPEC, selective_scan
from infiniops_py.operators.selective_scan._update import SPEC_UPDATE, selective_state_update

__all__ = ["SPEC", "SPECS", "SPEC_UPDATE", "ScanVarlen", "process_dt", "reference", "reference_update",
           "selective_scan", "selective_state_update", "state_dtype", "untied_view"]

SPECS = (SPEC, SPEC_UPDATE)
