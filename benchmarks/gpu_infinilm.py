"""GPU benchmark of infinilm on a Qwen3-0.6B-shaped checkpoint against transformers (run on the H200).

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton \
        -e providers/cupy
    python3 benchmarks/gpu_infinilm.py                 # ~2-4 min; prints a markdown table for RESULTS.md
    python3 benchmarks/gpu_infinilm.py --json FILE     # also the throughputs as records (benchmarks/plots.py)

1. Builds the published Qwen3-0.6B configuration (written out below) with random weights (seed 0), bf16,
   and saves it as safetensors in a temporary directory: the same weights for both engines.
2. Correctness: prefill logits at every position of three prompts (97, 256 and 700 tokens), infinilm (bf16)
   and transformers (bf16), each against transformers in fp32 on the same weights (transformers' own
   initialization, initializer_range 0.02, so activations stay in a sane range). PASS when infinilm's max
   error is at most 2x transformers' own bf16 error + 1e-2 (FlashAttention's low-precision rule applied to
   the whole model), and infinilm's argmax equals the fp32 argmax at no more than 5 points fewer positions
   than transformers-bf16's does (random weights give near-tied logits: an absolute agreement threshold is
   meaningless, what bf16 itself achieves is the yardstick). See `infinilm.bench.LogitsCheck`.
3. Speed, bf16, in this same run: batch-1 decode tokens/s of infinilm (CUDA graphs when every operator
   captures; the status line says) and of ``transformers``' own ``generate`` (greedy, dynamic cache), each
   measured as (tokens after the first) / (time after the first); target infinilm >= 10x. Then batch-32
   decode throughput of both, and infinilm's prefill throughput.
Exit status 1 when a PASS/FAIL line fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from infinilm import Engine, EngineOptions
from infinilm.bench import compare_logits, count_decode_step, run_bench

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when this file is loaded by its path
from _common import hf_generate_tokens_per_s, json_option, model_device, p50_ms, record, write_records

# Qwen/Qwen3-0.6B config.json, the fields that shape the model.
QWEN3_0_6B = {
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "attention_bias": False,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645,
}
# --smoke: a tiny model of the same family, to try the script itself on a CPU.
SMOKE = {**QWEN3_0_6B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "bos_token_id": 510,
         "eos_token_id": 511}
SPEEDUP_TARGET = 10.0


def build(path: Path, shape: dict[str, object], device: str) -> None:
    """Random bf16 weights of `shape`, saved by transformers."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(**shape, dtype="bfloat16")
    with torch.device(device):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(path))


def hf_model(path: Path, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()


@torch.no_grad()
def check_logits(engine: Engine, hf16: torch.nn.Module, hf32: torch.nn.Module) -> tuple[bool, str]:
    gen = torch.Generator().manual_seed(1)
    vocab = engine.config.vocab_size
    lengths = (97, 256, 700) if engine.device.type == "cuda" else (9, 30)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    ours = engine.prefill_logits(prompts)
    theirs, reference = [], []
    for prompt in prompts:
        ids = torch.tensor([prompt], device=engine.device)
        reference.append(hf32(ids).logits[0].float())
        theirs.append(hf16(ids).logits[0].float())
    check = compare_logits([o.float() for o in ours], theirs, reference)
    return check.ok, check.line("logits")


@torch.no_grad()
def hf_decode_tokens_per_s(model: torch.nn.Module, batch: int, input_len: int, output_len: int) -> float:
    """transformers' generate: (output_len - 1) tokens per row over the time past the first token.

    Prompts avoid token 0, the pad id, so that generate sees no padding."""
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, model.config.vocab_size, (batch, input_len), generator=gen).to(model.device)
    return hf_generate_tokens_per_s(model, ids, output_len, min_new_tokens=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--hf-output-len", type=int, default=64, help="transformers is slow: fewer tokens")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, to try the script")
    json_option(parser)
    args = parser.parse_args(argv)
    device = model_device(args.smoke)
    if device is None:
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        start = time.perf_counter()
        build(path, SMOKE if args.smoke else QWEN3_0_6B, device)
        options = EngineOptions(device=device, dtype=torch.bfloat16, block_size=16, max_num_seqs=32,
                                max_model_len=1024, max_num_batched_tokens=32 * args.input_len)
        engine = Engine.from_pretrained(path, options)
        setup = time.perf_counter() - start
        hf16, hf32 = hf_model(path, torch.bfloat16, device), hf_model(path, torch.float32, device)
        ok, line = check_logits(engine, hf16, hf32)
        del hf32
        print(line)
        ours1 = run_bench(engine, 1, args.input_len, args.output_len)
        ours32 = run_bench(engine, 32, args.input_len, args.output_len)
        counts = [count_decode_step(engine, b, args.input_len) for b in (1, 32)]
        theirs1 = hf_decode_tokens_per_s(hf16, 1, args.input_len, args.hf_output_len)
        theirs32 = hf_decode_tokens_per_s(hf16, 32, args.input_len, args.hf_output_len)
    speedup = ours1.decode_tokens_per_s / theirs1
    fast = speedup >= SPEEDUP_TARGET
    print(f"{'PASS' if fast else 'FAIL'} batch-1 decode speedup {speedup:.1f}x (target >= {SPEEDUP_TARGET:.0f}x)")
    providers = ", ".join(f"{op}={p}" for op, p in engine.plan.providers_by_op().items())
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU smoke run, tiny shape"
    print(f"\n### infinilm, Qwen3-0.6B shape (random weights, bf16), {where}, torch {torch.__version__}\n")
    print(f"input {args.input_len} tokens; infinilm output {args.output_len}, transformers output "
          f"{args.hf_output_len}; {engine.graph_status}; build + gates + load + capture {setup:.0f}s\n")
    print("| metric | infinilm | transformers generate | ratio |\n|---|---|---|---|")
    print(f"| batch-1 decode (tok/s) | {ours1.decode_tokens_per_s:.0f} | {theirs1:.0f} | {speedup:.1f}x |")
    ratio32 = ours32.decode_tokens_per_s / theirs32
    print(f"| batch-32 decode (tok/s) | {ours32.decode_tokens_per_s:.0f} | {theirs32:.0f} | {ratio32:.1f}x |")
    step1, step32 = p50_ms(ours1.decode_step_seconds), p50_ms(ours32.decode_step_seconds)
    print(f"| decode step p50, batch 1 / 32 (ms) | {step1:.2f} / {step32:.2f} | | |")
    print(f"| prefill, batch 32 (tok/s) | {ours32.prefill_tokens_per_s:.0f} | | |")
    print(f"\nproviders: {providers}")
    for count in counts:
        print(count.line())
    print(f"logits: {line}")
    if args.json:
        model = "Qwen3-0.6B shape" if not args.smoke else "Qwen3 tiny shape"
        graphs = "graph replay" if engine.graph_status.startswith("cuda graphs: on") else "eager"
        src = "benchmarks/gpu_infinilm.py"
        write_records(args.json, [
            record("model", src, model, "infinilm", "batch-1 decode", ms=step1, rate=ours1.decode_tokens_per_s,
                   metric="tok/s", timing=graphs),
            record("model", src, model, "transformers", "batch-1 decode", role="peer", ms=1e3 / theirs1,
                   rate=theirs1, metric="tok/s"),
            record("model", src, model, "infinilm", "batch-32 decode", ms=step32, rate=ours32.decode_tokens_per_s,
                   metric="tok/s", timing=graphs),
            record("model", src, model, "transformers", "batch-32 decode", role="peer", ms=32e3 / theirs32,
                   rate=theirs32, metric="tok/s"),
            record("model", src, model, "infinilm", "batch-32 prefill", rate=ours32.prefill_tokens_per_s,
                   metric="tok/s"),
        ], device)
    return 0 if ok and fast else 1


if __name__ == "__main__":
    sys.exit(main())
