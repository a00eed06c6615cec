"""The operators' argument-check helpers, shared by every operator module.

Each helper raises `ContractError` naming the operator, the argument, the value found and what is needed.
The framework types these modules also use (`Problem`, `OpSpec`, the dtype names, the overlap solver,
`ContractError`) live in `infiniops_py.problem`, `infiniops_py.memory` and
`infiniops_py.errors`; they are re-exported here for the operator modules.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

import torch

from infiniops_py._env import parse_flag
from infiniops_py.errors import ContractError
from infiniops_py.memory import byte_extent, overlaps, same_view
from infiniops_py.problem import DTYPE_NAMES, OpSpec, Problem, dtype_name, size_class

__all__ = [
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "INDEX_DTYPES",
    "ContractError",
    "OpSpec",
    "Problem",
    "byte_extent",
    "check_bool",
    "check_device",
    "check_disjoint",
    "check_dtype",
    "check_index_range",
    "check_last_stride",
    "check_like",
    "check_no_grad",
    "check_no_overlap",
    "check_out_like",
    "check_real",
    "check_shape",
    "check_slot_indices",
    "check_tensor",
    "check_unique_indices",
    "check_vector",
    "check_writable",
    "checked_indices",
    "device_type",
    "dtype_name",
    "is_checked",
    "overlaps",
    "same_view",
    "size_class",
    "strided",
    "unchecked_indices",
    "wants_grad",
]

FLOAT_DTYPES: Final = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
INDEX_DTYPES: Final = (torch.int32, torch.int64)  # state/cache slot indices (vLLM, mamba)
_STRIDED: Final = torch.strided

# --- argument checks shared by every operator ------------------------------------------------------

# Index range checks: None follows the default (CPU checked, CUDA not: a check would synchronize),
# True / False is a `checked_indices()` / `unchecked_indices()` scope of this thread or task.
_INDEX_CHECKS: contextvars.ContextVar[bool | None] = contextvars.ContextVar("infiniops_index_checks", default=None)


@functools.lru_cache(maxsize=8)
def _env_index_checks(raw: str | None) -> bool | None:
    """``INFINIOPS_CHECK_INDICES`` as a forced choice, or None when unset (the per-device default)."""
    if raw is None or not raw.strip():
        return None
    return parse_flag("INFINIOPS_CHECK_INDICES", raw, False)


@contextlib.contextmanager
def _index_checks(on: bool) -> Iterator[None]:
    token = _INDEX_CHECKS.set(on)
    try:
        yield
    finally:
        _INDEX_CHECKS.reset(token)


def checked_indices() -> contextlib.AbstractContextManager[None]:
    """Scope in which index tensors are range-checked on every device, raising `ContractError`.

    The values are read on the host, so on CUDA each check synchronizes with the device (never inside
    CUDA-graph capture, where the checks stay off). The scope belongs to the thread or asyncio task that
    enters it (a `contextvars` variable), like ``INFINIOPS_CHECK_INDICES=1`` does for the whole process.
    """
    return _index_checks(True)


def unchecked_indices() -> contextlib.AbstractContextManager[None]:
    """Scope in which index tensors (slots, block tables, sequence lengths, state indices) are not
    range-checked on the host, on any device; it belongs to the thread or asyncio task that enters it.

    Kernels still never read or write out of bounds: an out-of-range index is padding (its row is skipped,
    its output is zero) instead of raising. As with every `contextvars` scope, a generator that enters it
    and then yields leaves its caller inside the scope until the generator resumes and exits it: keep the
    scope around the calls, not around a ``yield``.
    """
    return _index_checks(False)


def is_checked(device: torch.device) -> bool:
    """Whether index tensors on `device` are range-checked now.

    In order: never on ``meta`` (no values) or inside CUDA-graph capture (a check would synchronize); a
    `checked_indices()` / `unchecked_indices()` scope of this thread or task; ``INFINIOPS_CHECK_INDICES``
    (a boolean: ``1``/``0``, ``true``/``false``, ...); otherwise checked on CPU and not on CUDA, where
    reading the values would synchronize with the device on every call.

    Raises:
        ValueError: ``INFINIOPS_CHECK_INDICES`` is set to a value that is not a boolean.
    """
    kind = device.type
    if kind == "meta":
        return False
    scoped = _INDEX_CHECKS.get()
    if scoped is None and kind == "cuda" and "INFINIOPS_CHECK_INDICES" not in os.environ:
        return False  # the CUDA default, capturing or not: no capture query on the hot path
    if kind == "cuda" and _capturing():
        return False
    if scoped is not None:
        return scoped
    forced = _env_index_checks(os.environ.get("INFINIOPS_CHECK_INDICES"))
    if forced is not None:
        return forced
    return kind == "cpu"


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph; False where torch has no CUDA runtime (a
    CPU-only build raises instead of answering)."""
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:
        return False


def check_unique_indices(op: str, name: str, index: torch.Tensor, what: str = "index") -> None:
    """When `index` is checked (`is_checked`), raise `ContractError` if a non-negative value repeats.

    Two rows naming one state or cache slot would race (which write lands, and whether a row reads the
    state before or after another row's write, is undefined: providers differ); negative values are
    padding and may repeat. Unchecked, duplicates are the caller's to avoid. `what` names a value in the
    message (``"index"``, or e.g. ``"cache slot"`` when `index` is derived from the argument `name`).
    Reads the values on the host, like `check_index_range`: never on meta or during CUDA-graph capture.
    """
    if index.numel() < 2 or index.is_meta or not is_checked(index.device):  # meta: no values (a model's trace)
        return
    values, counts = torch.unique(index[index >= 0], return_counts=True)
    repeated = counts > 1
    if bool(repeated.any()):
        first = int(repeated.int().argmax())
        raise ContractError(op, name, f"{what} {int(values[first])} appears {int(counts[first])} times, but each "
                                      "non-negative value must be unique: two rows would write one slot "
                                      "(negative values are padding and may repeat)")


def check_no_grad(op: str, tensors: Mapping[str, torch.Tensor | None]) -> None:
    """Raise `ContractError` when grad mode is on and one of `tensors` (argument name -> tensor or None)
    requires grad: no operator here registers a backward, so autograd would either fail inside a provider
    (torch's "out= arguments don't support automatic differentiation") or return wrong gradients. Call it
    after the `check_tensor` checks (it reads ``requires_grad``) and before any kernel."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise ContractError(op, name, f"requires_grad=True with grad mode on, but {op} has no backward: call "
                                          "it under torch.no_grad() or torch.inference_mode(), or pass .detach()")


def check_dtype(op: str, name: str, t: torch.Tensor, allowed: Sequence[torch.dtype], why: str = "") -> None:
    """Raise `ContractError` unless ``t.dtype`` is one of `allowed`."""
    if t.dtype not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise ContractError(op, name, f"expected dtype in ({names}){why}, got {t.dtype}")


def check_shape(op: str, name: str, t: torch.Tensor, expected: Sequence[int | None], what: str = "") -> None:
    """Raise `ContractError` unless ``t.shape`` matches `expected` (None matches any size)."""
    shape = t.shape
    if len(shape) == len(expected):  # a plain loop: this runs on every call (benchmarks/dispatch.py)
        for s, e in zip(shape, expected):
            if e is not None and s != e:
                break
        else:
            return
    want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
    raise ContractError(op, name, f"expected shape {want}{what}, got {list(t.shape)}")


def device_type(t: torch.Tensor) -> str:
    """``t.device.type``, read through ``is_cpu``/``is_cuda`` (cheaper than building the ``torch.device``)."""
    if t.is_cpu:
        return "cpu"
    return "cuda" if t.is_cuda else t.device.type


def check_device(op: str, name: str, t: torch.Tensor, device: torch.device) -> None:
    """Raise `ContractError` unless `t` lives on `device`."""
    if t.device != device:
        raise ContractError(op, name, f"expected a tensor on {device} (same as the first input), got {t.device}")


def check_like(op: str, name: str, t: torch.Tensor, like: torch.Tensor, like_name: str = "x") -> None:
    """Raise `ContractError` unless `t` has the dtype, then the device, of `like` (the argument `like_name`)."""
    if t.dtype != like.dtype:
        raise ContractError(op, name, f"expected dtype {like.dtype} (same as {like_name}), got {t.dtype}")
    check_device(op, name, t, like.device)


def check_last_stride(op: str, name: str, t: torch.Tensor) -> None:
    """Raise `ContractError` unless `t`'s last dim is dense (stride 1; any stride when it holds at most one
    element): the rows of a ``[..., H]`` operand may be strided, their elements not."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ContractError(op, name, f"expected last stride 1, got strides {list(t.stride())}")


_FLOAT_SET: Final = frozenset(FLOAT_DTYPES)


def check_projection(op: str, x: torch.Tensor, weight: torch.Tensor, weight_form: str = "[N, K={k}]",
                     ) -> tuple[int, int, bool]:
    """The input of a fused projection (`gemm_swiglu`, `gemm_add_rms_norm`): x ``[T, K]`` float, stride 1 along K,
    and weight ``[rows, K]`` of x's dtype and device in the ``nn.Linear`` layout (stride 1 along K), each attribute
    read once (the call's hot path: a helper runs only to raise). Returns ``(T, K, x.is_cpu)``.

    Raises:
        ContractError: naming x or weight; `weight_form` (formatted with ``k``) is the weight shape the message
            expects.
    """
    dtype = x.dtype
    if dtype not in _FLOAT_SET:
        check_dtype(op, "x", x, FLOAT_DTYPES)
    xs = x.shape
    if len(xs) != 2:
        raise ContractError(op, "x", f"expected 2 dims [T, K], got {len(xs)}: {list(xs)}")
    t, k = xs
    if k > 1 and x.stride(1) != 1:
        check_last_stride(op, "x", x)
    on_cpu = x.is_cpu  # `is_cpu` costs a third of a device comparison
    if weight.dtype is not dtype or ((not weight.is_cpu) if on_cpu else weight.device != x.device):
        check_like(op, "weight", weight, x)
    ws = weight.shape
    if len(ws) != 2 or ws[1] != k:
        raise ContractError(op, "weight", f"expected {weight_form.format(k=k)}, got {list(ws)}")
    if k > 1 and weight.stride(1) != 1:
        raise ContractError(op, "weight", f"expected last stride 1 (the nn.Linear layout), got strides "
                                          f"{list(weight.stride())}")
    return t, k, on_cpu


def check_vector(op: str, name: str, t: torch.Tensor, like: torch.Tensor, n: int, what: str, *,
                 like_name: str = "x", dim: str = "H") -> None:
    """Raise `ContractError` unless `t` is a contiguous ``[n]`` tensor of `like`'s dtype and device (a norm's
    weight: `what` says what `n` is, ``H = x.shape[-1]``; `dim` names it in one letter)."""
    if t.dtype is like.dtype and t.shape == (n,) and (n <= 1 or t.stride(0) == 1) and t.device == like.device:
        return  # the common case in a few attribute reads; the checks below name what is wrong
    check_like(op, name, t, like, like_name)
    if t.shape != (n,):
        raise ContractError(op, name, f"expected shape [{n}] ({what}), got {list(t.shape)}")
    if t.stride(0) != 1 and n > 1:
        raise ContractError(op, name, f"expected a contiguous [{dim}] tensor, got stride {t.stride(0)}")


def check_out_like(op: str, out: torch.Tensor, shape: Sequence[int], like: torch.Tensor,
                   what: str = "same as x") -> None:
    """Raise `ContractError` unless `out` is a contiguous tensor of `shape` (`what` says whose) with `like`'s dtype
    and device."""
    if tuple(out.shape) != tuple(shape):
        raise ContractError(op, "out", f"expected shape {list(shape)} ({what}), got {list(out.shape)}")
    check_like(op, "out", out, like)
    if not out.is_contiguous():
        raise ContractError(op, "out", f"expected a contiguous tensor, got strides {list(out.stride())}")


def check_index_range(op: str, name: str, index: torch.Tensor, high: int, *, allow_negative: bool) -> None:
    """In checked mode, raise `ContractError` when `index` holds a value >= `high` (or < 0 when not allowed).

    Negative values are padding when `allow_negative`; the check synchronizes with the device.
    """
    if index.numel() == 0 or index.is_meta or not is_checked(index.device):  # meta: no values (a model's trace)
        return
    lo_t, hi_t = torch.aminmax(index)
    lo, hi = int(lo_t), int(hi_t)
    if hi >= high or (lo < 0 and not allow_negative):
        bad = hi if hi >= high else lo
        rule = f"< {high} (negative values are padding)" if allow_negative else f"in [0, {high - 1}]"
        raise ContractError(op, name, f"index {bad} out of range: each value must be {rule}")


# --- argument kinds, scalars and memory layout ---------------------------------------------------------


def check_tensor(op: str, name: str, t: object, *, optional: bool = False) -> None:
    """Raise `ContractError` unless `t` is a strided `torch.Tensor` (or None when `optional`).

    A sparse (COO, CSR, CSC, BSR, BSC) or MKLDNN tensor is refused: no provider reads those layouts, and
    their missing strides and data pointers would raise torch's own errors inside later checks or kernels
    (issue #30). Callers whose checks skip this helper on their fast path read ``t.layout`` there.
    """
    if isinstance(t, torch.Tensor):
        if t.layout is _STRIDED:
            return
        raise ContractError(op, name, f"expected a strided tensor (dense, with strides), got layout {t.layout}: "
                                      "pass .to_dense()")
    if optional and t is None:
        return
    hint = " (or None)" if optional else ""
    raise ContractError(op, name, f"expected a torch.Tensor{hint}, got {type(t).__name__}")


def strided(*tensors: object) -> bool:
    """Whether each of `tensors` is None or a strided `torch.Tensor`: the operators' hot paths test this once
    and call `check_tensor` per argument (which names the bad one) only when it is false."""
    for t in tensors:  # a plain loop: a generator under all() costs more than the checks
        if t is not None and (not isinstance(t, torch.Tensor) or t.layout is not _STRIDED):
            break
    else:
        return True
    return False


def wants_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether grad mode is on and one of `tensors` (None skipped) requires grad: the hot paths test this
    and call `check_no_grad` (which names the tensor) only when it is true."""
    for t in tensors:
        if t is not None and t.requires_grad:
            return torch.is_grad_enabled()
    return False


def check_bool(op: str, name: str, value: object) -> bool:
    """Raise `ContractError` unless `value` is a bool (``1``, ``"yes"`` or a numpy bool are refused)."""
    if value is True or value is False:
        return value
    raise ContractError(op, name, f"expected a bool, got {type(value).__name__} {value!r}")


def check_real(op: str, name: str, value: object, *, low: float = -math.inf, low_inclusive: bool = True) -> float:
    """Return `value` as a float; raise `ContractError` unless it is a finite int or float (not a bool)
    that is ``>= low`` (``> low`` when not `low_inclusive`)."""
    if value.__class__ is float and low < value and value - value == 0.0:  # the common case (inf - inf is NaN)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ContractError(op, name, f"expected a real number (int or float), got {type(value).__name__} {value!r}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond the float range (10**400)
        v = math.inf
    if not math.isfinite(v):
        shown = value if isinstance(value, float) or abs(value) < 10**30 else f"an int of {len(str(abs(value)))} digits"
        raise ContractError(op, name, f"expected a finite number, got {shown}")
    if v < low or (v == low and not low_inclusive):
        bound = f">= {low:g}" if low_inclusive else f"> {low:g}"
        raise ContractError(op, name, f"expected a number {bound}, got {value!r}")
    return v


def check_writable(op: str, name: str, t: torch.Tensor) -> None:
    """Raise `ContractError` when `t`, written in place, maps two of its elements to one address.

    A zero stride on a dimension of size > 1 (an expanded view) is the common case. Any other layout must,
    with its dimensions sorted by stride, give each stride room for the whole extent of the smaller ones
    (true of every slice, transpose or permutation of a dense tensor).
    """
    if t.is_contiguous():
        return
    shape = t.shape
    if len(shape) == 2:  # the common case, rows of a wider matrix: dense rows that do not meet
        (s0, s1), (n0, n1) = t.stride(), shape
        if s1 == 1 and (n0 <= 1 or s0 >= n1):
            return
    dims = sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1)
    extent = 0  # elements spanned by the dims with smaller strides, minus one
    for st, n in dims:
        if st <= extent:
            what = "a zero stride (an expanded view)" if st == 0 else "strides that overlap"
            raise ContractError(op, name, f"shape {list(t.shape)} with strides {list(t.stride())} has {what}: "
                                          "several elements share one address, and it is written in place")
        extent += st * (n - 1)


def check_no_overlap(op: str, name: str, t: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    """Raise `ContractError` when `t` and `other` share any memory (see `overlaps`)."""
    if overlaps(t, other):
        raise ContractError(op, name, f"overlaps {other_name} in memory; pass separate tensors (e.g. .clone())")


def check_disjoint(op: str, other_name: str, other: torch.Tensor,
                tensors: Sequence[tuple[str, torch.Tensor | None]]) -> None:
    """`check_no_overlap` of each named tensor of `tensors` (None skipped) against `other`, in order; only a
    tensor whose byte range meets other's is handed to the overlap solver (the common case costs a few
    attribute reads per tensor)."""
    low = other.data_ptr()
    high = low + (other.nbytes if other.is_contiguous() else byte_extent(other))
    for name, t in tensors:
        if t is not None:
            start = t.data_ptr()
            if start < high and low < start + (t.nbytes if t.is_contiguous() else byte_extent(t)):
                check_no_overlap(op, name, t, other_name, other)


_INDEX_SET: Final = frozenset(INDEX_DTYPES)


def check_slot_indices(op: str, state_name: str, name: str, index: torch.Tensor | None, batch: int, slots: int,
                       device: torch.device) -> None:
    """The slot index of each of `batch` rows into a state of `slots` rows (vLLM's / mamba's
    ``state_batch_indices``, ``conv_state_indices``): int32/int64 ``[B]`` on `device`; without it, one slot per
    row. Checked indices (`is_checked`) are in range (negative: a padding row) and distinct.

    Raises:
        ContractError: naming `name` (or `state_name` when the index is None and the slot count differs).
    """
    if index is None:
        if slots != batch and batch:
            raise ContractError(op, state_name, f"expected {batch} slots (one per row of x) without {name}, "
                                                f"got {slots}")
        return
    if index.device != device or index.dtype not in _INDEX_SET or index.shape != (batch,):
        check_device(op, name, index, device)
        check_dtype(op, name, index, INDEX_DTYPES)
        check_shape(op, name, index, (batch,), " ([B])")
    if batch and is_checked(device):  # as the two checks' own early returns (B = numel)
        check_index_range(op, name, index, slots, allow_negative=True)
        check_unique_indices(op, name, index)
