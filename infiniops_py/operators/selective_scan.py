"""Selective scan with Mamba-2 SSD semantics, prefill and one decode step (DESIGN.md op 8).

Implementation calling conventions:
  selective_scan: fn(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_limit, initial_states, seq_idx,
    chunk_size, out, final_states) -> None; out like x [Bt, L, H, P] in x.dtype; final_states None or fp32
    [Bt, H, P, N] to fill.
  selective_state_update: fn(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, out)
    -> None; state fp32 [slots, H, P, N] in place; out [B, H, P] in x.dtype.
Problem fields: selective_scan: head_dim (P), d_state (N), n_groups, chunk_size, has_D, has_z,
  has_dt_bias, dt_softplus, has_seq_idx, has_initial_states, return_final_states;
  selective_state_update: head_dim, d_state, n_groups, has_D, has_z, has_dt_bias, dt_softplus, has_indices.

Semantics (peers: mamba_ssm's ``mamba_chunk_scan_combined`` and ``selective_state_update``, vLLM's SSD):
  per step t, head h of group ``g = h // (H // G)``::

    dt    <- clamp(softplus(dt + dt_bias), *dt_limit)     softplus passes values above 20 through
    state <- exp(dt * A[h]) * state + dt * outer(x[t, h], B[t, g])             state [P, N]
    y[t, h] = state @ C[t, g] + D[h] * x[t, h],  then * silu(z[t, h]) when z is given

  The clamp always applies, so the default ``dt_limit=(0, inf)`` turns a negative step into 0 (as the
  peers' Triton scan does); `selective_state_update` takes no limit and clamps to ``(0, inf)`` too, so that
  it equals one step of `selective_scan`. ``seq_idx`` zeroes the state where its value changes from t-1 to
  t; the initial states belong to the row's first sequence and the final states to its last. States and
  arithmetic are float32 (float64 when x is float64, the oracle's precision); outputs have x's dtype.
"""

from __future__ import annotations

import math
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

__all__ = ["SPECS", "process_dt", "selective_scan", "selective_state_update", "state_dtype"]

_SCAN = "selective_scan"
_UPDATE = "selective_state_update"
_STATE_DTYPES: Final = (torch.float32, torch.float64)
_NO_LIMIT: Final = (0.0, math.inf)


def state_dtype(x_dtype: torch.dtype) -> torch.dtype:
    """The dtype of states and arithmetic for inputs in `x_dtype`: float64 for float64, else float32."""
    return torch.float64 if x_dtype == torch.float64 else torch.float32


def process_dt(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool,
               dt_limit: tuple[float, float], dtype: torch.dtype) -> torch.Tensor:
    """``clamp(softplus(dt + dt_bias), *dt_limit)`` in `dtype`; dt_bias [H] broadcasts over the last dim."""
    dt = dt.to(dtype)
    if dt_bias is not None:
        dt = dt + dt_bias.to(dtype)
    if dt_softplus:
        dt = F.softplus(dt, beta=1.0, threshold=20.0)
    return dt.clamp(dt_limit[0], dt_limit[1])


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
                  D: torch.Tensor | None, dt_bias: torch.Tensor | None) -> None:
    """A [H] fp32 (fp64 allowed), D [H] or [H, P], dt_bias [H], any float dtype."""
    check_device(op, "A", A, x.device)
    check_dtype(op, "A", A, _STATE_DTYPES, " (A is kept in float32)")
    check_shape(op, "A", A, (heads,), " ([H])")
    if D is not None:
        check_device(op, "D", D, x.device)
        check_dtype(op, "D", D, FLOAT_DTYPES)
        if list(D.shape) not in ([heads], [heads, head_dim]):
            raise ContractError(op, "D", f"expected shape [{heads}] or [{heads}, {head_dim}] ([H] or [H, P]), "
                                         f"got {list(D.shape)}")
    if dt_bias is not None:
        check_device(op, "dt_bias", dt_bias, x.device)
        check_dtype(op, "dt_bias", dt_bias, FLOAT_DTYPES)
        check_shape(op, "dt_bias", dt_bias, (heads,), " ([H])")


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
    *,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = _NO_LIMIT,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    return_final_states: bool = False,
    chunk_size: int = 256,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The Mamba-2 selective scan over a sequence (mamba_ssm's ``mamba_chunk_scan_combined``).

    Args:
        x: [Bt, L, H, P] float16/bfloat16/float32/float64, last dim dense.
        dt: [Bt, L, H], any float dtype: the step sizes before bias, softplus and clamp.
        A: [H] float32 (float64 accepted): the per-head decay rate (negative for a stable scan).
        B, C: [Bt, L, G, N] in x's dtype, last dim dense; G divides H; head h uses group h // (H // G).
        D: [H] or [H, P], any float dtype, or None: the skip term ``D * x``.
        z: like x, or None: the output is gated by ``silu(z)`` after the D term.
        dt_bias: [H], any float dtype, or None.
        dt_softplus: apply softplus (threshold 20) to ``dt + dt_bias``.
        dt_limit: ``(low, high)`` bounds of the processed dt, low <= high.
        initial_states: [Bt, H, P, N] float32 (float64 accepted), or None (zeros).
        seq_idx: int32 [Bt, L]: the state restarts at zero where the value changes.
        return_final_states: also return the state after the last step.
        chunk_size: the scan's chunk length (a performance knob, >= 1; results do not depend on it).

    Returns:
        out [Bt, L, H, P] in x's dtype; ``(out, final_states)`` with final_states [Bt, H, P, N] float32
        (float64 for float64 x) when `return_final_states`.

    Raises:
        ContractError: a non-tensor, a bad flag or limit, a shape, dtype, device or stride that breaks the
            contract, or a tensor that requires grad while grad mode is on, named by argument.
    """
    if lowered(x):  # torch.compile / torch.export / FakeTensor: the custom operator
        scan = torch.ops.infiniops.selective_scan
        args = (x, dt, A, B, C, D, z, dt_bias, dt_softplus, list(dt_limit), initial_states, seq_idx, chunk_size)
        return scan.with_final_states(*args) if return_final_states is True else scan.default(*args)
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        check_tensor(_SCAN, name, t)
    for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias), ("initial_states", initial_states),
                    ("seq_idx", seq_idx)):
        check_tensor(_SCAN, name, t, optional=True)
    check_no_grad(_SCAN, {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias,
                          "initial_states": initial_states, "seq_idx": seq_idx})
    check_bool(_SCAN, "dt_softplus", dt_softplus)
    check_bool(_SCAN, "return_final_states", return_final_states)
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
    if initial_states is not None:
        check_device(_SCAN, "initial_states", initial_states, x.device)
        check_dtype(_SCAN, "initial_states", initial_states, _STATE_DTYPES, " (states are float32)")
        check_shape(_SCAN, "initial_states", initial_states, (batch, heads, head_dim, d_state), " ([Bt, H, P, N])")
    if seq_idx is not None:
        check_device(_SCAN, "seq_idx", seq_idx, x.device)
        check_dtype(_SCAN, "seq_idx", seq_idx, (torch.int32,))
        check_shape(_SCAN, "seq_idx", seq_idx, (batch, length), " ([Bt, L])")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ContractError(_SCAN, "chunk_size", f"expected an int >= 1, got {chunk_size!r}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    sdt = state_dtype(x.dtype)
    final_states = (torch.empty(batch, heads, head_dim, d_state, dtype=sdt, device=x.device)
                    if return_final_states else None)
    if x.numel() == 0:
        if final_states is not None and initial_states is not None:
            final_states.copy_(initial_states)
        elif final_states is not None:
            final_states.zero_()
    else:
        key = (x.device.type, x.dtype, head_dim, d_state, groups, chunk_size, D is not None, z is not None,
               dt_bias is not None, bool(dt_softplus), seq_idx is not None, initial_states is not None,
               return_final_states)
        SPEC.call(key, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), tuple(dt_limit), initial_states,
                  seq_idx, chunk_size, out, final_states)
    return (out, final_states) if final_states is not None else out


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
    chunk_size: int, out: torch.Tensor, final_states: torch.Tensor | None,
) -> None:
    """Literal reference: the sequential recurrence, one time step at a time (`chunk_size` is unused)."""
    batch, length, heads, head_dim = x.shape
    cdt = state_dtype(x.dtype)
    rep = heads // B.shape[2]
    xs = x.to(cdt)
    steps = process_dt(dt, dt_bias, dt_softplus, dt_limit, cdt)  # [Bt, L, H]
    a = A.to(cdt)
    bh = B.to(cdt).repeat_interleave(rep, dim=2)  # [Bt, L, H, N]
    ch = C.to(cdt).repeat_interleave(rep, dim=2)
    if initial_states is None:
        state = torch.zeros(batch, heads, head_dim, B.shape[3], dtype=cdt, device=x.device)
    else:
        state = initial_states.to(cdt)
    ys = []
    for t in range(length):
        if seq_idx is not None and t > 0:
            restart = (seq_idx[:, t] != seq_idx[:, t - 1])[:, None, None, None]
            state = torch.where(restart, torch.zeros_like(state), state)
        step = steps[:, t, :, None, None]  # [Bt, H, 1, 1]
        state = torch.exp(step * a[:, None, None]) * state + step * xs[:, t, :, :, None] * bh[:, t, :, None, :]
        ys.append((state * ch[:, t, :, None, :]).sum(-1))  # [Bt, H, P]
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
    *,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decode step of `selective_scan` against stored states (mamba_ssm's ``selective_state_update``).

    Row b advances slot ``state_batch_indices[b]`` (b when None) by one step, in place, and returns that
    step's output; dt is clamped to ``(0, inf)`` like `selective_scan`'s default. An index < 0 skips the row:
    output 0, no state read or written. Two rows may not name one slot: in checked mode a repeated
    non-negative index raises; unchecked, the slot's state and both rows' outputs are undefined (one
    provider reads every slot before writing any, another runs the rows in order).

    Args:
        state: [slots, H, P, N] float32 (float64 accepted), updated in place; last dim dense, no expanded
            (zero-stride) or self-overlapping dims, no memory shared with another argument. Without
            indices, slots == B (unless B == 0: an empty batch does nothing).
        x: [B, H, P] float16/bfloat16/float32/float64, last dim dense.
        dt: [B, H], any float dtype.
        A: [H] float32 (float64 accepted).
        B, C: [B, G, N] in x's dtype, last dim dense; G divides H.
        D: [H] or [H, P], any float dtype, or None.
        z: like x, or None.
        dt_bias: [H], any float dtype, or None.
        dt_softplus: apply softplus (threshold 20) to ``dt + dt_bias``.
        state_batch_indices: int32/int64 [B] slot per row, < slots, each non-negative value once; negative
            values are padding (and may repeat).

    Returns:
        out [B, H, P] in x's dtype.

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
    check_dtype(_UPDATE, "state", state, _STATE_DTYPES, " (states are float32)")
    if state.dim() != 4:
        raise ContractError(_UPDATE, "state", f"expected shape [slots, H, P, N], got {list(state.shape)}")
    slots, d_state = state.shape[0], state.shape[3]
    check_shape(_UPDATE, "state", state, (slots, heads, head_dim, d_state), " ([slots, H, P, N], H and P from x)")
    _last_dense(_UPDATE, "state", state)
    check_writable(_UPDATE, "state", state)
    check_device(_UPDATE, "dt", dt, x.device)
    check_dtype(_UPDATE, "dt", dt, FLOAT_DTYPES)
    check_shape(_UPDATE, "dt", dt, (batch, heads), " ([B, H])")
    if B.dim() != 3:
        raise ContractError(_UPDATE, "B", f"expected shape [B, G, N], got {list(B.shape)}")
    groups = B.shape[1]
    _check_like_x(_UPDATE, "B", B, x, (batch, groups, d_state), " ([B, G, N], N from state)")
    _check_groups(_UPDATE, B, heads)
    _check_like_x(_UPDATE, "C", C, x, (batch, groups, d_state), " (same as B)")
    _check_params(_UPDATE, x, heads, head_dim, A, D, dt_bias)
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
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        key = (x.device.type, x.dtype, head_dim, d_state, groups, D is not None, z is not None,
               dt_bias is not None, bool(dt_softplus), state_batch_indices is not None)
        SPEC_UPDATE.call(key, state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), state_batch_indices, out)
    return out


def reference_update(
    state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None, dt_softplus: bool,
    state_batch_indices: torch.Tensor | None, out: torch.Tensor,
) -> None:
    """Literal reference: row by row, one step of `reference`'s recurrence on the row's slot (the indices
    are read on the host, one at a time: it synchronizes on CUDA)."""
    slots = state.shape[0]
    cdt = torch.float64 if torch.float64 in (x.dtype, state.dtype) else torch.float32
    rep = x.shape[1] // B.shape[1]
    steps = process_dt(dt, dt_bias, dt_softplus, _NO_LIMIT, cdt)  # [B, H]
    a = A.to(cdt)
    for b in range(x.shape[0]):
        slot = b if state_batch_indices is None else int(state_batch_indices[b])
        if not 0 <= slot < slots:
            out[b] = 0
            continue
        xb = x[b].to(cdt)
        bh = B[b].to(cdt).repeat_interleave(rep, dim=0)  # [H, N]
        ch = C[b].to(cdt).repeat_interleave(rep, dim=0)
        step = steps[b, :, None, None]
        s = torch.exp(step * a[:, None, None]) * state[slot].to(cdt) + step * xb[:, :, None] * bh[:, None, :]
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
            "return_final_states": False},
    function=selective_scan,
    reference=reference,
    doc="Mamba-2 SSD selective scan over [Bt, L, H, P], D/z/dt_bias/softplus/dt_limit, seq_idx, states",
)
SPEC_UPDATE = OpSpec(
    name=_UPDATE,
    fields={"head_dim": 64, "d_state": 128, "n_groups": 1, "has_D": True, "has_z": True, "has_dt_bias": True,
            "dt_softplus": True, "has_indices": False},
    function=selective_state_update,
    reference=reference_update,
    doc="one Mamba-2 decode step on fp32 states [slots, H, P, N] in place, gathered slots",
)
SPECS = (SPEC, SPEC_UPDATE)
