"""causal_conv1d and its decode step (the causal-conv1d package's semantics).

Implementation calling conventions:
  causal_conv1d: fn(x, weight, bias, activation, seq_idx, initial_states, out, final_states[, varlen]) -> None;
    x [B, D, L] (channel-first or a channel-last view), out allocated like x, final_states None or
    [B, D, W-1] to fill (any strides: it may be the caller's final_states_out). The trailing `ConvVarlen`
    is passed only for the packed form (query_start_loc): then x and out are [1, D, T] views of the packed
    [D, T] tensors, and seq_idx, initial_states and final_states are None.
  causal_conv1d_update: fn(x, conv_state, weight, bias, activation, conv_state_indices, out[, cache_seqlens])
    -> None; x always [B, D, L] (the public function adds L=1 for 2-D x), conv_state [slots, D, S >= W-1] in
    place, index < 0: padded row (out 0, state untouched); out [B, D, L]. cache_seqlens (int [B]) is
    passed only when given: the state is then circular.
Problem fields: causal_conv1d: width, has_bias, silu, channel_last, has_seq_idx, has_initial_states,
  return_final_states, varlen (the packed form); causal_conv1d_update: width, state_len, has_bias, silu,
  has_indices, has_cache_seqlens.
Size bucket: causal_conv1d: tokens, the `size_class` (power of two at or above) of B * L; causal_conv1d_update:
  batch, the `size_class` of B.

Semantics (the peer is Dao-AILab/causal-conv1d; the decisions it leaves open are written down here):
  ``out[b, d, t] = act(bias[d] + sum_k weight[d, k] * xp[b, d, t + k - (W-1)])`` where ``xp`` is x preceded
  by ``initial_states`` (zeros when None). With ``seq_idx``, a tap at position ``s`` counts only when
  ``seq_idx`` does not change between ``s`` and ``t`` (runs, not equal values: ``[0, 1, 0]`` is three
  sequences); the initial states belong to the row's first sequence; ``seq_idx[b, t] < 0`` is padding and
  outputs 0. ``final_states`` are the last W-1 columns of ``xp`` (an exact copy of x values), with the
  columns that lie before the start of the last sequence set to 0. Arithmetic happens in the weight's dtype
  (x is cast to it, like causal-conv1d's reference); the output has x's dtype.

  The packed form (vLLM's ``causal_conv1d_fn`` for continuous-batching prefill, with its argument names):
  sequence i of x [D, T] is columns ``query_start_loc[i]:query_start_loc[i+1]`` and owns state slot
  ``cache_indices[i]`` (i when None) of ``conv_states`` [slots, D, S]; it is `causal_conv1d_update` of its
  columns against that slot, zeroed first unless ``has_initial_state[i]``: its first taps read the slot's
  last W-1 columns, and the slot keeps the last S columns of the slot followed by the sequence (vLLM's
  kernels take S = W-1, where both readings agree). A negative slot is a padded sequence: outputs 0, no
  state read or written.

  The update's ``cache_seqlens`` (causal-conv1d's circular state): with ``c = cache_seqlens[b] mod S``, the
  taps before the new columns read slot columns ``c - (W-1), ..., c - 1`` (mod S), and new column t is
  written to column ``(c + t) mod S`` (when L > S, the later columns win), all reads before any write.

The package: `_conv` holds `causal_conv1d` (both forms) and its spec, `_update` `causal_conv1d_update` and
its spec, `_checks` the width limits, the packed form's argument type and the checks both share,
`_reference` the literal references.
"""

from __future__ import annotations

from infiniops_py.operators.causal_conv1d._checks import MAX_WIDTH, MIN_WIDTH, ConvVarlen, check_cu_seqlens
from infiniops_py.operators.causal_conv1d._conv import SPEC, causal_conv1d
from infiniops_py.operators.causal_conv1d._reference import reference, reference_update, run_ids
from infiniops_py.operators.causal_conv1d._update import SPEC_UPDATE, causal_conv1d_update

__all__ = ["MAX_WIDTH", "MIN_WIDTH", "SPEC", "SPECS", "SPEC_UPDATE", "ConvVarlen", "causal_conv1d",
           "causal_conv1d_update", "check_cu_seqlens", "reference", "reference_update", "run_ids"]

SPECS = (SPEC, SPEC_UPDATE)
