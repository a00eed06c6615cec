"""Measured resolution on the GPU: infinilm's Qwen3-0.6B-shape closure, every implementation timed per bucket.

    python3 benchmarks/gpu_tuning.py                 # on the H200, ~3-6 min; a markdown report on stdout
    python3 benchmarks/gpu_tuning.py --json FILE     # also every row as JSON
    python3 benchmarks/gpu_tuning.py --smoke         # a tiny Qwen3 on the CPU, to try the script

1. Builds the Qwen3-0.6B-shaped checkpoint of benchmarks/gpu_infinilm.py (random bf16 weights) and an engine
   with default options (max_num_seqs 64, max_num_batched_tokens 8192), in a fresh tuning cache
   (``INFINIOPS_CACHE`` set to a temporary folder unless ``--keep-cache``): the build tunes and warms every
   bucket the engine runs (`infinilm.engine.warmup`); its time is reported. A second build then shows the
   reuse of the tuning file (its tuning time should be well under 1 s).
2. For every operator problem the engine's forwards call at prefill 128 to 8192 tokens (powers of two) and decode
   batch 1 to 64 (the CUDA-graph sizes), each accepting implementation is timed again, independently of the
   build's tuning (`infiniops_py.tuning.measure`: CUDA events, L2 flushed, median), and the table shows every
   time, the implementation the resolver chose, the fastest, and whether the chosen is within 5% of the
   fastest (``ok``) or not (``SLOW``).
3. The engine's numbers with default options: batch-1 and batch-32 decode tokens/s and step p50, and prefill
   tokens/s of one 8192-token prompt (`infinilm.bench.run_bench`, steady state after a cold run).

Exit status 1 when a chosen implementation is more than 5% slower than the fastest in some bucket.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from _common import model_device, p50_ms
from gpu_infinilm import QWEN3_0_6B, SMOKE, build

WITHIN: float = 0.05
PREFILL = tuple(1 << i for i in range(7, 14))  # 128 .. 8192
DECODE = (1, 2, 4, 8, 16, 32, 48, 64)


def _rows(engine: Any, prefill: tuple[int, ...], decode: tuple[int, ...]) -> list[dict[str, Any]]:
    """One row per problem bucket the forwards at `prefill` lengths and `decode` batch sizes call."""
    from infinilm.engine.warmup import _decode, _prefill
    from infiniops_py import resolve
    from infiniops_py.tuning import candidates, measure, recording

    rows: list[dict[str, Any]] = []
    seen: set[Any] = set()
    steps = [(f"prefill {n}", functools.partial(_prefill, engine, n)) for n in prefill]
    steps += [(f"decode {b}", functools.partial(_decode, engine, b)) for b in decode]
    with engine._scope():
        for label, step in steps:
            with recording() as calls:
                step()
            for call in calls:
                problem = call.problem
                if problem in seen:
                    continue
                seen.add(problem)
                chosen = resolve(problem)
                times: dict[str, float] = {}
                for impl in candidates(problem):
                    with torch.inference_mode():
                        try:
                            times[impl.name] = measure(functools.partial(impl.fn, *call.args, **call.kwargs),
                                                       problem.device_type)
                        except Exception as err:  # shown in the table
                            times[impl.name] = float("nan")
                            print(f"{impl.name} failed on {problem}: {err}", file=sys.stderr)
                timed = {k: v for k, v in times.items() if v == v}
                fastest = min(timed, key=timed.__getitem__) if timed else chosen.name
                ok = chosen.name not in timed or timed[chosen.name] <= timed[fastest] * (1 + WITHIN)
                rows.append({"step": label, "op": problem.op, "bucket": problem.describe_bucket(),
                             "times_us": {k: v * 1e6 for k, v in times.items()}, "chosen": chosen.name,
                             "fastest": fastest, "ok": ok})
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| first seen at | operator | bucket | implementations (us, fastest first) | chosen | within 5% |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        times = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["times_us"].items(), key=lambda kv: kv[1]))
        lines.append(f"| {r['step']} | {r['op']} | {r['bucket']} | {times or '(one candidate)'} | {r['chosen']} | "
                     f"{'ok' if r['ok'] else 'SLOW'} |")
    return "\n".join(lines)


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, to try the script")
    parser.add_argument("--keep-cache", action="store_true", help="use this machine's tuning cache as it is")
    parser.add_argument("--json", type=Path, help="also write the rows and the numbers to this file")
    args = parser.parse_args(argv)
    device = model_device(args.smoke)
    if device is None:
        return 2
    from infinilm import Engine, EngineOptions
    from infinilm.bench import run_bench

    os.environ["INFINILM_TUNE"] = "1"  # on by default on CUDA; the smoke run on the CPU asks for it
    prefill, decode = (PREFILL, DECODE) if not args.smoke else ((128, 256), (1, 2, 4))
    with tempfile.TemporaryDirectory() as tmp:
        if not args.keep_cache:
            os.environ["INFINIOPS_CACHE"] = str(Path(tmp) / "cache")
        path = Path(tmp) / "qwen3"
        build(path, SMOKE if args.smoke else QWEN3_0_6B, device)
        options = EngineOptions(device=device, dtype=torch.bfloat16,
                                **({"max_num_seqs": 4, "max_model_len": 512, "max_num_batched_tokens": 256}
                                   if args.smoke else {}))
        start = time.perf_counter()
        engine = Engine.from_pretrained(path, options)
        first_build = time.perf_counter() - start
        first = engine.warmup
        import infiniops_py

        infiniops_py.reload()  # a new resolver reads the tuning file, as the next process would
        start = time.perf_counter()
        engine = Engine.from_pretrained(path, options)
        second_build = time.perf_counter() - start
        second = engine.warmup
        rows = _rows(engine, prefill, decode)
        input_len = max(prefill)
        bench1 = run_bench(engine, 1, 128, 128 if not args.smoke else 16)
        bench32 = run_bench(engine, min(32, options.max_num_seqs), 128, 128 if not args.smoke else 16)
        prefill_run = run_bench(engine, 1, input_len - 1, 1)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU smoke run, tiny shape"
    print(f"### measured resolution, Qwen3-0.6B shape (bf16), {where}, torch {torch.__version__}\n")
    print(f"first build: {first_build:.1f} s ({first.summary()})")
    print(f"second build: {second_build:.1f} s ({second.summary()})\n")
    print(_table(rows))
    slow = [r for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(slow)} of {len(rows)} buckets chose an implementation within 5% of the fastest")
    print("\n| engine, default options | value |\n|---|---|")
    print(f"| batch-1 decode (tok/s), step p50 (ms) | {bench1.decode_tokens_per_s:.0f}, "
          f"{p50_ms(bench1.decode_step_seconds):.2f} |")
    print(f"| batch-{bench32.batch} decode (tok/s), step p50 (ms) | {bench32.decode_tokens_per_s:.0f}, "
          f"{p50_ms(bench32.decode_step_seconds):.2f} |")
    print(f"| prefill of one {input_len - 1}-token prompt (tok/s) | {prefill_run.prefill_tokens_per_s:.0f} |")
    print(f"| cold first request, batch 1: prefill / total (ms) | {bench1.cold_prefill_seconds * 1e3:.1f} / "
          f"{(bench1.cold_prefill_seconds + sum(bench1.cold_decode_step_seconds)) * 1e3:.1f} |")
    print(f"\n{engine.graph_status}")
    if args.json:
        args.json.write_text(json.dumps({
            "device": where, "first_build_s": first_build, "second_build_s": second_build,
            "first_tuning_s": first.tuning.seconds, "second_tuning_s": second.tuning.seconds, "rows": rows,
            "batch1": bench1.as_dict(), "batch32": bench32.as_dict(), "prefill": prefill_run.as_dict()}, indent=1))
    return 1 if slow else 0


if __name__ == "__main__":
    sys.exit(main())
