"""The contract layer's base: `ContractError`, `Problem`, `OpSpec` and the argument-check helpers.

`Problem` is the metadata of one operator call that capabilities are checked against.

A problem holds no tensors, only what decides which implementation can run it: the device type, the
dtype and operator-specific fields (``head_dim``, ``block_size``, ``width``, layout flags). Each operator
declares its fields and their defaults in an `OpSpec`, so a problem can also be built by hand (for
`explain`, closures and the CLI) from a few fields, the rest taking their defaults.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, final

import torch

__all__ = [
    "DTYPE_NAMES",
    "FLOAT_DTYPES",
    "ContractError",
    "OpSpec",
    "Problem",
    "check_device",
    "check_dtype",
    "check_index_range",
    "check_shape",
    "device_type",
    "dtype_name",
    "install_dispatcher",
    "is_checked",
]

FLOAT_DTYPES: Final = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

DTYPE_NAMES: Final[dict[torch.dtype, str]] = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
}
_DTYPE_ALIASES: Final[dict[str, str]] = {
    "fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32", "float": "float32",
    "fp64": "float64", "double": "float64",
}


def dtype_name(dtype: torch.dtype | str) -> str:
    """Canonical name of a dtype: ``torch.bfloat16``, ``"bf16"`` and ``"bfloat16"`` give ``"bfloat16"``."""
    if isinstance(dtype, torch.dtype):
        return DTYPE_NAMES.get(dtype) or str(dtype).removeprefix("torch.")
    name = dtype.removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


class ContractError(ValueError):
    """An argument breaks an operator's contract.

    The message names the argument, the value found and what the contract needs, e.g.
    ``flash_attn_varlen: k: expected dtype torch.bfloat16 (same as q), got torch.float16``.
    """

    def __init__(self, op: str, argument: str, message: str) -> None:
        self.op = op
        self.argument = argument
        super().__init__(f"{op}: {argument}: {message}")


_Dispatcher = Callable[["OpSpec", tuple[Any, ...], tuple[Any, ...], dict[str, Any]], Any]
_dispatcher: _Dispatcher | None = None


def install_dispatcher(fn: _Dispatcher) -> None:
    """Called once by the framework layer: route every `OpSpec.call` through the resolver."""
    global _dispatcher
    _dispatcher = fn


@dataclass(frozen=True)
class OpSpec:
    """An operator as the framework sees it.

    Attributes:
        name: the public entry point's name (``flash_attn_varlen``).
        fields: the problem fields after ``device_type`` and ``dtype``, with their defaults, in key order.
        function: the public function (checks, then dispatch).
        reference: the literal PyTorch reference, with the implementation calling convention.
        doc: one line for the matrix.
    """

    name: str
    fields: Mapping[str, Any]
    function: Callable[..., Any]
    reference: Callable[..., Any]
    doc: str = ""

    def problem(self, device_type: str = "cpu", dtype: torch.dtype | str = "float32", **fields: Any) -> Problem:
        """Build a problem from named fields; missing fields take their defaults.

        Raises:
            ValueError: a field the operator does not have.
        """
        unknown = set(fields) - set(self.fields)
        if unknown:
            raise ValueError(
                f"{self.name}: unknown problem field(s) {sorted(unknown)}; known: {sorted(self.fields)}"
            )
        values = {**self.fields, **fields}
        return Problem(self.name, device_type, dtype_name(dtype), values)

    def call(self, key: tuple[Any, ...], *args: Any, **kwargs: Any) -> Any:
        """Run the implementation the resolver picks for ``key = (device_type, dtype, *field values)``."""
        if _dispatcher is None:
            raise RuntimeError("infiniops_py did not install its dispatcher: import infiniops_py first")
        return _dispatcher(self, key, args, kwargs)

    def problem_from_key(self, key: tuple[Any, ...]) -> Problem:
        """Build the problem behind a dispatch key ``(device_type, dtype, *field values)``."""
        device_type, dtype, *rest = key
        return Problem(self.name, device_type, dtype_name(dtype), dict(zip(self.fields, rest, strict=True)))


@final
class Problem:
    """One operator call's metadata: ``op``, ``device_type``, ``dtype`` and the operator's fields."""

    __slots__ = ("_hash", "device_type", "dtype", "fields", "op")

    def __init__(self, op: str, device_type: str, dtype: str, fields: Mapping[str, Any]) -> None:
        self.op = op
        self.device_type = device_type
        self.dtype = dtype
        self.fields = dict(fields)
        self._hash = hash((op, device_type, dtype, tuple(sorted(self.fields.items()))))

    def get(self, name: str, default: Any = None) -> Any:
        """The value of a field; ``device_type`` and ``dtype`` are fields too."""
        if name == "device_type":
            return self.device_type
        if name == "dtype":
            return self.dtype
        return self.fields.get(name, default)

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "device_type": self.device_type, "dtype": self.dtype, **self.fields}

    def describe(self) -> str:
        parts = [f"device_type={self.device_type}", f"dtype={self.dtype}"]
        parts += [f"{k}={v}" for k, v in self.fields.items()]
        return "(" + ", ".join(parts) + ")"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Problem) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Problem({self.op}, {self.describe()[1:-1]})"


# --- argument checks shared by every operator ------------------------------------------------------

_UNCHECKED_DEPTH = [0]


@contextlib.contextmanager
def unchecked_indices() -> Iterator[None]:
    """Skip the host-side range checks of index tensors (slots, block tables, state indices).

    Kernels still never read or write out of bounds: an out-of-range index is then skipped instead of
    raising. CUDA-graph capture turns the checks off by itself, since they synchronize.
    """
    _UNCHECKED_DEPTH[0] += 1
    try:
        yield
    finally:
        _UNCHECKED_DEPTH[0] -= 1


def is_checked(device: torch.device) -> bool:
    """Whether index tensors on `device` are range-checked now (checked mode)."""
    if _UNCHECKED_DEPTH[0] or os.environ.get("INFINIOPS_CHECK_INDICES", "1") == "0":
        return False
    return not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())


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
    """``t.device.type``, five times faster for cpu and cuda tensors (``Tensor.device.type`` costs ~250 ns)."""
    if t.is_cpu:
        return "cpu"
    return "cuda" if t.is_cuda else t.device.type


def check_device(op: str, name: str, t: torch.Tensor, device: torch.device) -> None:
    """Raise `ContractError` unless `t` lives on `device`."""
    if t.device != device:
        raise ContractError(op, name, f"expected a tensor on {device} (same as the first input), got {t.device}")


def check_index_range(op: str, name: str, index: torch.Tensor, high: int, *, allow_negative: bool) -> None:
    """In checked mode, raise `ContractError` when `index` holds a value >= `high` (or < 0 when not allowed).

    Negative values are padding when `allow_negative`; the check synchronizes with the device.
    """
    if index.numel() == 0 or not is_checked(index.device):
        return
    lo_t, hi_t = torch.aminmax(index)
    lo, hi = int(lo_t), int(hi_t)
    if hi >= high or (lo < 0 and not allow_negative):
        bad = hi if hi >= high else lo
        rule = f"< {high} (negative values are padding)" if allow_negative else f"in [0, {high - 1}]"
        raise ContractError(op, name, f"index {bad} out of range: each value must be {rule}")
