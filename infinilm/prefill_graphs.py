"""CUDA graphs for the prefill of one Mamba-2 prompt, at fixed bucket lengths (issue 5: prefill speed).

A Mamba-2 prefill launches some twenty kernels per layer, most of them short at a few thousand tokens, so
the host's Python and launch cost can exceed the device time. A recurrent prefill has static shapes once the
prompt is padded to a bucket length: each bucket in `EngineOptions.prefill_graph_lengths` is captured once
over static buffers and replayed for a lone prompt (no decodes in the step) of up to that length.

Padding goes on the left with ``seq_idx`` -1 and token 0: `causal_conv1d` outputs 0 there and does not
mix it into the prompt, and `selective_scan` restarts its state where the prompt begins, so the prompt's
outputs and final states are its own (bit-for-bit those of an eager step only when there is no padding;
with padding the scan's chunk boundaries fall elsewhere, which changes rounding only). Warm-up and capture
write their final states into pool row 0, which no request holds yet (graphs are captured when the engine
starts) and which a prefill overwrites before anyone reads it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

import torch

from infinilm.host_sync import capture_failed_status
from infiniops_py import Implementation

if TYPE_CHECKING:
    from infinilm.models.mamba2 import Mamba2Model
    from infinilm.state_pool import StatePool

__all__ = ["PrefillGraphs"]


class PrefillGraphs:
    """Captured single-prompt prefills keyed by bucket length; each returns the last token's logits ``[1, V]``."""

    def __init__(self, model: Mamba2Model, pool: StatePool, device: torch.device,
                 implementations: Iterable[Implementation] = ()) -> None:
        self.model, self.pool, self.device = model, pool, device
        self.implementations = list(implementations)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.lengths: list[int] = []
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def serves(self, n: int) -> bool:
        return bool(self.lengths) and 0 < n <= self.lengths[-1]

    def _forward(self, length: int) -> torch.Tensor:
        from infinilm.state_pool import SsmContext

        ids, seq_idx, row = self.buffers[length]
        ctx = SsmContext(num_decode=0, prefill_rows=row, seq_idx=seq_idx)
        return self.model.logits(self.model.forward(ids, ctx, self.pool)[-1:])

    @torch.inference_mode()
    def capture(self, lengths: Iterable[int]) -> str:
        """Capture one graph per bucket length; returns a one-line status (eager prefill when capture fails)."""
        wanted = sorted(set(lengths))
        if not wanted:
            return "prefill graphs: off"
        pool = None
        length = wanted[-1]
        try:
            for length in reversed(wanted):  # largest first, so the smaller graphs reuse its memory pool
                self.buffers[length] = (torch.zeros(length, dtype=torch.int64, device=self.device),
                                        torch.zeros(1, length, dtype=torch.int32, device=self.device),
                                        torch.zeros(1, dtype=torch.int64, device=self.device))
                self._forward(length)  # warm-up: resolves every operator, compiles and tunes, settles allocations
                graph, out = self._capture_one(length, pool)
                pool = graph.pool()
                self.graphs[length] = (graph, out)
        except Exception as exc:  # an implementation that cannot be captured: stay eager, say why
            self.graphs.clear()
            status = capture_failed_status(exc, partial(self._forward, length), self.device, self.implementations)
            return status.replace("cuda graphs:", "prefill graphs:", 1)
        self.lengths = wanted
        return f"prefill graphs: on (prompt lengths up to {', '.join(map(str, wanted))})"

    def _capture_one(self, length: int, pool: object) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        # the outer stream scope restores the current stream even when capture_end raises
        with torch.cuda.stream(torch.cuda.current_stream(self.device)), torch.cuda.graph(graph, pool=pool):
            out = self._forward(length)
        torch.cuda.synchronize(self.device)
        return graph, out

    @torch.inference_mode()
    def replay(self, prompt: list[int], row: int) -> torch.Tensor:
        """Logits ``[1, V]`` at the last token of `prompt`, whose final states go to pool `row`."""
        length = self.lengths[bisect.bisect_left(self.lengths, len(prompt))]
        pad = length - len(prompt)
        ids, seq_idx, rows = self.buffers[length]
        host = torch.tensor([*([0] * pad), *prompt, row], dtype=torch.int64)
        ids.copy_(host[:length], non_blocking=True)
        rows.copy_(host[length:], non_blocking=True)
        seq_idx[0, :pad].fill_(-1)
        seq_idx[0, pad:].fill_(0)
        graph, out = self.graphs[length]
        graph.replay()
        return out
