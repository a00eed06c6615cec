"""CUDA graphs for the prefill of one prompt of a recurrent (Mamba-2) model, at fixed bucket lengths.

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
from collections.abc import Callable, Iterable

import torch

from infinilm.engine.graphs.capture import CapturedSteps
from infiniops_py import Implementation

__all__ = ["PrefillGraphs", "PrefillStep"]

# (input_ids int64 [L], seq_idx int32 [1, L], the state row int64 [1]) -> the last token's logits [1, V]
PrefillStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class PrefillGraphs(CapturedSteps):
    """Captured single-prompt prefills keyed by bucket length; each returns the last token's logits ``[1, V]``."""

    def __init__(self, step: PrefillStep, device: torch.device, implementations: Iterable[Implementation] = ()) -> None:
        """`step` runs one padded prompt (the recurrent runner's); `implementations` (the gate plan's choices)
        name the culprit when a step synchronizes with the host."""
        super().__init__(device, implementations)
        self.step = step
        self.buffers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @property
    def lengths(self) -> list[int]:
        """The captured bucket lengths, ascending (empty when capture is off or failed)."""
        return self.sizes

    def serves(self, n: int) -> bool:
        """Whether a prompt of `n` tokens fits a captured bucket."""
        return bool(self.sizes) and 0 < n <= self.sizes[-1]

    def _prepare(self, length: int) -> None:
        self.buffers[length] = (torch.zeros(length, dtype=torch.int64, device=self.device),
                                torch.zeros(1, length, dtype=torch.int32, device=self.device),
                                torch.zeros(1, dtype=torch.int64, device=self.device))

    def _forward(self, length: int) -> torch.Tensor:
        return self.step(*self.buffers[length])

    @torch.inference_mode()
    def capture(self, lengths: Iterable[int]) -> str:
        """Capture one graph per bucket length; returns a one-line status (eager prefill when capture fails)."""
        wanted = sorted(set(lengths))
        if not wanted:
            return "prefill graphs: off"
        failed = self._capture_all(wanted)
        if failed is not None:
            return failed.replace("cuda graphs:", "prefill graphs:", 1)
        return f"prefill graphs: on (prompt lengths up to {', '.join(map(str, wanted))})"

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
