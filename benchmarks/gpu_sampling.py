"""The batched sampler on the GPU: `top_k_top_p_sampling_from_logits` per provider against a torch-native baseline.

    python3 benchmarks/gpu_sampling.py [--batch 1,32,64] [--top-k 50,0] [--vocab 151936] [--dtype bfloat16]
                                       [--calls 50] [--rounds 5] [--device cuda] [--json FILE]

Logits ``[B, V]`` (Qwen's vocabulary by default, bf16, N(0, 1) times 4), the sampled step of issue #24
(temperature 0.8, top_p 0.9, top_k 50 per row, per-row seeds) and the serving benchmark's (the same without
top-k: ``--top-k 0``), one batched call per step. Ways:

- ``triton`` and ``torch``: the public function under ``use(...)`` (checks, resolver, kernel);
- ``native``: plain PyTorch in one batched call, vLLM's ``apply_top_k_top_p`` (one sort, the top-k and top-p
  masks, then ``q.exponential_()`` race sampling: ``(probs / q).argmax``), the best plain-torch alternative;
- ``greedy``: ``logits.argmax(-1)``, the step a greedy request pays, beside them.

Each figure is the median over `rounds` rounds of CUDA events around `calls` back-to-back calls, per call (the
host clock on the CPU). ``vs native`` is the way's time over the native baseline's (below 1: faster), ``vs
greedy`` over the argmax's. Before the timings, each provider's draws of the largest batch are checked to be in
range and its temperature-0 rows to be the argmax. On the CPU (``--device cpu``, a tiny ``--vocab``) the triton
way runs only under the Triton interpreter (``TRITON_INTERPRET=1 INFINIOPS_TRITON_INTERPRET_CPU=1``); it is
the dry run of this script.

Exit status 0 when every way ran and passed its check, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import infiniops_py as ops

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from _common import json_option, record, write_records

SOURCE = "benchmarks/gpu_sampling.py"
TEMPERATURE, TOP_P, TOP_K = 0.8, 0.9, 50


def native(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """vLLM's batched torch sampler: temperature, one ascending sort, the top-k and top-p masks, exponential race."""
    x = logits.float() / temperature[:, None]
    ordered, order = x.sort(-1)
    kth = ordered.gather(1, (x.shape[1] - top_k.long())[:, None])
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    probs = ordered.softmax(-1)
    drop = probs.cumsum(-1) <= 1 - top_p[:, None]
    drop[:, -1] = False
    ordered = ordered.masked_fill(drop, float("-inf"))
    x = torch.empty_like(x).scatter_(1, order, ordered)
    probs = x.softmax(-1)
    return probs.div_(torch.empty_like(probs).exponential_()).argmax(-1)


def _timer(device: str, calls: int, rounds: int) -> Callable[[Callable[[], Any]], float]:
    def time_ms(fn: Callable[[], Any]) -> float:
        fn()  # warm-up (compiles the Triton kernel)
        per_round = []
        for _ in range(rounds):
            if device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(calls):
                    fn()
                end.record()
                end.synchronize()
                per_round.append(start.elapsed_time(end) / calls)
            else:
                began = time.perf_counter()
                for _ in range(calls):
                    fn()
                per_round.append((time.perf_counter() - began) * 1e3 / calls)
        return statistics.median(per_round)

    return time_ms


def _providers(device: str) -> list[str]:
    interpreting = os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("INFINIOPS_TRITON_INTERPRET_CPU")
    return ["triton", "torch"] if device == "cuda" or interpreting else ["torch"]


def run(batches: list[int], vocab: int, dtype: torch.dtype, calls: int, rounds: int, device: str,
        ks: tuple[int, ...] = (TOP_K,)) -> tuple[list[tuple[str, int, float]], list[str]]:
    """The timings ``(way, batch, ms)`` and the failed checks (a way's name says its top-k when it is not 50)."""
    time_ms = _timer(device, calls, rounds)
    gen = torch.Generator().manual_seed(0)
    rows: list[tuple[str, int, float]] = []
    failures: list[str] = []
    for k in ks:
        for b in batches:
            _batch(b, vocab, dtype, device, gen, time_ms, rows, failures, k)
    return rows, failures


def _batch(b: int, vocab: int, dtype: torch.dtype, device: str, gen: torch.Generator,
           time_ms: Callable[[Callable[[], Any]], float], rows: list[tuple[str, int, float]],
           failures: list[str], k: int = TOP_K) -> None:
    tag = "" if k == TOP_K else f" k{k}"
    logits = (torch.randn(b, vocab, generator=gen) * 4).to(device, dtype)
    temperature = torch.full((b,), TEMPERATURE, device=device)
    top_k = torch.full((b,), k if k > 0 else vocab, dtype=torch.int32, device=device)
    top_p = torch.full((b,), TOP_P, device=device)
    seed = torch.randint(0, 2**62, (b,), generator=gen).to(device)
    offset = torch.zeros(b, dtype=torch.int64, device=device)
    for provider in _providers(device):
        def call(provider: str = provider, t: torch.Tensor = temperature) -> torch.Tensor:
            with ops.use(provider):
                return ops.top_k_top_p_sampling_from_logits(logits, top_k, top_p, temperature=t, seed=seed,
                                                            offset=offset)
        drawn = call().cpu()
        greedy_rows = call(t=torch.zeros_like(temperature)).cpu()
        if bool(((drawn < 0) | (drawn >= vocab)).any()) or not torch.equal(
                greedy_rows.long(), logits.float().argmax(-1).cpu()):
            failures.append(f"{provider}{tag} B={b}: draws out of range or temperature-0 rows not the argmax")
        rows.append((provider + tag, b, time_ms(call)))
    rows.append(("native" + tag, b, time_ms(lambda: native(logits, temperature, top_k, top_p))))
    rows.append(("greedy" + tag, b, time_ms(lambda: logits.argmax(-1))))


def table(rows: list[tuple[str, int, float]], vocab: int, dtype: torch.dtype) -> str:
    by = {(w, b): ms for w, b, ms in rows}
    tag = {w: w[w.index(" "):] if " " in w else "" for w, _, _ in rows}
    lines = [f"sampling [B, {vocab}] {str(dtype).removeprefix('torch.')}, temperature {TEMPERATURE}, top_p {TOP_P}, "
             f"top_k {TOP_K}", f"{'way':10} {'B':>4} {'ms':>9} {'vs native':>10} {'vs greedy':>10}"]
    for way, b, ms in rows:
        native_ms, greedy_ms = by[("native" + tag[way], b)], by[("greedy" + tag[way], b)]
        lines.append(f"{way:10} {b:>4} {ms:>9.4f} {ms / native_ms:>10.2f} {ms / greedy_ms:>10.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,32,64")
    parser.add_argument("--top-k", default="50,0", help="top-k values (0: none, top-p alone)")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    json_option(parser)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for the dry run", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    rows, failures = run([int(b) for b in args.batch.split(",")], args.vocab, dtype, args.calls, args.rounds,
                         args.device, tuple(int(k) for k in args.top_k.split(",")))
    print(table(rows, args.vocab, dtype))
    for failure in failures:
        print(f"FAIL {failure}")
    if args.json:
        write_records(args.json, [record("operator", SOURCE, "top_k_top_p_sampling_from_logits", way,
                                         f"[{b}, {args.vocab}] {args.dtype}", ms=ms,
                                         role="peer" if way in ("native", "greedy") else "ours")
                                  for way, b, ms in rows], args.device)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
