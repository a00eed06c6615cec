"""Paged-cache write, vLLM reshape_and_cache_flash semantics.

Public: reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto",
  k_scale=None, v_scale=None) -> None (vLLM's argument order).
Implementation calling convention: fn(key, value, key_cache, value_cache, slot_mapping, *, k_scale, v_scale)
  -> None; key/value [T, Hkv, D] (strided views allowed, last stride 1); caches [num_blocks, block_size, Hkv,
  D]; slot_mapping int64 [N], N <= T; slot s -> block s // block_size, offset s % block_size; s < 0 skipped.
  k_scale/v_scale (float32 tensors of one element) come only for an fp8 cache (float8_e4m3fn caches): each
  written value is then ``float8_e4m3fn(clamp(float32(x) / scale, -448, 448))``.
  Implementations must never write out of bounds, even for an unchecked out-of-range slot (skip it).
  (Caches may be strided views too, last stride 1: e.g. the HND layout [num_blocks, Hkv, block_size, D]
  permuted to NHD, or the two halves of one [num_blocks, 2, block_size, Hkv, D] buffer.)
Problem fields: head_dim, block_size, num_kv_heads (int), fp8_kv (bool: an fp8 cache).
Size bucket: tokens, the `size_class` (power of two at or above) of N, the tokens written.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    byte_extent,
    check_device,
    check_dtype,
    check_index_range,
    check_no_grad,
    check_no_overlap,
    check_tensor,
    check_unique_indices,
    check_writable,
    device_type,
    is_checked,
)
from infiniops_py.operators._declare import Operator, Overload, Sampler

__all__ = ["FP8_MAX", "SPECS", "quantize", "reference", "reshape_and_cache_flash"]

_OP = "reshape_and_cache_flash"
_FP8 = torch.float8_e4m3fn
_FP8_NAMES = ("fp8", "fp8_e4m3")  # vLLM's kv_cache_dtype names of float8_e4m3fn
_FLOAT_SET = frozenset(FLOAT_DTYPES)
_INT64 = torch.int64
_Tensor = torch.Tensor
_STRIDED = torch.strided  # a sparse or MKLDNN tensor is refused by check_tensor (issue #30)
_grad_enabled = torch.is_grad_enabled
FP8_MAX = 448.0  # the largest finite float8_e4m3fn: quotients beyond it saturate (CUDA's __NV_SATFINITE)


def reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Literal reference: a Python loop over the tokens, skipping padding and out-of-range slots (it reads
    `slot_mapping` on the host: one synchronization on CUDA; of tokens sharing a slot, the last lands);
    fp8 caches get `quantize` of each row."""
    num_blocks, block_size = key_cache.shape[:2]
    for i, s in enumerate(slot_mapping.tolist()):
        if 0 <= s < num_blocks * block_size:
            k, v = key[i], value[i]
            if k_scale is not None and v_scale is not None:
                k, v = quantize(k, k_scale), quantize(v, v_scale)
            key_cache[s // block_size, s % block_size] = k
            value_cache[s // block_size, s % block_size] = v


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``tokens`` rows of key and value ``[tokens, Hkv, D]`` written to consecutive slots of caches ``[blocks,
    block_size, Hkv, D]`` (fp8 ones with their scales when asked)."""
    r, f = Sampler(generator, dtype, device), values
    t, bs, hkv, d = f["tokens"], f["block_size"], f["num_kv_heads"], f["head_dim"]
    blocks = math.ceil(t / bs) + 1
    slots = torch.arange(t, dtype=torch.int64, device=r.device)
    caches = [r(blocks, bs, hkv, d) for _ in range(2)]
    kwargs: dict[str, Any] = {}
    if f["fp8_kv"]:
        caches = [c.to(torch.float8_e4m3fn) for c in caches]
        kwargs = {"kv_cache_dtype": "fp8", "k_scale": r.scale(1), "v_scale": r.scale(1)}
    return (r(t, hkv, d), r(t, hkv, d), *caches, slots), kwargs


SPEC = Operator(
    sample_inputs=sample_inputs,
    tune_sizes={"tokens": 128},
    name=_OP,
    fields={"head_dim": 128, "block_size": 16, "num_kv_heads": 8, "fp8_kv": False},
    buckets=("tokens",),
    reference=reference,
    doc="write key/value rows into a paged KV cache at slot_mapping (negative slots skipped), or quantize them into "
        "an fp8 cache",
    overloads=(Overload(outputs=0),),
    mutates=("key_cache", "value_cache"),
)


@SPEC.define
def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write each token's key and value into its slot of a paged KV cache (vLLM ``reshape_and_cache_flash``).

    Token ``i < N`` goes to block ``s // block_size``, offset ``s % block_size`` of both caches, where
    ``s = slot_mapping[i]``; ``s < 0`` marks a padding token, which is skipped. The token count is
    ``N = len(slot_mapping)``: rows of `key` past ``N`` are padding and are never read. Non-negative slots
    must be unique: in checked mode a repeated one raises; unchecked, which of the tokens lands in the slot
    is undefined (providers differ; vLLM's kernel races there too).

    Args:
        key, value: ``[T, Hkv, D]``, dtype float16/bfloat16/float32/float64, last stride 1 (strided views
            of a packed QKV projection are fine), same shape, dtype and device.
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, on key's device, last stride 1 (NHD,
            or an HND buffer viewed as NHD); updated in place. Key's dtype with ``kv_cache_dtype="auto"``,
            float8_e4m3fn with ``"fp8"`` / ``"fp8_e4m3"``.
        slot_mapping: int64 ``[N]``, ``N <= T``; in checked mode every value must be ``< num_blocks *
            block_size`` and no non-negative value may repeat.
        kv_cache_dtype: ``"auto"`` (the caches hold key's dtype: a plain copy) or ``"fp8"`` /
            ``"fp8_e4m3"`` (vLLM's names): each value is quantized as ``float8_e4m3fn(clamp(float32(x) /
            scale, -448, 448))`` (vLLM's ``scaled_convert``: the quotient in float32, rounded to nearest
            even, saturated to the largest finite fp8; NaN stays NaN). ``"fp8_e5m2"`` is not supported.
        k_scale, v_scale: float32 tensors of one element, the scales of an fp8 cache (required there);
            with ``"auto"`` they are not used, as in vLLM (which always passes them).

    The caches are written in place, so neither may have a zero-stride (expanded) or otherwise
    self-overlapping dim, and neither may share memory (by address, whatever storage objects hold them)
    with the other, the new `key`/`value`, `slot_mapping` or the scales (the two halves of one
    ``[num_blocks, 2, block_size, Hkv, D]`` buffer share none). A rejected call writes nothing.

    Raises:
        ContractError: a non-tensor, a mismatched shape, dtype or device, a last stride other than 1,
            ``N > T``, an unknown `kv_cache_dtype`, a missing or malformed scale of an fp8 cache, an expanded
            or overlapping cache, a tensor that requires grad while grad mode is on, or (in checked mode) a
            slot ``>= num_blocks * block_size`` or a repeated slot.
    """
    # The checks run on every call (benchmarks/host_overhead.py times them): each attribute is read once, a
    # helper is called only to raise, and `overlaps` only where two byte ranges meet.
    if not (isinstance(key, _Tensor) and isinstance(value, _Tensor) and isinstance(key_cache, _Tensor)
            and isinstance(value_cache, _Tensor) and isinstance(slot_mapping, _Tensor) and key.layout is _STRIDED
            and value.layout is _STRIDED and key_cache.layout is _STRIDED and value_cache.layout is _STRIDED
            and slot_mapping.layout is _STRIDED):
        for name, t in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
                        ("slot_mapping", slot_mapping)):
            check_tensor(_OP, name, t)
    if k_scale is not None or v_scale is not None:
        check_tensor(_OP, "k_scale", k_scale, optional=True)
        check_tensor(_OP, "v_scale", v_scale, optional=True)
    if _grad_enabled() and (key.requires_grad or value.requires_grad or key_cache.requires_grad
                            or value_cache.requires_grad or slot_mapping.requires_grad
                            or (k_scale is not None and k_scale.requires_grad)
                            or (v_scale is not None and v_scale.requires_grad)):
        check_no_grad(_OP, {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
                            "slot_mapping": slot_mapping, "k_scale": k_scale, "v_scale": v_scale})
    if kv_cache_dtype != "auto" and kv_cache_dtype not in _FP8_NAMES:
        raise ContractError(_OP, "kv_cache_dtype", f"expected 'auto', 'fp8' or 'fp8_e4m3' (vLLM's names of "
                                                   f"float8_e4m3fn), got {kv_cache_dtype!r}")
    fp8 = kv_cache_dtype in _FP8_NAMES
    dt = key.dtype
    if dt not in _FLOAT_SET:
        check_dtype(_OP, "key", key, FLOAT_DTYPES)
    ks = key.shape
    if len(ks) != 3:
        raise ContractError(_OP, "key", f"expected shape [T, Hkv, D], got {list(ks)}")
    t, hkv, d = ks
    if value.shape != ks:
        raise ContractError(_OP, "value", f"expected shape {list(ks)} (same as key), got {list(value.shape)}")
    cs = key_cache.shape
    if len(cs) != 4 or cs[2:] != (hkv, d):
        raise ContractError(_OP, "key_cache", f"expected shape [num_blocks, block_size, {hkv}, {d}], got {list(cs)}")
    if value_cache.shape != cs:
        raise ContractError(
            _OP, "value_cache", f"expected shape {list(cs)} (same as key_cache), got {list(value_cache.shape)}"
        )
    if value.dtype is not dt:
        raise ContractError(_OP, "value", f"expected dtype {dt} (same as key), got {value.dtype}")
    cache_dt = _FP8 if fp8 else dt
    if key_cache.dtype is not cache_dt or value_cache.dtype is not cache_dt:
        why = f"kv_cache_dtype={kv_cache_dtype!r}" if fp8 else "same as key: kv_cache_dtype='auto'"
        for name, x in (("key_cache", key_cache), ("value_cache", value_cache)):
            if x.dtype != cache_dt:
                raise ContractError(_OP, name, f"expected dtype {cache_dt} ({why}), got {x.dtype}")
    on_cpu = key.is_cpu  # `is_cpu` costs a third of a device comparison
    if not (on_cpu and value.is_cpu and key_cache.is_cpu and value_cache.is_cpu) and not (
            key.is_cuda and value.is_cuda and key_cache.is_cuda and value_cache.is_cuda  # one CUDA device: the
            and key.get_device() == value.get_device() == key_cache.get_device() == value_cache.get_device()):
        dev = key.device  # ints compare cheaper than devices
        for name, x in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
            check_device(_OP, name, x, dev)
    if d > 1 and (key.stride(-1) != 1 or value.stride(-1) != 1 or key_cache.stride(-1) != 1
                  or value_cache.stride(-1) != 1):
        for name, x in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
            if x.stride(-1) != 1:
                raise ContractError(_OP, name, f"expected last stride 1, got strides {list(x.stride())}")
    if slot_mapping.dtype is not _INT64:
        raise ContractError(_OP, "slot_mapping", f"expected dtype torch.int64, got {slot_mapping.dtype}")
    if (not slot_mapping.is_cpu) if on_cpu else not (slot_mapping.is_cuda and slot_mapping.get_device()
                                                      == key.get_device()) and slot_mapping.device != key.device:
        check_device(_OP, "slot_mapping", slot_mapping, key.device)
    ss = slot_mapping.shape
    if len(ss) != 1 or ss[0] > t:
        raise ContractError(_OP, "slot_mapping", f"expected shape [N] with N <= {t} (key's tokens), got {list(ss)}")
    n = ss[0]
    scales = _scales(kv_cache_dtype, k_scale, v_scale, key.device) if fp8 else {}
    num_blocks, block_size = cs[0], cs[1]
    kc_dense, vc_dense = key_cache.is_contiguous(), value_cache.is_contiguous()
    if not kc_dense:
        check_writable(_OP, "key_cache", key_cache)
    if not vc_dense:
        check_writable(_OP, "value_cache", value_cache)
    kc_lo, vc_lo = key_cache.data_ptr(), value_cache.data_ptr()
    kc_hi = kc_lo + (key_cache.nbytes if kc_dense else byte_extent(key_cache))
    vc_hi = vc_lo + (value_cache.nbytes if vc_dense else byte_extent(value_cache))
    if vc_lo < kc_hi and kc_lo < vc_hi:
        check_no_overlap(_OP, "value_cache", value_cache, "key_cache", key_cache)
    for name, x in (("key", key), ("value", value), ("slot_mapping", slot_mapping), *scales.items()):
        lo = x.data_ptr()
        hi = lo + (x.nbytes if x.is_contiguous() else byte_extent(x))  # covers key[:n] and value[:n]
        if (lo < kc_hi and kc_lo < hi) or (lo < vc_hi and vc_lo < hi):
            read = x[:n] if name == "key" or name == "value" else x
            check_no_overlap(_OP, name, read, "key_cache", key_cache)
            check_no_overlap(_OP, name, read, "value_cache", value_cache)
    if n and is_checked(slot_mapping.device):
        check_index_range(_OP, "slot_mapping", slot_mapping, num_blocks * block_size, allow_negative=True)
        check_unique_indices(_OP, "slot_mapping", slot_mapping, "slot")
    if n == 0 or 0 in cs:
        return
    problem = SPEC.key("cpu" if on_cpu else device_type(key), dt, head_dim=d, block_size=block_size,
                       num_kv_heads=hkv, fp8_kv=fp8, tokens=n)
    dispatch(SPEC, problem, key, value, key_cache, value_cache, slot_mapping, **scales)


def _scales(kv_cache_dtype: str, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
            dev: torch.device) -> dict[str, torch.Tensor]:
    """The checked scales of an fp8 cache, by argument name."""
    scales = {}
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            raise ContractError(_OP, name, f"is needed with kv_cache_dtype={kv_cache_dtype!r}: the fp8 cache "
                                           "holds x / scale")
        check_dtype(_OP, name, scale, (torch.float32, torch.float64), " (float32, as vLLM)")
        check_device(_OP, name, scale, dev)
        if scale.numel() != 1:
            raise ContractError(_OP, name, f"expected one element (shape [] or [1]), got shape "
                                           f"{list(scale.shape)}")
        scales[name] = scale
    return scales


def quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``float8_e4m3fn(clamp(float32(x) / scale, -448, 448))``: the fp8 cache write (vLLM's ``scaled_convert``);
    `scale` a one-element tensor."""
    return (x.to(torch.float32) / scale.reshape(()).to(torch.float32)).clamp(-FP8_MAX, FP8_MAX).to(_FP8)


SPECS = (SPEC,)
