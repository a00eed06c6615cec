"""GPU benchmark of infinilm's tensor parallelism: decode tokens/s at batch 1 and 32, one GPU against two (NCCL).

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton \
        -e providers/cupy
    python3 benchmarks/gpu_tp.py                      # Qwen3-0.6B shape, ~2 min on 2 GPUs
    python3 benchmarks/gpu_tp.py --shape 8B           # Qwen3-8B shape (16 GB of weights written first)
    python3 benchmarks/gpu_tp.py --smoke              # a tiny Qwen3 on the CPU (gloo), to try the script
    python3 benchmarks/gpu_tp.py --json FILE          # also the throughputs as records (benchmarks/plots.py)

1. Builds the Qwen3 shape (`gpu_infinilm.QWEN3_0_6B`, or Qwen3-8B's published configuration written out below)
   with random weights (seed 0, transformers' own initialization), bf16, saved as safetensors in a temporary
   directory.
2. One GPU (``tensor_parallel_size=1``): prefill logits of two prompts, then `infinilm.bench.run_bench` at batch 1
   and 32 (``--input-len`` prompt tokens, ``--output-len`` generated; one cold run, then the median of
   ``--repeats``), CUDA graphs when every operator captures. The engine is freed before the next one starts.
3. Two GPUs (``tensor_parallel_size=2``: this process is rank 0 on cuda:0 and starts rank 1 on cuda:1; NCCL for
   the all-reduces, gloo on the CPU for the step broadcast): the same logits (their max difference from one GPU's
   and how often the argmax agrees: bf16 partial sums are added in another order, so near-tied random logits may
   flip) and the same benchmark.
4. Prints a markdown table: decode tok/s and step p50 per batch for each, and the speedup of two GPUs.

Exit status 0, or 2 without enough CUDA devices (two) when not ``--smoke``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

import torch

from infinilm import Engine, EngineOptions
from infinilm.bench import BenchResult, run_bench

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py and gpu_infinilm.py, also when loaded by its path
from _common import json_option, p50_ms, record, write_records
from gpu_infinilm import QWEN3_0_6B, SMOKE, build

# Qwen/Qwen3-8B config.json, the fields that shape the model.
QWEN3_8B = {**QWEN3_0_6B, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False}
SHAPES = {"0.6B": QWEN3_0_6B, "8B": QWEN3_8B}
BATCHES = (1, 32)


def _engine(path: Path, device: str, tp: int, input_len: int) -> Engine:
    options = EngineOptions(device=device, dtype=torch.bfloat16, block_size=16, max_num_seqs=max(BATCHES),
                            max_model_len=1024, max_num_batched_tokens=max(BATCHES) * input_len,
                            tensor_parallel_size=tp)
    return Engine.from_pretrained(path, options)


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (97, 256)]


def measure(path: Path, device: str, tp: int, args: argparse.Namespace
            ) -> tuple[list[torch.Tensor], dict[int, BenchResult], str, float]:
    """The prefill logits (on the CPU, float32), the benchmark per batch, the graph status and the build seconds of
    an engine split across `tp` ranks; the engine is closed and freed before this returns."""
    start = time.perf_counter()
    engine = _engine(path, device, tp, args.input_len)
    built = time.perf_counter() - start
    try:
        logits = [t.float().cpu() for t in engine.prefill_logits(_prompts(engine.config.vocab_size))]
        results = {b: run_bench(engine, b, args.input_len, args.output_len, repeats=args.repeats) for b in BATCHES}
        status = engine.graph_status
    finally:
        engine.close()
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return logits, results, status, built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.6B", help="the Qwen3 shape (default 0.6B)")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="steady-state runs after the cold one (median)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU (gloo), to try the script")
    json_option(parser)
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if not args.smoke and (not torch.cuda.is_available() or torch.cuda.device_count() < 2):
        print(f"needs two CUDA devices (found {torch.cuda.device_count() if torch.cuda.is_available() else 0}), "
              "or --smoke", file=sys.stderr)
        return 2
    shape = SMOKE if args.smoke else SHAPES[args.shape]
    name = "Qwen3 tiny shape" if args.smoke else f"Qwen3-{args.shape} shape"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        build(path, shape, device)
        one = measure(path, device, 1, args)
        two = measure(path, device, 2, args)
    diffs = [(a - b).abs().max().item() for a, b in zip(one[0], two[0])]
    agree = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(one[0], two[0]))
    positions = sum(a.shape[0] for a in one[0])
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU smoke run"
    print(f"\n### infinilm tensor parallelism, {name} (random weights, bf16), {where}, torch {torch.__version__}\n")
    print(f"input {args.input_len} tokens, output {args.output_len}; build + gates + load + capture: 1 GPU "
          f"{one[3]:.0f}s, 2 GPUs {two[3]:.0f}s")
    print(f"1 GPU: {one[2]}\n2 GPUs: {two[2]}")
    print(f"logits, 2 GPUs against 1: max |diff| {max(diffs):.4f}; argmax equal at {agree}/{positions} positions\n")
    print("| batch | 1 GPU decode (tok/s) | 2 GPUs decode (tok/s) | speedup | step p50, 1 / 2 GPUs (ms) |")
    print("|---|---|---|---|---|")
    records = []
    for b in BATCHES:
        r1, r2 = one[1][b], two[1][b]
        s1, s2 = p50_ms(r1.decode_step_seconds), p50_ms(r2.decode_step_seconds)
        speedup = r2.decode_tokens_per_s / r1.decode_tokens_per_s if r1.decode_tokens_per_s else float("nan")
        print(f"| {b} | {r1.decode_tokens_per_s:.0f} | {r2.decode_tokens_per_s:.0f} | {speedup:.2f}x | "
              f"{s1:.2f} / {s2:.2f} |")
        for tp, r, step, status in ((1, r1, s1, one[2]), (2, r2, s2, two[2])):
            timing = "graph replay" if status.startswith("cuda graphs: on") else "eager"
            records.append(record("model", "benchmarks/gpu_tp.py", name, f"infinilm tp{tp}", f"batch-{b} decode",
                                  ms=step, rate=r.decode_tokens_per_s, metric="tok/s", timing=timing))
    if args.json:
        write_records(args.json, records, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
