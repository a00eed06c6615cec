"""Recording the implementation calls that code makes: what the tuner times, at the exact sizes the code ran.

Inside `recording()`, every call of a public operator still runs as usual (the resolver's implementation serves
it); the first call of each dispatch key is also kept as a `CapturedCall`: the operator's spec, the key (device,
dtype, fields, bucket classes) and the arguments in the implementation calling convention, so that each
accepting implementation can be timed on exactly those arguments afterwards. The block observes the calls of
its own context (`infiniops_py.dispatch.observing`): this thread's, not another thread's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from infiniops_py.dispatch import Dispatched, observing
from infiniops_py.problem import OpSpec, Problem

__all__ = ["CapturedCall", "recording"]


@dataclass(frozen=True)
class CapturedCall:
    """One implementation call: ``impl.fn(*args, **kwargs)`` for the problem behind `key`.

    Attributes:
        spec: the operator. key: its dispatch key. args, kwargs: the implementation's arguments (tensors of the
            call itself, kept alive while this object lives).
        sizes: the sizes the bucket classes came from, when known (synthetic inputs); else empty.
    """

    spec: OpSpec
    key: tuple[Any, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    sizes: dict[str, int] | None = None

    @property
    def problem(self) -> Problem:
        """The problem behind `key`, with its size bucket."""
        return self.spec.problem_from_key(self.key)


@contextlib.contextmanager
def recording() -> Iterator[list[CapturedCall]]:
    """Record the first call of each dispatch key made inside the block, in this context, into the list it yields
    (each call once its implementation has returned)."""
    calls: list[CapturedCall] = []
    seen: set[tuple[str, tuple[Any, ...]]] = set()

    def record(call: Dispatched) -> None:
        if (call.spec.name, call.key) not in seen:
            seen.add((call.spec.name, call.key))
            calls.append(CapturedCall(call.spec, call.key, call.args, dict(call.kwargs)))

    with observing(record):
        yield calls
