"""CUDA graphs for decode steps: one captured forward + LM head per padded batch size.

Decode steps have static shapes once the batch is padded, so each size in `capture_sizes` is captured
once over static input buffers and replayed with the step's values copied in. Padding rows write nothing
(slot -1) and attend over one key of block 0; their logits are dropped. Index checks of the operator
contracts are off during capture by design (they would synchronize), so the inputs are built only by the
runner from the allocator's own block tables. A capture that fails (an implementation that synchronizes
with the host, or allocates or launches in a way graphs forbid) leaves the engine in eager mode, with a
status that names the synchronizing implementation when there is one (`infinilm.engine.graphs.host_sync`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from infinilm.engine.graphs.capture import CapturedSteps
from infinilm.engine.kv_cache import KVCache
from infinilm.layers.attention import AttnContext
from infinilm.models.llama import LlamaModel
from infiniops_py import Implementation

__all__ = ["DecodeGraphs", "capture_sizes"]


def capture_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 16, up to and including `max_batch`."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_batch] + list(range(16, max_batch, 16))
    return [*sizes, max_batch]


class DecodeGraphs(CapturedSteps):
    """Captured decode graphs keyed by padded batch size, over shared static buffers.

    `implementations` (the gate plan's choices) name the culprit when a step synchronizes with the host.
    """

    def __init__(self, model: LlamaModel, cache: KVCache, device: torch.device, max_blocks: int,
                 implementations: Iterable[Implementation] = ()) -> None:
        super().__init__(device, implementations)
        self.model, self.cache, self.max_blocks = model, cache, max_blocks
        self.rows = torch.empty(0)
        self.tables = torch.empty(0)

    def serves(self, n: int) -> bool:
        return bool(self.sizes) and n <= self.sizes[-1]

    def _prepare(self, bs: int) -> None:
        """Padding rows: slot -1 (nothing written), one key of block 0."""
        self.rows[:, :bs] = torch.tensor([0, 0, -1, 1], device=self.device)[:, None]
        self.tables[:bs] = 0

    def _forward(self, bs: int) -> torch.Tensor:
        ids, positions, slots, lens = self.rows[0, :bs], self.rows[1, :bs], self.rows[2, :bs], self.rows[3, :bs]
        ctx = AttnContext(slot_mapping=slots, num_decode=bs, context_lens=self.lens32[:bs],
                          block_tables=self.tables[:bs])
        self.lens32[:bs].copy_(lens)
        return self.model.logits(self.model.forward(ids, positions, ctx, self.cache))

    @torch.inference_mode()
    def capture(self, max_batch: int) -> str:
        """Capture every size up to `max_batch`; returns a one-line status for the CLI and benchmarks."""
        sizes = capture_sizes(max_batch)
        self.rows = torch.zeros(4, max_batch, dtype=torch.int64, device=self.device)
        self.lens32 = torch.ones(max_batch, dtype=torch.int32, device=self.device)
        self.tables = torch.zeros(max_batch, self.max_blocks, dtype=torch.int32, device=self.device)
        failed = self._capture_all(sizes)
        if failed is not None:
            return failed
        return f"cuda graphs: on (decode batch sizes {sizes[0]}..{sizes[-1]}, {len(sizes)} graphs)"

    def replay(self, inputs: tuple[list[int], list[int], list[int], list[int], list[list[int]]]) -> torch.Tensor:
        """Logits ``[n, V]`` of a decode step of n sequences (see `ModelRunner.decode_inputs`)."""
        ids, positions, slots, lens, tables = inputs
        n = len(ids)
        bs = next(s for s in self.sizes if s >= n)
        if bs > n:
            self._prepare(bs)
        self.rows[:, :n].copy_(torch.tensor([ids, positions, slots, lens], dtype=torch.int64), non_blocking=True)
        self.tables[:n].copy_(torch.tensor(tables, dtype=torch.int32), non_blocking=True)
        graph, out = self.graphs[bs]
        graph.replay()
        return out[:n]
