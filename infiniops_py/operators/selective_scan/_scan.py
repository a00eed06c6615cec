"""`selective_scan`: the Mamba-2 SSD scan over [Bt, L, H, P], optionally packed (cu_seqlens), its checks and
its `OpSpec`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    ContractError,
    check_bool,
    check_device,
    check_dtype,
    check_no_grad,
    check_shape,
    check_tensor,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import Operator, Overload
from infiniops_py.operators.causal_conv1d import check_cu_seqlens
from infiniops_py.operators.selective_scan._checks import (
    STATE_DTYPES,
    check_groups,
    check_like_x,
    check_params,
    last_dense,
)
from infiniops_py.operators.selective_scan._common import ScanVarlen, state_dtype
from infiniops_py.operators.selective_scan._reference import reference
from infiniops_py.operators.selective_scan._samples import sample_scan

__all__ = ["SPEC", "selective_scan"]

_SCAN = "selective_scan"
_NO_LIMIT: Final = (0.0, math.inf)
_FLOAT_SET: Final = frozenset(FLOAT_DTYPES)


def _fake(x: torch.Tensor, **_: object) -> torch.Tensor:
    return x.new_empty(x.shape)


def _states(x: torch.Tensor, B: torch.Tensor, rows: int) -> torch.Tensor:
    _, _, h, p = x.shape
    return x.new_empty((rows, h, p, B.shape[-1]), dtype=state_dtype(x.dtype))


def _fake_final(x: torch.Tensor, B: torch.Tensor, **_: object) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), _states(x, B, x.shape[0])


def _fake_varlen(x: torch.Tensor, B: torch.Tensor, cu_seqlens: torch.Tensor, **_: object
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), _states(x, B, cu_seqlens.shape[0] - 1)


def _with_final(outputs: tuple[torch.Tensor, ...], call: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
    """``(out, varlen_states)``, or with `return_final_states` ``(out, final, varlen_states)``: the final state is
    the last sequence's (one overload, as a custom operator cannot return a view of its other output)."""
    out, varlen = outputs
    if call["return_final_states"] is not True:
        return out, varlen
    final = varlen[-1:].clone() if varlen.shape[0] else varlen.new_zeros((1, *varlen.shape[1:]))
    return out, final, varlen


SPEC = Operator(
    sample_inputs=sample_scan,
    tune_sizes={"tokens": 2048, "num_heads": 24},
    name=_SCAN,
    fields={"head_dim": 64, "d_state": 128, "n_groups": 1, "chunk_size": 256, "has_D": True, "has_z": True,
            "has_dt_bias": True, "dt_softplus": True, "has_seq_idx": False, "has_initial_states": False,
            "return_final_states": False, "varlen": False, "return_varlen_states": False},
    buckets=("tokens",),  # Bt * L
    reference=reference,
    doc="Mamba-2 SSD selective scan over [Bt, L, H, P], D/z/dt_bias/softplus/dt_limit, seq_idx, states, "
        "cu_seqlens packing with per-sequence states",
    overloads=(
        Overload(when={"return_final_states": False, "return_varlen_states": False}, fake=_fake),
        Overload("with_final_states", when={"return_final_states": True, "return_varlen_states": False}, outputs=2,
                 fake=_fake_final),
        Overload("with_varlen_states", when={"return_varlen_states": True}, drop=("return_final_states",), outputs=2,
                 fake=_fake_varlen, finish=_with_final),
    ),
)


@SPEC.define
def selective_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int = 256,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = _NO_LIMIT,
    return_final_states: bool = False,
    return_varlen_states: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The Mamba-2 selective scan over a sequence (mamba_ssm's ``mamba_chunk_scan_combined``, in its
    argument order; ``chunk_size`` defaults to 256).

    Args:
        x: [Bt, L, H, P] float16/bfloat16/float32/float64, last dim dense.
        dt: [Bt, L, H], any float dtype: the step sizes before bias, softplus and clamp.
        A: [H] float32 (float64 accepted): the per-head decay rate (negative for a stable scan).
        B, C: [Bt, L, G, N] in x's dtype, last dim dense; G divides H; head h uses group h // (H // G).
        chunk_size: the scan's chunk length (a performance knob, >= 1; results do not depend on it).
        D: [H] or [H, P], any float dtype, or None: the skip term ``D * x``.
        z: like x, or None: the output is gated by ``silu(z)`` after the D term.
        dt_bias: [H], any float dtype, or None.
        initial_states: float32 (float64 accepted) [Bt, H, P, N], or None (zeros). With `cu_seqlens`:
            [S, H, P, N], one per sequence, or mamba's [1, H, P, N], the first sequence's (the others
            start from zero).
        seq_idx: int32 [Bt, L]: the state restarts at zero where the value changes.
        cu_seqlens: int32/int64 [S + 1], or None: S sequences packed in one row (Bt == 1), sequence i being
            tokens ``cu_seqlens[i]:cu_seqlens[i+1]`` (0 first, non-decreasing, L last; checked mode raises
            otherwise, unchecked such values give unspecified numbers, never an out-of-bounds access). Each
            sequence starts from its own initial state (zeros without `initial_states`); `seq_idx` may be
            given too and restarts the state within a sequence where it changes. mamba reads cu_seqlens
            only for `return_varlen_states` and separates the sequences by `seq_idx` alone: code that
            passes both (as it must for mamba to separate them) gets mamba's numbers.
        dt_softplus: apply softplus (threshold 20) to ``dt + dt_bias``.
        dt_limit: ``(low, high)`` bounds of the processed dt, low <= high.
        return_final_states: also return the state after the last step (with `cu_seqlens`: the last
            sequence's final state).
        return_varlen_states: also return each packed sequence's final state, [S, H, P, N] (an empty
            sequence's is its initial state); needs `cu_seqlens`.

    Returns:
        out [Bt, L, H, P] in x's dtype; followed, in mamba's order, by final_states [Bt, H, P, N] when
        `return_final_states` and varlen_states [S, H, P, N] when `return_varlen_states` (states float32,
        float64 for float64 x): ``out``, ``(out, final)``, ``(out, varlen)`` or ``(out, final, varlen)``.

    Raises:
        ContractError: a non-tensor, a bad flag or limit, a shape, dtype, device or stride that breaks the
            contract, a varlen argument without `cu_seqlens` or with Bt != 1, a tensor that requires grad
            while grad mode is on, or (checked mode) a cu_seqlens that does not cut the row; named by
            argument.
    """
    # The checks run on every call: each attribute is read once and a helper is called only to raise, in the
    # order of the contract.
    if not (strided(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens) and x is not None
            and dt is not None and A is not None and B is not None and C is not None):
        for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
            check_tensor(_SCAN, name, t)
        for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias), ("initial_states", initial_states),
                        ("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens)):
            check_tensor(_SCAN, name, t, optional=True)
    if wants_grad(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx, cu_seqlens):
        check_no_grad(_SCAN, {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias,
                              "initial_states": initial_states, "seq_idx": seq_idx, "cu_seqlens": cu_seqlens})
    for name, flag in (("dt_softplus", dt_softplus), ("return_final_states", return_final_states),
                       ("return_varlen_states", return_varlen_states)):
        if flag is not True and flag is not False:
            check_bool(_SCAN, name, flag)
    xdtype, xshape = x.dtype, x.shape
    if xdtype not in _FLOAT_SET:
        check_dtype(_SCAN, "x", x, FLOAT_DTYPES)
    if len(xshape) != 4:
        raise ContractError(_SCAN, "x", f"expected shape [Bt, L, H, P], got {list(x.shape)}")
    batch, length, heads, head_dim = xshape
    if head_dim > 1 and x.stride(3) != 1:
        last_dense(_SCAN, "x", x)
    device = x.device
    if dt.device != device or dt.dtype not in _FLOAT_SET or dt.shape != (batch, length, heads):
        check_device(_SCAN, "dt", dt, device)
        check_dtype(_SCAN, "dt", dt, FLOAT_DTYPES)
        check_shape(_SCAN, "dt", dt, (batch, length, heads), " ([Bt, L, H])")
    bshape = B.shape
    if len(bshape) != 4:
        raise ContractError(_SCAN, "B", f"expected shape [Bt, L, G, N], got {list(B.shape)}")
    groups, d_state = bshape[2], bshape[3]
    expected = (batch, length, groups, d_state)
    if B.device != device or B.dtype is not xdtype or bshape != expected or groups == 0 or heads % groups \
            or C.device != device or C.dtype is not xdtype or C.shape != expected \
            or (d_state > 1 and (B.stride(3) != 1 or C.stride(3) != 1)):
        check_like_x(_SCAN, "B", B, x, expected, " ([Bt, L, G, N])")
        check_groups(_SCAN, B, heads)
        check_like_x(_SCAN, "C", C, x, expected, " (same as B)")
    check_params(_SCAN, x, heads, head_dim, A, D, dt_bias)
    if z is not None and (z.device != device or z.dtype is not xdtype or z.shape != xshape
                          or (head_dim > 1 and z.stride(3) != 1)):
        check_like_x(_SCAN, "z", z, x, tuple(xshape), " (same as x)")
    dt_limit = _NO_LIMIT if dt_limit is _NO_LIMIT else _check_limit(dt_limit)  # the default is valid
    if seq_idx is not None:
        check_device(_SCAN, "seq_idx", seq_idx, x.device)
        check_dtype(_SCAN, "seq_idx", seq_idx, (torch.int32,))
        check_shape(_SCAN, "seq_idx", seq_idx, (batch, length), " ([Bt, L])")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ContractError(_SCAN, "chunk_size", f"expected an int >= 1, got {chunk_size!r}")
    sdt = state_dtype(x.dtype)
    if cu_seqlens is None:
        if return_varlen_states:
            raise ContractError(_SCAN, "return_varlen_states", "True needs cu_seqlens (the packed sequences)")
        sequences = batch
    else:
        sequences = _check_cu_seqlens(x, cu_seqlens)
    if initial_states is not None:
        check_device(_SCAN, "initial_states", initial_states, x.device)
        check_dtype(_SCAN, "initial_states", initial_states, STATE_DTYPES, " (states are float32)")
        rows = (sequences, 1) if cu_seqlens is not None else (batch,)
        if list(initial_states.shape[1:]) != [heads, head_dim, d_state] or initial_states.shape[0] not in rows:
            what = "[S, H, P, N] or [1, H, P, N] with cu_seqlens" if cu_seqlens is not None else "[Bt, H, P, N]"
            want = f"[{rows[0]}, {heads}, {head_dim}, {d_state}]"
            raise ContractError(_SCAN, "initial_states", f"expected shape {want} ({what}), "
                                                         f"got {list(initial_states.shape)}")
        if cu_seqlens is not None and initial_states.shape[0] != sequences:  # mamba's form: the first sequence's
            # (no sequence at all: it belongs to none)
            rest = initial_states.new_zeros(max(sequences - 1, 0), *initial_states.shape[1:])
            initial_states = torch.cat([initial_states, rest])[:sequences]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    final_states = varlen_states = None
    if cu_seqlens is not None and (return_final_states or return_varlen_states):
        varlen_states = torch.empty(sequences, heads, head_dim, d_state, dtype=sdt, device=x.device)
    elif return_final_states:
        final_states = torch.empty(batch, heads, head_dim, d_state, dtype=sdt, device=x.device)
    if x.numel() == 0:
        for states in (final_states, varlen_states):
            if states is not None and initial_states is not None:
                states.copy_(initial_states)
            elif states is not None:
                states.zero_()
    else:
        key = SPEC.key(device.type, xdtype, head_dim=head_dim, d_state=d_state, n_groups=groups,
                       chunk_size=chunk_size, has_D=D is not None, has_z=z is not None, has_dt_bias=dt_bias is not None,
                       dt_softplus=bool(dt_softplus), has_seq_idx=seq_idx is not None,
                       has_initial_states=initial_states is not None, return_final_states=return_final_states,
                       varlen=cu_seqlens is not None, return_varlen_states=return_varlen_states,
                       tokens=batch * length)
        args = (x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), tuple(dt_limit), initial_states, seq_idx,
                chunk_size, out, final_states)
        if cu_seqlens is None:
            dispatch(SPEC, key, *args)
        else:
            dispatch(SPEC, key, *args, ScanVarlen(cu_seqlens, varlen_states))
    if varlen_states is not None and return_final_states:
        final_states = (varlen_states[-1:].clone() if sequences else
                        torch.zeros(1, heads, head_dim, d_state, dtype=sdt, device=x.device))
    results = [out]
    if return_final_states:
        results.append(final_states)
    if return_varlen_states:
        results.append(varlen_states)
    return results[0] if len(results) == 1 else tuple(results)


def _check_cu_seqlens(x: torch.Tensor, cu_seqlens: torch.Tensor) -> int:
    """Check the packed form's `cu_seqlens` (and Bt == 1); return the number of sequences S."""
    check_device(_SCAN, "cu_seqlens", cu_seqlens, x.device)
    check_dtype(_SCAN, "cu_seqlens", cu_seqlens, INDEX_DTYPES)
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ContractError(_SCAN, "cu_seqlens", f"expected shape [S + 1] (S >= 0), got {list(cu_seqlens.shape)}")
    if x.shape[0] != 1:
        raise ContractError(_SCAN, "x", f"cu_seqlens packs the sequences in one row: expected Bt == 1, got "
                                        f"shape {list(x.shape)}")
    check_cu_seqlens(_SCAN, "cu_seqlens", cu_seqlens, x.shape[1])
    return cu_seqlens.shape[0] - 1


def _check_limit(dt_limit: tuple[float, float]) -> tuple[float, float]:
    """`dt_limit` as two floats (an int beyond the float range is that infinity), low <= high."""
    try:
        low, high = dt_limit
    except (TypeError, ValueError):
        raise ContractError(_SCAN, "dt_limit", f"expected a (low, high) pair of floats, got {dt_limit!r}") from None
    for v in (low, high):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ContractError(_SCAN, "dt_limit", f"expected a (low, high) pair of floats, got {dt_limit!r}")
    if not low <= high:
        raise ContractError(_SCAN, "dt_limit", f"expected low <= high, got {dt_limit!r}")
    return _as_float(low), _as_float(high)


def _as_float(v: float) -> float:
    try:
        return float(v)
    except OverflowError:  # an int of more than 309 digits: beyond every float, so that infinity
        return math.inf if v > 0 else -math.inf


