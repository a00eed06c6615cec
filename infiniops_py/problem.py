"""The framework's description of an operator and of one call: `OpSpec`, `Problem`, the dtype names.

`Problem` is the metadata of one operator call that capabilities are checked against.

A problem holds no tensors, only what decides which implementation can run it: the device type, the
dtype and operator-specific fields (``head_dim``, ``block_size``, ``width``, layout flags). Each operator
declares its fields and their defaults in an `OpSpec`, so a problem can also be built by hand (for
`explain`, closures and the CLI) from a few fields, the rest taking their defaults.

`OpSpec.call` hands a call to the dispatcher that `install_dispatcher` sets (the runtime's resolver, once
``infiniops_py`` is imported).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, final

import torch

__all__ = ["DTYPE_NAMES", "OpSpec", "Problem", "dtype_name", "install_dispatcher", "installed_dispatcher"]

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


_Dispatcher = Callable[["OpSpec", tuple[Any, ...], tuple[Any, ...], dict[str, Any]], Any]
_dispatcher: _Dispatcher | None = None


def install_dispatcher(fn: _Dispatcher) -> None:
    """Called once by the framework layer: route every `OpSpec.call` through the resolver."""
    global _dispatcher
    _dispatcher = fn


def installed_dispatcher() -> _Dispatcher | None:
    """The dispatcher `install_dispatcher` set last; None until ``infiniops_py.runtime`` is imported."""
    return _dispatcher


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
