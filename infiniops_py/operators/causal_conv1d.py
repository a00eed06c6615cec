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

Semantics (the peer is Dao-AILab/causal-conv1d; the decisions it leaves open are written down here):
  ``out[b, d, t] = act(bias[d] + sum_k weight[d, k] * xp[b, d, t + k - (W-1)])`` where ``xp`` is x preceded
  by ``initial_states`` (zeros when None). With ``seq_idx``, a tap at position ``s`` counts only when
  ``seq_idx`` does not change between ``s`` and ``t`` (runs, not equal values: ``[0, 1, 0]`` is three
  sequences); the initial states belong to the row's first sequence; ``seq_idx[b, t] < 0`` is padding and
  outputs 0. ``final_states`` are the last W-1 columns of ``xp`` (an exact copy of x values), with the
  columns that lie before the start of the last sequence set to 0. Arithmetic happens in the weight's dtype
  (x is cast to it, like causal-conv1d's reference); the output has x's dtype.
"""

from __future__ import annotations

from typing import Final

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
)
from infiniops_py.operators._torch_library import lowered

__all__ = ["MAX_WIDTH", "MIN_WIDTH", "SPECS", "causal_conv1d", "causal_conv1d_update", "run_ids"]

MIN_WIDTH: Final = 2
MAX_WIDTH: Final = 16
_CONV = "causal_conv1d"
_UPDATE = "causal_conv1d_update"


# --- checks ----------------------------------------------------------------------------------------

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
    *,
    activation: str | None = None,
    seq_idx: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    return_final_states: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal 1-D convolution over the sequence, as in causal-conv1d's ``causal_conv1d_fn``.

    Args:
        x: [B, D, L] float16/bfloat16/float32/float64, channel-first (stride 1 along L) or a channel-last
            view of a [B, L, D] tensor (stride 1 along D).
        weight: [D, W], any float dtype (the arithmetic runs in it), 2 <= W <= 16.
        bias: [D] in weight's dtype, or None.
        activation: None or "silu".
        seq_idx: int32 [B, L] packing several sequences in one row: no tap crosses a change of value;
            values < 0 mark padding, whose output is 0.
        initial_states: [B, D, W-1] in x's dtype: the W-1 inputs before position 0 (the row's first
            sequence continues from them); zeros when None.
        return_final_states: also return the last W-1 inputs [B, D, W-1] (x's dtype, exact copies).

    Returns:
        out [B, D, L] in x's dtype, laid out like x; ``(out, final_states)`` when `return_final_states`.

    Raises:
        ContractError: a non-tensor, a non-bool flag, a shape, dtype, device, layout or width that breaks
            the contract, or a tensor that requires grad while grad mode is on, named by argument.
    """
    if lowered(x):  # torch.compile / torch.export / FakeTensor: the custom operator
        conv = torch.ops.infiniops.causal_conv1d
        if return_final_states is True:
            return conv.with_final_states(x, weight, bias, activation, seq_idx, initial_states)
        return conv.default(x, weight, bias, activation, seq_idx, initial_states)
    check_tensor(_CONV, "x", x)
    check_tensor(_CONV, "weight", weight)
    for name, t in (("bias", bias), ("seq_idx", seq_idx), ("initial_states", initial_states)):
        check_tensor(_CONV, name, t, optional=True)
    check_no_grad(_CONV, {"x": x, "weight": weight, "bias": bias, "seq_idx": seq_idx,
                          "initial_states": initial_states})
    check_bool(_CONV, "return_final_states", return_final_states)
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
    out = _empty_like_layout(x, channel_last)
    final_states = torch.empty(batch, dim, width - 1, dtype=x.dtype, device=x.device) if return_final_states else None
    if x.numel() == 0:
        _empty_final_states(final_states, initial_states)
    else:
        key = (x.device.type, x.dtype, width, bias is not None, silu, channel_last, seq_idx is not None,
               initial_states is not None, return_final_states)
        SPEC.call(key, x, weight, bias, activation, seq_idx, initial_states, out, final_states)
    return (out, final_states) if final_states is not None else out


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
) -> None:
    """Literal reference: each output column the masked dot of its W-tap window, summed one tap at a time
    over all columns at once (W steps, not L: the conformance suite runs it at L = 4096 on the GPU)."""
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


# --- causal_conv1d_update --------------------------------------------------------------------------

def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    conv_state_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode step(s) of `causal_conv1d` against a rolling state, as causal-conv1d's ``causal_conv1d_update``.

    Row b reads and writes state slot ``conv_state_indices[b]`` (b when None): its L new columns are
    appended to the slot's S columns, the output is the convolution of the last W columns ending at each new
    column, and the slot keeps the last S columns (exact copies). An index < 0 is a padded row: output 0,
    no state is read or written. Two rows may not name one slot: in checked mode a repeated non-negative
    index raises; unchecked, the slot's state and both rows' outputs are undefined (one provider reads
    every slot before writing any, another runs the rows in order).

    Args:
        x: [B, D] (one token) or [B, D, L], float16/bfloat16/float32/float64, stride 1 along D or L.
        conv_state: [slots, D, S] in x's dtype, S >= W-1, updated in place; stride 1 along D or S, no
            expanded (zero-stride) or self-overlapping dims, no memory (by address) shared with x,
            weight, bias or conv_state_indices. Without indices,
            slots == B (unless B == 0: an empty batch does nothing).
        weight: [D, W], any float dtype (the arithmetic runs in it), 2 <= W <= 16.
        bias: [D] in weight's dtype, or None.
        activation: None or "silu".
        conv_state_indices: int32/int64 [B] slot per row, < slots, each non-negative value once; negative
            values are padding (and may repeat).

    Returns:
        out shaped like x, in x's dtype.

    Raises:
        ContractError: a non-tensor, a bad shape, dtype, device, layout or width, a conv_state that cannot be
            written in place, a tensor that requires grad while grad mode is on; in checked mode an index
            >= slots or a repeated index.
    """
    if lowered(x):  # torch.compile / torch.export / FakeTensor: the custom operator
        return torch.ops.infiniops.causal_conv1d_update(x, conv_state, weight, bias, activation, conv_state_indices)
    check_tensor(_UPDATE, "x", x)
    check_tensor(_UPDATE, "conv_state", conv_state)
    check_tensor(_UPDATE, "weight", weight)
    check_tensor(_UPDATE, "bias", bias, optional=True)
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
    for name, t in (("x", x), ("weight", weight), ("bias", bias), ("conv_state_indices", conv_state_indices)):
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
    out = _empty_like_layout(x3, channel_last)
    if x3.numel():
        key = (x.device.type, x.dtype, width, state_len, bias is not None, silu, conv_state_indices is not None)
        SPEC_UPDATE.call(key, x3, conv_state, weight, bias, activation, conv_state_indices, out)
    return out.squeeze(-1) if x.dim() == 2 else out


def reference_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    conv_state_indices: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """Literal reference: row by row, append x to the slot, convolve the new columns, keep the last S (the
    indices are read on the host, one at a time: it synchronizes on CUDA)."""
    slots, _, state_len = conv_state.shape
    width = weight.shape[1]
    length = x.shape[2]
    for b in range(x.shape[0]):
        slot = b if conv_state_indices is None else int(conv_state_indices[b])
        if not 0 <= slot < slots:
            out[b] = 0
            continue
        full = torch.cat([conv_state[slot], x[b]], dim=1)  # [D, S + L], x's dtype
        fw = full.to(weight.dtype)
        for t in range(length):
            end = state_len + t + 1
            y = (fw[:, end - width:end] * weight).sum(-1)
            if bias is not None:
                y = y + bias
            out[b, :, t] = F.silu(y) if activation == "silu" else y
        conv_state[slot] = full[:, -state_len:]


SPEC = OpSpec(
    name=_CONV,
    fields={"width": 4, "has_bias": True, "silu": True, "channel_last": False, "has_seq_idx": False,
            "has_initial_states": False, "return_final_states": False},
    function=causal_conv1d,
    reference=reference,
    doc="depthwise causal conv1d over [B, D, L], optional silu, seq_idx packing, initial/final states",
)
SPEC_UPDATE = OpSpec(
    name=_UPDATE,
    fields={"width": 4, "state_len": 3, "has_bias": True, "silu": True, "has_indices": False},
    function=causal_conv1d_update,
    reference=reference_update,
    doc="causal conv1d decode step against a rolling [slots, D, S] state, gathered slots",
)
SPECS = (SPEC, SPEC_UPDATE)
