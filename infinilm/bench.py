"""Throughput and latency of an engine: one batched prefill, then decode steps to the output length.

Prompts are random token ids from a seeded generator; every request ignores EOS so that all of them run
to `output_len`. A short warm-up generation first resolves every operator and warms the kernels.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from infinilm.engine import Engine
from infinilm.sequence import SamplingParams

__all__ = ["BenchResult", "run_bench"]


@dataclass(frozen=True)
class BenchResult:
    """Times in seconds; throughputs in tokens per second over the whole batch."""

    batch: int
    input_len: int
    output_len: int
    prefill_seconds: float
    decode_step_seconds: tuple[float, ...]

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.batch * self.input_len / self.prefill_seconds

    @property
    def decode_tokens_per_s(self) -> float:
        steps = self.decode_step_seconds
        return self.batch * len(steps) / sum(steps) if steps else 0.0

    def table(self) -> str:
        steps = sorted(self.decode_step_seconds) or [0.0]
        p = lambda q: steps[min(len(steps) - 1, int(q * len(steps)))] * 1e3  # noqa: E731
        rows = [
            ("batch / input / output", f"{self.batch} / {self.input_len} / {self.output_len}"),
            ("prefill latency (ms)", f"{self.prefill_seconds * 1e3:.2f}"),
            ("prefill throughput (tok/s)", f"{self.prefill_tokens_per_s:.1f}"),
            ("decode step latency mean / p50 / p90 (ms)",
             f"{statistics.fmean(steps) * 1e3:.3f} / {p(0.5):.3f} / {p(0.9):.3f}"),
            ("decode throughput (tok/s)", f"{self.decode_tokens_per_s:.1f}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run_bench(engine: Engine, batch: int, input_len: int, output_len: int, *, seed: int = 0,
              warmup: bool = True) -> BenchResult:
    """Prefill `batch` random prompts of `input_len` tokens together, then decode to `output_len` tokens each.

    Raises:
        ValueError: sizes below 1, or more than the engine can schedule in one step.
    """
    if min(batch, input_len, output_len) < 1:
        raise ValueError("batch, input_len and output_len must be >= 1")
    if batch > engine.scheduler.max_num_seqs or batch * input_len > engine.scheduler.max_num_batched_tokens:
        raise ValueError(f"batch={batch} x input_len={input_len} does not fit one step (max_num_seqs="
                         f"{engine.scheduler.max_num_seqs}, max_num_batched_tokens="
                         f"{engine.scheduler.max_num_batched_tokens})")
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.config.vocab_size
    if warmup:
        warm = torch.randint(0, vocab, (batch, min(input_len, 8)), generator=gen).tolist()
        engine.generate(warm, SamplingParams(max_new_tokens=4, ignore_eos=True))
    prompts = torch.randint(0, vocab, (batch, input_len), generator=gen).tolist()
    params = SamplingParams(max_new_tokens=output_len, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    start = time.perf_counter()
    first = engine.step()
    prefill = time.perf_counter() - start
    if len(first) != batch:
        raise ValueError(f"only {len(first)} of {batch} prompts fit the first step (KV cache too small?)")
    steps = []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        steps.append(time.perf_counter() - start)
    return BenchResult(batch, input_len, output_len, prefill, tuple(steps))
