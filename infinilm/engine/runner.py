"""The model runners: turn a scheduled batch into tensors, run the model, return the last-token logits.

`Runner` is the data path both kinds share: a decode-only step replays a captured CUDA graph
(`infinilm.engine.graphs.decode`) when one serves its batch size, which removes the per-operator Python cost
from the decode loop; any other step is prepared, run eagerly, and the rows of each sequence's last token
go through the LM head. Token layout of a step: the decode tokens (one per decode sequence) first, then
every prefill sequence's tokens, packed. Metadata is built with plain Python lists and moved to the device
in one copy per tensor. The two kinds:

- `AttentionRunner`: a paged KV cache (`infinilm.engine.kv_cache`); the context is an `AttnContext`.
- `RecurrentRunner`: a state pool (`infinilm.engine.state_pool`), one row per request; the context is an
  `SsmContext`; a step that is one lone prompt also replays a prefill graph when one serves its length
  (`infinilm.engine.graphs.prefill`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from infinilm.config import ConfigError
from infinilm.engine.graphs.decode import DecodeGraphs
from infinilm.engine.graphs.prefill import PrefillGraphs
from infinilm.engine.kv_cache import KVCache, slots_for
from infinilm.engine.scheduler import Batch
from infinilm.engine.sequence import Sequence
from infinilm.engine.state_pool import StatePool
from infinilm.layers.attention import AttnContext
from infinilm.layers.ssm import SsmContext, prefill_starts
from infiniops_py import Implementation

__all__ = ["AttentionRunner", "RecurrentRunner", "Runner"]


class Runner(abc.ABC):
    """Runs `model` over `cache` on `device`; a subclass prepares its kind's inputs and decode-graph step.

    Attributes:
        graphs: the captured decode graphs, or None (eager decode).
        padding / table_width: the `infinilm.engine.graphs.decode.DecodeStep` of this kind.
    """

    padding: ClassVar[tuple[int, ...]]
    table_width: int = 0

    def __init__(self, model: Any, cache: KVCache | StatePool, device: torch.device) -> None:
        self.model, self.cache, self.device = model, cache, device
        self.graphs: DecodeGraphs | None = None

    def _tensor(self, values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    @abc.abstractmethod
    def prepare(self, batch: Batch) -> tuple[tuple[Any, ...], list[int]]:
        """The model's forward arguments for `batch`, and the index of each sequence's last token."""

    @abc.abstractmethod
    def decode_rows(self, seqs: list[Sequence]) -> tuple[list[list[int]], list[list[int]] | None]:
        """The decode graph's per-sequence value rows and block tables (None: none) of decode sequences `seqs`."""

    @abc.abstractmethod
    def graph_step(self, rows: torch.Tensor, tables: torch.Tensor | None) -> torch.Tensor:
        """Logits of a decode step over the decode graph's static buffers (see `DecodeGraphs`)."""

    def _replay(self, batch: Batch) -> torch.Tensor | None:
        """The logits of `batch` from a captured graph, or None when no graph serves it."""
        if not batch.prefills and self.graphs is not None and self.graphs.serves(len(batch.decodes)):
            return self.graphs.replay(*self.decode_rows(batch.decodes))
        return None

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits ``[len(batch.seqs), V]`` at each sequence's last token."""
        logits = self._replay(batch)
        if logits is not None:
            return logits
        inputs, last = self.prepare(batch)
        hidden = self.model.forward(*inputs)
        if len(last) != hidden.shape[0]:
            hidden = hidden[self._tensor(last, torch.int64)]
        return self.model.logits(hidden)

    @torch.inference_mode()
    def prefill_logits(self, batch: Batch) -> torch.Tensor:
        """Logits ``[T, V]`` at every token of a prefill-only batch (for checking against a reference)."""
        inputs, _ = self.prepare(batch)
        return self.model.logits(self.model.forward(*inputs))

    def capture_graphs(self, max_batch: int, implementations: Iterable[Implementation] = ()) -> str:
        """Capture decode CUDA graphs for batch sizes up to `max_batch`, at most the cache's blocks (rows: each
        running sequence holds one at least); returns a one-line status.

        `implementations` (the gate plan's choices) name the one that synchronizes, when one does."""
        graphs = DecodeGraphs(self, self.device, implementations)
        status = graphs.capture(min(max_batch, self.cache.allocator.num_blocks))
        self.graphs = graphs if graphs.sizes else None
        return status

    def capture_prefill_graphs(self, lengths: Iterable[int], implementations: Iterable[Implementation] = ()) -> str:
        """Capture single-prompt prefill CUDA graphs at bucket `lengths`; only a recurrent runner has them.

        Raises:
            ConfigError: this runner keeps a KV cache (`EngineOptions.prefill_graph_lengths` is refused
                earlier, by the engine's option checks).
        """
        raise ConfigError(f"prefill_graph_lengths={tuple(lengths)}: prefill graphs serve recurrent models only")


class AttentionRunner(Runner):
    """Runs an attention model over the paged KV cache `cache`."""

    padding = (0, 0, -1, 0)  # token 0 at position 0, slot -1, context 0 (cache_seqlens -1): nothing written or read

    def __init__(self, model: Any, cache: KVCache, device: torch.device, max_blocks_per_seq: int) -> None:
        super().__init__(model, cache, device)
        self.block_size = cache.allocator.block_size
        self.max_blocks = self.table_width = max_blocks_per_seq

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

    def prepare(self, batch: Batch) -> tuple[tuple[Any, ...], list[int]]:
        """``(input_ids, positions, AttnContext, cache)`` and the index of each sequence's last token."""
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
            ctx.cache_seqlens = self._tensor([n - 1 for n in lens], i32)
            ctx.block_tables = self._tensor(tables, i32) if tables else None
        if batch.prefills:
            ctx.cu_seqlens = self._tensor(cu, i32)
            ctx.max_seqlen = max(len(s) for s in batch.prefills)
        return (self._tensor(ids, i64), self._tensor(positions, i64), ctx, self.cache), last

    def decode_rows(self, seqs: list[Sequence]) -> tuple[list[list[int]], list[list[int]] | None]:
        """Rows token, position, slot, context length; block tables padded to the longest a sequence has."""
        ids, positions, slots, lens, tables = self.decode_inputs(seqs, self.max_blocks)
        return [ids, positions, slots, lens], tables

    def graph_step(self, rows: torch.Tensor, tables: torch.Tensor | None) -> torch.Tensor:
        """Logits of a decode step whose rows are token, position, slot and context length."""
        ids, positions, slots, lens = rows
        ctx = AttnContext(slot_mapping=slots, num_decode=rows.shape[1], cache_seqlens=(lens - 1).to(torch.int32),
                          block_tables=tables)
        return self.model.logits(self.model.forward(ids, positions, ctx, self.cache))


class RecurrentRunner(Runner):
    """Runs a recurrent model over the state pool `pool` (one row per request).

    Attributes:
        prefill_graphs: the captured single-prompt prefill graphs, or None.
    """

    padding = (0, -1)  # token 0, row -1 (no state read or written)

    def __init__(self, model: Any, pool: StatePool, device: torch.device) -> None:
        super().__init__(model, pool, device)
        self.pool = pool
        self.prefill_graphs: PrefillGraphs | None = None

    def prepare(self, batch: Batch) -> tuple[tuple[Any, ...], list[int]]:
        """``(input_ids, SsmContext, pool)`` and the index of each sequence's last token."""
        i64 = torch.int64
        ids = [s.tokens[-1] for s in batch.decodes]
        ctx = SsmContext(num_decode=len(ids))
        if batch.decodes:
            ctx.decode_rows = self._tensor([self.pool.row(s) for s in batch.decodes], i64)
        last = list(range(len(ids)))
        if batch.prefills:
            for s in batch.prefills:
                ids += s.tokens
                last.append(len(ids) - 1)
            ctx.prefill_rows = self._tensor([self.pool.row(s) for s in batch.prefills], i64)
            if len(batch.prefills) > 1:  # one packed row: the packed conv and scan
                ctx.cu_seqlens = self._tensor(prefill_starts([len(s) for s in batch.prefills]), torch.int32)
        return (self._tensor(ids, i64), ctx, self.pool), last

    def decode_rows(self, seqs: list[Sequence]) -> tuple[list[list[int]], list[list[int]] | None]:
        """Rows token and state row; no block tables."""
        return [[s.tokens[-1] for s in seqs], [self.pool.row(s) for s in seqs]], None

    def graph_step(self, rows: torch.Tensor, tables: torch.Tensor | None) -> torch.Tensor:
        """Logits of a decode step whose rows are token and state row."""
        ctx = SsmContext(num_decode=rows.shape[1], decode_rows=rows[1])
        return self.model.logits(self.model.forward(rows[0], ctx, self.pool))

    def prefill_step(self, ids: torch.Tensor, seq_idx: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        """The last token's logits ``[1, V]`` of one prompt `ids` (left-padded where `seq_idx` is -1), whose
        final states go to pool `row`: the step a prefill graph captures."""
        ctx = SsmContext(num_decode=0, prefill_rows=row, seq_idx=seq_idx)
        return self.model.logits(self.model.forward(ids, ctx, self.pool)[-1:])

    def _replay(self, batch: Batch) -> torch.Tensor | None:
        logits = super()._replay(batch)
        if (logits is None and not batch.decodes and len(batch.prefills) == 1 and self.prefill_graphs is not None
                and self.prefill_graphs.serves(len(batch.prefills[0]))):
            seq = batch.prefills[0]
            logits = self.prefill_graphs.replay(seq.tokens, self.pool.row(seq))
        return logits

    def capture_prefill_graphs(self, lengths: Iterable[int], implementations: Iterable[Implementation] = ()) -> str:
        """Capture single-prompt prefill CUDA graphs at bucket `lengths` (`infinilm.engine.graphs.prefill`); call
        it before any request runs (capture writes pool row 0). Returns a one-line status."""
        graphs = PrefillGraphs(self.prefill_step, self.device, implementations)
        status = graphs.capture(lengths)
        self.prefill_graphs = graphs if graphs.lengths else None
        return status
