"""causal_conv1d and its decode step (DESIGN.md operator 7, causal-conv1d semantics).

Implementation calling conventions:
  causal_conv1d: fn(x, weight, bias, activation, seq_idx, initial_states, out, final_states) -> None;
    x [B, D, L] (channel-first or a channel-last view), out allocated like x, final_states None or
    [B, D, W-1] to fill.
  causal_conv1d_update: fn(x, conv_state, weight, bias, activation, conv_state_indices, out) -> None;
    x always [B, D, L] (the public function adds L=1 for 2-D x), conv_state [slots, D, S >= W-1] in place,
    index < 0: padded row (out 0, state untouched); out [B, D, L].
Problem fields: causal_conv1d: width, has_bias, silu, channel_last, has_seq_idx, has_initial_states,
  return_final_states; causal_conv1d_update: width, state_len, has_bias, silu, has_indices.
"""

from __future__ import annotations

SPECS = ()  # placeholder: the contract module is being written
