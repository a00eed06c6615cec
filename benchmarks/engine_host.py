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
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from infinilm import EngineOptions, SamplingParams
from infinilm.config import ModelConfig
from infinilm.engine import Engine
from infinilm.engine.gates import plan

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


def engine(max_model_len: int, context: int, batch: int, steps: int) -> Engine:
    """An engine over `StandIn` whose `batch` requests have prefilled `context` tokens (one step each done)."""
    cfg = config()
    block_size = 16
    blocks = batch * math.ceil((context + steps + 8) / block_size) + 1
    options = EngineOptions(block_size=block_size, num_blocks=max(blocks, max_model_len // block_size),
                            max_num_seqs=batch, max_num_batched_tokens=batch * context + batch,
                            max_model_len=max_model_len)
    eng = Engine(cfg, options, plan(cfg, options), StandIn(batch * context + batch))
    params = SamplingParams(max_new_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        eng.add_request([2 + (i + j) % (VOCAB - 2) for j in range(context)], params)
    eng.step()  # the prefills
    return eng


def time_steps(eng: Engine, steps: int) -> list[float]:
    """Microseconds of each of `steps` decode steps."""
    out = []
    for _ in range(steps):
        start = time.perf_counter_ns()
        eng.step()
        out.append((time.perf_counter_ns() - start) / 1e3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300, help="decode steps timed per cell and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the cells (the best p50 is kept)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[tuple[int, int], list[list[float]]] = {cell: [] for cell in CELLS}
    for _ in range(args.rounds):  # interleaved, so a busy moment of the machine hits every cell alike
        for mml, ctx in CELLS:
            eng = engine(mml, ctx, args.batch, args.steps + 20)
            time_steps(eng, 20)
            results[(mml, ctx)].append(time_steps(eng, args.steps))
    p50 = {cell: min(statistics.median(r) for r in runs) for cell, runs in results.items()}
    p90 = {cell: min(statistics.quantiles(r, n=10)[-1] for r in runs) for cell, runs in results.items()}
    print(f"decode step host time, batch {args.batch}, stand-in model (no kernels), greedy sampling call; "
          f"best of {args.rounds} rounds of {args.steps} steps; torch {torch.__version__}, 1 thread\n")
    print("| max_model_len | context (tokens) | p50 (us) | p90 (us) |")
    print("|---|---|---|---|")
    for mml, ctx in CELLS:
        print(f"| {mml} | {ctx} | {p50[(mml, ctx)]:.1f} | {p90[(mml, ctx)]:.1f} |")
    print()
    print(f"- max_model_len 40960 / 512 at context 128: {p50[(40960, 128)] / p50[(512, 128)]:.3f}")
    print(f"- max_model_len 40960 / 8192 at context 4096: {p50[(40960, 4096)] / p50[(8192, 4096)]:.3f}")
    print(f"- context 4096 / 128 at max_model_len 40960: {p50[(40960, 4096)] / p50[(40960, 128)]:.3f}")
    worst = max(p50.values())
    print(f"- slowest cell {worst:.1f} us: {'PASS' if worst <= 150 else 'FAIL'} (at most 150 us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
