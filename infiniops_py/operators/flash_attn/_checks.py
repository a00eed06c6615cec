"""FlashAttention's argument checks on metadata (shapes, dtypes, devices, strides, scalars) and the window
normalization of flash-attention's ``flash_api.cpp``. They read no tensor values, so they run on every call,
meta tensors and CUDA tensors included. Each raises `ContractError` naming the argument."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    check_bool,
    check_device,
    check_dtype,
    check_no_overlap,
    check_real,
    check_shape,
    check_tensor,
    check_writable,
)

__all__ = ["FP8", "INT32", "SCALES", "as_seqlens_tensor", "check_alibi", "check_block_table", "check_cache_writes",
           "check_descale", "check_kv", "check_per_sequence", "check_q", "check_rotary", "non_negative_int",
           "normalize", "seqlens_argument"]

INT32 = (torch.int32,)
FP8 = torch.float8_e4m3fn  # the fp8 KV-cache dtype (vLLM's "fp8" / "fp8_e4m3", flash-attention 3's e4m3)
SCALES = (torch.float32, torch.float64)
_INT32 = torch.int32
_STRIDED = torch.strided
_FLOAT_SET = frozenset(FLOAT_DTYPES)  # ALiBi slopes and descales: float32 (float64 in the oracle's copies)


def check_last_stride(op: str, name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ContractError(op, name, f"expected last-dim stride 1 (contiguous head dim), got strides {t.stride()}")


def check_q(op: str, q: torch.Tensor, rank: int) -> tuple[int, int]:
    shape = q.shape  # the common case in a few attribute reads; the checks below name what is wrong
    if q.dtype in _FLOAT_SET and len(shape) == rank:
        hq, d = shape[-2], shape[-1]
        if hq >= 1 and d >= 1 and (d == 1 or q.stride(-1) == 1):
            return hq, d
    check_dtype(op, "q", q, FLOAT_DTYPES)
    check_shape(op, "q", q, [None] * rank, " ([total_q, Hq, D])" if rank == 3 else " ([B, Sq, Hq, D])")
    check_last_stride(op, "q", q)
    hq, d = q.shape[-2], q.shape[-1]
    if hq < 1 or d < 1:
        raise ContractError(op, "q", f"needs at least one head and head_dim >= 1, got shape {list(q.shape)}")
    return hq, d


def check_kv(op: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, names: tuple[str, str], rank: int,
             hq: int, d: int, expect_hkv: int | None = None, dtype: torch.dtype | None = None) -> int:
    """Check a k/v pair against q; returns Hkv. Their dtype is `dtype` when given (new k/v: the caches'),
    else q's or float8_e4m3fn (an fp8 KV cache), the same for both. A rank-4 cache (`dtype` None) needs
    block_size (or S_max) >= 1; new k/v (`dtype` given) may hold 0 tokens, an empty append."""
    kdtype, shape = k.dtype, k.shape  # the common case in a few attribute reads; the checks below name what is wrong
    if (dtype is None or kdtype is dtype) and (kdtype is q.dtype or kdtype is FP8) and v.dtype is kdtype \
            and len(shape) == rank and v.shape == shape and shape[-1] == d:
        device, hkv = q.device, shape[-2]
        if k.device == device and v.device == device and (d == 1 or (k.stride(-1) == 1 and v.stride(-1) == 1)) \
                and (expect_hkv is None or hkv == expect_hkv) and hkv >= 1 and not hq % hkv \
                and (rank != 4 or dtype is not None or shape[1] >= 1):
            return hkv
    layout = " ([total_k, Hkv, D])" if rank == 3 else " ([num_blocks or B, block_size or S, Hkv, D])"
    if dtype is not None and k.dtype != dtype:
        raise ContractError(op, names[0], f"expected dtype {dtype} (same as the caches), got {k.dtype}")
    if k.dtype not in (q.dtype, FP8):
        raise ContractError(op, names[0], f"expected dtype {q.dtype} (same as q) or {FP8} (an fp8 KV cache), "
                                          f"got {k.dtype}")
    if v.dtype != k.dtype:
        raise ContractError(op, names[1], f"expected dtype {k.dtype} (same as {names[0]}), got {v.dtype}")
    for name, t in zip(names, (k, v)):
        check_device(op, name, t, q.device)
        check_shape(op, name, t, [None] * rank, layout)
        check_last_stride(op, name, t)
    if v.shape != k.shape:
        raise ContractError(op, names[1], f"expected the shape of {names[0]} {list(k.shape)}, got {list(v.shape)}")
    hkv, dk = k.shape[-2], k.shape[-1]
    if dk != d:
        raise ContractError(op, names[0], f"expected head_dim {d} (same as q), got {dk}")
    if expect_hkv is not None and hkv != expect_hkv:
        raise ContractError(op, names[0], f"expected {expect_hkv} kv heads (same as the cache), got {hkv}")
    if hkv < 1 or hq % hkv:
        raise ContractError(op, names[0], f"{hkv} kv heads do not divide the {hq} query heads (Hq % Hkv != 0)")
    if rank == 4 and dtype is None and k.shape[1] < 1:
        raise ContractError(op, names[0], f"expected block_size (or S_max) >= 1 in dim 1, got {list(k.shape)}")
    return hkv


def check_cache_writes(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       inputs: dict[str, torch.Tensor | None]) -> None:
    """The caches receive k/v in place: each must be writable, and no other argument (the index tensors
    included: a reinterpreting ``.view(torch.int32)`` could place them in a cache) may share their memory."""
    check_writable(op, "k_cache", k_cache)
    check_writable(op, "v_cache", v_cache)
    check_no_overlap(op, "v_cache", v_cache, "k_cache", k_cache)
    for name, t in inputs.items():
        if t is not None:
            check_no_overlap(op, name, t, "k_cache", k_cache)
            check_no_overlap(op, name, t, "v_cache", v_cache)


def check_per_sequence(op: str, name: str, t: torch.Tensor, b: int, device: torch.device) -> None:
    """An int32 ``[B]`` index tensor on q's device (seqused_k, cache_batch_idx, cache_leftpad)."""
    check_dtype(op, name, t, INT32)
    check_device(op, name, t, device)
    check_shape(op, name, t, [b], " ([B])")


def check_alibi(op: str, slopes: torch.Tensor | None, b: int, hq: int, device: torch.device
                ) -> torch.Tensor | None:
    """ALiBi slopes ``[Hq]`` or ``[B, Hq]``, returned as ``[B, Hq]`` (a ``[Hq]`` argument expanded)."""
    if slopes is None:
        return None
    check_dtype(op, "alibi_slopes", slopes, SCALES, " (float32, as flash-attention)")
    check_device(op, "alibi_slopes", slopes, device)
    if slopes.dim() == 1 and slopes.shape[0] == hq:
        return slopes.expand(b, hq)
    check_shape(op, "alibi_slopes", slopes, [b, hq], " ([B, Hq], or [Hq] for every sequence)")
    return slopes


def check_descale(op: str, name: str, scale: torch.Tensor | None, b: int, hkv: int, cache: torch.Tensor,
                  cache_name: str) -> torch.Tensor | None:
    """A descale ``[B, Hkv]`` (flash-attention 3's layout) of an fp8 `cache`."""
    if scale is None:
        return None
    if cache.dtype != FP8:
        raise ContractError(op, name, f"dequantizes a {FP8} {cache_name}, but {cache_name} is {cache.dtype}: pass "
                                      "it only with an fp8 KV cache")
    check_dtype(op, name, scale, SCALES, " (float32)")
    check_device(op, name, scale, cache.device)
    check_shape(op, name, scale, [b, hkv], " ([B, Hkv], as flash-attention 3)")
    return scale


def seqlens_argument(cache_seqlens: object, q: torch.Tensor) -> object:
    """`cache_seqlens` for the custom operator: an int becomes an int32 ``[B]`` tensor (a tensor or None, or
    anything else for the eager checks to refuse, passes)."""
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        return torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    return cache_seqlens


def as_seqlens_tensor(op: str, cache_seqlens: object, b: int, capacity: int, device: torch.device, *,
                      appending: bool) -> torch.Tensor:
    """`cache_seqlens` as an int32 ``[B]`` tensor: as given, one int for every sequence, or None for full
    caches (flash-attention's meaning; then nothing can be appended)."""
    if isinstance(cache_seqlens, torch.Tensor):
        if cache_seqlens.layout is _STRIDED and cache_seqlens.dtype is _INT32 and cache_seqlens.shape == (b,) \
                and cache_seqlens.device == device:
            return cache_seqlens  # the common case; the checks below name what is wrong
        check_tensor(op, "cache_seqlens", cache_seqlens)  # its layout
        check_dtype(op, "cache_seqlens", cache_seqlens, INT32)
        check_device(op, "cache_seqlens", cache_seqlens, device)
        check_shape(op, "cache_seqlens", cache_seqlens, [b], " (B = q.shape[0])")
        return cache_seqlens
    if cache_seqlens is None:
        if appending:
            raise ContractError(op, "cache_seqlens", "is needed to append k/v: None means every cache is full "
                                                     "(as in flash-attention)")
        return torch.full((b,), capacity, dtype=torch.int32, device=device)
    if isinstance(cache_seqlens, bool) or not isinstance(cache_seqlens, int):
        raise ContractError(op, "cache_seqlens", f"expected a torch.Tensor (int32), an int or None, got "
                                                 f"{type(cache_seqlens).__name__}")
    if not 0 <= cache_seqlens < 2**31:
        raise ContractError(op, "cache_seqlens", f"expected an int in [0, 2**31), got {cache_seqlens}")
    return torch.full((b,), cache_seqlens, dtype=torch.int32, device=device)


def check_rotary(op: str, cos: torch.Tensor | None, sin: torch.Tensor | None, q: torch.Tensor,
                 k: torch.Tensor | None, capacity: int, fp8: bool) -> int:
    """Check the rotary tables; returns seqlen_ro (0 without rotary)."""
    if cos is None and sin is None:
        return 0
    if cos is None or sin is None:
        missing = "rotary_cos" if cos is None else "rotary_sin"
        raise ContractError(op, missing, "rotary_cos and rotary_sin must be given together (or neither)")
    if k is None:
        raise ContractError(op, "rotary_cos", "rotates the new k before the append: pass k and v too (as "
                                              "flash-attention requires)")
    if fp8:
        raise ContractError(op, "rotary_cos", f"needs the caches and new k/v in q's dtype, not {FP8}")
    d = q.shape[-1]
    for name, t in (("rotary_cos", cos), ("rotary_sin", sin)):
        if t.dtype != q.dtype:
            raise ContractError(op, name, f"expected dtype {q.dtype} (same as q), got {t.dtype}")
        check_device(op, name, t, q.device)
        check_shape(op, name, t, [None, None], " ([seqlen_ro, rotary_dim / 2])")
    if sin.shape != cos.shape:
        raise ContractError(op, "rotary_sin", f"expected the shape of rotary_cos {list(cos.shape)}, got "
                                              f"{list(sin.shape)}")
    seqlen_ro, half = cos.shape
    if half < 1 or 2 * half > d:
        raise ContractError(op, "rotary_cos", f"rotary_dim = 2 * {half} must be in [2, head_dim {d}]")
    if seqlen_ro < capacity:
        raise ContractError(op, "rotary_cos", f"has {seqlen_ro} positions, fewer than the cache capacity "
                                              f"{capacity} per sequence (flash-attention needs seqlen_ro >= it)")
    return seqlen_ro


def non_negative_int(op: str, name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ContractError(op, name, f"expected an int, got bool {value!r}")
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ContractError(op, name, f"expected an int, got {type(value).__name__}") from None
    if n < 0:
        raise ContractError(op, name, f"expected >= 0, got {n}")
    return n


def check_block_table(op: str, table: torch.Tensor, b: int, device: torch.device) -> None:
    shape = table.shape
    if table.dtype is _INT32 and len(shape) == 2 and shape[0] == b and (shape[1] or not b) and table.device == device:
        return  # the common case; the checks below name what is wrong
    check_dtype(op, "block_table", table, INT32)
    check_device(op, "block_table", table, device)
    check_shape(op, "block_table", table, [b, None], " ([B, max_blocks])")
    if b and not table.shape[1]:  # a shape, known without reading the values: refused in unchecked mode too
        raise ContractError(op, "block_table", f"expected max_blocks >= 1 columns, got shape {list(table.shape)}: "
                                               "each sequence needs a block (unused entries may be any padding)")


def normalize(op: str, d: int, softmax_scale: float | None, causal: bool, window_size: Sequence[int],
              softcap: float, max_seqlen_k: int) -> tuple[float, tuple[int, int], float]:
    """Check the scalars, fill in the scale and normalize the window as flash-attention's ``flash_api.cpp``
    does (``mha_varlen_fwd``/``mha_fwd_kvcache``, then ``set_params_fprop``): a side >= `max_seqlen_k` is
    -1; under causal the right side is the causal mask (-1 here); otherwise, when exactly one side is
    bounded, the other becomes `max_seqlen_k` (a left side of `max_seqlen_k` hides no key, a right one does
    when ``Sq > max_seqlen_k + 1``)."""
    check_bool(op, "causal", causal)
    # any finite scale, as flash-attention accepts; None means D**-0.5
    scale = d**-0.5 if softmax_scale is None else check_real(op, "softmax_scale", softmax_scale)
    try:
        if any(isinstance(w, bool) for w in window_size):
            raise TypeError
        left, right = (operator.index(w) for w in window_size)
    except (TypeError, ValueError):
        raise ContractError(op, "window_size", f"expected a pair of ints (left, right), got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ContractError(op, "window_size", f"expected values >= -1 (-1 = unbounded), got {(left, right)}")
    left = -1 if left >= max_seqlen_k else left
    right = -1 if right >= max_seqlen_k or causal else right
    if not causal and (left < 0) != (right < 0):
        left, right = (max_seqlen_k, right) if left < 0 else (left, max_seqlen_k)
    cap = check_real(op, "softcap", softcap, low=0.0)
    return scale, (left, right), cap

