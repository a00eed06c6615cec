"""Async scheduling: the host schedules and launches step N+1 before it reads step N's sampled ids (vLLM V1's
``async_scheduling``, SGLang's overlap scheduler), so that its work (schedule, inputs, the launch, then
detokenization and streaming of step N) runs while the device computes.

`Engine.step` under ``EngineOptions.async_scheduling``: after launching step N (the graph replay or eager forward,
then the sampling call, whose ids stay on the device), the engine schedules step N+1 assuming every running
request continues (``Scheduler.schedule(pending=True)``), builds its inputs from the persistent rows (their
lengths already advanced at N's launch, `infinilm.engine.input_batch.SeqRows.launched`), takes the input ids
from step N's sampled ids with a gather on the device, launches it, and only then reads step N's ids
(`InFlight`: a pinned non-blocking copy and an event, so the read waits for step N alone, not for N+1) for the
stop checks and the outputs. Each call returns one step's outputs, as the synchronous step does; one step stays
in flight between calls.

A request that finished at step N (a stop token, EOS, its length) or was cancelled before N+1 was read had one
extra token computed by step N+1: it is dropped (never emitted, never counted), and the request's blocks and
row are freed once step N+1 is read (`infinilm.engine.scheduler.Scheduler.release_deferred`: one step late, as
vLLM). A step is not overlapped (the engine reads its ids before scheduling the next) when one of its requests
needs its output on the host to sample again (penalties) or asks for logprobs (computed from this step's logits,
which the next graph replay overwrites), or when the next step would need a preemption (a preempted request is
recomputed from its tokens, which must all be on the host). New requests join the step after the one in flight.
"""

from __future__ import annotations

import torch

from infinilm.batch import Batch

__all__ = ["HostIds", "InFlight"]


class HostIds:
    """Two pinned host buffers of `size` int32 ids, taken in turn (CUDA): step N's copy lands in one while step
    N+1's is launched into the other. Off CUDA there are none (the ids are on the host already)."""

    __slots__ = ("_buffers", "_turn")

    def __init__(self, size: int, device: torch.device) -> None:
        cuda = device.type == "cuda"
        self._buffers = [torch.empty(size, dtype=torch.int32, pin_memory=True) for _ in range(2 if cuda else 0)]
        self._turn = 0

    def take(self) -> torch.Tensor | None:
        """The next buffer, or None off CUDA."""
        if not self._buffers:
            return None
        self._turn ^= 1
        return self._buffers[self._turn]


class InFlight:
    """A launched step whose sampled ids are not read yet.

    Attributes:
        batch: the step's batch (`Batch.rows` filled in).
        ids: its sampled ids, int32 ``[len(batch.seqs)]`` on the device.
        overlap: whether the next step may be launched before these ids are read (no request of the batch has
            penalties or asks for logprobs).
        logits: the step's logits when it is not overlapped (for logprobs), else None.
        start: `time.perf_counter` at the launch.
    """

    __slots__ = ("_host", "_ready", "batch", "ids", "logits", "overlap", "start")

    def __init__(self, batch: Batch, ids: torch.Tensor, logits: torch.Tensor, host: torch.Tensor | None,
                 start: float) -> None:
        """`host`: a pinned buffer of at least ``len(ids)`` entries (`HostIds.take`) the ids are copied to without
        blocking, or None (the ids are on the host already)."""
        self.batch, self.ids, self.start = batch, ids, start
        self.overlap = not any(s.params.needs_host for s in batch.seqs)
        self.logits = None if self.overlap else logits
        self._ready: torch.cuda.Event | None = None
        if host is not None and ids.device.type == "cuda":
            self._host = host[:ids.shape[0]]
            self._host.copy_(ids, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record(torch.cuda.current_stream(ids.device))
        else:
            self._host = ids

    def tokens(self) -> list[int]:
        """The sampled ids on the host: waits for this step's sampling only (the event after its copy)."""
        if self._ready is not None:
            self._ready.synchronize()
        return self._host.tolist()
