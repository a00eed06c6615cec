"""CUDA graphs for decode steps: one captured forward + LM head per padded batch size, for either runner kind.

Decode steps have static shapes once the batch is padded, so each size in `capture_sizes` is captured once
over static input buffers and replayed with the step's values copied in, device to device, from the
runner's persistent rows (`infinilm.engine.input_batch`). The buffers are the `DecodeStep`'s:
a few int64 values per sequence (the paged runner: token, position, cache slot, context length; the recurrent
runner: token, state row), plus int32 block tables when the step has them. A padding row holds the step's
`DecodeStep.padding` values, which write and read nothing (slot -1 and cache length -1, row -1): index values
out of range, which the operators take for padding with their index checks off, as they are during capture;
its logits are dropped. Index checks of the operator contracts are off during capture by design (they
would synchronize), so the inputs are built only by the runner from the allocator's own block tables and
rows. A capture that fails (an implementation that synchronizes with the host, or allocates or launches in
a way graphs forbid) leaves the engine eager, with a status that names the synchronizing implementation when
there is one (`infinilm.engine.graphs.host_sync`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch

from infinilm.engine.graphs.capture import CapturedSteps
from infiniops_py import Implementation, unchecked_indices

__all__ = ["DecodeGraphs", "DecodeStep", "capture_sizes"]


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, up to and including `max_batch`."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_batch] + list(range(16, max_batch, 16))
    return [*sizes, max_batch]


class DecodeStep(Protocol):
    """A runner's decode step over static buffers, as `DecodeGraphs` captures it."""

    padding: tuple[int, ...]  # the int64 values of a padding row, one per value row
    table_width: int  # columns of the int32 block tables (0: the step has none)

    def graph_step(self, rows: torch.Tensor, tables: torch.Tensor | None) -> torch.Tensor:
        """Logits ``[bs, V]`` of a decode step: `rows` int64 ``[len(padding), bs]``, `tables` int32
        ``[bs, table_width]`` or None."""
        ...


class DecodeGraphs(CapturedSteps):
    """Captured decode graphs of `step` keyed by padded batch size, over shared static buffers.

    Attributes:
        rows: int64 ``[len(step.padding), max_batch]``, the per-sequence values.
        tables: int32 ``[max_batch, step.table_width]`` block tables, or None.
    """

    def __init__(self, step: DecodeStep, device: torch.device, implementations: Iterable[Implementation] = ()) -> None:
        """`implementations` (the gate plan's choices) name the culprit when a step synchronizes with the host."""
        super().__init__(device, implementations)
        self.step = step
        self.rows = torch.empty(0)
        self.tables: torch.Tensor | None = None
        self._padding = torch.empty(0)
        # per batch size n: the captured size that serves it, its graph, and the views a replay of n copies into
        # and returns (made once per n: slicing costs host time on every step)
        self._replays: dict[int, tuple[int, torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None,
                                       torch.Tensor]] = {}

    def serves(self, n: int) -> bool:
        """Whether a decode step of `n` sequences fits a captured size."""
        return bool(self.sizes) and n <= self.sizes[-1]

    def _pad(self, start: int, stop: int) -> None:
        self.rows[:, start:stop] = self._padding
        if self.tables is not None:
            self.tables[start:stop] = 0

    def _prepare(self, bs: int) -> None:
        self._pad(0, bs)  # padding rows: the warm-up and capture write nothing

    def _forward(self, bs: int) -> torch.Tensor:
        with unchecked_indices():  # as during capture on CUDA: padding rows hold out-of-range values on purpose
            return self.step.graph_step(self.rows[:, :bs], None if self.tables is None else self.tables[:bs])

    @torch.inference_mode()
    def capture(self, max_batch: int) -> str:
        """Capture every size up to `max_batch`; returns a one-line status for the CLI and benchmarks."""
        sizes = capture_sizes(max_batch)
        self.rows = torch.zeros(len(self.step.padding), max_batch, dtype=torch.int64, device=self.device)
        self._padding = torch.tensor(self.step.padding, dtype=torch.int64, device=self.device)[:, None]
        width = self.step.table_width
        self.tables = torch.zeros(max_batch, width, dtype=torch.int32, device=self.device) if width else None
        self._replays.clear()
        failed = self._capture_all(sizes)
        if failed is not None:
            return failed
        return f"cuda graphs: on (decode batch sizes {sizes[0]}..{sizes[-1]}, {len(sizes)} graphs)"

    def replay(self, rows: torch.Tensor, tables: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[n, V]`` of a decode step of n sequences: `rows` int64 ``[len(padding), n]`` and `tables` int32
        ``[n, width]`` (width <= ``table_width``; any strides) on the device, copied into the static buffers by
        the device (the columns past `width` keep older entries, which the step's context lengths never reach).
        """
        n = rows.shape[1]
        bs, graph, static_rows, static_tables, out = self._replays.get(n) or self._replay_of(n)
        if bs > n:
            self._pad(n, bs)
        static_rows.copy_(rows)
        if static_tables is not None and tables is not None:
            static_tables[:, :tables.shape[1]].copy_(tables)
        graph.replay()
        return out

    def _replay_of(self, n: int) -> tuple[int, torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """What a replay of `n` sequences uses: the captured size serving it, its graph, the static rows' and
        tables' first `n` entries, and its output's first `n` rows (kept for the next replay of `n`)."""
        bs = next(s for s in self.sizes if s >= n)
        graph, out = self.graphs[bs]
        entry = self._replays[n] = (bs, graph, self.rows[:, :n], None if self.tables is None else self.tables[:n],
                                    out[:n])
        return entry
