"""The recurrent state pool of a Mamba-2 model, and the runner that feeds a step's batch through it.

A recurrent model keeps no KV blocks: each running request owns one **row** of two pools preallocated per
layer, a conv state ``[conv_dim, W-1]`` in the model dtype and an SSM state ``[H, P, N]`` in float32, whatever
the request's length. Rows come from a `BlockAllocator` whose one block spans a whole sequence
(``block_size = max_model_len``), so the unchanged scheduler admits a request only while a row is free and
queues it otherwise, never preempts (a running request never needs a second row), and frees the row on EOS,
max tokens and cancellation for the next request to reuse. A prefill never reads its row, it overwrites it
with the prompt's final states, so a reused row cannot leak the previous holder's state.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from infinilm.config import EngineOptions, ModelConfig
from infinilm.engine.graphs.capture import CapturedSteps
from infinilm.engine.graphs.decode import capture_sizes
from infinilm.engine.graphs.prefill import PrefillGraphs
from infinilm.engine.kv_cache import BlockAllocator, check_fits
from infinilm.engine.scheduler import Batch
from infinilm.engine.sequence import Sequence
from infiniops_py import Implementation

if TYPE_CHECKING:
    from infinilm.models.mamba2 import Mamba2Model

__all__ = ["RecurrentRunner", "SsmContext", "StatePool", "describe_state", "prefill_layout", "state_bytes"]


def state_bytes(config: ModelConfig, dtype: torch.dtype) -> tuple[int, int]:
    """Bytes of one request's ``(conv state, SSM state)`` over all layers; independent of its length.

    Raises:
        ValueError: `config` is not a recurrent (Mamba-2) config.
    """
    s = config.ssm
    if s is None:
        raise ValueError(f"{config.model_type}: has no recurrent state (not a Mamba-2 config)")
    conv = config.num_layers * s.conv_dim * (s.conv_kernel - 1) * torch.empty((), dtype=dtype).element_size()
    return conv, config.num_layers * s.num_heads * s.head_dim * s.state_size * 4


def describe_state(config: ModelConfig, dtype: torch.dtype) -> str:
    """One line for ``infinilm check``: the recurrent shape and the state bytes per request."""
    s = config.ssm
    if s is None:
        raise ValueError(f"{config.model_type}: has no recurrent state (not a Mamba-2 config)")
    conv, ssm = state_bytes(config, dtype)
    return (f"{config.model_type}, {config.num_layers} layers, {s.num_heads} heads x head_dim {s.head_dim}, d_state "
            f"{s.state_size}, n_groups {s.n_groups}, conv width {s.conv_kernel}; recurrent state per request: "
            f"{(conv + ssm) / 2**20:.3f} MiB (conv {conv / 2**10:.1f} KiB in {str(dtype).removeprefix('torch.')} + "
            f"SSM {ssm / 2**10:.1f} KiB in float32), whatever the sequence length")


class StatePool:
    """Per-layer conv states ``conv[l]`` ``[rows, conv_dim, W-1]`` and SSM states ``ssm[l]`` ``[rows, H, P, N]``.

    Request row ``r`` is ``conv[:, r]`` ``[layers, conv_dim, W-1]`` (model dtype) and ``ssm[:, r]``
    ``[layers, H, P, N]`` (float32). ``allocator`` hands out rows as one-block block tables.
    """

    __slots__ = ("allocator", "conv", "ssm")

    def __init__(self, config: ModelConfig, num_rows: int, max_model_len: int, *, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        s = config.ssm
        if s is None:
            raise ValueError(f"{config.model_type}: has no recurrent state (not a Mamba-2 config)")
        layers = config.num_layers
        self.conv = torch.zeros(layers, num_rows, s.conv_dim, s.conv_kernel - 1, dtype=dtype, device=device)
        self.ssm = torch.zeros(layers, num_rows, s.num_heads, s.head_dim, s.state_size, dtype=torch.float32,
                               device=device)
        self.allocator = BlockAllocator(num_rows, max_model_len)

    @classmethod
    def for_engine(cls, config: ModelConfig, options: EngineOptions, device: torch.device) -> StatePool:
        """Rows: ``options.num_blocks`` when given, else as many as fit the memory budget, at most
        ``max_num_seqs`` (the budget is ``kv_cache_memory``, or on CUDA the free memory above
        ``1 - gpu_memory_utilization``).

        Raises:
            ConfigError: the rows need more memory than `device` has available (checked before allocating).
        """
        dtype = options.resolved_dtype(config)
        per_row = sum(state_bytes(config, dtype))
        rows = options.num_blocks
        if rows is None:
            budget = options.kv_cache_memory
            if device.type == "cuda":
                free, total = torch.cuda.mem_get_info(device)
                budget = int(free - total * (1.0 - options.gpu_memory_utilization))
            rows = max(1, min(options.max_num_seqs, budget // per_row))
        given = f"num_blocks={rows}" if options.num_blocks is not None else f"{rows} rows sized from the memory budget"
        check_fits(f"{given}: the state pool ({rows} x {per_row} bytes)", rows * per_row, device, now=True,
                   fix="lower num_blocks" if options.num_blocks is not None else "lower kv_cache_memory")
        return cls(config, rows, options.model_len(config), dtype=dtype, device=device)

    @property
    def num_rows(self) -> int:
        return self.allocator.num_blocks

    @staticmethod
    def row(seq: Sequence) -> int:
        """The row a running sequence owns (its one-block block table)."""
        return seq.block_table[0]


@dataclass
class SsmContext:
    """Where a step's tokens read and write recurrent state (built by `RecurrentRunner`, passed down).

    The step holds ``num_decode`` decode tokens first (one per request, advancing rows ``decode_rows``), then
    the prompts. Prompts go one per row of a ``[P, L]`` grid, right-aligned (L: the longest prompt), with
    ``seq_idx`` -1 on the left padding and 0 on the prompt: the conv outputs 0 on padding and the scan
    restarts where the prompt begins, so each grid row's final states are its prompt's own (the operators
    return final states per row, for its last sequence; that is why prompts are not packed several to a row).
    A single prompt skips the grid: ``gather``, ``seq_idx`` and ``token_index`` are None.

    Attributes:
        decode_rows: int64 ``[num_decode]`` pool rows (-1: a padding row, skipped by the operators).
        prefill_rows: int64 ``[P]`` pool rows receiving each prompt's final states, or None without prompts.
        gather: int64 ``[P, L]``: 1 + the index of the prompt token at each grid cell, 0 for padding.
        seq_idx: int32 ``[P, L]``.
        token_index: int64 ``[Tp]``: the flat grid cell of each prompt token, in step order.
    """

    num_decode: int = 0
    decode_rows: torch.Tensor | None = None
    prefill_rows: torch.Tensor | None = None
    gather: torch.Tensor | None = None
    seq_idx: torch.Tensor | None = None
    token_index: torch.Tensor | None = None


def prefill_layout(lengths: list[int]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """``gather``, ``seq_idx`` and ``token_index`` of `SsmContext` for prompts of `lengths`, packed in order."""
    width = max(lengths)
    gather: list[list[int]] = []
    seq_idx: list[list[int]] = []
    token_index: list[int] = []
    offset = 0
    for row, n in enumerate(lengths):
        pad = width - n
        gather.append([0] * pad + list(range(offset + 1, offset + n + 1)))
        seq_idx.append([-1] * pad + [0] * n)
        token_index.extend(range(row * width + pad, (row + 1) * width))
        offset += n
    return gather, seq_idx, token_index


class RecurrentRunner:
    """Turns a scheduled batch into a `SsmContext`, runs the model over `pool`, returns logits.

    Decode-only steps on CUDA replay a captured CUDA graph when one serves the batch size; a step that is
    one lone prompt replays a prefill graph when one serves its length (`EngineOptions.prefill_graph_lengths`).
    """

    def __init__(self, model: Mamba2Model, pool: StatePool, device: torch.device) -> None:
        self.model, self.pool, self.device = model, pool, device
        self.graphs: _DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None

    def _tensor(self, values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def prepare(self, batch: Batch) -> tuple[torch.Tensor, SsmContext, list[int]]:
        """input_ids ``[T]``, the context and the index of each sequence's last token."""
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
            if len(batch.prefills) > 1:
                gather, seq_idx, token_index = prefill_layout([len(s) for s in batch.prefills])
                ctx.gather = self._tensor(gather, i64)
                ctx.seq_idx = self._tensor(seq_idx, torch.int32)
                ctx.token_index = self._tensor(token_index, i64)
        return self._tensor(ids, i64), ctx, last

    @torch.inference_mode()
    def run(self, batch: Batch) -> torch.Tensor:
        """Logits ``[len(batch.seqs), V]`` at each sequence's last token."""
        if not batch.prefills and self.graphs is not None and self.graphs.serves(len(batch.decodes)):
            return self.graphs.replay([s.tokens[-1] for s in batch.decodes],
                                      [self.pool.row(s) for s in batch.decodes])
        if (not batch.decodes and len(batch.prefills) == 1 and self.prefill_graphs is not None
                and self.prefill_graphs.serves(len(batch.prefills[0]))):
            seq = batch.prefills[0]
            return self.prefill_graphs.replay(seq.tokens, self.pool.row(seq))
        ids, ctx, last = self.prepare(batch)
        hidden = self.model.forward(ids, ctx, self.pool)
        if len(last) != hidden.shape[0]:
            hidden = hidden[self._tensor(last, torch.int64)]
        return self.model.logits(hidden)

    @torch.inference_mode()
    def prefill_logits(self, batch: Batch) -> torch.Tensor:
        """Logits ``[T, V]`` at every token of a prefill-only batch (for checking against a reference)."""
        ids, ctx, _ = self.prepare(batch)
        return self.model.logits(self.model.forward(ids, ctx, self.pool))

    def capture_graphs(self, max_batch: int, implementations: Iterable[Implementation] = ()) -> str:
        """Capture decode CUDA graphs for batch sizes up to `max_batch` (at most the pool's rows).

        `implementations` (the gate plan's choices) name the one that synchronizes, when one does."""
        graphs = _DecodeGraphs(self.model, self.pool, self.device, implementations)
        status = graphs.capture(min(max_batch, self.pool.num_rows))
        self.graphs = graphs if graphs.sizes else None
        return status


    def capture_prefill_graphs(self, lengths: Iterable[int], implementations: Iterable[Implementation] = ()) -> str:
        """Capture single-prompt prefill CUDA graphs at bucket `lengths` (`infinilm.engine.graphs.prefill`); call it
        before any request runs (capture writes pool row 0). Returns a one-line status."""
        graphs = PrefillGraphs(self.model, self.pool, self.device, implementations)
        status = graphs.capture(lengths)
        self.prefill_graphs = graphs if graphs.lengths else None
        return status


class _DecodeGraphs(CapturedSteps):
    """Decode steps captured per padded batch size over static ``[ids; rows]`` buffers; padding rows are -1."""

    def __init__(self, model: Mamba2Model, pool: StatePool, device: torch.device,
                 implementations: Iterable[Implementation] = ()) -> None:
        super().__init__(device, implementations)
        self.model, self.pool = model, pool
        self.inputs = torch.empty(0)

    def serves(self, n: int) -> bool:
        return bool(self.sizes) and n <= self.sizes[-1]

    def _prepare(self, bs: int) -> None:
        self._pad(0, bs)  # padding rows: the warm-up and capture touch no state

    def _pad(self, start: int, stop: int) -> None:
        self.inputs[0, start:stop] = 0
        self.inputs[1, start:stop] = -1

    def _forward(self, bs: int) -> torch.Tensor:
        ctx = SsmContext(num_decode=bs, decode_rows=self.inputs[1, :bs])
        return self.model.logits(self.model.forward(self.inputs[0, :bs], ctx, self.pool))

    @torch.inference_mode()
    def capture(self, max_batch: int) -> str:
        """Capture every size up to `max_batch`; returns a one-line status for the CLI and benchmarks."""
        sizes = capture_sizes(max_batch)
        self.inputs = torch.zeros(2, max_batch, dtype=torch.int64, device=self.device)
        failed = self._capture_all(sizes)
        if failed is not None:
            return failed
        return f"cuda graphs: on (decode batch sizes {sizes[0]}..{sizes[-1]}, {len(sizes)} graphs)"

    def replay(self, ids: list[int], rows: list[int]) -> torch.Tensor:
        """Logits ``[n, V]`` of a decode step of n sequences (their last tokens and pool rows)."""
        n = len(ids)
        bs = next(s for s in self.sizes if s >= n)
        if bs > n:
            self._pad(n, bs)
        self.inputs[:, :n].copy_(torch.tensor([ids, rows], dtype=torch.int64), non_blocking=True)
        graph, out = self.graphs[bs]
        graph.replay()
        return out[:n]
