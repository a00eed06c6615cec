"""`selective_state_update`: one Mamba-2 decode step on stored states in place, its checks and its `OpSpec`."""

from __future__ import annotations

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    check_bool,
    check_device,
    check_disjoint,
    check_dtype,
    check_no_grad,
    check_shape,
    check_slot_indices,
    check_tensor,
    check_writable,
    dtype_name,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import Operator, Overload
from infiniops_py.operators.selective_scan._checks import check_groups, check_like_x, check_params, last_dense
from infiniops_py.operators.selective_scan._reference import reference_update
from infiniops_py.operators.selective_scan._samples import sample_update

__all__ = ["SPEC_UPDATE", "selective_state_update"]

_UPDATE = "selective_state_update"
_FLOAT_SET = frozenset(FLOAT_DTYPES)
_CONTIGUOUS = torch.contiguous_format


SPEC_UPDATE = Operator(
    sample_inputs=sample_update,
    tune_sizes={"batch": 16, "num_heads": 24},
    name=_UPDATE,
    fields={"head_dim": 64, "d_state": 128, "n_groups": 1, "has_D": True, "has_z": True, "has_dt_bias": True,
            "dt_softplus": True, "has_indices": False, "untied": False, "state_dtype": "float32"},
    buckets=("batch",),  # B
    reference=reference_update,
    doc="one Mamba-2 decode step on states [slots, H, P, N] in place (no dt clamp), gathered slots, untied "
        "dt/A/dt_bias, 16-bit states",
    overloads=(Overload(fake=lambda x, **_: x.new_empty(x.shape)),),
    mutates=("state",),
)


@SPEC_UPDATE.define
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
    # The checks run on every call: each attribute is read once and a helper is called only to raise (or
    # for what it alone can tell: strided layouts, overlaps, indices), in the order of the contract.
    if not (strided(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices) and state is not None
            and x is not None and dt is not None and A is not None and B is not None and C is not None):
        for name, t in (("state", state), ("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
            check_tensor(_UPDATE, name, t)
        for name, t in (("D", D), ("z", z), ("dt_bias", dt_bias), ("state_batch_indices", state_batch_indices)):
            check_tensor(_UPDATE, name, t, optional=True)
    if wants_grad(state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices):
        check_no_grad(_UPDATE, {"state": state, "x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z,
                                "dt_bias": dt_bias, "state_batch_indices": state_batch_indices})
    if dt_softplus is not True and dt_softplus is not False:
        check_bool(_UPDATE, "dt_softplus", dt_softplus)
    xdtype, xshape = x.dtype, x.shape
    if xdtype not in _FLOAT_SET:
        check_dtype(_UPDATE, "x", x, FLOAT_DTYPES)
    if len(xshape) != 3:
        raise ContractError(_UPDATE, "x", f"expected shape [B, H, P], got {list(x.shape)}")
    batch, heads, head_dim = xshape
    if head_dim > 1 and x.stride(2) != 1:
        last_dense(_UPDATE, "x", x)
    device = x.device
    sshape = state.shape
    if state.device != device or state.dtype not in _FLOAT_SET or len(sshape) != 4 or sshape[1] != heads \
            or sshape[2] != head_dim or (sshape[3] > 1 and state.stride(3) != 1):
        check_device(_UPDATE, "state", state, device)
        check_dtype(_UPDATE, "state", state, FLOAT_DTYPES)
        if state.dim() != 4:
            raise ContractError(_UPDATE, "state", f"expected shape [slots, H, P, N], got {list(state.shape)}")
        check_shape(_UPDATE, "state", state, (sshape[0], heads, head_dim, sshape[3]),
                    " ([slots, H, P, N], H and P from x)")
        last_dense(_UPDATE, "state", state)
    slots, d_state = sshape[0], sshape[3]
    check_writable(_UPDATE, "state", state)
    dshape = dt.shape
    if dt.device != device or dt.dtype not in _FLOAT_SET or not (
            dshape == (batch, heads) or dshape == (batch, heads, head_dim)):
        check_device(_UPDATE, "dt", dt, device)
        check_dtype(_UPDATE, "dt", dt, FLOAT_DTYPES)
        raise ContractError(_UPDATE, "dt", f"expected shape [{batch}, {heads}] or [{batch}, {heads}, {head_dim}] "
                                           f"([B, H] or [B, H, P]), got {list(dt.shape)}")
    bshape = B.shape
    if len(bshape) != 3:
        raise ContractError(_UPDATE, "B", f"expected shape [B, G, N], got {list(B.shape)}")
    groups = bshape[1]
    expected = (batch, groups, d_state)
    if B.device != device or B.dtype is not xdtype or bshape != expected or groups == 0 or heads % groups \
            or C.device != device or C.dtype is not xdtype or C.shape != expected \
            or (d_state > 1 and (B.stride(2) != 1 or C.stride(2) != 1)):
        check_like_x(_UPDATE, "B", B, x, expected, " ([B, G, N], N from state)")
        check_groups(_UPDATE, B, heads)
        check_like_x(_UPDATE, "C", C, x, expected, " (same as B)")
    check_params(_UPDATE, x, heads, head_dim, A, D, dt_bias, d_state)
    if z is not None and (z.device != device or z.dtype is not xdtype or z.shape != xshape
                          or (head_dim > 1 and z.stride(2) != 1)):
        check_like_x(_UPDATE, "z", z, x, tuple(xshape), " (same as x)")
    check_disjoint(_UPDATE, "state", state, (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D), ("z", z),
                                          ("dt_bias", dt_bias), ("state_batch_indices", state_batch_indices)))
    check_slot_indices(_UPDATE, "state", "state_batch_indices", state_batch_indices, batch, slots, device)
    dt, A, dt_bias = _tie(dt, A, dt_bias)
    untied = dt.dim() == 3 or A.dim() == 3 or (dt_bias is not None and dt_bias.dim() == 2)
    out = torch.empty_like(x, memory_format=_CONTIGUOUS)
    if x.numel():
        key = SPEC_UPDATE.key(device.type, xdtype, head_dim=head_dim, d_state=d_state, n_groups=groups,
                              has_D=D is not None, has_z=z is not None, has_dt_bias=dt_bias is not None,
                              dt_softplus=bool(dt_softplus), has_indices=state_batch_indices is not None,
                              untied=untied, state_dtype=dtype_name(state.dtype), batch=batch)
        dispatch(SPEC_UPDATE, key, state, x, dt, A, B, C, D, z, dt_bias, bool(dt_softplus), state_batch_indices, out)
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


