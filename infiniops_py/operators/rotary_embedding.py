"""Rotary position embedding (RoPE) in place on query and key heads, vLLM's ``rotary_embedding`` semantics.

Public: rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox) -> (query, key) (vLLM's
  argument order).
Implementation calling convention: fn(positions, query, key, cos_sin_cache, is_neox) -> None; query
  [T, Hq, D] and key [T, Hkv, D] or None (any token and head strides, last stride 1), updated in place;
  positions int64 [T]; cos_sin_cache [max_position, R] contiguous (R even, R <= D; row p holds cos then sin
  of position p's R/2 angles), query's dtype or float32. Pair i < R/2 of each head is (x, y) = channels
  (i, i + R/2) for NeoX, (2i, 2i + 1) for GPT-J; ``x' = x cos - y sin``, ``y' = y cos + x sin`` in fp32 (fp64
  for float64) with the cache values as stored, rounded once to the dtype. Channels >= R are not written.
  A token whose position is outside [0, max_position) (possible only in unchecked mode) is not written and
  its cache row is never read.
Problem fields: head_dim, rotary_dim (int), is_neox (bool).
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
    byte_extent,
    check_bool,
    check_device,
    check_dtype,
    check_index_range,
    check_no_grad,
    check_no_overlap,
    check_tensor,
    check_writable,
    device_type,
    strided,
    wants_grad,
)
from infiniops_py.operators._declare import Operator, Overload, Sampler

__all__ = ["SPECS", "check_apart", "check_cos_sin_cache", "check_positions", "reference", "rotary_embedding"]

_OP = "rotary_embedding"
_FLOAT_SET = frozenset(FLOAT_DTYPES)


def reference(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Literal reference, vLLM's ``forward_native``: each token's cache row split into cos and sin, the rotated
    pairs put back with ``torch.cat`` (NeoX) or stacked and flattened (GPT-J); tokens at out-of-range positions
    keep their values (and read row 0, which nothing uses)."""
    max_position, rotary_dim = cos_sin_cache.shape
    valid = ((positions >= 0) & (positions < max_position))[:, None, None]
    rows = cos_sin_cache.index_select(0, torch.where(valid[:, 0, 0], positions, 0))
    for x in (query, key):
        if x is None:
            continue
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        cos, sin = rows.to(acc)[:, None, :].chunk(2, dim=-1)
        turned = x[..., :rotary_dim].to(acc)
        x1, x2 = turned.chunk(2, dim=-1) if is_neox else (turned[..., 0::2], turned[..., 1::2])
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        rotated = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)
        x[..., :rotary_dim] = torch.where(valid, rotated.to(x.dtype), x[..., :rotary_dim])


def sample_cos_sin_cache(r: Sampler, rotary_dim: int, positions: int) -> torch.Tensor:
    """vLLM's cache ``[positions, rotary_dim]``: the cos half, then the sin half (float32)."""
    inv = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(r.device)


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """query and key as column views of one packed projection ``[tokens, (Hq + 2 Hkv) D]``, positions
    ``0..tokens-1`` and vLLM's cos/sin cache."""
    r, f = Sampler(generator, dtype, device), values
    t, hq, hkv, d = f["tokens"], f["num_q_heads"], f["num_kv_heads"], f["head_dim"]
    qkv = r(t, (hq + 2 * hkv) * d)  # query and key as column views of one packed projection, as in a model
    positions = torch.arange(t, dtype=torch.int64, device=r.device)
    return (positions, qkv[:, :hq * d], qkv[:, hq * d:(hq + hkv) * d], d,
                              sample_cos_sin_cache(r, f["rotary_dim"], t), f["is_neox"]), {}


SPEC = Operator(
    sample_inputs=sample_inputs,
    tune_sizes={"tokens": 128, "num_q_heads": 16, "num_kv_heads": 8},
    name=_OP,
    fields={"head_dim": 128, "rotary_dim": 128, "is_neox": True},
    buckets=("tokens",),
    reference=reference,
    doc="RoPE in place on query and key heads from a cos/sin cache at int64 positions (NeoX or GPT-J pairs, "
        "partial rotary)",
    overloads=(Overload(outputs=0, returns=("query", "key")),),
    mutates=("query", "key"),
    lowered_by="query",
)


@SPEC.define
def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate the first ``rotary_dim`` channels of every query and key head by its token's position, in place.

    vLLM's ``rotary_embedding`` (``vllm/_custom_ops.py``, the ``RotaryEmbedding`` layer of
    ``vllm/model_executor/layers/rotary_embedding``): ``rotary_dim = cos_sin_cache.shape[1]``; the cache row
    of token t's position ``p = positions[t]`` holds ``cos`` (its first ``rotary_dim / 2`` values) then
    ``sin``. Pair i of a head is channels ``(i, i + rotary_dim / 2)`` with `is_neox` (GPT-NeoX, rotate halves:
    Llama, Qwen) and ``(2i, 2i + 1)`` without (GPT-J, interleaved pairs: GLM-4); each pair ``(x, y)`` becomes
    ``(x cos_i - y sin_i, y cos_i + x sin_i)``, computed in fp32 (fp64 for float64) and rounded once to the
    dtype, as vLLM's kernel does. Channels from ``rotary_dim`` to `head_size` (partial rotary) are untouched.

    Positions are indices into the cache: in checked mode (CPU by default; `checked_indices()` or
    ``INFINIOPS_CHECK_INDICES=1`` elsewhere) one outside ``[0, max_position)`` raises; unchecked, such a token
    is left as it is (its query and key rows unwritten, its cache row never read).

    Args:
        positions: int64 ``[T]``, on query's device, sharing no memory with query or key.
        query: ``[T, Hq * head_size]`` or ``[T, Hq, head_size]`` (Hq >= 1), dtype float16/bfloat16/float32/
            float64, last stride 1 (views of a packed QKV projection, with strided rows, are fine); updated in
            place, so no zero-stride (expanded) or otherwise self-overlapping dims.
        key: None (only query turns), or ``[T, Hkv * head_size]`` / ``[T, Hkv, head_size]`` (Hkv >= 1) of
            query's dtype and device, last stride 1, updated in place, sharing no memory with query.
        head_size: ``D``, a positive int (not a bool).
        cos_sin_cache: ``[max_position, rotary_dim]``, ``max_position >= 1``, ``rotary_dim`` even and at most
            `head_size`; query's dtype or float32, on its device, contiguous, sharing no memory with query or
            key.
        is_neox: True for rotate-halves pairs, False for interleaved pairs.

    Returns:
        ``(query, key)``, updated in place (vLLM's operator returns nothing).

    Raises:
        ContractError: a non-tensor, a bad `head_size` or `is_neox`, a width that is no multiple of
            `head_size`, a mismatched token count, dtype or device, a last stride other than 1, a malformed
            cache, an expanded or overlapping query or key, a tensor that requires grad while grad mode is
            on, or (in checked mode) a position outside ``[0, max_position)``.
    """
    # The common case in one test each; the per-argument helpers (which name the bad one) run when it fails.
    if not (strided(positions, query, key, cos_sin_cache) and positions is not None and query is not None
            and cos_sin_cache is not None):
        check_tensor(_OP, "positions", positions)
        check_tensor(_OP, "query", query)
        check_tensor(_OP, "key", key, optional=True)
        check_tensor(_OP, "cos_sin_cache", cos_sin_cache)
    if wants_grad(positions, query, key, cos_sin_cache):
        check_no_grad(_OP, {"positions": positions, "query": query, "key": key, "cos_sin_cache": cos_sin_cache})
    if not isinstance(head_size, int) or isinstance(head_size, bool) or head_size <= 0:
        raise ContractError(_OP, "head_size", f"expected a positive int, got {head_size!r}")
    if is_neox is not True and is_neox is not False:
        check_bool(_OP, "is_neox", is_neox)
    if query.dtype not in _FLOAT_SET:
        check_dtype(_OP, "query", query, FLOAT_DTYPES)
    q3 = _heads("query", query, head_size)
    tokens = q3.shape[0]
    k3 = None
    if key is not None:
        if key.dtype != query.dtype:
            raise ContractError(_OP, "key", f"expected dtype {query.dtype} (same as query), got {key.dtype}")
        check_device(_OP, "key", key, query.device)
        k3 = _heads("key", key, head_size)
        if k3.shape[0] != tokens:
            raise ContractError(_OP, "key", f"expected {tokens} tokens (query's), got shape {list(key.shape)}")
    check_positions(_OP, positions, tokens, query.device)
    rotary_dim = check_cos_sin_cache(_OP, cos_sin_cache, query.dtype, query.device, head_size, "head_size")
    if tokens == 0:
        return query, key
    check_writable(_OP, "query", query)
    if key is not None:
        check_writable(_OP, "key", key)
        if not _rows_apart(query, key):  # the common case, views of one packed projection, needs no solver
            check_apart(_OP, {"query": query}, {"key": key})
    check_apart(_OP, {"query": query} if key is None else {"query": query, "key": key},
                {"positions": positions, "cos_sin_cache": cos_sin_cache})
    check_index_range(_OP, "positions", positions, cos_sin_cache.shape[0], allow_negative=False)
    problem = SPEC.key(device_type(query), query.dtype, head_dim=head_size, rotary_dim=rotary_dim, is_neox=is_neox,
                       tokens=tokens)
    dispatch(SPEC, problem, positions, q3, k3, cos_sin_cache, is_neox)
    return query, key


def _heads(name: str, x: torch.Tensor, head_size: int) -> torch.Tensor:
    """`x` ``[T, H * D]`` or ``[T, H, D]`` as a ``[T, H, D]`` view (H >= 1, last stride 1)."""
    if x.dim() == 2 and x.shape[1] % head_size == 0 and x.shape[1] > 0:
        if x.stride(1) != 1 and x.shape[1] > 1:
            raise ContractError(_OP, name, f"expected last stride 1, got strides {list(x.stride())}")
        return x.view(x.shape[0], x.shape[1] // head_size, head_size)
    if x.dim() == 3 and x.shape[2] == head_size and x.shape[1] > 0:
        if x.stride(2) != 1 and head_size > 1:
            raise ContractError(_OP, name, f"expected last stride 1, got strides {list(x.stride())}")
        return x
    raise ContractError(_OP, name, f"expected shape [T, H * {head_size}] or [T, H, {head_size}] (head_size "
                                   f"{head_size}, H >= 1 heads), got {list(x.shape)}")


def check_apart(op: str, written: Mapping[str, torch.Tensor], read: Mapping[str, torch.Tensor]) -> None:
    """Raise `ContractError`, naming the tensor of `read`, when one of `read` shares memory with one of
    `written` (`check_no_overlap`); the overlap solver runs only for the pairs whose byte ranges meet
    (``byte_extent``), so tensors far apart cost a few pointer reads (this runs on every call)."""
    ranges = [(name, t, t.data_ptr(), t.data_ptr() + _extent(t)) for name, t in written.items()]
    for name, t in read.items():
        low = t.data_ptr()
        high = low + _extent(t)
        for other, w, w_low, w_high in ranges:
            if low < w_high and w_low < high:
                check_no_overlap(op, name, t, other, w)


def _extent(t: torch.Tensor) -> int:
    """`byte_extent`, read off ``nbytes`` for a contiguous tensor (a cache, the positions)."""
    return t.nbytes if t.is_contiguous() else byte_extent(t)


def _row_runs(t: torch.Tensor) -> tuple[int, int] | None:
    """(row stride, row width) in elements when each token's row of `t` is one contiguous run of elements:
    ``[T, W]`` with strides ``(s, 1)``, or ``[T, H, D]`` with strides ``(s, D, 1)``; else None."""
    if t.dim() == 2 and t.stride(1) == 1:
        return t.stride(0), t.shape[1]
    if t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]:
        return t.stride(0), t.shape[1] * t.shape[2]
    return None


def _rows_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` provably share no memory because their rows are runs with one row stride ``s``
    whose offsets modulo ``s`` never meet (query and key as column slices of one packed ``[T, W]``
    projection); False means "not proven", not "overlapping"."""
    ra, rb = _row_runs(a), _row_runs(b)
    size = a.element_size()
    if ra is None or rb is None or ra[0] != rb[0] or b.element_size() != size:
        return False
    (stride, wa), (_, wb) = ra, rb
    gap, misaligned = divmod(b.data_ptr() - a.data_ptr(), size)
    if misaligned or wa > stride or wb > stride:
        return False
    d = gap % stride  # where b's runs start within a's period
    return wa <= d and d + wb <= stride


def check_positions(op: str, positions: torch.Tensor, tokens: int, device: torch.device) -> None:
    """Raise `ContractError` (naming ``positions``) unless `positions` is int64 ``[tokens]`` on `device`."""
    if positions.dtype != torch.int64:
        raise ContractError(op, "positions", f"expected dtype torch.int64, got {positions.dtype}")
    check_device(op, "positions", positions, device)
    if positions.shape != (tokens,):
        raise ContractError(op, "positions", f"expected shape [{tokens}] (one position per token), got "
                                             f"{list(positions.shape)}")


def check_cos_sin_cache(op: str, cache: torch.Tensor, dtype: torch.dtype, device: torch.device, head_dim: int,
                        head_name: str) -> int:
    """Check a ``[max_position, rotary_dim]`` cos/sin cache for heads of `head_dim` (the argument `head_name`)
    in `dtype` on `device`; returns ``rotary_dim``.

    Raises:
        ContractError: naming ``cos_sin_cache``: not 2-D, no row, an odd rotary dim or one above `head_dim`,
            a dtype other than `dtype` or float32, another device, or a layout that is not contiguous.
    """
    if cache.dim() != 2:
        raise ContractError(op, "cos_sin_cache", f"expected shape [max_position, rotary_dim], got {list(cache.shape)}")
    rows, rotary_dim = cache.shape
    if rows == 0:
        raise ContractError(op, "cos_sin_cache", "expected at least one position (row), got shape "
                                                 f"{list(cache.shape)}")
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise ContractError(op, "cos_sin_cache", f"expected an even rotary_dim in [2, {head_dim}] ({head_name}): "
                                                 f"each row holds rotary_dim / 2 cosines, then as many sines; got "
                                                 f"shape {list(cache.shape)}")
    if cache.dtype not in (dtype, torch.float32):
        raise ContractError(op, "cos_sin_cache", f"expected dtype {dtype} (the heads') or torch.float32, got "
                                                 f"{cache.dtype}")
    check_device(op, "cos_sin_cache", cache, device)
    if not cache.is_contiguous():
        raise ContractError(op, "cos_sin_cache", f"expected a contiguous tensor, got strides {list(cache.stride())}")
    return rotary_dim


SPECS = (SPEC,)
