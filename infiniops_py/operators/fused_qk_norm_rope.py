"""FusedQkNormRope: per-head RmsNorm, then RoPE, of the Q and K heads of a packed QKV, in place.

Public: fused_qk_norm_rope(qkv, q_weight, k_weight, cos_sin_cache, positions, *, num_q_heads, num_kv_heads,
  head_dim, eps=1e-6, is_neox=True) -> qkv.
Implementation calling convention: fn(qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads,
  num_kv_heads, head_dim, eps, is_neox) -> None; qkv 2-D [T, (Hq + 2*Hkv)*D] (last stride 1, row stride
  arbitrary), weights [D] of qkv's dtype; cos_sin_cache and positions as `rotary_embedding` takes them.
  Each Q/K head: ``n = x * rsqrt(mean(x**2) + eps) * weight`` in fp32 (fp64 for float64), then the pairs of its
  first R channels turn as `rotary_embedding` turns them, still in fp32, and every channel is rounded once to
  the dtype (vLLM's kernel; a token at an out-of-range position, possible only in unchecked mode, is
  normalized and not turned). V columns must stay bit-for-bit untouched.
Problem fields: head_dim, num_q_heads, num_kv_heads, rotary_dim (int), is_neox (bool).
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
    check_bool,
    check_dtype,
    check_index_range,
    check_no_grad,
    check_real,
    check_tensor,
    check_vector,
    check_writable,
    device_type,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import Operator, Overload, Sampler
from infiniops_py.operators.fused_qk_norm import reference as _qk_norm_reference
from infiniops_py.operators.rotary_embedding import (
    check_apart,
    check_cos_sin_cache,
    check_positions,
    sample_cos_sin_cache,
)
from infiniops_py.operators.rotary_embedding import reference as _rotary_reference

__all__ = ["SPECS", "fused_qk_norm_rope", "reference"]

_OP = "fused_qk_norm_rope"
_FLOAT_SET = frozenset(FLOAT_DTYPES)


def reference(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float,
    is_neox: bool,
) -> None:
    """Literal reference: the FusedQkNorm reference, then the RoPE reference on the Q and K head views."""
    _qk_norm_reference(qkv, q_weight, k_weight, num_q_heads, num_kv_heads, head_dim, eps)
    t, q_cols = qkv.shape[0], num_q_heads * head_dim
    q = qkv[:, :q_cols].view(t, num_q_heads, head_dim)
    k = qkv[:, q_cols : q_cols + num_kv_heads * head_dim].view(t, num_kv_heads, head_dim)
    _rotary_reference(positions, q, k, cos_sin_cache, is_neox)


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """a packed qkv ``[tokens, (Hq + 2 Hkv) D]``, q/k weights near 1, vLLM's cos/sin cache and positions
    ``0..tokens-1``."""
    r, f = Sampler(generator, dtype, device), values
    t, hq, hkv, d = f["tokens"], f["num_q_heads"], f["num_kv_heads"], f["head_dim"]
    positions = torch.arange(t, dtype=torch.int64, device=r.device)
    return (r(t, (hq + 2 * hkv) * d), 1 + r(d, scale=0.1), 1 + r(d, scale=0.1),
                                sample_cos_sin_cache(r, f["rotary_dim"], t), positions), {
        "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d, "is_neox": f["is_neox"]}


SPEC = Operator(
    sample_inputs=sample_inputs,
    tune_sizes={"tokens": 128},
    name=_OP,
    fields={"head_dim": 128, "num_q_heads": 32, "num_kv_heads": 8, "rotary_dim": 128, "is_neox": True},
    buckets=("tokens",),
    reference=reference,
    doc="per-head RmsNorm then RoPE of Q and K in a packed QKV, in place, V untouched",
    overloads=(Overload(outputs=0, returns=("qkv",)),),
    mutates=("qkv",),
)


@SPEC.define
def fused_qk_norm_rope(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    eps: float = 1e-6,
    is_neox: bool = True,
) -> torch.Tensor:
    """Qwen3's q/k norms then RoPE on the packed projection, in place: `fused_qk_norm`, then `rotary_embedding`.

    Each Q head (``q_weight``) and K head (``k_weight``) of `qkv` gets the RmsNorm over ``head_dim`` of
    `fused_qk_norm` (fp32 mean square, times the weight), then the rotation of `rotary_embedding` at its
    token's position (the first ``rotary_dim = cos_sin_cache.shape[1]`` channels, NeoX or GPT-J pairs); V is
    left bit for bit untouched. As in vLLM's kernel, the normalized value stays in fp32 (fp64 for float64)
    through the rotation and each channel is rounded to the dtype once, at the end, where the two separate
    operators round it twice more (the normalized value, then its product with the weight): the results agree
    within those roundings, not bit for bit.

    vLLM's ``fused_qk_norm_rope(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight, k_weight,
    cos_sin_cache, is_neox, position_ids)`` (``vllm/_custom_ops.py``) has the same semantics. Its order is not
    kept: the tensors come first, in `fused_qk_norm`'s order with the cache and positions after them, and the
    sizes are keyword-only, as `fused_qk_norm` takes them (four ints in a row are easy to swap); there is no
    ``num_heads_v`` (V has ``num_kv_heads`` heads); `eps` and `is_neox` default to Qwen3's ``1e-6`` and NeoX.

    Positions follow `rotary_embedding`'s index rule: in checked mode (CPU by default) one outside
    ``[0, max_position)`` raises; unchecked, that token's heads are normalized and not rotated, and its cache
    row is never read.

    Args:
        qkv: the packed projection ``[T, (Hq + 2*Hkv) * D]``: Q heads, then K heads, then V heads. dtype
            float16/bfloat16/float32/float64, last stride 1 (rows may be strided); written in place, so no
            zero-stride (expanded) or otherwise self-overlapping dims.
        q_weight, k_weight: the checkpoint's ``q_norm.weight`` / ``k_norm.weight``, ``[D]``, same dtype and
            device, contiguous.
        cos_sin_cache: ``[max_position, rotary_dim]``, ``max_position >= 1``, ``rotary_dim`` even and at most
            ``D``, qkv's dtype or float32, contiguous (cos values, then sin values, per row).
        positions: int64 ``[T]``.
        num_q_heads, num_kv_heads, head_dim: ``Hq``, ``Hkv``, ``D`` (positive ints, not bools).
        eps: added to each head's mean square, a finite number > 0.
        is_neox: True for rotate-halves pairs (Qwen3), False for interleaved pairs.

    No tensor may share memory with `qkv`.

    Returns:
        `qkv`, updated in place.

    Raises:
        ContractError: a non-tensor, a non-positive head count or head dim, a width other than
            ``(Hq + 2*Hkv) * D``, a mismatched weight, dtype or device, a last stride other than 1, a bad `eps`
            or `is_neox`, a malformed cache or positions, an expanded `qkv`, a tensor sharing its memory, a
            tensor that requires grad while grad mode is on, or (in checked mode) a position outside
            ``[0, max_position)``.
    """
    tensors = {"qkv": qkv, "q_weight": q_weight, "k_weight": k_weight, "cos_sin_cache": cos_sin_cache,
               "positions": positions}
    # The common case in one test each; the per-argument helpers (which name the bad one) run when it fails.
    if not (strided(qkv, q_weight, k_weight, cos_sin_cache, positions) and qkv is not None
            and q_weight is not None and k_weight is not None and cos_sin_cache is not None
            and positions is not None):
        for name, t in tensors.items():
            check_tensor(_OP, name, t)
    if wants_grad(qkv, q_weight, k_weight, cos_sin_cache, positions):
        check_no_grad(_OP, tensors)
    if qkv.dtype not in _FLOAT_SET:
        check_dtype(_OP, "qkv", qkv, FLOAT_DTYPES)
    eps = check_real(_OP, "eps", eps, low=0.0, low_inclusive=False)
    if is_neox is not True and is_neox is not False:
        check_bool(_OP, "is_neox", is_neox)
    for name, v in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ContractError(_OP, name, f"expected a positive int, got {v!r}")
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    if qkv.dim() != 2 or qkv.shape[1] != width:
        raise ContractError(_OP, "qkv", f"expected shape [T, {width}] ((num_q_heads + 2 * num_kv_heads) * head_dim), "
                                        f"got {list(qkv.shape)}")
    if qkv.stride(1) != 1:
        raise ContractError(_OP, "qkv", f"expected last stride 1, got strides {list(qkv.stride())}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        check_vector(_OP, name, w, qkv, head_dim, "head_dim", like_name="qkv", dim="D")
    check_positions(_OP, positions, qkv.shape[0], qkv.device)
    rotary_dim = check_cos_sin_cache(_OP, cos_sin_cache, qkv.dtype, qkv.device, head_dim, "head_dim")
    if qkv.shape[0] == 0:
        return qkv
    check_writable(_OP, "qkv", qkv)
    check_apart(_OP, {"qkv": qkv}, {name: t for name, t in tensors.items() if name != "qkv"})
    check_index_range(_OP, "positions", positions, cos_sin_cache.shape[0], allow_negative=False)
    key = SPEC.key(device_type(qkv), qkv.dtype, head_dim=head_dim, num_q_heads=num_q_heads,
                   num_kv_heads=num_kv_heads, rotary_dim=rotary_dim, is_neox=is_neox, tokens=qkv.shape[0])
    dispatch(SPEC, key, qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads, num_kv_heads, head_dim, eps,
             is_neox)
    return qkv


SPECS = (SPEC,)
