"""FusedQkNorm: per-head RmsNorm of the Q and K heads of a packed QKV, in place.

Public: fused_qk_norm(qkv, q_weight, k_weight, *, num_q_heads, num_kv_heads, head_dim, eps=1e-6) -> qkv.
Implementation calling convention: fn(qkv, q_weight, k_weight, num_q_heads, num_kv_heads, head_dim, eps)
  -> None; qkv 2-D [T, (Hq + 2*Hkv)*D] (last stride 1, row stride arbitrary), weights [D] same dtype;
  V columns must stay bit-for-bit untouched.
Problem fields: head_dim, num_q_heads, num_kv_heads (int).
Size bucket: tokens, the `size_class` (power of two at or above) of T.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    check_dtype,
    check_no_grad,
    check_no_overlap,
    check_real,
    check_tensor,
    check_vector,
    check_writable,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import Operator, Overload, Sampler
from infiniops_py.operators.rms_norm import reference as _rms_norm_reference

__all__ = ["SPECS", "fused_qk_norm", "reference"]

_OP = "fused_qk_norm"
_FLOAT_SET = frozenset(FLOAT_DTYPES)


def reference(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
) -> None:
    """Literal reference: the RmsNorm reference on each Q head, then on each K head; V is not touched."""
    t = qkv.shape[0]
    for first, count, weight in ((0, num_q_heads, q_weight), (num_q_heads, num_kv_heads, k_weight)):
        heads = qkv[:, first * head_dim : (first + count) * head_dim].view(t, count, head_dim)
        _rms_norm_reference(heads, weight, eps, heads)


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """a packed qkv ``[tokens, (Hq + 2 Hkv) D]`` and q/k weights near 1."""
    r, f = Sampler(generator, dtype, device), values
    d, hq, hkv = f["head_dim"], f["num_q_heads"], f["num_kv_heads"]
    qkv = r(f["tokens"], (hq + 2 * hkv) * d)
    return (qkv, 1 + r(d, scale=0.1), 1 + r(d, scale=0.1)), {
        "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d}


SPEC = Operator(
    sample_inputs=sample_inputs,
    tune_sizes={"tokens": 128},
    name=_OP,
    fields={"head_dim": 128, "num_q_heads": 32, "num_kv_heads": 8},
    buckets=("tokens",),
    reference=reference,
    doc="per-head RmsNorm of Q and K in a packed QKV, in place, V untouched",
    overloads=(Overload(outputs=0, returns=("qkv",)),),
    mutates=("qkv",),
)


@SPEC.define
def fused_qk_norm(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Qwen3's ``q_norm``/``k_norm``: an RmsNorm over ``head_dim`` of every Q and K head, in place.

    Each head's row of ``D`` values gets `rms_norm` (fp32 mean square, cast to the dtype, times the
    weight) with `q_weight` for the Q heads and `k_weight` for the K heads; the V columns are left bit
    for bit untouched. Matches vLLM's ``fused_qk_norm_rope`` without the RoPE part.

    Args:
        qkv: the packed projection ``[T, (Hq + 2*Hkv) * D]``: Q heads, then K heads, then V heads.
            dtype float16/bfloat16/float32/float64, last stride 1 (rows may be strided); written in place,
            so no zero-stride (expanded) or otherwise self-overlapping dims.
        q_weight, k_weight: the checkpoint's ``q_norm.weight`` / ``k_norm.weight``, ``[D]``, same dtype
            and device, contiguous, not overlapping `qkv` in memory.
        num_q_heads, num_kv_heads, head_dim: ``Hq``, ``Hkv``, ``D`` (positive ints, not bools).
        eps: added to each head's mean square, a finite number > 0.

    Returns:
        `qkv`, updated in place.

    Raises:
        ContractError: a non-tensor, a non-positive head count or head dim, a width other than
            ``(Hq + 2*Hkv) * D``, a mismatched weight, dtype or device, a last stride other than 1, a bad
            `eps`, an expanded `qkv`, a weight sharing its memory, or a tensor that requires grad while
            grad mode is on.
    """
    # The common case in one test each; the per-argument helpers (which name the bad one) run when it fails.
    if not (strided(qkv, q_weight, k_weight) and qkv is not None and q_weight is not None and k_weight is not None):
        check_tensor(_OP, "qkv", qkv)
        check_tensor(_OP, "q_weight", q_weight)
        check_tensor(_OP, "k_weight", k_weight)
    if wants_grad(qkv, q_weight, k_weight):
        check_no_grad(_OP, {"qkv": qkv, "q_weight": q_weight, "k_weight": k_weight})
    if qkv.dtype not in _FLOAT_SET:
        check_dtype(_OP, "qkv", qkv, FLOAT_DTYPES)
    eps = check_real(_OP, "eps", eps, low=0.0, low_inclusive=False)
    for name, v in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ContractError(_OP, name, f"expected a positive int, got {v!r}")
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width:
        raise ContractError(
            _OP, "qkv", f"expected shape [T, {width}] ((num_q_heads + 2 * num_kv_heads) * head_dim), "
            f"got {list(qkv.shape)}"
        )
    if qkv.stride(1) != 1:
        raise ContractError(_OP, "qkv", f"expected last stride 1, got strides {list(qkv.stride())}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        check_vector(_OP, name, w, qkv, head_dim, "head_dim", like_name="qkv", dim="D")
    if qkv.shape[0] == 0:
        return qkv
    check_writable(_OP, "qkv", qkv)
    check_no_overlap(_OP, "q_weight", q_weight, "qkv", qkv)
    check_no_overlap(_OP, "k_weight", k_weight, "qkv", qkv)
    key = SPEC.key(qkv.device.type, qkv.dtype, head_dim=head_dim, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                   tokens=qkv.shape[0])
    dispatch(SPEC, key, qkv, q_weight, k_weight, num_q_heads, num_kv_heads, head_dim, eps)
    return qkv


SPECS = (SPEC,)
