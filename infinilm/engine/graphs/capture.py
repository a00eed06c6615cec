"""`CapturedSteps`: one forward step captured as a CUDA graph per static size, shared by every graph set.

Decode graphs (per padded batch size) and Mamba-2 prefill graphs (per bucket length) capture the same way:
largest size first, so the smaller graphs reuse its memory pool; each size warmed up once eagerly (which
resolves every operator, compiles and tunes kernels and settles allocations), then captured over static
buffers that the subclass owns. A capture that fails (an implementation that synchronizes with the host,
or allocates or launches in a way graphs forbid) clears every graph and returns a status naming the
synchronizing implementation when there is one (`infinilm.engine.graphs.host_sync`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from functools import partial

import torch

from infinilm.engine.graphs.host_sync import capture_failed_status
from infiniops_py import Implementation

__all__ = ["CapturedSteps"]


class CapturedSteps(abc.ABC):
    """Graphs keyed by static size; subclasses define `_prepare` (fill the static buffers) and `_forward`."""

    def __init__(self, device: torch.device, implementations: Iterable[Implementation] = ()) -> None:
        self.device = device
        self.implementations = list(implementations)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.sizes: list[int] = []

    @abc.abstractmethod
    def _prepare(self, size: int) -> None:
        """Put harmless inputs of this size into the static buffers (allocating them if needed)."""

    @abc.abstractmethod
    def _forward(self, size: int) -> torch.Tensor:
        """The step over the static buffers; its output tensor is what a replay returns."""

    def _capture_all(self, sizes: list[int]) -> str | None:
        """Capture every size (ascending list); None on success, else the failure status (graphs cleared)."""
        pool = None
        size = sizes[-1]
        try:
            for size in reversed(sizes):  # largest first, so the smaller graphs reuse its memory pool
                self._prepare(size)
                self._forward(size)  # warm-up: resolves every operator, compiles and tunes, settles allocations
                graph, out = self._capture_one(size, pool)
                pool = graph.pool()
                self.graphs[size] = (graph, out)
        except Exception as exc:  # an implementation that cannot be captured: stay eager, say why
            self.graphs.clear()
            return capture_failed_status(exc, partial(self._forward, size), self.device, self.implementations)
        self.sizes = sizes
        return None

    def _capture_one(self, size: int, pool: object) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        # the outer stream scope restores the current stream even when capture_end raises (torch.cuda.graph
        # leaves its side stream current then), so that a failed capture leaves eager steps where they were
        with torch.cuda.stream(torch.cuda.current_stream(self.device)), torch.cuda.graph(graph, pool=pool):
            out = self._forward(size)
        torch.cuda.synchronize(self.device)
        return graph, out
