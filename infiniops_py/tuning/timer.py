"""Timing one call: warm-up, then the median of repeats, bounded in time; never during CUDA-graph capture.

CUDA: like ``triton.testing.do_bench``: after the warm-up (which compiles), each repeat flushes the L2 cache
(a write twice its size, so that weights come from memory as they do in a model, where every layer has its own)
and times the call alone between two CUDA events; one synchronize after the last. The call is captured in a
CUDA graph after its warm-up and each repeat replays it, the way an engine's decode graphs run it; a call that
cannot be captured is timed as launched, and then, before each timed call the
GPU is also kept busy (``torch.cuda._sleep``) for 1.5x the longest host time of a warm-up call, so the host has
enqueued every kernel of the call before the first event fires: the time is the call's GPU time, what a CUDA-graph
replay of it costs, and not how fast this host launches it (a host slower than the flush otherwise adds its
launch latency to the implementations with the costlier launch path, and the ranking then depends on the load
of the host at the moment of tuning). CPU: ``time.perf_counter``
around each call. The result is the median in seconds. A `Timer` is what the tuner calls; tests inject one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, Final

import torch

__all__ = ["MAX_REPEATS", "MIN_REPEATS", "WARMUP", "CaptureError", "Timer", "capturing", "measure"]

Timer = Callable[[Callable[[], Any], str], float]  # (call, device type) -> median seconds per call
WARMUP: Final = 3
MIN_REPEATS: Final = 5
MAX_REPEATS: Final = 25
BUDGET_S: Final = 0.05  # repeats stop past this much measured time (after MIN_REPEATS)

GPU_CYCLES_PER_S: Final = 2.0e9  # the head start is counted in GPU clock cycles: a slower clock only lengthens it
MAX_HEAD_START_S: Final = 0.01

_flush: dict[int, torch.Tensor] = {}  # per CUDA device: the buffer whose write flushes L2


class CaptureError(RuntimeError):
    """Timing was asked for while the current CUDA stream captures a graph (the timing would be captured)."""


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without a CUDA runtime)."""
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except RuntimeError:
        return False


def measure(fn: Callable[[], Any], device_type: str, *, warmup: int = WARMUP, max_repeats: int = MAX_REPEATS,
            budget_s: float = BUDGET_S) -> float:
    """The median time of `fn()` in seconds on `device_type` (``cuda``: the GPU time between events; else the
    host's wall time), after `warmup` calls, over at least `MIN_REPEATS` and at most `max_repeats` repeats,
    stopping once `budget_s` of repeats has run.

    Raises:
        CaptureError: the current CUDA stream is capturing a graph. Whatever `fn` raises propagates.
    """
    if capturing():
        raise CaptureError("not timing during CUDA-graph capture: tune before capturing")
    if device_type == "cuda":
        return _cuda(fn, warmup, max_repeats, budget_s)
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    spent = 0.0
    while len(samples) < max_repeats and (len(samples) < MIN_REPEATS or spent < budget_s):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
        spent += samples[-1]
    return statistics.median(samples)


def _cuda(fn: Callable[[], Any], warmup: int, max_repeats: int, budget_s: float) -> float:
    device = torch.cuda.current_device()
    flush = _flush.get(device)
    if flush is None:
        size = max(2 * int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)), 32 << 20)
        flush = _flush[device] = torch.empty(size, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    host = 0.0
    for n in range(max(warmup, 1) + 1):
        begun = time.perf_counter()
        fn()
        if n:  # the first call compiles
            host = max(host, time.perf_counter() - begun)
        torch.cuda.synchronize()
    graph = _graph_of(fn)
    if graph is not None:  # the call as a model's decode graph runs it: one replay, no host launch cost
        fn, cycles = graph.replay, 0
    else:
        cycles = int(min(1.5 * host, MAX_HEAD_START_S) * GPU_CYCLES_PER_S)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush.zero_()
    torch.cuda._sleep(cycles)
    start.record()
    fn()
    end.record()
    end.synchronize()
    estimate = max(start.elapsed_time(end) / 1e3, 1e-7)
    repeats = max(MIN_REPEATS, min(max_repeats, int(budget_s / estimate)))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for begin, stop in events:
        flush.zero_()
        torch.cuda._sleep(cycles)
        begin.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(stop) for begin, stop in events) / 1e3


def _graph_of(fn: Callable[[], Any]) -> torch.cuda.CUDAGraph | None:
    """`fn` (warmed up: compiled, autotuned) captured in a CUDA graph, or None when it cannot be captured (it
    synchronizes, or calls what capture forbids): then it is timed as launched."""
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # any failure to capture means: time it as launched
        torch.cuda.synchronize()
        return None
    return graph
