"""The framework's description of an operator and of one call: `OpSpec`, `Problem`, the dtype names.

`Problem` is the metadata of one operator call that capabilities are checked against.

A problem holds no tensors, only what decides which implementation can run it: the device type, the
dtype and operator-specific fields (``head_dim``, ``block_size``, ``width``, layout flags). Each operator
declares its fields and their defaults in an `OpSpec`, so a problem can also be built by hand (for
`explain`, closures and the CLI) from a few fields, the rest taking their defaults.

A problem may also carry a *size bucket*: the classes of the sizes that decide which implementation is
fastest (Gemm's M, N and K, an attention's query tokens and context length), each the power of two at or
above the size (`size_class`). Each operator names its bucket entries in ``OpSpec.buckets``, beside its
fields; the hot path appends their classes to the dispatch key, so measured resolution stays one dict lookup
per call. Capabilities never read the bucket: it ranks, it does not gate.

Each `OpSpec` registers itself when it is defined: `SPECS` maps every operator name defined so far to its spec,
and a second spec of a name already taken is refused. The call path (`infiniops_py.dispatch`) and what it builds
the resolver from (discovery, the built-in providers, the overrides) read `SPECS`, so none of them imports an
operator module (the operators import the call path). Importing ``infiniops_py`` imports every operator family,
so `SPECS` is complete before any call.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, final

import torch

__all__ = ["DTYPE_NAMES", "SPECS", "OpSpec", "Problem", "dtype_name", "size_class"]

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


def size_class(n: int) -> int:
    """The size class of `n` >= 0: the smallest power of two >= `n` (1 -> 1, 3 -> 4, 100 -> 128), 0 for 0.

    The classes of a size bucket (``OpSpec.buckets``); cheap enough for the hot path (two int operations).
    """
    return n and 1 << (n - 1).bit_length()


_SPECS: dict[str, OpSpec] = {}
SPECS: Final[Mapping[str, OpSpec]] = MappingProxyType(_SPECS)
"""Every `OpSpec` defined so far, by operator name, in the order of the names (so the order does not depend on
which module was imported first); a read-only view: specs register themselves when they are made."""


@dataclass(frozen=True, kw_only=True, eq=False)
class OpSpec:
    """An operator as the framework sees it; making one registers it in `SPECS` (see `__post_init__`).

    Attributes:
        name: the public entry point's name (``flash_attn_varlen``).
        fields: the problem fields after ``device_type`` and ``dtype``, with their defaults, in key order.
        function: the public function (checks, then dispatch); None until the operator module defines it
            (``infiniops_py.operators._declare.Operator.define``).
        reference: the literal PyTorch reference, with the implementation calling convention.
        doc: one line for the matrix.
        buckets: the names of the size-bucket entries, appended to the dispatch key after the fields, in order;
            each is the `size_class` of one size of the call (the operator module documents which). Empty:
            the operator's speed has no size bucket.
        key: made from `fields` and `buckets`: ``key(device_type, dtype, *, <field>=..., <bucket>=...)`` returns
            the dispatch key ``(device_type, dtype, *field values, *size classes)``; each field and bucket is a
            keyword (a missing or unknown one is a `TypeError`), and each bucket takes the raw size (its
            `size_class` is taken here).
    """

    name: str
    fields: Mapping[str, Any]
    function: Callable[..., Any] | None = None
    reference: Callable[..., Any]
    doc: str = ""
    buckets: tuple[str, ...] = ()
    key: Callable[..., tuple[Any, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Make `key` and register the spec in `SPECS` under its name.

        Raises:
            ValueError: a spec of that name is already registered (an operator name is defined once), naming the
                module of the spec that holds it; a field or bucket name that is not a Python identifier, is a
                keyword, repeats, or is ``device_type``/``dtype``.
        """
        object.__setattr__(self, "key", _key_function(self.name, tuple(self.fields), self.buckets))
        taken = _SPECS.get(self.name)
        if taken is not None:
            raise ValueError(f"OpSpec name {self.name!r} is already taken by the spec of {_where(taken.function)}: "
                             f"each operator name is defined once (this spec's function: {_where(self.function)})")
        ordered = sorted([*_SPECS.items(), (self.name, self)], key=lambda item: item[0])
        _SPECS.clear()
        _SPECS.update(ordered)

    def problem(self, device_type: str = "cpu", dtype: torch.dtype | str = "float32", **fields: Any) -> Problem:
        """Build a problem from named fields; missing fields take their defaults.

        Sizes named by `buckets` (``m=100`` for Gemm) give the problem its size bucket, each size becoming its
        `size_class` (``m=100`` -> class 128); they come all together or not at all (no bucket).

        Raises:
            ValueError: a field the operator does not have; some of the bucket's sizes but not all, or a size
                that is negative. TypeError: a size that is not an int (a bool is not one).
        """
        sizes = {name: fields.pop(name) for name in self.buckets if name in fields}
        unknown = set(fields) - set(self.fields)
        if unknown:
            known = sorted(self.fields) + [f"{b} (size)" for b in self.buckets]
            raise ValueError(f"{self.name}: unknown problem field(s) {sorted(unknown)}; known: {known}")
        if sizes and len(sizes) != len(self.buckets):
            missing = [b for b in self.buckets if b not in sizes]
            raise ValueError(f"{self.name}: the size bucket needs {', '.join(self.buckets)}; got "
                             f"{', '.join(sizes)}, missing {', '.join(missing)}")
        for name, n in sizes.items():
            if not isinstance(n, int) or isinstance(n, bool):
                raise TypeError(f"{self.name}: size {name}={n!r} must be an int, got {type(n).__name__}")
            if n < 0:
                raise ValueError(f"{self.name}: size {name}={n} must be >= 0")
        values = {**self.fields, **fields}
        bucket = {name: size_class(sizes[name]) for name in self.buckets} if sizes else {}
        return Problem(self.name, device_type, dtype_name(dtype), values, bucket)

    def problem_from_key(self, key: tuple[Any, ...]) -> Problem:
        """Build the problem behind a dispatch key ``(device_type, dtype, *field values, *bucket classes)``."""
        device_type, dtype, *rest = key
        n = len(self.fields)
        return Problem(self.name, device_type, dtype_name(dtype), dict(zip(self.fields, rest[:n], strict=True)),
                       dict(zip(self.buckets, rest[n:], strict=True)))


def _key_function(op: str, fields: tuple[str, ...], buckets: tuple[str, ...]) -> Callable[..., tuple[Any, ...]]:
    """The ``key`` of an `OpSpec`: a function of one keyword per field and bucket, made from their names, so
    a key is built by name at the cost of a plain call (a bucket's `size_class` written inline)."""
    names = (*fields, *buckets)
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name) or name in ("device_type", "dtype"):
            raise ValueError(f"{op}: problem field or bucket {name!r} must be an identifier, not a keyword nor "
                             "device_type/dtype")
    if len(set(names)) != len(names):
        raise ValueError(f"{op}: a field and a bucket share a name: {names}")
    values = [*fields, *(f"{b} and 1 << ({b} - 1).bit_length()" for b in buckets)]
    params = "".join(f", {n}" for n in names)
    source = (f"def key(device_type, dtype{', *' if names else ''}{params}):\n"
              f"    return (device_type, dtype{''.join(f', {v}' for v in values)})\n")
    namespace: dict[str, Any] = {}
    exec(source, namespace)  # the source is made of the identifiers checked above
    key = namespace["key"]
    key.__qualname__ = f"OpSpec({op!r}).key"
    return key


def _where(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of a spec's function, or its repr when it has none (a partial)."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(fn)


@final
class Problem:
    """One operator call's metadata: ``op``, ``device_type``, ``dtype``, the operator's fields, and the size
    bucket (``bucket``: the `size_class` of each size named by ``OpSpec.buckets``; empty when not known)."""

    __slots__ = ("_hash", "bucket", "device_type", "dtype", "fields", "op")

    def __init__(self, op: str, device_type: str, dtype: str, fields: Mapping[str, Any],
                 bucket: Mapping[str, int] | None = None) -> None:
        self.op = op
        self.device_type = device_type
        self.dtype = dtype
        self.fields = dict(fields)
        self.bucket = dict(bucket or {})
        self._hash = hash((op, device_type, dtype, tuple(sorted(self.fields.items())),
                           tuple(sorted(self.bucket.items()))))

    def get(self, name: str, default: Any = None) -> Any:
        """The value of a field; ``device_type`` and ``dtype`` are fields too (the bucket is not)."""
        if name == "device_type":
            return self.device_type
        if name == "dtype":
            return self.dtype
        return self.fields.get(name, default)

    def without_bucket(self) -> Problem:
        """The same problem with no size bucket (what a capability and a closure see)."""
        return self if not self.bucket else Problem(self.op, self.device_type, self.dtype, self.fields)

    def as_dict(self) -> dict[str, Any]:
        """``op``, ``device_type``, ``dtype`` and the fields; ``bucket`` (a dict) too when there is one."""
        out = {"op": self.op, "device_type": self.device_type, "dtype": self.dtype, **self.fields}
        if self.bucket:
            out["bucket"] = dict(self.bucket)
        return out

    def describe_bucket(self) -> str:
        """The size bucket as text (``m<=1, n<=4096, k<=1024``); empty when there is none."""
        return ", ".join(f"{k}<={v}" for k, v in self.bucket.items())

    def describe(self) -> str:
        parts = [f"device_type={self.device_type}", f"dtype={self.dtype}"]
        parts += [f"{k}={v}" for k, v in self.fields.items()]
        bucket = self.describe_bucket()
        return "(" + ", ".join(parts) + (f"; size bucket {bucket}" if bucket else "") + ")"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Problem) and self.as_dict() == other.as_dict()

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Problem({self.op}, {self.describe()[1:-1]})"
