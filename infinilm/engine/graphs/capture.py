"""`CapturedSteps`: one forward step captured as a CUDA graph per static size, shared by every graph set.

Decode graphs (per padded batch size) and Mamba-2 prefill graphs (per bucket length) capture the same way:
largest size first, so the smaller graphs reuse its memory pool; each size warmed up once eagerly (which
resolves every operator, compiles and tunes kernels and settles allocations), then captured over static
buffers that the subclass owns. The warm-up and the capture run on one side stream of the set's own (as
PyTorch's CUDA-graph notes ask): libraries such as cuBLAS set up per-stream state (a workspace) on their first
call on a stream, which must not happen inside a capture. A capture that fails (an implementation that
synchronizes with the host, or allocates or launches in a way graphs forbid) clears every graph and returns a
status naming the synchronizing implementation when there is one (`infinilm.engine.graphs.host_sync`).
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
        self._stream: torch.cuda.Stream | None = None

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
                self._warm_up(size)
                graph, out = self._capture_one(size, pool)
                pool = graph.pool()
                self.graphs[size] = (graph, out)
        except Exception as exc:  # an implementation that cannot be captured: stay eager, say why
            self.graphs.clear()
            return capture_failed_status(exc, partial(self._forward, size), self.device, self.implementations)
        self.sizes = sizes
        return None

    def _side_stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return self._stream

    def _warm_up(self, size: int) -> None:
        """One eager step: resolves every operator, compiles and tunes kernels, settles allocations; on CUDA on
        the capture's side stream, so that libraries set up their state for that stream before the capture."""
        if self.device.type != "cuda":
            self._forward(size)
            return
        side, current = self._side_stream(), torch.cuda.current_stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            self._forward(size)
        current.wait_stream(side)

    def _capture_one(self, size: int, pool: object) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        # the outer stream scope restores the current stream even when capture_end raises (torch.cuda.graph
        # leaves its side stream current then), so that a failed capture leaves eager steps where they were
        with torch.cuda.stream(torch.cuda.current_stream(self.device)), \
                torch.cuda.graph(graph, pool=pool, stream=self._side_stream()):
            out = self._forward(size)
        torch.cuda.synchronize(self.device)
        return graph, out
