"""Throughput and latency of an engine, and the low-precision logits check of the GPU benchmarks.

`run_bench`: one batched prefill, then decode steps to the output length, run ``1 + repeats`` times at exactly
the sizes measured. Prompts are random token ids from a seeded generator; every request ignores EOS so that all
of them run to `output_len`. The first run is the cold first request (the first call of each kernel at these
sizes in this process: resolution, compilation, allocation) and is its own row; it also warms every kernel of
the sizes measured, so that the steady-state numbers, from the `repeats` runs after it, hold no warm-up.

`count_decode_step`: what one decode step launches (`StepCount`): the operator calls it makes on the host and,
on CUDA, the kernels and CUDA graph launches the profiler records in it.

`compare_logits`: infinilm's bf16 logits judged against what bf16 itself allows on the same weights (see
`LogitsCheck`).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Final

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from infinilm.engine import Engine
from infinilm.engine.sequence import SamplingParams
from infiniops_py.dispatch import observing

__all__ = ["BenchResult", "LogitsCheck", "StepCount", "check_bench_args", "compare_logits", "count_decode_step",
           "run_bench"]

ERR_FACTOR: Final = 2.0  # infinilm's max logits error <= ERR_FACTOR x transformers' own + ERR_ATOL
ERR_ATOL: Final = 1e-2
AGREE_MARGIN: Final = 0.05  # argmax agreement with fp32 at most this much below transformers' own


@dataclass(frozen=True)
class BenchResult:
    """Times in seconds; throughputs in tokens per second over the whole batch.

    Attributes:
        prefill_seconds: the steady-state prefill latency (the median over the runs after the cold one).
        decode_step_seconds: every decode step of the steady-state runs.
        cold_prefill_seconds / cold_decode_step_seconds: the cold first request's (the first run).
        runs: how many steady-state runs (0: only the cold one ran; the steady numbers are then its own).
    """

    batch: int
    input_len: int
    output_len: int
    prefill_seconds: float
    decode_step_seconds: tuple[float, ...]
    cold_prefill_seconds: float = 0.0
    cold_decode_step_seconds: tuple[float, ...] = ()
    runs: int = 0

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens of the whole batch per second of the prefill step."""
        return self.batch * self.input_len / self.prefill_seconds

    @property
    def decode_tokens_per_s(self) -> float:
        """Generated tokens of the whole batch per second of decode steps (0.0 without any)."""
        steps = self.decode_step_seconds
        return self.batch * len(steps) / sum(steps) if steps else 0.0

    def _steps(self, cold: bool = False) -> dict[str, float]:
        steps = sorted(self.cold_decode_step_seconds if cold else self.decode_step_seconds) or [0.0]
        at = lambda q: steps[min(len(steps) - 1, int(q * len(steps)))] * 1e3  # noqa: E731
        return {"mean_ms": statistics.fmean(steps) * 1e3, "p50_ms": at(0.5), "p90_ms": at(0.9)}

    def as_dict(self) -> dict[str, object]:
        """The result as ``--json`` writes it: the sizes, the steady state and the cold first request (ms, tok/s)."""
        cold_steps = self.cold_decode_step_seconds
        return {
            "batch": self.batch, "input_len": self.input_len, "output_len": self.output_len, "runs": self.runs,
            "prefill_ms": self.prefill_seconds * 1e3, "prefill_tokens_per_s": self.prefill_tokens_per_s,
            "decode_step": self._steps(), "decode_tokens_per_s": self.decode_tokens_per_s,
            "cold_first_request": {
                "prefill_ms": self.cold_prefill_seconds * 1e3, "decode_step": self._steps(cold=True),
                "total_ms": (self.cold_prefill_seconds + sum(cold_steps)) * 1e3},
        }

    def table(self) -> str:
        """The result as an aligned two-column text table (latencies in ms, throughputs in tok/s): the steady
        state, then the cold first request's row."""
        steps, cold = self._steps(), self._steps(cold=True)
        rows = [
            ("batch / input / output", f"{self.batch} / {self.input_len} / {self.output_len}"),
            ("steady state over (runs)", f"{self.runs}" if self.runs else "1 (the cold run alone)"),
            ("prefill latency (ms)", f"{self.prefill_seconds * 1e3:.2f}"),
            ("prefill throughput (tok/s)", f"{self.prefill_tokens_per_s:.1f}"),
            ("decode step latency mean / p50 / p90 (ms)",
             f"{steps['mean_ms']:.3f} / {steps['p50_ms']:.3f} / {steps['p90_ms']:.3f}"),
            ("decode throughput (tok/s)", f"{self.decode_tokens_per_s:.1f}"),
            ("cold first request: prefill / decode step mean / total (ms)",
             f"{self.cold_prefill_seconds * 1e3:.2f} / {cold['mean_ms']:.3f} / "
             f"{(self.cold_prefill_seconds + sum(self.cold_decode_step_seconds)) * 1e3:.2f}"),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def check_bench_args(batch: int, input_len: int, output_len: int, seed: int) -> None:
    """The arguments of `run_bench` that need no engine (the CLI checks them before loading the model).

    Raises:
        ValueError: a size or seed that is not an int (a float or a bool), a size below 1, or a seed outside
            ``[0, 2**64)`` (what a `torch.Generator` takes).
    """
    sizes = {"batch": batch, "input_len": input_len, "output_len": output_len}
    for k, v in {**sizes, "seed": seed}.items():
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"{k}={v!r} must be an int")
    bad = [f"{k}={v}" for k, v in sizes.items() if v < 1]
    if bad:
        raise ValueError(f"{', '.join(bad)}: batch, input_len and output_len must be >= 1")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed={seed} must be in [0, 2**64)")


def run_bench(engine: Engine, batch: int, input_len: int, output_len: int, *, seed: int = 0,
              warmup: bool = True, repeats: int = 3) -> BenchResult:
    """Prefill `batch` random prompts of `input_len` tokens together, then decode to `output_len` tokens each:
    once cold, then `repeats` more times for the steady state (none without `warmup`).

    Raises:
        ValueError: `check_bench_args` fails; more than the engine can schedule in one step; ``input_len +
            output_len`` beyond the engine's ``max_model_len``; or a batch whose requests, at full length, need
            more KV blocks (Mamba-2: state rows) than the cache holds (all checked before any prompt is made).
    """
    check_bench_args(batch, input_len, output_len, seed)
    if input_len + output_len > engine.scheduler.max_model_len:
        raise ValueError(f"input_len={input_len} + output_len={output_len} exceeds max_model_len="
                         f"{engine.scheduler.max_model_len}; lower them or raise max_model_len")
    alloc = engine.cache.allocator
    if batch * alloc.blocks_needed(input_len + output_len) > alloc.num_blocks:
        raise ValueError(f"batch={batch} requests of {input_len} + {output_len} tokens need "
                         f"{batch * alloc.blocks_needed(input_len + output_len)} cache blocks of {alloc.block_size} "
                         f"tokens, the cache holds {alloc.num_blocks}; lower batch or give more blocks (num_blocks)")
    if batch > engine.scheduler.max_num_seqs or batch * input_len > engine.scheduler.max_num_batched_tokens:
        raise ValueError(f"batch={batch} x input_len={input_len} does not fit one step (max_num_seqs="
                         f"{engine.scheduler.max_num_seqs}, max_num_batched_tokens="
                         f"{engine.scheduler.max_num_batched_tokens})")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r} must be an int >= 1")
    gen = torch.Generator().manual_seed(seed)
    cold_prefill, cold_steps = _one_run(engine, batch, input_len, output_len, gen)
    runs = [_one_run(engine, batch, input_len, output_len, gen) for _ in range(repeats if warmup else 0)]
    if not runs:
        return BenchResult(batch, input_len, output_len, cold_prefill, cold_steps, cold_prefill, cold_steps, 0)
    return BenchResult(batch, input_len, output_len, statistics.median(p for p, _ in runs),
                       tuple(s for _, steps in runs for s in steps), cold_prefill, cold_steps, len(runs))


def _one_run(engine: Engine, batch: int, input_len: int, output_len: int, gen: torch.Generator
             ) -> tuple[float, tuple[float, ...]]:
    """One batched prefill of fresh random prompts and its decode steps: (prefill seconds, step seconds)."""
    prompts = torch.randint(0, engine.config.vocab_size, (batch, input_len), generator=gen).tolist()
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
    return prefill, tuple(steps)


@dataclass(frozen=True)
class StepCount:
    """What one decode step of `batch` sequences launched.

    Attributes:
        batch: sequences decoded in the step. layers: the model's layers.
        operator_calls: InfiniOps operator calls the step made on the host, by operator name (none when the
            step replayed a CUDA graph: a replay calls no operator).
        kernels: device kernels the profiler recorded in the step, copies and memsets not counted (None off
            CUDA); the embedding, the final norm, the LM head and sampling are in it.
        graph_launches: CUDA graph launches in the step (``cudaGraphLaunch`` on the host).
    """

    batch: int
    layers: int
    operator_calls: dict[str, int]
    kernels: int | None
    graph_launches: int

    @property
    def calls(self) -> int:
        """All operator calls of the step."""
        return sum(self.operator_calls.values())

    def line(self) -> str:
        """One line for the bench output: the calls and kernels of the step, and per layer."""
        per = lambda n: f"{n / self.layers:.1f}" if self.layers else "-"  # noqa: E731
        kernels = ("no device kernels (not on CUDA)" if self.kernels is None else
                   f"{self.kernels} device kernels ({per(self.kernels)} per layer)")
        graphs = f" in {self.graph_launches} CUDA graph launch(es)" if self.graph_launches else ""
        return (f"one decode step of {self.batch}: {self.calls} operator calls on the host ({per(self.calls)} per "
                f"layer), {kernels}{graphs}; {self.layers} layers, the LM head and sampling included")

    def as_dict(self) -> dict[str, object]:
        """The count as ``--json`` writes it."""
        return {"batch": self.batch, "layers": self.layers, "operator_calls": dict(self.operator_calls),
                "kernels": self.kernels, "graph_launches": self.graph_launches}


def count_decode_step(engine: Engine, batch: int, input_len: int, *, seed: int = 0,
                      params: SamplingParams | None = None) -> StepCount:
    """Prefill `batch` random prompts of `input_len` tokens, then count what the one decode step after it
    launches: its operator calls (through `infiniops_py.dispatch.observing`) and, on CUDA, the device kernels and
    graph launches ``torch.profiler`` records in it. The requests sample with `params` (None: greedy; a
    greedy step takes the argmax without the sampling operator); each then has its two tokens and has finished;
    the engine is left idle.

    Raises:
        ValueError: as `run_bench` for these sizes (an output of 2 tokens); the engine has requests already.
    """
    if engine.has_work():
        raise ValueError("count_decode_step needs an idle engine (it has requests in flight)")
    check_bench_args(batch, input_len, 2, seed)
    gen = torch.Generator().manual_seed(seed)
    for p in torch.randint(0, engine.config.vocab_size, (batch, input_len), generator=gen).tolist():
        engine.add_request(p, replace(params, max_new_tokens=2, ignore_eos=True) if params is not None
                           else SamplingParams(max_new_tokens=2, ignore_eos=True))
    if len(engine.step()) != batch:
        raise ValueError(f"the {batch} prompts of {input_len} tokens do not fit one prefill step")
    names: Counter[str] = Counter()
    count = lambda call: names.update((call.spec.name,))  # noqa: E731
    kernels, launches = None, 0
    if engine.device.type == "cuda":  # off CUDA the profiler has no kernels to count
        torch.cuda.synchronize(engine.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof, observing(count):
            engine.step()
            torch.cuda.synchronize(engine.device)
        events = list(prof.events())
        kernels = sum(1 for e in events
                      if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset")))
        launches = sum(1 for e in events if e.device_type == DeviceType.CPU and e.name == "cudaGraphLaunch")
    else:
        with observing(count):
            engine.step()
    while engine.has_work():  # nothing should be left (two tokens each); finish whatever is
        engine.step()
    return StepCount(batch, engine.config.num_layers, dict(sorted(names.items())), kernels, launches)


@dataclass(frozen=True)
class LogitsCheck:
    """infinilm's and transformers' low-precision logits, each against transformers' fp32 forward.

    The rule (FlashAttention's for low-precision kernels, applied to the whole model): infinilm's max
    error may be at most ``ERR_FACTOR`` times transformers' own low-precision max error plus ``ERR_ATOL``,
    and infinilm's argmax may agree with the fp32 argmax on at most ``AGREE_MARGIN`` fewer positions than
    transformers' own low-precision argmax does. Random weights give near-tied logits, so an absolute
    agreement threshold says nothing; the reference is what the same dtype achieves in transformers.

    Attributes:
        err_ours / err_theirs: max ``|logits - fp32 logits|`` over every position.
        agree_ours / agree_theirs: fraction of positions whose argmax equals the fp32 argmax.
        agree_pair: fraction of positions where infinilm's and transformers' low-precision argmax agree.
        positions: positions compared.
    """

    err_ours: float
    err_theirs: float
    agree_ours: float
    agree_theirs: float
    agree_pair: float
    positions: int

    @property
    def ok(self) -> bool:
        """Whether the check passes: the error within its bound and the argmax agreement within its margin."""
        return (self.err_ours <= ERR_FACTOR * self.err_theirs + ERR_ATOL
                and self.agree_ours >= self.agree_theirs - AGREE_MARGIN)

    def line(self, what: str = "logits", dtype: str = "bf16") -> str:
        """``PASS``/``FAIL``, the rule, then the numbers, on one line."""
        return (f"{'PASS' if self.ok else 'FAIL'} {what} vs transformers fp32 over {self.positions} positions "
                f"(rule: max err <= {ERR_FACTOR:g} x transformers {dtype}'s + {ERR_ATOL:g}, and argmax = fp32 "
                f"argmax at no more than {AGREE_MARGIN:.0%} fewer positions than transformers {dtype}): "
                f"max err infinilm {self.err_ours:.4f}, transformers {dtype} {self.err_theirs:.4f}; argmax = fp32 "
                f"argmax: infinilm {self.agree_ours:.1%}, transformers {dtype} {self.agree_theirs:.1%}; "
                f"infinilm = transformers {dtype} argmax {self.agree_pair:.1%}")


def compare_logits(ours: list[torch.Tensor], theirs: list[torch.Tensor],
                   reference: list[torch.Tensor]) -> LogitsCheck:
    """Pool per-prompt logits ``[L_i, V]`` of infinilm (`ours`), transformers low precision (`theirs`) and
    transformers fp32 (`reference`) into one `LogitsCheck`.

    Raises:
        ValueError: the lists differ in length or are empty, or a prompt's three tensors differ in shape.
    """
    if not reference or not len(ours) == len(theirs) == len(reference):
        raise ValueError(f"compare_logits: {len(ours)}, {len(theirs)} and {len(reference)} prompts; need the "
                         "same number, at least one")
    err_ours = err_theirs = 0.0
    hits_ours = hits_theirs = hits_pair = positions = 0
    for mine, hf, ref in zip(ours, theirs, reference):
        if not mine.shape == hf.shape == ref.shape:
            raise ValueError(f"compare_logits: shapes {list(mine.shape)}, {list(hf.shape)}, {list(ref.shape)}")
        ref = ref.double()
        err_ours = max(err_ours, (mine.double() - ref).abs().max().item())
        err_theirs = max(err_theirs, (hf.double() - ref).abs().max().item())
        best, best_ours, best_hf = ref.argmax(-1), mine.argmax(-1), hf.argmax(-1)
        hits_ours += int((best_ours == best).sum())
        hits_theirs += int((best_hf == best).sum())
        hits_pair += int((best_ours == best_hf).sum())
        positions += ref.shape[0]
    return LogitsCheck(err_ours, err_theirs, hits_ours / positions, hits_theirs / positions,
                       hits_pair / positions, positions)
