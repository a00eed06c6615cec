"""Values that every layer of one forward shares (`PerForward`), derived once per forward, not once per layer."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Final, TypeVar

import torch

__all__ = ["PerForward", "forget"]

T = TypeVar("T")

_ALL: Final[list[PerForward]] = []


class PerForward:
    """One held value and the key it was made for. The key's tensors are compared by identity (the layers of a
    forward hand on the same objects), the rest by equality. `forget` empties every `PerForward` before each
    forward, so that a tensor rewritten in place between forwards (a static buffer) is read again. While
    tracing (``torch.compile``) nothing is held: the graph computes the value, and the compiler merges the
    layers' identical computations."""

    __slots__ = ("_key", "_value")

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._value: Any = None
        _ALL.append(self)

    def get(self, key: tuple[Hashable | torch.Tensor, ...], make: Callable[[], T]) -> T:
        """The value for `key`, made by `make` unless the held one was made for the same key."""
        if torch.compiler.is_compiling():
            return make()
        held = self._key
        if held is not None and len(held) == len(key):
            for a, b in zip(held, key, strict=True):  # a loop, not all(...) over a generator: this runs per layer
                if a is not b and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or a != b):
                    break
            else:
                return self._value  # type: ignore[no-any-return]
        self._value = make()
        self._key = key
        return self._value  # type: ignore[no-any-return]

    def clear(self) -> None:
        self._key = self._value = None


def forget(*_: Any) -> None:
    """Start a new forward: drop every value held (also a forward pre-hook of a kernelized model)."""
    for memo in _ALL:
        memo.clear()
