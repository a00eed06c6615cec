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
"""

from __future__ import annotations

import itertools
from typing import Final, NamedTuple

import torch
import torch.nn.functional as F

from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    ContractError,
    OpSpec,
    check_bool,
    check_device,
    check_dtype,
    check_index_range,
    check_no_grad,
    check_no_overlap,
    check_shape,
    check_tensor,
    check_unique_indices,
    check_writable,
    is_checked,
)
from infiniops_py.operators._torch_library import lowered

__all__ = ["MAX_WIDTH", "MIN_WIDTH", "SPECS", "ConvVarlen", "causal_conv1d", "causal_conv1d_update",
           "check_cu_seqlens", "run_ids"]

MIN_WIDTH: Final = 2
MAX_WIDTH: Final = 16
_CONV = "causal_conv1d"
_UPDATE = "causal_conv1d_update"


class ConvVarlen(NamedTuple):
    """The packed form of a `causal_conv1d` call, as implementations receive it (vLLM's names).

    Attributes:
        conv_states: [slots, D, S >= W-1] in x's dtype, read and written in place.
        query_start_loc: int32/int64 [nseq + 1]: sequence i is columns ``query_start_loc[i]:query_start_loc[i+1]``.
        cache_indices: int32/int64 [nseq] slot per sequence (< 0: padding), or None (sequence i, slot i).
        has_initial_state: bool [nseq], or None (no sequence reads its slot).
    """

    conv_states: torch.Tensor
    query_start_loc: torch.Tensor
    cache_indices: torch.Tensor | None
    has_initial_state: torch.Tensor | None


# --- checks ----------------------------------------------------------------------------------------

def check_cu_seqlens(op: str, name: str, cu: torch.Tensor, total: int) -> None:
    """In checked mode (`is_checked`), raise `ContractError` unless the cumulative lengths `cu` [S + 1]
    start at 0, never decrease and end at `total` (the packed tokens); reads the values on the host."""
    if not is_checked(cu.device):
        return
    values = cu.tolist()
    if values[0] != 0 or values[-1] != total or any(b < a for a, b in itertools.pairwise(values)):
        raise ContractError(op, name, f"{values[:8]}{'...' if len(values) > 8 else ''}: expected cumulative "
                                      f"lengths from 0, non-decreasing, ending at {total} (the packed tokens)")


def _check_weight(op: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> int:
    """Check weight [D, W] and bias [D]; return W."""
    dim = x.shape[1]
    check_device(op, "weight", weight, x.device)
    check_dtype(op, "weight", weight, FLOAT_DTYPES)
    check_shape(op, "weight", weight, (dim, None), " ([D, W], D = x.shape[1])")
    width = weight.shape[1]
    if not MIN_WIDTH <= width <= MAX_WIDTH:
        raise ContractError(op, "weight", f"width W={width} out of range: need {MIN_WIDTH} <= W <= {MAX_WIDTH}")
    if bias is not None:
        check_device(op, "bias", bias, x.device)
        if bias.dtype != weight.dtype:
            raise ContractError(op, "bias", f"expected dtype {weight.dtype} (same as weight), got {bias.dtype}")
        check_shape(op, "bias", bias, (dim,), " ([D])")
    return width


def _check_activation(op: str, activation: str | None) -> bool:
    if activation not in (None, "silu"):
        raise ContractError(op, "activation", f"expected None or 'silu', got {activation!r}")
    return activation == "silu"


def _check_layout(op: str, name: str, t: torch.Tensor) -> bool:
    """A [*, C, L] tensor must be dense along C (channel-last) or along L; return whether channel-last."""
    if t.stride(2) != 1 and t.stride(1) != 1:
        raise ContractError(op, name, f"strides {t.stride()}: need stride 1 along dim 2 (channel-first) or "
                                      "dim 1 (channel-last view); call .contiguous()")
    return t.stride(2) != 1 and t.shape[2] > 1


def _check_x(op: str, x: torch.Tensor) -> bool:
    check_dtype(op, "x", x, FLOAT_DTYPES)
    if x.dim() != 3:
        raise ContractError(op, "x", f"expected shape [B, D, L], got {list(x.shape)}")
    return _check_layout(op, "x", x)


def _empty_like_layout(x: torch.Tensor, channel_last: bool) -> torch.Tensor:
    b, d, length = x.shape
    if channel_last:
        return torch.empty(b, length, d, dtype=x.dtype, device=x.device).transpose(1, 2)
    return torch.empty(b, d, length, dtype=x.dtype, device=x.device)


# --- causal_conv1d ---------------------------------------------------------------------------------

def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
    final_states_out: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    conv_states: torch.Tensor | None = None,
    query_start_loc: torch.Tensor | None = None,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal 1-D convolution over the sequence, as causal-conv1d's ``causal_conv1d_fn`` (its
    argument order), or vLLM's packed form of it (the keyword arguments).

    Args:
        x: [B, D, L] float16/bfloat16/float32/float64, channel-first (stride 1 along L) or a channel-last
            view of a [B, L, D] tensor (stride 1 along D). The packed form: [D, T], stride 1 along D or T.
        weight: [D, W], any float dtype (the arithmetic runs in it), 2 <= W <= 16.
        bias: [D] in weight's dtype, or None.
        seq_idx: int32 [B, L] packing several sequences in one row: no tap crosses a change of value;
            values < 0 mark padding, whose output is 0.
        initial_states: [B, D, W-1] in x's dtype: the W-1 inputs before position 0 (the row's first
            sequence continues from them); zeros when None.
        return_final_states: also return the last W-1 inputs [B, D, W-1] (x's dtype, exact copies).
        final_states_out: [B, D, W-1] in x's dtype (any strides, writable, sharing no memory with the
            inputs), or None: with `return_final_states` the final states are written there and it is
            returned (causal-conv1d's buffer); it needs `return_final_states`.
        activation: None or "silu".
        conv_states: the packed form: [slots, D, S >= W-1] in x's dtype, updated in place (stride 1 along
            D or S, no expanded dims, no memory shared with another argument): each sequence's initial and
            final states (see the module docstring).
        query_start_loc: int32/int64 [nseq + 1]: the packed form's cumulative sequence lengths (0 first,
            non-decreasing, T last; checked mode raises otherwise, unchecked such values give unspecified
            numbers, never an out-of-bounds access). Needed by the other packed arguments.
        cache_indices: int32/int64 [nseq]: the slot of each sequence (< slots, each non-negative value
            once; negative: a padded sequence), or None: sequence i uses slot i (then slots == nseq).
        has_initial_state: bool [nseq]: whether sequence i continues from its slot's state (else from
            zeros); None: no sequence does.

    Returns:
        out [B, D, L] ([D, T] packed) in x's dtype, laid out like x; ``(out, final_states)`` when
        `return_final_states` (final_states being `final_states_out` itself when given).

    Raises:
        ContractError: a non-tensor, a non-bool flag, a shape, dtype, device or layout that breaks the
            contract, a width out of range, an argument of one form mixed with the other, a tensor that
            requires grad while grad mode is on; in checked mode bad query_start_loc or cache_indices;
            named by argument.
    """
    if lowered(x):  # torch.compile / torch.export / FakeTensor: the custom operator
        conv = torch.ops.infiniops.causal_conv1d
        if query_start_loc is not None:
            return conv.varlen(x, weight, bias, activation, conv_states, query_start_loc, cache_indices,
                               has_initial_state)
        if return_final_states is True and final_states_out is not None:
            return conv.final_states_out(x, weight, bias, activation, seq_idx, initial_states,
                                         final_states_out), final_states_out
        if return_final_states is True:
            return conv.with_final_states(x, weight, bias, activation, seq_idx, initial_states)
        return conv.default(x, weight, bias, activation, seq_idx, initial_states)
    check_tensor(_CONV, "x", x)
    check_tensor(_CONV, "weight", weight)
    for name, t in (("bias", bias), ("seq_idx", seq_idx), ("initial_states", initial_states),
                    ("final_states_out", final_states_out), ("conv_states", conv_states),
                    ("query_start_loc", query_start_loc), ("cache_indices", cache_indices),
                    ("has_initial_state", has_initial_state)):
        check_tensor(_CONV, name, t, optional=True)
    check_no_grad(_CONV, {"x": x, "weight": weight, "bias": bias, "seq_idx": seq_idx,
                          "initial_states": initial_states, "final_states_out": final_states_out,
                          "conv_states": conv_states})
    check_bool(_CONV, "return_final_states", return_final_states)
    if query_start_loc is not None:
        return _causal_conv1d_varlen(x, weight, bias, seq_idx, initial_states, return_final_states,
                                     final_states_out, activation, conv_states, query_start_loc, cache_indices,
                                     has_initial_state)
    for name, t in (("conv_states", conv_states), ("cache_indices", cache_indices),
                    ("has_initial_state", has_initial_state)):
        if t is not None:
            raise ContractError(_CONV, name, "belongs to the packed form: it needs query_start_loc")
    channel_last = _check_x(_CONV, x)
    batch, dim, length = x.shape
    width = _check_weight(_CONV, x, weight, bias)
    silu = _check_activation(_CONV, activation)
    if seq_idx is not None:
        check_device(_CONV, "seq_idx", seq_idx, x.device)
        check_dtype(_CONV, "seq_idx", seq_idx, (torch.int32,))
        check_shape(_CONV, "seq_idx", seq_idx, (batch, length), " ([B, L])")
    if initial_states is not None:
        check_device(_CONV, "initial_states", initial_states, x.device)
        if initial_states.dtype != x.dtype:
            raise ContractError(_CONV, "initial_states",
                                f"expected dtype {x.dtype} (same as x), got {initial_states.dtype}")
        check_shape(_CONV, "initial_states", initial_states, (batch, dim, width - 1), " ([B, D, W-1])")
    if final_states_out is not None:
        if not return_final_states:
            raise ContractError(_CONV, "final_states_out", "is written only with return_final_states=True "
                                                           "(causal-conv1d ignores it otherwise): pass both")
        _check_state_like_x(_CONV, "final_states_out", final_states_out, x, (batch, dim, width - 1), " ([B, D, W-1])")
        for name, t in (("x", x), ("weight", weight), ("bias", bias), ("seq_idx", seq_idx),
                        ("initial_states", initial_states)):
            if t is not None:
                check_no_overlap(_CONV, name, t, "final_states_out", final_states_out)
    out = _empty_like_layout(x, channel_last)
    final_states = None
    if return_final_states:
        final_states = (final_states_out if final_states_out is not None else
                        torch.empty(batch, dim, width - 1, dtype=x.dtype, device=x.device))
    if x.numel() == 0:
        _empty_final_states(final_states, initial_states)
    else:
        key = (x.device.type, x.dtype, width, bias is not None, silu, channel_last, seq_idx is not None,
               initial_states is not None, return_final_states, False)
        SPEC.call(key, x, weight, bias, activation, seq_idx, initial_states, out, final_states)
    return (out, final_states) if final_states is not None else out


def _check_state_like_x(op: str, name: str, t: torch.Tensor, x: torch.Tensor, shape: tuple[int | None, ...],
                        what: str) -> None:
    """A state tensor written in place: x's device and dtype, `shape`, no two elements at one address."""
    check_device(op, name, t, x.device)
    if t.dtype != x.dtype:
        raise ContractError(op, name, f"expected dtype {x.dtype} (same as x), got {t.dtype}")
    check_shape(op, name, t, shape, what)
    check_writable(op, name, t)


def _causal_conv1d_varlen(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, seq_idx: torch.Tensor | None,
    initial_states: torch.Tensor | None, return_final_states: bool, final_states_out: torch.Tensor | None,
    activation: str | None, conv_states: torch.Tensor | None, query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor | None, has_initial_state: torch.Tensor | None,
) -> torch.Tensor:
    """The packed form of `causal_conv1d`: checks, then the implementation on [1, D, T] views."""
    for name, t in (("seq_idx", seq_idx), ("initial_states", initial_states), ("final_states_out", final_states_out)):
        if t is not None:
            raise ContractError(_CONV, name, "is not taken by the packed form (query_start_loc): each sequence's "
                                             "states are conv_states' slots")
    if return_final_states:
        raise ContractError(_CONV, "return_final_states", "the packed form (query_start_loc) writes the final "
                                                          "states into conv_states: pass False")
    if conv_states is None:
        raise ContractError(_CONV, "conv_states", "the packed form (query_start_loc) needs conv_states "
                                                  "[slots, D, S >= W-1]")
    check_dtype(_CONV, "x", x, FLOAT_DTYPES)
    if x.dim() != 2:
        raise ContractError(_CONV, "x", f"the packed form (query_start_loc) takes x [D, T], got {list(x.shape)}")
    x3 = x.unsqueeze(0)
    channel_last = _check_layout(_CONV, "x", x3)
    dim, tokens = x.shape
    width = _check_weight(_CONV, x3, weight, bias)
    silu = _check_activation(_CONV, activation)
    check_device(_CONV, "query_start_loc", query_start_loc, x.device)
    check_dtype(_CONV, "query_start_loc", query_start_loc, INDEX_DTYPES)
    if query_start_loc.dim() != 1 or query_start_loc.shape[0] < 1:
        raise ContractError(_CONV, "query_start_loc", f"expected shape [nseq + 1], got {list(query_start_loc.shape)}")
    nseq = query_start_loc.shape[0] - 1
    _check_state_like_x(_CONV, "conv_states", conv_states, x, (None, dim, None), " ([slots, D, S])")
    state_len = conv_states.shape[2]
    if state_len < width - 1:
        raise ContractError(_CONV, "conv_states", f"state length S={state_len} < W-1={width - 1}")
    _check_layout(_CONV, "conv_states", conv_states)
    slots = conv_states.shape[0]
    if cache_indices is None:
        if slots != nseq and nseq:
            raise ContractError(_CONV, "conv_states", f"expected {nseq} slots (one per sequence) without "
                                                      f"cache_indices, got {slots}")
    else:
        check_device(_CONV, "cache_indices", cache_indices, x.device)
        check_dtype(_CONV, "cache_indices", cache_indices, INDEX_DTYPES)
        check_shape(_CONV, "cache_indices", cache_indices, (nseq,), " ([nseq])")
    if has_initial_state is not None:
        check_device(_CONV, "has_initial_state", has_initial_state, x.device)
        check_dtype(_CONV, "has_initial_state", has_initial_state, (torch.bool,))
        check_shape(_CONV, "has_initial_state", has_initial_state, (nseq,), " ([nseq])")
    for name, t in (("x", x), ("weight", weight), ("bias", bias), ("query_start_loc", query_start_loc),
                    ("cache_indices", cache_indices), ("has_initial_state", has_initial_state)):
        if t is not None:  # every input is read while conv_states is written
            check_no_overlap(_CONV, name, t, "conv_states", conv_states)
    check_cu_seqlens(_CONV, "query_start_loc", query_start_loc, tokens)
    if cache_indices is not None:
        check_index_range(_CONV, "cache_indices", cache_indices, slots, allow_negative=True)
        check_unique_indices(_CONV, "cache_indices", cache_indices)
    out = _empty_like_layout(x3, channel_last)
    if dim and nseq:  # empty sequences still reset their slots
        key = (x.device.type, x.dtype, width, bias is not None, silu, channel_last, False, False, False, True)
        SPEC.call(key, x3, weight, bias, activation, None, None, out, None,
                  ConvVarlen(conv_states, query_start_loc, cache_indices, has_initial_state))
    return out[0]


def _empty_final_states(final_states: torch.Tensor | None, initial_states: torch.Tensor | None) -> None:
    """With no input, the final states are the initial ones (zeros when None)."""
    if final_states is None:
        return
    if initial_states is None:
        final_states.zero_()
    else:
        final_states.copy_(initial_states)


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
    packed form runs `reference_update` per sequence (`_reference_varlen`)."""
    if varlen is not None:
        _reference_varlen(x, weight, bias, activation, out, varlen)
        return
    batch, dim, length = x.shape
    width = weight.shape[1]
    xw = x.to(weight.dtype)
    if initial_states is None:
        head = torch.zeros(batch, dim, width - 1, dtype=weight.dtype, device=x.device)
    else:
        head = initial_states.to(weight.dtype)
    xp = torch.cat([head, xw], dim=2)  # column p holds position p - (W-1) of the row
    raw = torch.cat([head.to(x.dtype) if initial_states is None else initial_states, x], dim=2)
    run = run_ids(seq_idx) if seq_idx is not None else torch.zeros(batch, length, dtype=torch.long, device=x.device)
    run_p = torch.cat([run[:, :1].expand(batch, width - 1), run], dim=1)  # runs of xp's columns
    zero = torch.zeros((), dtype=xw.dtype, device=x.device)
    y = torch.zeros(batch, dim, length, dtype=weight.dtype, device=x.device)
    for j in range(width):  # tap j of column t reads xp's column t + j (position t - (W-1) + j)
        same = (run_p[:, j:j + length] == run)[:, None, :]  # [B, 1, L]: the same sequence as column t
        y = y + torch.where(same, xp[:, :, j:j + length], zero) * weight[:, j, None]
    if bias is not None:
        y = y + bias[:, None]
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


# --- causal_conv1d_update --------------------------------------------------------------------------

def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode step(s) of `causal_conv1d` against a rolling state, as causal-conv1d's ``causal_conv1d_update``
    (its argument order).

    Row b reads and writes state slot ``conv_state_indices[b]`` (b when None): its L new columns are
    appended to the slot's S columns, the output is the convolution of the last W columns ending at each new
    column, and the slot keeps the last S columns (exact copies). With `cache_seqlens` the slot is instead a
    circular buffer, as in causal-conv1d: with ``c = cache_seqlens[b] mod S`` the taps before the new
    columns read slot columns ``c - (W-1) .. c - 1`` (mod S) and new column t is written to column
    ``(c + t) mod S`` (all reads first; when L > S the later columns win); the caller advances
    cache_seqlens. An index < 0 is a padded row: output 0, no state is read or written. Two rows may not
    name one slot: in checked mode a repeated non-negative index raises; unchecked, the slot's state and
    both rows' outputs are undefined (one provider reads every slot before writing any, another runs the
    rows in order).

    Args:
        x: [B, D] (one token) or [B, D, L], float16/bfloat16/float32/float64, stride 1 along D or L.
        conv_state: [slots, D, S] in x's dtype, S >= W-1, updated in place; stride 1 along D or S, no
            expanded (zero-stride) or self-overlapping dims, no memory (by address) shared with x,
            weight, bias, cache_seqlens or conv_state_indices. Without indices,
            slots == B (unless B == 0: an empty batch does nothing).
        weight: [D, W], any float dtype (the arithmetic runs in it), 2 <= W <= 16.
        bias: [D] in weight's dtype, or None.
        activation: None or "silu".
        cache_seqlens: int32/int64 [B] (one per row of x, not per slot), or None: the circular state's
            write position; in checked mode a negative value raises, unchecked it is taken mod S.
        conv_state_indices: int32/int64 [B] slot per row, < slots, each non-negative value once; negative
            values are padding (and may repeat).

    Returns:
        out shaped like x, in x's dtype.

    Raises:
        ContractError: a non-tensor, a bad shape, dtype, device, layout or width, a conv_state that cannot be
            written in place, a tensor that requires grad while grad mode is on; in checked mode an index
            >= slots, a repeated index or a negative cache_seqlens.
    """
    if lowered(x):  # torch.compile / torch.export / FakeTensor: the custom operator
        return torch.ops.infiniops.causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices,
                                                        cache_seqlens)
    check_tensor(_UPDATE, "x", x)
    check_tensor(_UPDATE, "conv_state", conv_state)
    check_tensor(_UPDATE, "weight", weight)
    check_tensor(_UPDATE, "bias", bias, optional=True)
    check_tensor(_UPDATE, "cache_seqlens", cache_seqlens, optional=True)
    check_tensor(_UPDATE, "conv_state_indices", conv_state_indices, optional=True)
    check_no_grad(_UPDATE, {"x": x, "conv_state": conv_state, "weight": weight, "bias": bias,
                            "conv_state_indices": conv_state_indices})
    check_dtype(_UPDATE, "x", x, FLOAT_DTYPES)
    if x.dim() not in (2, 3):
        raise ContractError(_UPDATE, "x", f"expected shape [B, D] or [B, D, L], got {list(x.shape)}")
    x3 = x.unsqueeze(-1) if x.dim() == 2 else x
    channel_last = _check_layout(_UPDATE, "x", x3)
    batch, dim, _ = x3.shape
    width = _check_weight(_UPDATE, x3, weight, bias)
    silu = _check_activation(_UPDATE, activation)
    check_device(_UPDATE, "conv_state", conv_state, x.device)
    if conv_state.dtype != x.dtype:
        raise ContractError(_UPDATE, "conv_state", f"expected dtype {x.dtype} (same as x), got {conv_state.dtype}")
    check_shape(_UPDATE, "conv_state", conv_state, (None, dim, None), " ([slots, D, S])")
    state_len = conv_state.shape[2]
    if state_len < width - 1:
        raise ContractError(_UPDATE, "conv_state", f"state length S={state_len} < W-1={width - 1}")
    _check_layout(_UPDATE, "conv_state", conv_state)
    check_writable(_UPDATE, "conv_state", conv_state)
    for name, t in (("x", x), ("weight", weight), ("bias", bias), ("cache_seqlens", cache_seqlens),
                    ("conv_state_indices", conv_state_indices)):
        if t is not None:  # every input is read while conv_state is written
            check_no_overlap(_UPDATE, name, t, "conv_state", conv_state)
    slots = conv_state.shape[0]
    if conv_state_indices is None:
        if slots != batch and batch:
            raise ContractError(_UPDATE, "conv_state", f"expected {batch} slots (one per row of x) without "
                                                       f"conv_state_indices, got {slots}")
    else:
        check_device(_UPDATE, "conv_state_indices", conv_state_indices, x.device)
        check_dtype(_UPDATE, "conv_state_indices", conv_state_indices, INDEX_DTYPES)
        check_shape(_UPDATE, "conv_state_indices", conv_state_indices, (batch,), " ([B])")
        check_index_range(_UPDATE, "conv_state_indices", conv_state_indices, slots, allow_negative=True)
        check_unique_indices(_UPDATE, "conv_state_indices", conv_state_indices)
    if cache_seqlens is not None:
        check_device(_UPDATE, "cache_seqlens", cache_seqlens, x.device)
        check_dtype(_UPDATE, "cache_seqlens", cache_seqlens, INDEX_DTYPES)
        check_shape(_UPDATE, "cache_seqlens", cache_seqlens, (batch,), " ([B], one per row of x)")
        if cache_seqlens.numel() and is_checked(cache_seqlens.device) and int(cache_seqlens.min()) < 0:
            raise ContractError(_UPDATE, "cache_seqlens", f"value {int(cache_seqlens.min())} < 0: each is the "
                                                          "number of columns written so far (>= 0)")
    out = _empty_like_layout(x3, channel_last)
    if x3.numel():
        key = (x.device.type, x.dtype, width, state_len, bias is not None, silu, conv_state_indices is not None,
               cache_seqlens is not None)
        args = (x3, conv_state, weight, bias, activation, conv_state_indices, out)
        if cache_seqlens is None:
            SPEC_UPDATE.call(key, *args)
        else:
            SPEC_UPDATE.call(key, *args, cache_seqlens)
    return out.squeeze(-1) if x.dim() == 2 else out


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
    time, circularly (indices and positions are read on the host, one at a time: it synchronizes on CUDA)."""
    slots, _, state_len = conv_state.shape
    width = weight.shape[1]
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
        fw = full.to(weight.dtype)
        for t in range(length):
            end = full.shape[1] - length + t + 1
            y = (fw[:, end - width:end] * weight).sum(-1)
            if bias is not None:
                y = y + bias
            out[b, :, t] = F.silu(y) if activation == "silu" else y
        if cache_seqlens is None:
            conv_state[slot] = full[:, -state_len:]
        else:
            for t in range(length):  # in order: a later column overwrites an earlier one
                conv_state[slot][:, (pos + t) % state_len] = x[b, :, t]


SPEC = OpSpec(
    name=_CONV,
    fields={"width": 4, "has_bias": True, "silu": True, "channel_last": False, "has_seq_idx": False,
            "has_initial_states": False, "return_final_states": False, "varlen": False},
    function=causal_conv1d,
    reference=reference,
    doc="depthwise causal conv1d over [B, D, L], optional silu, seq_idx packing, initial/final states, "
        "vLLM's packed form with per-sequence state slots",
)
SPEC_UPDATE = OpSpec(
    name=_UPDATE,
    fields={"width": 4, "state_len": 3, "has_bias": True, "silu": True, "has_indices": False,
            "has_cache_seqlens": False},
    function=causal_conv1d_update,
    reference=reference_update,
    doc="causal conv1d decode step against a rolling or circular [slots, D, S] state, gathered slots",
)
SPECS = (SPEC, SPEC_UPDATE)
