"""`causal_conv1d`: the depthwise causal convolution over [B, D, L], or vLLM's packed form over [D, T] with
per-sequence state slots; its checks and its `OpSpec`."""

from __future__ import annotations

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    ContractError,
    check_bool,
    check_device,
    check_dtype,
    check_index_range,
    check_no_grad,
    check_no_overlap,
    check_shape,
    check_tensor,
    check_unique_indices,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import GIVEN, Operator, Overload
from infiniops_py.operators.causal_conv1d._checks import (
    ConvVarlen,
    check_activation,
    check_cu_seqlens,
    check_layout,
    check_state_like_x,
    check_weight,
    check_x,
    empty_like_layout,
)
from infiniops_py.operators.causal_conv1d._reference import reference
from infiniops_py.operators.causal_conv1d._samples import sample_conv

__all__ = ["SPEC", "causal_conv1d"]

_CONV = "causal_conv1d"


def _conv_out(x: torch.Tensor) -> torch.Tensor:
    """The output of `x` ``[B, D, L]``: a channel-last view gives a channel-last output."""
    b, d, length = x.shape
    if x.stride(2) != 1 and length > 1:
        return x.new_empty((b, length, d)).transpose(1, 2)
    return x.new_empty((b, d, length))


def _fake_final(x: torch.Tensor, weight: torch.Tensor, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    return _conv_out(x), x.new_empty((x.shape[0], x.shape[1], weight.shape[1] - 1))


_PACKED = {"conv_states": None, "query_start_loc": None, "cache_indices": None, "has_initial_state": None}
SPEC = Operator(
    sample_inputs=sample_conv,
    tune_sizes={"tokens": 2048, "dim": 1792},
    name=_CONV,
    fields={"width": 4, "has_bias": True, "silu": True, "channel_last": False, "has_seq_idx": False,
            "has_initial_states": False, "return_final_states": False, "varlen": False},
    buckets=("tokens",),  # B * L (the packed form: its tokens)
    reference=reference,
    doc="depthwise causal conv1d over [B, D, L], optional silu, seq_idx packing, initial/final states, "
        "vLLM's packed form with per-sequence state slots",
    overloads=(
        Overload(when={"return_final_states": False, "final_states_out": None, **_PACKED},
                 fake=lambda x, **_: _conv_out(x)),
        Overload("with_final_states", when={"return_final_states": True, "final_states_out": None, **_PACKED},
                 outputs=2, fake=_fake_final),
        Overload("final_states_out", when={"return_final_states": True, "final_states_out": GIVEN, **_PACKED},
                 returns=("final_states_out",), fake=lambda x, **_: _conv_out(x)),
        Overload("varlen", when={"seq_idx": None, "initial_states": None, "return_final_states": False,
                                 "final_states_out": None, "conv_states": GIVEN, "query_start_loc": GIVEN},
                 fake=lambda x, **_: _conv_out(x.unsqueeze(0))[0]),  # x [D, T]: the output keeps its layout
    ),
    mutates=("final_states_out", "conv_states"),
)


@SPEC.define
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
    # The common case in one test each; the per-argument helpers (which name the bad one) run when it fails.
    if not (strided(x, weight, bias, seq_idx, initial_states, final_states_out, conv_states, query_start_loc,
                    cache_indices, has_initial_state) and x is not None and weight is not None):
        check_tensor(_CONV, "x", x)
        check_tensor(_CONV, "weight", weight)
        for name, t in (("bias", bias), ("seq_idx", seq_idx), ("initial_states", initial_states),
                        ("final_states_out", final_states_out), ("conv_states", conv_states),
                        ("query_start_loc", query_start_loc), ("cache_indices", cache_indices),
                        ("has_initial_state", has_initial_state)):
            check_tensor(_CONV, name, t, optional=True)
    if wants_grad(x, weight, bias, seq_idx, initial_states, final_states_out, conv_states):
        check_no_grad(_CONV, {"x": x, "weight": weight, "bias": bias, "seq_idx": seq_idx,
                              "initial_states": initial_states, "final_states_out": final_states_out,
                              "conv_states": conv_states})
    if return_final_states is not True and return_final_states is not False:
        check_bool(_CONV, "return_final_states", return_final_states)
    if query_start_loc is not None:
        return _causal_conv1d_varlen(x, weight, bias, seq_idx, initial_states, return_final_states,
                                     final_states_out, activation, conv_states, query_start_loc, cache_indices,
                                     has_initial_state)
    for name, t in (("conv_states", conv_states), ("cache_indices", cache_indices),
                    ("has_initial_state", has_initial_state)):
        if t is not None:
            raise ContractError(_CONV, name, "belongs to the packed form: it needs query_start_loc")
    channel_last = check_x(_CONV, x)
    batch, dim, length = x.shape
    width = check_weight(_CONV, x, weight, bias)
    silu = check_activation(_CONV, activation)
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
        check_state_like_x(_CONV, "final_states_out", final_states_out, x, (batch, dim, width - 1), " ([B, D, W-1])")
        for name, t in (("x", x), ("weight", weight), ("bias", bias), ("seq_idx", seq_idx),
                        ("initial_states", initial_states)):
            if t is not None:
                check_no_overlap(_CONV, name, t, "final_states_out", final_states_out)
    out = empty_like_layout(x, channel_last)
    final_states = None
    if return_final_states:
        final_states = (final_states_out if final_states_out is not None else
                        torch.empty(batch, dim, width - 1, dtype=x.dtype, device=x.device))
    if x.numel() == 0:
        _empty_final_states(final_states, initial_states)
    else:
        key = SPEC.key(x.device.type, x.dtype, width=width, has_bias=bias is not None, silu=silu,
                       channel_last=channel_last, has_seq_idx=seq_idx is not None,
                       has_initial_states=initial_states is not None, return_final_states=return_final_states,
                       varlen=False, tokens=x.shape[0] * x.shape[-1])
        dispatch(SPEC, key, x, weight, bias, activation, seq_idx, initial_states, out, final_states)
    return (out, final_states) if final_states is not None else out


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
    channel_last = check_layout(_CONV, "x", x3)
    dim, tokens = x.shape
    width = check_weight(_CONV, x3, weight, bias)
    silu = check_activation(_CONV, activation)
    check_device(_CONV, "query_start_loc", query_start_loc, x.device)
    check_dtype(_CONV, "query_start_loc", query_start_loc, INDEX_DTYPES)
    if query_start_loc.dim() != 1 or query_start_loc.shape[0] < 1:
        raise ContractError(_CONV, "query_start_loc", f"expected shape [nseq + 1], got {list(query_start_loc.shape)}")
    nseq = query_start_loc.shape[0] - 1
    check_state_like_x(_CONV, "conv_states", conv_states, x, (None, dim, None), " ([slots, D, S])")
    state_len = conv_states.shape[2]
    if state_len < width - 1:
        raise ContractError(_CONV, "conv_states", f"state length S={state_len} < W-1={width - 1}")
    check_layout(_CONV, "conv_states", conv_states)
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
    out = empty_like_layout(x3, channel_last)
    if dim and nseq:  # empty sequences still reset their slots
        key = SPEC.key(x.device.type, x.dtype, width=width, has_bias=bias is not None, silu=silu,
                       channel_last=channel_last, has_seq_idx=False, has_initial_states=False,
                       return_final_states=False, varlen=True, tokens=x3.shape[0] * x3.shape[-1])
        dispatch(SPEC, key, x3, weight, bias, activation, None, None, out, None,
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


