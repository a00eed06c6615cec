"""The model runner: turns a scheduled batch into tensors, runs the model, returns the last-token logits.

Token layout of a step: the decode tokens (one per decode sequence) first, then every prefill sequence's
tokens, packed. Metadata is built with plain Python lists and moved to the device in one copy per tensor.
Decode-only steps on CUDA replay a captured CUDA graph (`infinilm.engine.graphs.decode`) when one is available for the
batch size, which removes the per-operator Python cost from the decode loop.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from infinilm.engine.graphs.decode import DecodeGraphs
from infinilm.engine.kv_cache import KVCache, slots_for
from infinilm.engine.scheduler import Batch
from infinilm.engine.sequence import Sequence
from infinilm.layers.attention import AttnContext
from infinilm.models.llama import LlamaModel
from infiniops_py import Implementation

__all__ = ["ModelRunner"]


class ModelRunner:
    """Runs `model` over paged `cache` on `device`."""

    def __init__(self, model: LlamaModel, cache: KVCache, device: torch.device, max_blocks_per_seq: int) -> None:
        self.model = model
        self.cache = cache
        self.device = device
        self.block_size = cache.allocator.block_size
        self.max_blocks = max_blocks_per_seq
        self.graphs: DecodeGraphs | None = None

    def _tensor(self, values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def decode_inputs(
        self, seqs: list[Sequence], width: int | None = None
    ) -> tuple[list[int], list[int], list[int], list[int], list[list[int]]]:
        """Per decode sequence: its last token, position, slot, context length and block table padded with
        block 0 to `width` entries (default: the longest table of the batch)."""
        bs = self.block_size
        width = width or max((len(s.block_table) for s in seqs), default=0)
        ids = [s.tokens[-1] for s in seqs]
        positions = [len(s) - 1 for s in seqs]
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions)]
        lens = [len(s) for s in seqs]
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        return ids, positions, slots, lens, tables

    def prepare(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, AttnContext, list[int]]:
        """input_ids, positions, the attention context and the index of each sequence's last token."""
        ids, positions, slots, lens, tables = self.decode_inputs(batch.decodes)
        last = list(range(len(ids)))
        cu = [0]
        for s in batch.prefills:
            n = len(s)
            ids += s.tokens
            positions += range(n)
            slots += slots_for(s.block_table, 0, n, self.block_size)
            cu.append(cu[-1] + n)
            last.append(len(ids) - 1)
        i64, i32 = torch.int64, torch.int32
        ctx = AttnContext(slot_mapping=self._tensor(slots, i64), num_decode=len(batch.decodes))
        if batch.decodes:
            ctx.context_lens = self._tensor(lens, i32)
            ctx.block_tables = self._tensor(tables, i32) if tables else None
        if batch.prefills:
            ctx.cu_seqlens = self._tensor(cu, i32)
            ctx.max_seqlen = max(len(s) for s in batch.prefills)
        return self._tensor(ids, i64), self._tensor(positions, i64), ctx, last

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits ``[len(batch.seqs), V]`` at each sequence's last token."""
        if not batch.prefills and self.graphs is not None and self.graphs.serves(len(batch.decodes)):
            return self.graphs.replay(self.decode_inputs(batch.decodes, self.max_blocks))
        ids, positions, ctx, last = self.prepare(batch)
        hidden = self.model.forward(ids, positions, ctx, self.cache)
        if len(last) != hidden.shape[0]:
            hidden = hidden[self._tensor(last, torch.int64)]
        return self.model.logits(hidden)

    @torch.inference_mode()
    def prefill_logits(self, batch: Batch) -> torch.Tensor:
        """Logits ``[T, V]`` at every token of a prefill-only batch (for checking against a reference)."""
        ids, positions, ctx, _ = self.prepare(batch)
        return self.model.logits(self.model.forward(ids, positions, ctx, self.cache))

    def capture_graphs(self, max_batch: int, implementations: Iterable[Implementation] = ()) -> str:
        """Capture decode CUDA graphs for batch sizes up to `max_batch`, at most the cache's blocks (each running
        sequence holds one at least); returns a one-line status.

        `implementations` (the gate plan's choices) name the one that synchronizes, when one does."""
        graphs = DecodeGraphs(self.model, self.cache, self.device, self.max_blocks, implementations)
        status = graphs.capture(min(max_batch, self.cache.allocator.num_blocks))
        self.graphs = graphs if graphs.sizes else None
        return status
