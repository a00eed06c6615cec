"""`Derived`: a tensor computed from a loaded weight (``-exp(A_log)``, ``1 + weight``, a dtype cast).

The loader fills a model's weights after the model is built, and a reload may change them in place; a value
computed once at build time would keep the empty weight's. `Derived.get` recomputes the value when its
source's in-place version counter has moved, so a hot call costs one integer comparison.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["Derived"]


class Derived:
    """``fn(source)``, recomputed only when `source` has changed in place since the last `get`."""

    __slots__ = ("fn", "source", "value", "version")

    def __init__(self, source: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.source, self.fn, self.value, self.version = source, fn, source, -1

    def get(self) -> torch.Tensor:
        """The value for the source as it is now."""
        if self.source._version != self.version:
            self.value, self.version = self.fn(self.source), self.source._version
        return self.value
