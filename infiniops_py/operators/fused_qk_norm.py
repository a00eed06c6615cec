"""FusedQkNorm: per-head RmsNorm of the Q and K heads of a packed QKV, in place (DESIGN.md op 4).

Public: fused_qk_norm(qkv, q_weight, k_weight, *, num_q_heads, num_kv_heads, head_dim, eps=1e-6) -> qkv.
Implementation calling convention: fn(qkv, q_weight, k_weight, num_q_heads, num_kv_heads, head_dim, eps)
  -> None; qkv 2-D [T, (Hq + 2*Hkv)*D] (last stride 1, row stride arbitrary), weights [D] same dtype;
  V columns must stay bit-for-bit untouched.
Problem fields: head_dim, num_q_heads, num_kv_heads (int).
"""

from __future__ import annotations

SPECS = ()  # placeholder: the contract module is being written
