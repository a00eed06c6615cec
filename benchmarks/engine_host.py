"""CPU benchmark of the engine's host path: one decode step with a kernel-free stand-in model (issue #24).

    python3 benchmarks/engine_host.py            # ~1 min; prints the table for RESULTS.md
    python3 benchmarks/engine_host.py --steps 50 --batch 8    # a quicker look

The model is replaced by `StandIn`, an object of the model's interface (``forward(input_ids, positions, ctx,
cache)`` and ``logits(hidden)``) that runs no kernel: it returns slices of preallocated tensors. So what an
``Engine.step`` costs here is the engine alone: schedule, the step's inputs (block tables, slots, positions,
context lengths), the sampling call, postprocess. The sampling call is ``infinilm.engine.sampling.sample``
(greedy: argmax) over the stand-in's logits of a small vocabulary (`VOCAB`: the argmax of a large vocabulary
is device work, not host work). Batch 64 decode steps are timed at max_model_len 512, 8192 and 40960, with
contexts of 128 and 4096 tokens in the cache; the table gives each cell's p50 and p90 over `--steps` steps and
the ratios the acceptance of #24 asks for (at most 150 us, within 10% across max_model_len and context).

Two paths per cell: ``eager`` (the step's inputs handed to the model's forward) and ``graphs`` (the decode
graph's path: `DecodeGraphs` over a stand-in capture whose replay runs nothing, as a replayed CUDA graph costs
the host one launch, so the step copies its rows into the static buffers and "replays"). The last column times,
on the same sequences, the inputs the graph path built before #24 (`legacy_graph_inputs`: per-sequence Python
lists, block tables padded to ``max_model_len / block_size``, then two tensors): the alternative measured in the
same run. ``eager async`` and ``graphs async`` are the same two paths with ``async_scheduling=True``
(`infinilm.engine.overlap`: the next step launched before this one's ids are read, its input ids gathered from
them on the device), which decides the option's default on the CPU. ``--breakdown`` adds where the graph path's
time goes.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import infinilm.engine.engine as engine_module
from infinilm import EngineOptions, SamplingParams
from infinilm.config import ModelConfig
from infinilm.engine import Engine
from infinilm.engine.gates import plan
from infinilm.engine.graphs.decode import DecodeGraphs
from infinilm.engine.sequence import Sequence

VOCAB = 64
MAX_POSITIONS = 40960
CELLS = ((512, 128), (8192, 4096), (40960, 128), (40960, 4096))  # (max_model_len, context)


class StandIn:
    """The attention model's interface without kernels: ``forward`` and ``logits`` return slices of
    preallocated tensors (the logits' argmax is token 1, never an EOS id)."""

    def __init__(self, max_tokens: int) -> None:
        self.hidden = torch.zeros(max_tokens, 1)
        self.table = torch.zeros(max_tokens, VOCAB)
        self.table[:, 1] = 1.0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: object, cache: object) -> torch.Tensor:
        return self.hidden[:input_ids.shape[0]]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.table[:hidden.shape[0]]


def config() -> ModelConfig:
    """A Qwen3-like config of one tiny layer (the cache stays small at 64 x 4096 tokens)."""
    return ModelConfig(model_type="qwen3", vocab_size=VOCAB, hidden_size=8, intermediate_size=16, num_layers=1,
                       num_heads=1, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_type="default",
                       rope_theta=1e6, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True,
                       qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=True, dtype=torch.float32,
                       eos_token_ids=(0,))


class NoGraph:
    """What `DecodeGraphs` captures here: a replay that runs nothing (its output is the stand-in's logits)."""

    def replay(self) -> None:
        pass

    def pool(self) -> None:
        return None


def _capture_nothing(self: DecodeGraphs, size: int, pool: object) -> tuple[NoGraph, torch.Tensor]:
    return NoGraph(), self._forward(size)


def engine(max_model_len: int, context: int, batch: int, steps: int, graphs: bool = False,
           async_scheduling: bool = False) -> Engine:
    """An engine over `StandIn` whose `batch` requests have prefilled `context` tokens (one step each done); with
    `graphs`, its decode steps go through `DecodeGraphs` over `NoGraph` captures; `async_scheduling`: the
    engine option."""
    cfg = config()
    block_size = 16
    blocks = batch * math.ceil((context + steps + 8) / block_size) + 1
    options = EngineOptions(block_size=block_size, num_blocks=max(blocks, max_model_len // block_size),
                            max_num_seqs=batch, max_num_batched_tokens=batch * context + batch,
                            max_model_len=max_model_len, async_scheduling=async_scheduling)
    eng = Engine(cfg, options, plan(cfg, options), StandIn(batch * context + batch))
    if graphs:
        real, DecodeGraphs._capture_one = DecodeGraphs._capture_one, _capture_nothing  # type: ignore[assignment]
        try:
            eng.runner.capture_graphs(batch)
        finally:
            DecodeGraphs._capture_one = real  # type: ignore[method-assign]
    params = SamplingParams(max_new_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        eng.add_request([2 + (i + j) % (VOCAB - 2) for j in range(context)], params)
    eng.step()  # the prefills
    return eng


def time_steps(eng: Engine, steps: int, cpu: list[float] | None = None) -> list[float]:
    """Wall microseconds of each of `steps` decode steps; `cpu` gets the thread's CPU microseconds of each (what
    the step itself used, without the time the OS gave the core to other processes)."""
    out = []
    for _ in range(steps):
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        eng.step()
        out.append((time.perf_counter_ns() - start) / 1e3)
        if cpu is not None:
            cpu.append((time.thread_time_ns() - start_cpu) / 1e3)
    return out


def legacy_graph_inputs(seqs: list[Sequence], max_blocks: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode graph's inputs as built before #24 (``AttentionRunner.decode_rows`` and ``DecodeGraphs.replay``
    at ee38887): lists per sequence, tables padded to `max_blocks`, then one tensor of each."""
    bs = block_size
    ids = [s.tokens[-1] for s in seqs]
    positions = [len(s) - 1 for s in seqs]
    slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions)]
    lens = [len(s) for s in seqs]
    tables = [s.block_table + [0] * (max_blocks - len(s.block_table)) for s in seqs]
    return torch.tensor([ids, positions, slots, lens], dtype=torch.int64), torch.tensor(tables, dtype=torch.int32)


def time_legacy(eng: Engine, steps: int) -> list[float]:
    """Microseconds of `legacy_graph_inputs` over the decode sequences of each of `steps` more steps, timed
    inside the step (after its schedule, where the old runner built them), apart from the step's own time."""
    width, bs, run = eng.runner.table_width, eng.cache.allocator.block_size, eng.runner.run
    out = []

    def timing_run(batch: Any) -> torch.Tensor:
        start = time.perf_counter_ns()
        legacy_graph_inputs(batch.decodes, width, bs)
        out.append((time.perf_counter_ns() - start) / 1e3)
        return run(batch)

    eng.runner.run = timing_run  # type: ignore[method-assign]
    try:
        time_steps(eng, steps)
    finally:
        del eng.runner.run
    return out


def breakdown(eng: Engine, steps: int) -> dict[str, float]:
    """Median microseconds per step of schedule, the runner (inputs and the graph path), sample, the rows'
    advance and postprocess, over `steps` steps (each phase wrapped by a timer)."""
    spent: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any) -> Any:
            start = time.perf_counter_ns()
            out = fn(*args)
            spent.setdefault(name, []).append((time.perf_counter_ns() - start) / 1e3)
            return out
        return wrapper

    sample = engine_module.sample
    eng.scheduler.schedule = timed("schedule", eng.scheduler.schedule)  # type: ignore[method-assign]
    eng.runner.run = timed("inputs + run", eng.runner.run)  # type: ignore[method-assign]
    eng.rows.advance = timed("advance rows", eng.rows.advance)  # type: ignore[method-assign]
    eng.scheduler.postprocess = timed("postprocess", eng.scheduler.postprocess)  # type: ignore[method-assign]
    engine_module.sample = timed("sample", sample)  # type: ignore[assignment]
    try:
        total = time_steps(eng, steps)
    finally:
        engine_module.sample = sample  # type: ignore[assignment]
    return {**{k: statistics.median(v) for k, v in spent.items()}, "step (wrapped)": statistics.median(total)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300, help="decode steps timed per cell and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds over the cells (the best p50 is kept)")
    parser.add_argument("--breakdown", action="store_true", help="also where the graph path's step time goes")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    paths, clocks = ("eager", "graphs", "eager async", "graphs async"), ("wall", "cpu")
    runs: dict[tuple[str, str, int, int], list[list[float]]] = {
        (p, k, *c): [] for p in paths for k in clocks for c in CELLS}
    legacy: dict[tuple[int, int], list[list[float]]] = {c: [] for c in CELLS}
    time_steps(engine(512, 128, args.batch, 2 * args.steps), 2 * args.steps)  # the process's first steps: warm-up
    for _ in range(args.rounds):  # interleaved, so a busy moment of the machine hits every cell alike
        for mml, ctx in CELLS:
            for path in paths:
                eng = engine(mml, ctx, args.batch, 2 * args.steps + 50, graphs=path.startswith("graphs"),
                             async_scheduling=path.endswith("async"))
                time_steps(eng, 50)
                cpu: list[float] = []
                runs[(path, "wall", mml, ctx)].append(time_steps(eng, args.steps, cpu))
                runs[(path, "cpu", mml, ctx)].append(cpu)
                if path == "graphs":
                    legacy[(mml, ctx)].append(time_legacy(eng, args.steps))
    p50 = {k: min(statistics.median(r) for r in v) for k, v in runs.items()}
    old = {k: min(statistics.median(r) for r in v) for k, v in legacy.items()}
    print(f"decode step host time (us), batch {args.batch}, stand-in model (no kernels), greedy sampling call "
          f"(argmax over {VOCAB} logits); best p50 of {args.rounds} rounds of {args.steps} steps (wall: "
          f"perf_counter; cpu: the thread's CPU time); torch {torch.__version__}, 1 thread\n")
    print("| max_model_len | context (tokens) | " + " | ".join(f"{p} {k}" for p in paths for k in clocks)
          + " | graph inputs before #24 (wall) |")
    print("|---|---|" + "---|" * (len(paths) * len(clocks) + 1))
    for mml, ctx in CELLS:
        cells = " | ".join(f"{p50[(p, k, mml, ctx)]:.1f}" for p in paths for k in clocks)
        print(f"| {mml} | {ctx} | {cells} | {old[(mml, ctx)]:.1f} |")
    print()
    for path in paths:
        for clock in clocks:
            r = {c: p50[(path, clock, *c)] for c in CELLS}
            ratios = (r[(40960, 128)] / r[(512, 128)], r[(40960, 4096)] / r[(8192, 4096)],
                      r[(40960, 4096)] / r[(40960, 128)])
            worst = max(r.values())
            verdict = "PASS" if worst <= 150 and all(0.9 <= x <= 1.1 for x in ratios) else "FAIL"
            print(f"- {verdict} {path}, {clock}: slowest cell {worst:.1f} us (target <= 150); max_model_len "
                  f"40960 / 512 at context 128: {ratios[0]:.3f}; 40960 / 8192 at context 4096: {ratios[1]:.3f}; "
                  f"context 4096 / 128 at max_model_len 40960: {ratios[2]:.3f} (targets within 10%)")
    for path in ("eager", "graphs"):
        ratio = max(p50[(f"{path} async", "wall", *c)] / p50[(path, "wall", *c)] for c in CELLS)
        print(f"- {path}: async scheduling / synchronous steps, wall, worst cell: {ratio:.3f}")
    print(f"- the graph inputs before #24 at max_model_len 40960, context 4096: {old[(40960, 4096)]:.1f} us, "
          f"{old[(40960, 4096)] / p50[('graphs', 'wall', 40960, 4096)]:.1f}x this whole step")
    if args.breakdown:
        eng = engine(40960, 4096, args.batch, args.steps + 20, graphs=True)
        time_steps(eng, 20)
        parts = breakdown(eng, args.steps)
        print("\ngraph path at max_model_len 40960, context 4096 (median us per step): "
              + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
