"""Recording the implementation calls that code makes: what the tuner times, at the exact sizes the code ran.

Inside `recording()`, every call of a public operator still runs as usual (the dispatcher the runtime installed
serves it); the first call of each dispatch key is also kept as a `CapturedCall`: the operator's spec, the key
(device, dtype, fields, bucket classes) and the arguments in the implementation calling convention, so that
each accepting implementation can be timed on exactly those arguments afterwards. The dispatcher is swapped
for the whole process while the block runs: record from one thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from infiniops_py.problem import OpSpec, Problem, install_dispatcher, installed_dispatcher

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
    """Record the first call of each dispatch key made inside the block into the list it yields.

    Raises:
        RuntimeError: the runtime has installed no dispatcher (``infiniops_py`` was not imported).
    """
    previous = installed_dispatcher()
    if previous is None:
        raise RuntimeError("infiniops_py did not install its dispatcher: import infiniops_py first")
    calls: list[CapturedCall] = []
    seen: set[tuple[str, tuple[Any, ...]]] = set()

    def dispatch(spec: OpSpec, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if (spec.name, key) not in seen:
            seen.add((spec.name, key))
            calls.append(CapturedCall(spec, key, args, dict(kwargs)))
        return previous(spec, key, args, kwargs)

    install_dispatcher(dispatch)
    try:
        yield calls
    finally:
        install_dispatcher(previous)
