"""The model runners: turn a scheduled batch into tensors, run the model, return the last-token logits.

`Runner` is the data path both kinds share: a decode-only step replays a captured CUDA graph
(`infinilm.engine.graphs.decode`) when one serves its batch size, which removes the per-operator Python cost
from the decode loop; any other step is prepared, run eagerly, and the rows of each sequence's last token
go through the LM head. Token layout of a step: the decode tokens (one per decode sequence) first, then
every prefill sequence's tokens, packed. A decode sequence's inputs come from its persistent row
(`infinilm.engine.input_batch.SeqRows`: array gathers, two copies to the device, nothing that grows with
max_model_len or the context); a prefill's are built from its tokens and blocks (work in its length) and moved
to the device in one copy per tensor. The two kinds:

- `AttentionRunner`: a paged KV cache (`infinilm.engine.kv_cache`); the context is an `AttnContext`.
- `RecurrentRunner`: a state pool (`infinilm.engine.state_pool`), one row per request; the context is an
  `SsmContext`; a step that is one lone prompt also replays a prefill graph when one serves its length
  (`infinilm.engine.graphs.prefill`).
"""

from __future__ import annotations

import abc
import itertools
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np
import torch

from infinilm.batch import Batch
from infinilm.config import ConfigError
from infinilm.engine.graphs.decode import DecodeGraphs
from infinilm.engine.graphs.prefill import PrefillGraphs
from infinilm.engine.input_batch import SeqRows
from infinilm.engine.kv_cache import KVCache, slots_for
from infinilm.engine.state_pool import StatePool
from infinilm.layers.attention import AttnContext
from infinilm.layers.ssm import SsmContext, prefill_starts
from infiniops_py import Implementation

__all__ = ["AttentionRunner", "RecurrentRunner", "Runner"]


class Runner(abc.ABC):
    """Runs `model` over `cache` on `device`; a subclass prepares its kind's inputs and decode-graph step.

    Attributes:
        rows: the running sequences' persistent rows (`SeqRows`), which decode steps read.
        graphs: the captured decode graphs, or None (eager decode).
        padding / table_width: the `infinilm.engine.graphs.decode.DecodeStep` of this kind.
    """

    padding: ClassVar[tuple[int, ...]]
    table_width: int = 0

    def __init__(self, model: Any, cache: KVCache | StatePool, device: torch.device, rows: SeqRows) -> None:
        self.model, self.cache, self.device, self.rows = model, cache, device, rows
        self.graphs: DecodeGraphs | None = None
        self._static_tables: np.ndarray[Any, Any] | None = None  # NumPy's view of the CPU graphs' static tables

    def _tensor(self, values: Any, dtype: torch.dtype) -> torch.Tensor:
        """`values` (a list or an array) on the device: through pinned memory on CUDA, so the copy is
        asynchronous (torch's caching host allocator reuses the buffer only once the copy is done)."""
        host = torch.as_tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    @staticmethod
    def decode_rows_of(batch: Batch) -> np.ndarray[Any, Any]:
        """The rows of `batch`'s decode sequences (`Batch.rows` when the engine filled it)."""
        if batch.rows is not None:
            return batch.rows[:len(batch.decodes)]
        return SeqRows.rows_of(batch.decodes)

    @abc.abstractmethod
    def prepare(self, batch: Batch) -> tuple[tuple[Any, ...], np.ndarray[Any, Any] | None]:
        """The model's forward arguments for `batch`, and the index of each sequence's last token (None: every
        token is one, a decode-only step)."""

    @abc.abstractmethod
    def graph_inputs(self, rows: np.ndarray[Any, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The decode graph's value rows ``[len(padding), n]`` and block tables ``[n, width]`` (None: none) of a
        decode step over `rows`, on the device (see `DecodeGraphs.replay`)."""

    @abc.abstractmethod
    def graph_step(self, rows: torch.Tensor, tables: torch.Tensor | None) -> torch.Tensor:
        """Logits of a decode step over the decode graph's static buffers (see `DecodeGraphs`)."""

    def _replay(self, batch: Batch) -> torch.Tensor | None:
        """The logits of `batch` from a captured graph, or None when no graph serves it."""
        if not batch.prefills and self.graphs is not None and self.graphs.serves(len(batch.decodes)):
            return self.graphs.replay(*self.graph_inputs(self.decode_rows_of(batch)))
        return None

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits ``[len(batch.seqs), V]`` at each sequence's last token."""
        logits = self._replay(batch)
        if logits is not None:
            return logits
        inputs, last = self.prepare(batch)
        hidden = self.model.forward(*inputs)
        if last is not None and len(last) != hidden.shape[0]:
            hidden = hidden[self._tensor(last, torch.int64)]
        return self.model.logits(hidden)

    @torch.inference_mode()
    def prefill_logits(self, batch: Batch) -> torch.Tensor:
        """Logits ``[T, V]`` at every token of a prefill-only batch (for checking against a reference)."""
        inputs, _ = self.prepare(batch)
        return self.model.logits(self.model.forward(*inputs))

    def _prefill_tokens(self, batch: Batch) -> tuple[list[int], np.ndarray[Any, Any]]:
        """The prefill sequences' tokens, packed, and the index of each sequence's last token in the step."""
        ids = list(itertools.chain.from_iterable(s.tokens for s in batch.prefills))
        ends = np.cumsum([len(s) for s in batch.prefills], dtype=np.int64) - 1
        nd = len(batch.decodes)
        return ids, np.concatenate([np.arange(nd, dtype=np.int64), nd + ends])

    def capture_graphs(self, max_batch: int, implementations: Iterable[Implementation] = ()) -> str:
        """Capture decode CUDA graphs for batch sizes up to `max_batch`, at most the cache's blocks (rows: each
        running sequence holds one at least); returns a one-line status.

        `implementations` (the gate plan's choices) name the one that synchronizes, when one does."""
        graphs = DecodeGraphs(self, self.device, implementations)
        status = graphs.capture(min(max_batch, self.cache.allocator.num_blocks))
        self.graphs = graphs if graphs.sizes else None
        self._static_tables = None
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

    def __init__(self, model: Any, cache: KVCache, device: torch.device, rows: SeqRows) -> None:
        """`rows`: the engine's rows, whose tables hold ``max_model_len / block_size`` blocks."""
        super().__init__(model, cache, device, rows)
        self.block_size = cache.allocator.block_size
        self.max_blocks = self.table_width = rows.max_blocks

    def prepare(self, batch: Batch) -> tuple[tuple[Any, ...], np.ndarray[Any, Any] | None]:
        """``(input_ids, positions, AttnContext, cache)`` and the index of each sequence's last token."""
        i64, i32 = torch.int64, torch.int32
        parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        if batch.decodes:
            d = self.rows.decode_inputs(self.decode_rows_of(batch))
            ctx = AttnContext(slot_mapping=d.slot_mapping, num_decode=len(batch.decodes), context_lens=d.context_lens,
                              cache_seqlens=d.cache_seqlens, block_tables=d.block_tables)
            if not batch.prefills:  # a decode-only step: the rows' views as they are
                return (d.input_ids, d.positions, ctx, self.cache), None
            parts.append((d.input_ids, d.positions, d.slot_mapping))
        else:
            ctx = AttnContext(slot_mapping=torch.empty(0, dtype=i64), num_decode=0)
        last = None
        if batch.prefills:
            ids, last = self._prefill_tokens(batch)
            lens = [len(s) for s in batch.prefills]
            positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
            slots = list(itertools.chain.from_iterable(slots_for(s.block_table, 0, n, self.block_size)
                                                       for s, n in zip(batch.prefills, lens)))
            host = torch.stack([torch.tensor(ids, dtype=i64), torch.from_numpy(positions),
                                torch.tensor(slots, dtype=i64)])
            fresh = self._tensor(host, i64)
            parts.append((fresh[0], fresh[1], fresh[2]))
            ctx.cu_seqlens = self._tensor(np.concatenate([[0], np.cumsum(lens)]), i32)
            ctx.max_seqlen = max(lens)
        ids_t, positions_t, slots_t = (torch.cat(p) if len(parts) > 1 else p[0] for p in zip(*parts))
        ctx.slot_mapping = slots_t
        return (ids_t, positions_t, ctx, self.cache), last

    def graph_inputs(self, rows: np.ndarray[Any, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows token, position, slot, context length; block tables as wide as the longest in the step (on the
        CPU gathered straight into the graphs' static tables, and None returned for them)."""
        static = self.graphs.tables if self.graphs is not None else None
        if static is not None and not self.rows.tables.transposed:
            if self._static_tables is None:
                self._static_tables = static.numpy()
            return self.rows.decode_step(rows, values=True, tables_out=self._static_tables)
        return self.rows.decode_step(rows, values=True)

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

    def __init__(self, model: Any, pool: StatePool, device: torch.device, rows: SeqRows) -> None:
        """`rows`: the engine's rows, whose one-entry tables hold each sequence's state row."""
        super().__init__(model, pool, device, rows)
        self.pool = pool
        self.prefill_graphs: PrefillGraphs | None = None

    def prepare(self, batch: Batch) -> tuple[tuple[Any, ...], np.ndarray[Any, Any] | None]:
        """``(input_ids, SsmContext, pool)`` and the index of each sequence's last token."""
        i64 = torch.int64
        ctx = SsmContext(num_decode=len(batch.decodes))
        parts = []
        if batch.decodes:
            step = self.rows.recurrent_step(self.decode_rows_of(batch))
            parts.append(step[0])
            ctx.decode_rows = step[1]
        last = None
        if batch.prefills:
            ids, last = self._prefill_tokens(batch)
            parts.append(self._tensor(ids, i64))
            ctx.prefill_rows = self._tensor([self.pool.row(s) for s in batch.prefills], i64)
            if len(batch.prefills) > 1:  # one packed row: the packed conv and scan
                ctx.cu_seqlens = self._tensor(prefill_starts([len(s) for s in batch.prefills]), torch.int32)
        return (torch.cat(parts) if len(parts) > 1 else parts[0], ctx, self.pool), last

    def graph_inputs(self, rows: np.ndarray[Any, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows token and state row; no block tables."""
        return self.rows.recurrent_step(rows), None

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
