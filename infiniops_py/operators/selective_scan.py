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
"""

from __future__ import annotations

import math
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
    dtype_name,
)
from infiniops_py.operators._torch_library import lowered
from infiniops_py.operators.causal_conv1d import check_cu_seqlens

__all__ = ["SPECS", "ScanVarlen", "process_dt", "selective_scan", "selective_state_update", "state_dtype",
           "untied_view"]

_SCAN = "selective_scan"
_UPDATE = "selective_state_update"
_STATE_DTYPES: Final = (torch.float32, torch.float64)
_NO_LIMIT: Final = (0.0, math.inf)


class ScanVarlen(NamedTuple):
    """The packed form of a `selective_scan` call, as implementations receive it.

    Attributes:
        cu_seqlens: int32/int64 [S + 1] on x's device: sequence i is tokens ``cu_seqlens[i]:cu_seqlens[i+1]``
            of the one row.
        varlen_states: None, or [S, H, P, N] in the state dtype, to fill with each sequence's final state
            (its initial state, or zeros, when it is empty).
    """

    cu_seqlens: torch.Tensor
    varlen_states: torch.Tensor | None


def state_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """The dtype of states and arithmetic for inputs in `x_dtype`: float64 for float64, else float32."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def process_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool,
               dt_limit: tuple[float, float] | None, dtype: torch.dtype) -> torch.Tensor:
    """``softplus(dt + dt_bias)`` (softplus, threshold 20, only when `dt_softplus`), in `dtype`, then
    clamped to ``dt_limit = (low, high)``, or not clamped at all when `dt_limit` is None (the state
    update's rule). dt_bias broadcasts against dt's trailing dims: [H] against [..., H], [H, P] against
    [..., H, P]."""
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    if dt_softplus:
        dt = F.softplus(dt, beta=1.0, threshold=20.0)
    return dt if dt_limit is None else dt.clamp(dt_limit[0], dt_limit[1])


# --- checks shared by both entry points ------------------------------------------------------------

def _last_dense(op: str, name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ContractError(op, name, f"strides {t.stride()}: the last dim needs stride 1; call .contiguous()")


def _check_like_x(op: str, name: str, t: torch.Tensor, x: torch.Tensor, shape: tuple[int, ...], what: str) -> None:
    check_device(op, name, t, x.device)
    if t.dtype != x.dtype:
        raise ContractError(op, name, f"expected dtype {x.dtype} (same as x), got {t.dtype}")
    check_shape(op, name, t, shape, what)
    _last_dense(op, name, t)


def _check_params(op: str, x: torch.Tensor, heads: int, head_dim: int, A: torch.Tensor,
                  D: torch.Tensor | None, dt_bias: torch.Tensor | None, d_state: int | None = None) -> None:
    """A [H] fp32 (fp64 allowed), D [H] or [H, P], dt_bias [H], any float dtype; with `d_state` (the state
    update) also the untied forms A [H, P, N] and dt_bias [H, P]."""
    check_device(op, "A", A, x.device)
    check_dtype(op, "A", A, _STATE_DTYPES, " (A is kept in float32)")
    if d_state is None:
        check_shape(op, "A", A, (heads,), " ([H])")
    elif list(A.shape) not in ([heads], [heads, head_dim, d_state]):
        raise ContractError(op, "A", f"expected shape [{heads}] or [{heads}, {head_dim}, {d_state}] ([H] or "
                                     f"[H, P, N]), got {list(A.shape)}")
    if D is not None:
        check_device(op, "D", D, x.device)
        check_dtype(op, "D", D, FLOAT_DTYPES)
        if list(D.shape) not in ([heads], [heads, head_dim]):
            raise ContractError(op, "D", f"expected shape [{heads}] or [{heads}, {head_dim}] ([H] or [H, P]), "
                                         f"got {list(D.shape)}")
    if dt_bias is not None:
        check_device(op, "dt_bias", dt_bias, x.device)
        check_dtype(op, "dt_bias", dt_bias, FLOAT_DTYPES)
        if d_state is None:
            check_shape(op, "dt_bias", dt_bias, (heads,), " ([H])")
        elif list(dt_bias.shape) not in ([heads], [heads, head_dim]):
            raise ContractError(op, "dt_bias", f"expected shape [{heads}] or [{heads}, {head_dim}] ([H] or "
                                               f"[H, P]), got {list(dt_bias.shape)}")


def _check_groups(op: str, B: torch.Tensor, heads: int) -> int:
    groups = B.shape[-2]
    if groups == 0 or heads % groups:
        raise ContractError(op, "B", f"n_groups G={groups} (B.shape[-2]) must divide the head count H={heads}")
    return groups


# --- selective_scan --------------------------------------------------------------------------------

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
    if lowered(x):  # torch.compile / torch.export / FakeTensor: the custom operator
        return _lowered_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, seq_idx,
                             chunk_size, cu_seqlens, return_final_states, return_varlen_states)
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        check_tensor(_SCAN, name, t)
    for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias), ("initial_states", initial_states),
                    ("seq_idx", seq_idx), ("cu_seqlens", cu_seqlens)):
        check_tensor(_SCAN, name, t, optional=True)
    check_no_grad(_SCAN, {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias,
                          "initial_states": initial_states, "seq_idx": seq_idx, "cu_seqlens": cu_seqlens})
    check_bool(_SCAN, "dt_softplus", dt_softplus)
    check_bool(_SCAN, "return_final_states", return_final_states)
    check_bool(_SCAN, "return_varlen_states", return_varlen_states)
    check_dtype(_SCAN, "x", x, FLOAT_DTYPES)
    if x.dim() != 4:
        raise ContractError(_SCAN, "x", f"expected shape [Bt, L, H, P], got {list(x.shape)}")
    _last_dense(_SCAN, "x", x)
    batch, length, heads, head_dim = x.shape
    check_device(_SCAN, "dt", dt, x.device)
    check_dtype(_SCAN, "dt", dt, FLOAT_DTYPES)
    check_shape(_SCAN, "dt", dt, (batch, length, heads), " ([Bt, L, H])")
    if B.dim() != 4:
        raise ContractError(_SCAN, "B", f"expected shape [Bt, L, G, N], got {list(B.shape)}")
    groups, d_state = B.shape[2], B.shape[3]
    _check_like_x(_SCAN, "B", B, x, (batch, length, groups, d_state), " ([Bt, L, G, N])")
    _check_groups(_SCAN, B, heads)
    _check_like_x(_SCAN, "C", C, x, (batch, length, groups, d_state), " (same as B)")
    _check_params(_SCAN, x, heads, head_dim, A, D, dt_bias)
    if z is not None:
        _check_like_x(_SCAN, "z", z, x, tuple(x.shape), " (same as x)")
    _check_limit(dt_limit)
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
        check_dtype(_SCAN, "initial_states", initial_states, _STATE_DTYPES, " (states are float32)")
        rows = (sequences, 1) if cu_seqlens is not None else (batch,)
        if list(initial_states.shape[1:]) != [heads, head_dim, d_state] or initial_states.shape[0] not in rows:
            what = "[S, H, P, N] or [1, H, P, N] with cu_seqlens" if cu_seqlens is not None else "[Bt, H, P, N]"
            want = f"[{rows[0]}, {heads}, {head_dim}, {d_state}]"
            raise ContractError(_SCAN, "initial_states", f"expected shape {want} ({what}), "
                                                         f"got {list(initial_states.shape)}")
        if cu_seqlens is not None and initial_states.shape[0] != sequences:  # mamba's form: the first sequence's
            rest = initial_states.new_zeros(sequences - 1, *initial_states.shape[1:])
            initial_states = torch.cat([initial_states, rest])
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
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
        key = (x.device.type, x.dtype, head_dim, d_state, groups, chunk_size, D is not None, z is not None,
               dt_bias is not None, bool(dt_softplus), seq_idx is not None, initial_states is not None,
               return_final_states, cu_seqlens is not None, return_varlen_states)
        args = (x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), tuple(dt_limit), initial_states, seq_idx,
                chunk_size, out, final_states)
        if cu_seqlens is None:
            SPEC.call(key, *args)
        else:
            SPEC.call(key, *args, ScanVarlen(cu_seqlens, varlen_states))
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


def _lowered_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                  D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
                  dt_limit: tuple[float, float], initial_states: torch.Tensor | None,
                  seq_idx: torch.Tensor | None, chunk_size: int, cu_seqlens: torch.Tensor | None,
                  return_final_states: bool, return_varlen_states: bool) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """`selective_scan` through its custom operator, one overload per form of the result."""
    scan = torch.ops.infiniops.selective_scan
    args = (x, dt, A, B, C, D, z, dt_bias, dt_softplus, list(dt_limit), initial_states, seq_idx, chunk_size,
            cu_seqlens)
    if return_varlen_states is True:  # the final state is the last sequence's (one overload: no 3-tuple op)
        out, varlen = scan.with_varlen_states(*args)
        if return_final_states is not True:
            return out, varlen
        final = varlen[-1:].clone() if varlen.shape[0] else varlen.new_zeros((1, *varlen.shape[1:]))
        return out, final, varlen
    return scan.with_final_states(*args) if return_final_states is True else scan.default(*args)


def _check_limit(dt_limit: tuple[float, float]) -> None:
    try:
        low, high = dt_limit
    except (TypeError, ValueError):
        raise ContractError(_SCAN, "dt_limit", f"expected a (low, high) pair of floats, got {dt_limit!r}") from None
    for v in (low, high):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ContractError(_SCAN, "dt_limit", f"expected a (low, high) pair of floats, got {dt_limit!r}")
    if not low <= high:
        raise ContractError(_SCAN, "dt_limit", f"expected low <= high, got {dt_limit!r}")


def _d_term(D: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``D * x`` for D [H] or [H, P] and x [..., H, P]."""
    d = D.to(x.dtype)
    return (d[:, None] if d.dim() == 1 else d) * x


def reference(
    x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    dt_limit: tuple[float, float], initial_states: torch.Tensor | None, seq_idx: torch.Tensor | None,
    chunk_size: int, out: torch.Tensor, final_states: torch.Tensor | None, varlen: ScanVarlen | None = None,
) -> None:
    """Literal reference: the sequential recurrence, one time step at a time (`chunk_size` is unused); a
    packed row restarts at each sequence start from that sequence's initial state (cu_seqlens is read on
    the host: it synchronizes on CUDA)."""
    batch, length, heads, head_dim = x.shape
    d_state = B.shape[3]
    cdt = state_dtype(x.dtype)
    rep = heads // B.shape[2]
    xs = x.to(cdt)
    steps = process_dt(dt, dt_bias, dt_softplus, dt_limit, cdt)  # [Bt, L, H]
    a = A.to(cdt)
    bh = B.to(cdt).repeat_interleave(rep, dim=2)  # [Bt, L, H, N]
    ch = C.to(cdt).repeat_interleave(rep, dim=2)
    zeros = torch.zeros(batch, heads, head_dim, d_state, dtype=cdt, device=x.device)
    if varlen is None:
        state = zeros if initial_states is None else initial_states.to(cdt)
        starts: dict[int, int] = {}
        ends: dict[int, int] = {}
    else:  # sequence i begins at token cu[i] and ends at cu[i + 1] - 1 (the last of equal starts wins)
        cu = varlen.cu_seqlens.tolist()
        starts = {cu[i]: i for i in range(len(cu) - 1) if cu[i] < cu[i + 1]}
        ends = {cu[i + 1] - 1: i for i in range(len(cu) - 1) if cu[i] < cu[i + 1]}
        state = zeros

    def initial(i: int) -> torch.Tensor:
        return zeros[0] if initial_states is None else initial_states[i].to(cdt)

    if varlen is not None and varlen.varlen_states is not None:
        for i in range(varlen.varlen_states.shape[0]):  # empty sequences keep their initial state
            varlen.varlen_states[i] = initial(i)
    ys = []
    for t in range(length):
        if t in starts:
            state = initial(starts[t])[None]
        elif seq_idx is not None and t > 0:
            restart = (seq_idx[:, t] != seq_idx[:, t - 1])[:, None, None, None]
            state = torch.where(restart, torch.zeros_like(state), state)
        step = steps[:, t, :, None, None]  # [Bt, H, 1, 1]
        state = torch.exp(step * a[:, None, None]) * state + step * xs[:, t, :, :, None] * bh[:, t, :, None, :]
        ys.append((state * ch[:, t, :, None, :]).sum(-1))  # [Bt, H, P]
        if t in ends and varlen is not None and varlen.varlen_states is not None:
            varlen.varlen_states[ends[t]] = state[0]
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + _d_term(D, xs)
    if z is not None:
        y = y * F.silu(z.to(cdt))
    out.copy_(y)
    if final_states is not None:
        final_states.copy_(state)


# --- selective_state_update ------------------------------------------------------------------------

def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step against stored states (mamba_ssm's ``selective_state_update``, in its argument order).

    Row b advances slot ``state_batch_indices[b]`` (b when None) by one step, in place, and returns that
    step's output. dt is ``softplus(dt + dt_bias)`` (softplus when asked) and is never clamped, as in
    mamba's kernel and reference: a negative step stays negative (`selective_scan` clamps to its
    ``dt_limit``, by default ``(0, inf)``), so for dt >= 0 this is one step of `selective_scan`. An index
    < 0 skips the row: output 0, no state read or written. Two rows may not name one slot: in checked mode a
    repeated non-negative index raises; unchecked, the slot's state and both rows' outputs are undefined
    (one provider reads every slot before writing any, another runs the rows in order).

    Mamba's untied layouts are taken as well: a per-channel step dt [B, H, P], decay A [H, P, N] and bias
    dt_bias [H, P], each independently of the others, with ``state[h, p, n] <- exp(dt[h, p] * A[h, p, n])
    * state + dt[h, p] * x[h, p] * B[g, n]``. A view whose extra dims have stride 0 (mamba's "tied" calls,
    ``repeat(dt, "b h -> b h p")``) is taken as the per-head form it repeats.

    Args:
        state: [slots, H, P, N] float16/bfloat16/float32/float64 (mamba's kernel keeps any state dtype: the
            arithmetic is float32, float64 when x or state is float64, and the new state is rounded to the
            state's dtype), updated in place; last dim dense, no expanded (zero-stride) or self-overlapping
            dims, no memory shared with another argument. Without indices, slots == B (unless B == 0: an
            empty batch does nothing).
        x: [B, H, P] float16/bfloat16/float32/float64, last dim dense.
        dt: [B, H] or [B, H, P], any float dtype, any strides.
        A: [H] or [H, P, N], float32 (float64 accepted), any strides.
        B, C: [B, G, N] in x's dtype, last dim dense; G divides H.
        D: [H] or [H, P], any float dtype, or None.
        z: like x, or None.
        dt_bias: [H] or [H, P], any float dtype, or None.
        dt_softplus: apply softplus (threshold 20) to ``dt + dt_bias``.
        state_batch_indices: int32/int64 [B] slot per row, < slots, each non-negative value once; negative
            values are padding (and may repeat).

    Returns:
        out [B, H, P] in x's dtype, computed from the unrounded new state.

    Raises:
        ContractError: a non-tensor, a bad flag, shape, dtype, device or stride, a state that cannot be
            written in place, a tensor that requires grad while grad mode is on; in checked mode an index
            >= slots or a repeated index.
    """
    if lowered(x):  # torch.compile / torch.export / FakeTensor: the custom operator
        return torch.ops.infiniops.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                                                          state_batch_indices)
    for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        check_tensor(_UPDATE, name, t)
    for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias), ("state_batch_indices", state_batch_indices)):
        check_tensor(_UPDATE, name, t, optional=True)
    check_no_grad(_UPDATE, {"state": state, "x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z,
                            "dt_bias": dt_bias, "state_batch_indices": state_batch_indices})
    check_bool(_UPDATE, "dt_softplus", dt_softplus)
    check_dtype(_UPDATE, "x", x, FLOAT_DTYPES)
    if x.dim() != 3:
        raise ContractError(_UPDATE, "x", f"expected shape [B, H, P], got {list(x.shape)}")
    _last_dense(_UPDATE, "x", x)
    batch, heads, head_dim = x.shape
    check_device(_UPDATE, "state", state, x.device)
    check_dtype(_UPDATE, "state", state, FLOAT_DTYPES)
    if state.dim() != 4:
        raise ContractError(_UPDATE, "state", f"expected shape [slots, H, P, N], got {list(state.shape)}")
    slots, d_state = state.shape[0], state.shape[3]
    check_shape(_UPDATE, "state", state, (slots, heads, head_dim, d_state), " ([slots, H, P, N], H and P from x)")
    _last_dense(_UPDATE, "state", state)
    check_writable(_UPDATE, "state", state)
    check_device(_UPDATE, "dt", dt, x.device)
    check_dtype(_UPDATE, "dt", dt, FLOAT_DTYPES)
    if list(dt.shape) not in ([batch, heads], [batch, heads, head_dim]):
        raise ContractError(_UPDATE, "dt", f"expected shape [{batch}, {heads}] or [{batch}, {heads}, {head_dim}] "
                                           f"([B, H] or [B, H, P]), got {list(dt.shape)}")
    if B.dim() != 3:
        raise ContractError(_UPDATE, "B", f"expected shape [B, G, N], got {list(B.shape)}")
    groups = B.shape[1]
    _check_like_x(_UPDATE, "B", B, x, (batch, groups, d_state), " ([B, G, N], N from state)")
    _check_groups(_UPDATE, B, heads)
    _check_like_x(_UPDATE, "C", C, x, (batch, groups, d_state), " (same as B)")
    _check_params(_UPDATE, x, heads, head_dim, A, D, dt_bias, d_state)
    if z is not None:
        _check_like_x(_UPDATE, "z", z, x, tuple(x.shape), " (same as x)")
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z), ("dt_bias", dt_bias),
                    ("state_batch_indices", state_batch_indices)):
        if t is not None:
            check_no_overlap(_UPDATE, name, t, "state", state)
    if state_batch_indices is None:
        if slots != batch and batch:
            raise ContractError(_UPDATE, "state", f"expected {batch} slots (one per row of x) without "
                                                  f"state_batch_indices, got {slots}")
    else:
        check_device(_UPDATE, "state_batch_indices", state_batch_indices, x.device)
        check_dtype(_UPDATE, "state_batch_indices", state_batch_indices, INDEX_DTYPES)
        check_shape(_UPDATE, "state_batch_indices", state_batch_indices, (batch,), " ([B])")
        check_index_range(_UPDATE, "state_batch_indices", state_batch_indices, slots, allow_negative=True)
        check_unique_indices(_UPDATE, "state_batch_indices", state_batch_indices)
    dt, A, dt_bias = _tie(dt, A, dt_bias)
    untied = dt.dim() == 3 or A.dim() == 3 or (dt_bias is not None and dt_bias.dim() == 2)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        key = (x.device.type, x.dtype, head_dim, d_state, groups, D is not None, z is not None,
               dt_bias is not None, bool(dt_softplus), state_batch_indices is not None, untied,
               dtype_name(state.dtype))
        SPEC_UPDATE.call(key, state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), state_batch_indices, out)
    return out


def _tie(dt: torch.Tensor, A: torch.Tensor, dt_bias: torch.Tensor | None
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The per-head form of each untied argument that only repeats one value per head (stride 0 along P,
    and N for A): mamba's "tied" calls then take the per-head kernels."""
    if dt.dim() == 3 and (dt.stride(2) == 0 or dt.shape[2] == 1):
        dt = dt[:, :, 0]
    if A.dim() == 3 and (A.stride(1) == 0 or A.shape[1] == 1) and (A.stride(2) == 0 or A.shape[2] == 1):
        A = A[:, 0, 0]
    if dt_bias is not None and dt_bias.dim() == 2 and (dt_bias.stride(1) == 0 or dt_bias.shape[1] == 1):
        dt_bias = dt_bias[:, 0]
    return dt, A, dt_bias


def untied_view(dt: torch.Tensor, A: torch.Tensor, dt_bias: torch.Tensor | None, head_dim: int, d_state: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """dt [B, H, P], A [H, P, N] and dt_bias [H, P] from either form (per-head ones expanded, no copy)."""
    if dt.dim() == 2:
        dt = dt[:, :, None].expand(*dt.shape, head_dim)
    if A.dim() == 1:
        A = A[:, None, None].expand(A.shape[0], head_dim, d_state)
    if dt_bias is not None and dt_bias.dim() == 1:
        dt_bias = dt_bias[:, None].expand(dt_bias.shape[0], head_dim)
    return dt, A, dt_bias


def reference_update(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    state_batch_indices: torch.Tensor | None, out: torch.Tensor,
) -> None:
    """Literal reference: row by row, one unclamped step of the recurrence on the row's slot, in the untied
    form (the indices are read on the host, one at a time: it synchronizes on CUDA)."""
    slots, _, head_dim, d_state = state.shape
    cdt = torch.float64 if torch.float64 in (x.dtype, state.dtype) else torch.float32
    rep = x.shape[1] // B.shape[1]
    dt, A, dt_bias = untied_view(dt, A, dt_bias, head_dim, d_state)
    steps = process_dt(dt, dt_bias, dt_softplus, None, cdt)  # [B, H, P]
    a = A.to(cdt)  # [H, P, N]
    for b in range(x.shape[0]):
        slot = b if state_batch_indices is None else int(state_batch_indices[b])
        if not 0 <= slot < slots:
            out[b] = 0
            continue
        xb = x[b].to(cdt)
        bh = B[b].to(cdt).repeat_interleave(rep, dim=0)  # [H, N]
        ch = C[b].to(cdt).repeat_interleave(rep, dim=0)
        step = steps[b, :, :, None]  # [H, P, 1]
        s = torch.exp(step * a) * state[slot].to(cdt) + step * xb[:, :, None] * bh[:, None, :]
        y = (s * ch[:, None, :]).sum(-1)
        if D is not None:
            y = y + _d_term(D, xb)
        if z is not None:
            y = y * F.silu(z[b].to(cdt))
        state[slot] = s
        out[b] = y


SPEC = OpSpec(
    name=_SCAN,
    fields={"head_dim": 64, "d_state": 128, "n_groups": 1, "chunk_size": 256, "has_D": True, "has_z": True,
            "has_dt_bias": True, "dt_softplus": True, "has_seq_idx": False, "has_initial_states": False,
            "return_final_states": False, "varlen": False, "return_varlen_states": False},
    function=selective_scan,
    reference=reference,
    doc="Mamba-2 SSD selective scan over [Bt, L, H, P], D/z/dt_bias/softplus/dt_limit, seq_idx, states, "
        "cu_seqlens packing with per-sequence states",
)
SPEC_UPDATE = OpSpec(
    name=_UPDATE,
    fields={"head_dim": 64, "d_state": 128, "n_groups": 1, "has_D": True, "has_z": True, "has_dt_bias": True,
            "dt_softplus": True, "has_indices": False, "untied": False, "state_dtype": "float32"},
    function=selective_state_update,
    reference=reference_update,
    doc="one Mamba-2 decode step on states [slots, H, P, N] in place (no dt clamp), gathered slots, untied "
        "dt/A/dt_bias, 16-bit states",
)
SPECS = (SPEC, SPEC_UPDATE)
