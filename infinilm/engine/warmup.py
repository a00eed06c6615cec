"""Tune and warm the engine's operator closure at build, for the size buckets it will run, before any request.

The buckets: every prefill length class (powers of two) up to ``max_num_batched_tokens`` (and what the cache can
hold and ``max_model_len`` allows), and every decode batch size the engine runs as one (`capture_sizes` of
``max_num_seqs``: the sizes of its CUDA graphs). For each, `warm_up` runs one forward of the real model at that
exact size (a lone prompt of zeros in freshly allocated blocks or a state row, freed after; a decode step of
padding rows, which write nothing) while recording its operator calls (`infiniops_py.tuning.recording`), then
times every accepting implementation of each new problem bucket on those very arguments
(`infiniops_py.tuning.tune_calls`, which persists the times: a second build on the same machine reuses them
and times nothing). A second pass over the buckets then runs the winners, so every kernel a request will use
is compiled and warm before the first one. It runs before the CUDA graphs are captured, which then hold the
measured choices.

On by default on CUDA, off on the CPU; ``INFINILM_TUNE=1`` / ``0`` turns it on or off anywhere
(``INFINILM_TUNE_BUDGET`` bounds the tuning in seconds, default 120). The progress bar (tqdm) shows while
`EngineOptions.progress` is true, or, when it is None, on a terminal.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from infinilm.batch import Batch
from infinilm.engine.graphs.decode import capture_sizes
from infinilm.engine.sampling import sample_ids
from infinilm.engine.sequence import SamplingParams, Sequence
from infiniops_py import Implementation, Problem, unchecked_indices
from infiniops_py._env import parse_flag
from infiniops_py.tuning import TuneReport, recording, tune_calls

__all__ = ["WarmupReport", "buckets", "decode_padding", "tuning_wanted", "warm_up"]

DEFAULT_BUDGET_S: Final = 120.0


@dataclass
class WarmupReport:
    """What `warm_up` did.

    Attributes:
        ran: whether it ran (see `tuning_wanted`); the rest is empty when it did not.
        prefill_lengths / decode_sizes: the buckets warmed.
        tuning: the tuner's report over every bucket.
        chosen: each problem bucket the forwards called -> the implementation that serves it after tuning.
        seconds: wall time of the whole warm-up (both passes; ``tuning.seconds`` is the timing's part).
    """

    ran: bool = False
    prefill_lengths: tuple[int, ...] = ()
    decode_sizes: tuple[int, ...] = ()
    tuning: TuneReport = field(default_factory=TuneReport)
    chosen: dict[Problem, Implementation] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        """One line: the buckets, the tuner's counts and the time; or why it did not run."""
        if not self.ran:
            return "tuning and warm-up: off (INFINILM_TUNE=1 turns it on)"
        return (f"tuning and warm-up: {len(self.prefill_lengths)} prefill lengths up to "
                f"{max(self.prefill_lengths, default=0)}, {len(self.decode_sizes)} decode batch sizes up to "
                f"{max(self.decode_sizes, default=0)}; {self.tuning.summary()}; {self.seconds:.2f} s in all")


def tuning_wanted(device: torch.device) -> bool:
    """``INFINILM_TUNE`` when set, else on for CUDA and off for the CPU.

    Raises:
        ValueError: ``INFINILM_TUNE`` is set to a value that is not a boolean (naming the variable).
    """
    return parse_flag("INFINILM_TUNE", os.environ.get("INFINILM_TUNE"), device.type == "cuda")


def _budget() -> float:
    raw = os.environ.get("INFINILM_TUNE_BUDGET", "").strip()
    try:
        value = float(raw) if raw else DEFAULT_BUDGET_S
    except ValueError:
        raise ValueError(f"INFINILM_TUNE_BUDGET={raw!r} must be a number of seconds") from None
    if not value >= 0:
        raise ValueError(f"INFINILM_TUNE_BUDGET={raw!r} must be >= 0 seconds")
    return value


def buckets(engine: Any) -> tuple[list[int], list[int]]:
    """The prefill lengths (powers of two up to ``max_num_batched_tokens``, capped by what ``max_model_len``
    allows and the free cache holds) and the decode batch sizes (`capture_sizes` of ``max_num_seqs``, at most
    the cache's blocks or rows) that `engine` will run."""
    alloc = engine.cache.allocator
    longest = min(engine.scheduler.max_num_batched_tokens, engine.scheduler.max_model_len,
                  alloc.num_free * alloc.block_size)
    lengths = [1 << i for i in range(max(longest, 1).bit_length()) if 1 << i <= longest]
    if longest > 0 and longest not in lengths:
        lengths.append(longest)  # the largest step, exactly
    most = min(engine.scheduler.max_num_seqs, alloc.num_blocks)
    return lengths, capture_sizes(most) if most > 0 else []


def _prefill(engine: Any, n: int) -> None:
    """One forward of a lone prompt of `n` zeros, in blocks (or a state row) allocated for it and freed after."""
    seq = Sequence([0] * n, SamplingParams())
    alloc = engine.cache.allocator
    alloc.append(seq.block_table, n)
    try:
        engine.runner.run(Batch(prefills=[seq]))
    finally:
        alloc.free(seq.block_table)


def decode_padding(engine: Any, batch: int) -> Callable[[], torch.Tensor]:
    """A decode step of `batch` padding rows (they write nothing), as a decode CUDA graph runs it: the call that
    runs it and returns its logits (the warm-up's decode buckets, the CPU thread calibration of
    `infinilm.engine.threads`)."""
    runner = engine.runner
    rows = torch.tensor(runner.padding, dtype=torch.int64, device=engine.device)[:, None].repeat(1, batch)
    width = runner.table_width
    tables = torch.zeros(batch, width, dtype=torch.int32, device=engine.device) if width else None

    @torch.inference_mode()
    def step() -> torch.Tensor:
        with unchecked_indices():  # padding rows hold out-of-range values on purpose, as in a graph's capture
            return runner.graph_step(rows, tables)

    return step


def _decode(engine: Any, batch: int) -> None:
    """One decode step of `batch` padding rows (see `decode_padding`)."""
    decode_padding(engine, batch)()


def _sample(engine: Any, most: int) -> None:
    """Sampled (temperature 1, top_p 0.9) calls of the sampling operator on rows of the model's logits (its
    vocabulary and dtype) for 1, 2 and 16 rows (up to `most`), so that a provider that compiles per dtype and row
    class (the Triton sampler: one row, a multiple of 16, other) does it here and not under the first sampled
    request of a batch; the greedy argmax needs no warming."""
    row = decode_padding(engine, 1)()[:1]
    for n in sorted({1, min(2, most), min(16, most)}):
        sample_ids(row.expand(n, -1).contiguous(),
                   [Sequence([0], SamplingParams(temperature=1.0, top_p=0.9, seed=0)) for _ in range(n)])


def _bar(total: int, show: bool | None) -> Any:
    from tqdm import tqdm

    visible = sys.stderr.isatty() if show is None else show
    return tqdm(total=total, desc="tuning and warming kernels", unit="bucket", disable=not visible)


def warm_up(engine: Any, *, tune: bool | None = None, progress: bool | None = None,
            budget_s: float | None = None) -> WarmupReport:
    """Tune and warm `engine`'s buckets (see the module doc); call it inside the engine's provider scope,
    before the CUDA graphs are captured.

    Args:
        engine: a built `infinilm.engine.Engine` (its cache, runner and scheduler exist).
        tune: run it; None asks `tuning_wanted`.
        progress: show the progress bar; None: on a terminal.
        budget_s: the tuning's bound in seconds; None reads ``INFINILM_TUNE_BUDGET`` (default 120).

    Raises:
        ValueError: ``INFINILM_TUNE`` or ``INFINILM_TUNE_BUDGET`` holds a value it does not accept.
    """
    if not (tuning_wanted(engine.device) if tune is None else tune):
        return WarmupReport()
    budget = _budget() if budget_s is None else budget_s
    start = time.perf_counter()
    lengths, sizes = buckets(engine)
    steps: list[tuple[str, Callable[[], None]]] = [
        *((f"prefill {n}", lambda n=n: _prefill(engine, n)) for n in lengths),
        *((f"decode {b}", lambda b=b: _decode(engine, b)) for b in sizes)]
    report = WarmupReport(True, tuple(lengths), tuple(sizes))
    deadline = start + budget
    seen: set[Problem] = set()  # a problem several buckets call (the LM head of one row) is tuned once
    with _bar(2 * len(steps), progress) as bar:
        for label, step in steps:
            bar.set_postfix_str(f"timing {label}")
            with recording() as calls:
                step()
            new = [c for c in calls if c.problem not in seen]
            seen.update(c.problem for c in new)
            tuned = tune_calls(new, budget_s=max(0.0, deadline - time.perf_counter()))
            report.tuning.results += tuned.results
            report.tuning.seconds += tuned.seconds
            bar.update()
        problems: list[Problem] = []
        for label, step in steps:  # the winners: compiled and warm before the first request
            bar.set_postfix_str(f"warming {label}")
            with recording() as calls:
                step()
            problems += [c.problem for c in calls]
            bar.update()
        if sizes:
            _sample(engine, max(sizes))
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    report.chosen = _chosen(problems)
    report.seconds = time.perf_counter() - start
    return report


def _chosen(problems: Iterable[Problem]) -> dict[Problem, Implementation]:
    from infiniops_py import resolve

    return {p: resolve(p) for p in dict.fromkeys(problems)}
