"""`causal_conv1d_update`: decode step(s) of causal_conv1d against a rolling or circular state, its checks
and its `OpSpec`."""

from __future__ import annotations

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    ContractError,
    check_device,
    check_disjoint,
    check_dtype,
    check_no_grad,
    check_shape,
    check_slot_indices,
    check_tensor,
    check_writable,
    is_checked,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import Operator, Overload
from infiniops_py.operators.causal_conv1d._checks import check_activation, check_layout, check_weight, empty_like_layout
from infiniops_py.operators.causal_conv1d._reference import reference_update
from infiniops_py.operators.causal_conv1d._samples import sample_update

__all__ = ["SPEC_UPDATE", "causal_conv1d_update"]

_UPDATE = "causal_conv1d_update"
_FLOAT_SET = frozenset(FLOAT_DTYPES)


def _fake(x: torch.Tensor, **_: object) -> torch.Tensor:
    if x.dim() == 3 and x.stride(2) != 1 and x.shape[2] > 1:  # a channel-last view: the output keeps its layout
        return x.new_empty((x.shape[0], x.shape[2], x.shape[1])).transpose(1, 2)
    return x.new_empty(x.shape)


SPEC_UPDATE = Operator(
    sample_inputs=sample_update,
    tune_sizes={"batch": 16, "dim": 1792},
    name=_UPDATE,
    fields={"width": 4, "state_len": 3, "has_bias": True, "silu": True, "has_indices": False,
            "has_cache_seqlens": False},
    buckets=("batch",),  # B
    reference=reference_update,
    doc="causal conv1d decode step against a rolling or circular [slots, D, S] state, gathered slots",
    overloads=(Overload(fake=_fake),),
    mutates=("conv_state",),
)


@SPEC_UPDATE.define
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
    # The checks run on every call: each attribute is read once and a helper is called only to raise (or
    # for what it alone can tell: strided layouts, overlaps, indices), in the order of the contract.
    if not (strided(x, conv_state, weight, bias, cache_seqlens, conv_state_indices) and x is not None
            and conv_state is not None and weight is not None):
        check_tensor(_UPDATE, "x", x)
        check_tensor(_UPDATE, "conv_state", conv_state)
        check_tensor(_UPDATE, "weight", weight)
        check_tensor(_UPDATE, "bias", bias, optional=True)
        check_tensor(_UPDATE, "cache_seqlens", cache_seqlens, optional=True)
        check_tensor(_UPDATE, "conv_state_indices", conv_state_indices, optional=True)
    if wants_grad(x, conv_state, weight, bias, conv_state_indices):
        check_no_grad(_UPDATE, {"x": x, "conv_state": conv_state, "weight": weight, "bias": bias,
                                "conv_state_indices": conv_state_indices})
    xdtype, ndim = x.dtype, x.dim()
    if xdtype not in _FLOAT_SET:
        check_dtype(_UPDATE, "x", x, FLOAT_DTYPES)
    if ndim != 2 and ndim != 3:
        raise ContractError(_UPDATE, "x", f"expected shape [B, D] or [B, D, L], got {list(x.shape)}")
    x3 = x.unsqueeze(-1) if ndim == 2 else x
    channel_last = check_layout(_UPDATE, "x", x3)
    batch, dim, _ = x3.shape
    width = check_weight(_UPDATE, x3, weight, bias)
    silu = check_activation(_UPDATE, activation)
    device, sshape = x.device, conv_state.shape
    if conv_state.device != device or conv_state.dtype is not xdtype or len(sshape) != 3 or sshape[1] != dim:
        check_device(_UPDATE, "conv_state", conv_state, device)
        if conv_state.dtype != xdtype:
            raise ContractError(_UPDATE, "conv_state", f"expected dtype {x.dtype} (same as x), got "
                                                       f"{conv_state.dtype}")
        check_shape(_UPDATE, "conv_state", conv_state, (None, dim, None), " ([slots, D, S])")
    state_len = sshape[2]
    if state_len < width - 1:
        raise ContractError(_UPDATE, "conv_state", f"state length S={state_len} < W-1={width - 1}")
    check_layout(_UPDATE, "conv_state", conv_state)
    check_writable(_UPDATE, "conv_state", conv_state)
    # every input is read while conv_state is written
    check_disjoint(_UPDATE, "conv_state", conv_state, (("x", x), ("weight", weight), ("bias", bias),
                                                    ("cache_seqlens", cache_seqlens),
                                                    ("conv_state_indices", conv_state_indices)))
    slots = sshape[0]
    check_slot_indices(_UPDATE, "conv_state", "conv_state_indices", conv_state_indices, batch, slots, device)
    if cache_seqlens is not None:
        check_device(_UPDATE, "cache_seqlens", cache_seqlens, x.device)
        check_dtype(_UPDATE, "cache_seqlens", cache_seqlens, INDEX_DTYPES)
        check_shape(_UPDATE, "cache_seqlens", cache_seqlens, (batch,), " ([B], one per row of x)")
        if cache_seqlens.numel() and is_checked(cache_seqlens.device) and int(cache_seqlens.min()) < 0:
            raise ContractError(_UPDATE, "cache_seqlens", f"value {int(cache_seqlens.min())} < 0: each is the "
                                                          "number of columns written so far (>= 0)")
    out = empty_like_layout(x3, channel_last)
    if x3.numel():
        key = SPEC_UPDATE.key(device.type, xdtype, width=width, state_len=state_len, has_bias=bias is not None,
                              silu=silu, has_indices=conv_state_indices is not None,
                              has_cache_seqlens=cache_seqlens is not None, batch=batch)
        args = (x3, conv_state, weight, bias, activation, conv_state_indices, out)
        if cache_seqlens is None:
            dispatch(SPEC_UPDATE, key, *args)
        else:
            dispatch(SPEC_UPDATE, key, *args, cache_seqlens)
    return out.squeeze(-1) if ndim == 2 else out


