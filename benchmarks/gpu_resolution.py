"""Measured resolution against forced providers and transformers, infinilm on the Qwen3-0.6B shape (run on the H200).

    python3 benchmarks/gpu_resolution.py [--json FILE]    # ~3-4 min; a markdown table on stdout
    python3 benchmarks/gpu_resolution.py --smoke          # a tiny Qwen3 on the CPU, to try the script

In one process, on one random-weight bf16 checkpoint (benchmarks/gpu_infinilm.py's `build`), one engine per
configuration, built and benchmarked in turn (each freed before the next):

- ``measured``: default options (the build tunes its closure in a fresh tuning cache and the resolver ranks by
  the times);
- ``priority``: no measurement (``INFINIOPS_TUNING=off``, ``INFINILM_TUNE=0``), the fixed priority order;
- forced combinations, without measurement: ``gemm=torch``, ``gemm=cupy``, every operator ``torch``.

Per configuration (`infinilm.bench.run_bench`, CUDA graphs as the engine decides): batch-1 decode tokens/s
(128-token prompt, 128 new tokens), prefill tokens/s of one 4096-token prompt, and the cold first request
(the first run after the build) against the steady state. Then transformers' own eager forward of the same
4096 tokens (bf16, its default attention), median of 3 after a warm-up, and a second build of ``measured``
(its tuning time: the file of the first is reused).

Checks printed as PASS/FAIL: measured batch-1 decode >= the best forced configuration's; measured 1 x 4096
prefill >= 1.2x transformers'; measured cold first request (prefill + decode) within 1.5x of the steady state;
second build's tuning under 1 s. Exit status 1 when one fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from gpu_infinilm import QWEN3_0_6B, SMOKE, build, hf_model

CONFIGS: tuple[tuple[str, bool, tuple[tuple[str | None, str], ...]], ...] = (
    ("measured", True, ()),
    ("priority", False, ()),
    ("gemm=torch", False, (("gemm", "torch"),)),
    ("gemm=cupy", False, (("gemm", "cupy"),)),
    ("all torch", False, ((None, "torch"),)),
)


def _engine(path: Path, device: str, tuned: bool, providers: tuple[tuple[str | None, str], ...],
            smoke: bool) -> tuple[Any, float]:
    import infiniops_py
    from infinilm import Engine, EngineOptions

    os.environ["INFINILM_TUNE"] = "1" if tuned else "0"
    os.environ["INFINIOPS_TUNING"] = "" if tuned else "off"
    infiniops_py.reload()
    options = EngineOptions(device=device, dtype=torch.bfloat16, providers=providers,
                            **({"max_num_seqs": 4, "max_model_len": 512, "max_num_batched_tokens": 256}
                               if smoke else {"max_model_len": 4224}))
    start = time.perf_counter()
    engine = Engine.from_pretrained(path, options)
    return engine, time.perf_counter() - start


def _free(engine: Any) -> None:
    engine.close()
    del engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _hf_prefill(path: Path, device: str, length: int) -> float:
    model = hf_model(path, torch.bfloat16, device)
    ids = torch.randint(1, model.config.vocab_size, (1, length), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    with torch.inference_mode():
        for n in range(5):
            sync()
            start = time.perf_counter()
            model(ids, use_cache=False, logits_to_keep=1)
            sync()
            if n >= 2:
                times.append(time.perf_counter() - start)
    del model
    gc.collect()
    return length / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, to try the script")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_resolution: needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    from infinilm.bench import run_bench

    prompt, new, long = (16, 8, 128) if args.smoke else (128, 128, 4096)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["INFINIOPS_CACHE"] = str(Path(tmp) / "cache")
        path = Path(tmp) / "qwen3"
        build(path, SMOKE if args.smoke else QWEN3_0_6B, device)
        for name, tuned, providers in CONFIGS:
            if args.smoke and "cupy" in name:
                continue
            engine, built = _engine(path, device, tuned, providers, args.smoke)
            decode = run_bench(engine, 1, prompt, new)
            prefill = run_bench(engine, 1, long, 1)
            warm = engine.warmup
            rows.append({"config": name, "build_s": built, "tuning_s": warm.tuning.seconds if warm.ran else 0.0,
                         "decode_tok_s": decode.decode_tokens_per_s, "prefill_tok_s": prefill.prefill_tokens_per_s,
                         "cold_ms": 1e3 * (decode.cold_prefill_seconds + sum(decode.cold_decode_step_seconds)),
                         "steady_ms": 1e3 * (decode.prefill_seconds + statistics.median(decode.decode_step_seconds)
                                             * len(decode.cold_decode_step_seconds)),
                         })
            _free(engine)
        hf = _hf_prefill(path, device, long)
        engine, second_build = _engine(path, device, True, (), args.smoke)
        second_tuning = engine.warmup.tuning.seconds if engine.warmup.ran else 0.0
        second_summary = engine.warmup.summary()
        _free(engine)
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU smoke run, tiny shape"
    print(f"### measured resolution against forced providers, Qwen3-0.6B shape (bf16), {where}, torch "
          f"{torch.__version__}, {time.strftime('%Y-%m-%d')}\n")
    print(f"| configuration | build (s) | tuning (s) | batch-1 decode (tok/s) | 1 x {long} prefill (tok/s) | "
          "cold first request / steady (ms) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['build_s']:.1f} | {r['tuning_s']:.2f} | {r['decode_tok_s']:.0f} | "
              f"{r['prefill_tok_s']:.0f} | {r['cold_ms']:.1f} / {r['steady_ms']:.1f} |")
    print(f"| transformers eager forward | - | - | - | {hf:.0f} | - |\n")
    measured = rows[0]
    forced = [r for r in rows[1:]]
    best = max(forced, key=lambda r: r["decode_tok_s"])
    checks = [
        (measured["decode_tok_s"] >= best["decode_tok_s"],
         f"batch-1 decode: measured {measured['decode_tok_s']:.0f} tok/s vs the best other configuration "
         f"({best['config']}) {best['decode_tok_s']:.0f}"),
        (measured["prefill_tok_s"] >= 1.2 * hf,
         f"1 x {long} prefill: measured {measured['prefill_tok_s']:.0f} tok/s = "
         f"{measured['prefill_tok_s'] / hf:.2f}x transformers' {hf:.0f} (target >= 1.2x)"),
        (measured["cold_ms"] <= 1.5 * measured["steady_ms"],
         f"first request after the build: {measured['cold_ms']:.1f} ms = "
         f"{measured['cold_ms'] / measured['steady_ms']:.2f}x the steady state (target <= 1.5x)"),
        (second_tuning < 1.0, f"second build: {second_build:.1f} s, tuning {second_tuning:.2f} s (target < 1 s): "
                              f"{second_summary}"),
    ]
    for ok, line in checks:
        print(f"{'PASS' if ok else 'FAIL'} {line}")
    if args.json:
        args.json.write_text(json.dumps({"device": where, "rows": rows, "transformers_prefill_tok_s": hf,
                                         "second_build_s": second_build, "second_tuning_s": second_tuning},
                                        indent=1) + "\n")
    return 0 if all(ok for ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
