"""GPU benchmark of infinilm on a mamba2-130m-shaped checkpoint against transformers (run on the H200).

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton \
        -e providers/cupy
    python3 benchmarks/gpu_mamba2.py                   # ~2-4 min; prints a markdown table for RESULTS.md
    python3 benchmarks/gpu_mamba2.py --smoke           # a tiny model on the CPU, to try the script itself
    python3 benchmarks/gpu_mamba2.py --json FILE       # also the throughputs as records (benchmarks/plots.py)

1. Builds the published mamba2-130m configuration (written out below) with random weights (seed 0), bf16,
   saved by transformers' ``Mamba2ForCausalLM`` in a temporary directory: the same weights for both. The
   weights come from transformers' own initialization with ``initializer_range=0.02`` (the published config
   does not set it; Qwen3's value): at Mamba2Config's default 0.1 this random 24-layer model is chaotic in
   bf16 (transformers' own bf16 forward is off its fp32 forward by ~6 in the logits and picks the fp32
   argmax at ~47% of positions), which leaves nothing to judge infinilm by.
2. Correctness: prefill logits of two prompts in one packed call (97 and 600 tokens: several scan chunks),
   infinilm (bf16) and transformers (bf16), each against transformers in fp32 on the same weights. PASS
   when infinilm's max error is at most 2x transformers' own bf16 error + 1e-2 and infinilm's argmax equals
   the fp32 argmax at no more than 5 points fewer positions than transformers-bf16's does (random weights
   give near-tied logits; see `infinilm.bench.LogitsCheck`). Decode: 32 greedy steps of each, scored by
   how often transformers-fp32 (a forward over prompt + tokens) picks the same token; PASS when infinilm's
   agreement is at most 5 points below transformers-bf16's own.
3. Speed, bf16, in this same run (transformers runs its PyTorch path: no mamba_ssm or causal_conv1d there):
   prefill of one 2048-token prompt, tokens/s, infinilm (``Engine``, one step, with its prefill replayed as
   a CUDA graph captured for that length, ``prefill_graph_lengths``; and eagerly, for comparison) vs
   transformers' forward (``use_cache=False``, logits of the last token only), median of 5 after 2
   warm-ups, target >= 20x (judged on the CUDA-graph prefill when it captured, else the eager one); and
   batch-1 decode tokens/s, infinilm (CUDA graphs when every operator captures; the status line says) vs
   transformers' ``generate`` (greedy), each as (tokens after the first) / (time after the first),
   target >= 10x.
4. Where the prefill time goes: a ``torch.profiler`` summary of one eager and one graphed infinilm prefill
   (host wall time vs device busy time, blocking host calls, the top 15 kernels, the top host ops), printed
   after the table (`infinilm.profiling.profile_summary`).
Exit status 1 when a PASS/FAIL line fails.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from infinilm import Engine, EngineOptions, SamplingParams
from infinilm.bench import ERR_ATOL, ERR_FACTOR, compare_logits, run_bench
from infinilm.profiling import profile_summary

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when this file is loaded by its path
from _common import hf_generate_tokens_per_s, json_option, model_device, p50_ms, record, write_records

# state-spaces/mamba2-130m config.json (d_model 768, n_layer 24, d_state 128, expand 2, headdim 64,
# ngroups 1, d_conv 4, chunk_size 256, vocab_size 50277 padded to a multiple of 16: 50288, tied embeddings),
# in transformers' Mamba2Config names.
MAMBA2_130M = {
    "hidden_size": 768, "num_hidden_layers": 24, "state_size": 128, "expand": 2, "head_dim": 64, "num_heads": 24,
    "n_groups": 1, "conv_kernel": 4, "chunk_size": 256, "vocab_size": 50288, "tie_word_embeddings": True,
    "layer_norm_epsilon": 1e-5, "residual_in_fp32": True, "use_bias": False, "use_conv_bias": True,
    "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0, "initializer_range": 0.02,
}
SMOKE = {**MAMBA2_130M, "hidden_size": 64, "num_hidden_layers": 2, "state_size": 16, "head_dim": 16, "num_heads": 8,
         "chunk_size": 32, "vocab_size": 512}
PREFILL_TARGET, DECODE_TARGET = 20.0, 10.0


def build(path: Path, shape: dict[str, object], device: str) -> None:
    """Random bf16 weights of `shape`, saved by transformers."""
    from transformers import Mamba2Config, Mamba2ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Mamba2ForCausalLM(Mamba2Config(**shape, dtype="bfloat16")).to(torch.bfloat16)
    model.save_pretrained(str(path))


def hf_model(path: Path, dtype: torch.dtype, device: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None  # generate every step asked for
    return model


def _prompts(vocab: int, lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in lengths]


@torch.no_grad()
def check_prefill(engine: Engine, hf16: torch.nn.Module, hf32: torch.nn.Module) -> tuple[bool, str]:
    prompts = _prompts(engine.config.vocab_size, (97, 600), seed=1)
    theirs, reference = [], []
    for prompt in prompts:
        ids = torch.tensor([prompt], device=engine.device)
        reference.append(hf32(ids).logits[0].float())
        theirs.append(hf16(ids).logits[0].float())
    eager = [o.float() for o in engine.prefill_logits(prompts)]
    check = compare_logits(eager, theirs, reference)
    ok, line = check.ok, check.line("prefill logits")
    graphs = getattr(engine.runner, "prefill_graphs", None)
    if graphs is not None:  # each prompt alone, left-padded to the captured length, last token only
        mine = [graphs.replay(p, 0).float() for p in prompts]  # row 0: free while the engine is idle
        last = compare_logits(mine, [t[-1:] for t in theirs], [r[-1:] for r in reference])
        close = last.err_ours <= ERR_FACTOR * last.err_theirs + ERR_ATOL
        eager_err = max((e[-1:] - r[-1:]).abs().max().item() for e, r in zip(eager, reference))
        line += (f"\n{'PASS' if close else 'FAIL'} prefill CUDA graph (prompts of 97 and 600 tokens left-padded to "
                 f"{graphs.lengths[-1]}), last-token logits vs transformers fp32 (rule: max err <= "
                 f"{ERR_FACTOR:g} x transformers bf16's + {ERR_ATOL:g}): max err graph {last.err_ours:.4f}, eager "
                 f"infinilm {eager_err:.4f}, transformers bf16 {last.err_theirs:.4f}")
        ok = ok and close
    return ok, line


@torch.no_grad()
def check_decode(engine: Engine, hf16: torch.nn.Module, hf32: torch.nn.Module, steps: int = 32) -> tuple[bool, str]:
    prompts = _prompts(engine.config.vocab_size, (40, 9), seed=3)
    ours = engine.generate(prompts, SamplingParams(max_new_tokens=steps, ignore_eos=True))
    scores = {"infinilm": [], "transformers": []}
    for prompt, mine in zip(prompts, ours):
        ids = torch.tensor([prompt], device=engine.device)
        theirs = hf16.generate(ids, max_new_tokens=steps, do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
        for name, tokens in (("infinilm", mine), ("transformers", theirs)):
            full = torch.tensor([prompt + tokens], device=engine.device)
            picks = hf32(full).logits[0, len(prompt) - 1:-1].argmax(-1).tolist()
            scores[name].append(sum(a == b for a, b in zip(picks, tokens)) / steps)
    mine, theirs = statistics.fmean(scores["infinilm"]), statistics.fmean(scores["transformers"])
    ok = mine >= theirs - 0.05
    return ok, (f"{'PASS' if ok else 'FAIL'} {steps} greedy decode steps (2 concurrent requests): transformers "
                f"fp32 picks the same token for {mine:.1%} of infinilm's, {theirs:.1%} of transformers bf16's")


def _median_seconds(fn: Callable[[], object], sync: Callable[[], None], repeats: int = 5) -> float:
    times = []
    for i in range(repeats + 2):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        if i >= 2:  # two warm-ups: kernel compilation and autotuning
            times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def eager_prefill(engine: Engine) -> Iterator[None]:
    """Within the block, lone prompts run eagerly even where a prefill graph was captured."""
    runner = engine.runner
    saved = getattr(runner, "prefill_graphs", None)
    runner.prefill_graphs = None  # type: ignore[union-attr]
    try:
        yield
    finally:
        runner.prefill_graphs = saved  # type: ignore[union-attr]


def _one_prefill(engine: Engine, length: int) -> Callable[[], object]:
    prompt = _prompts(engine.config.vocab_size, (length,), seed=4)[0]
    return lambda: engine.generate([prompt], SamplingParams(max_new_tokens=1))


@torch.no_grad()
def prefill_tokens_per_s(engine: Engine, hf16: torch.nn.Module, length: int) -> tuple[float, float, float]:
    """Tokens/s of infinilm (with its prefill graph when one was captured), infinilm eager, and transformers."""
    ids = torch.tensor(_prompts(engine.config.vocab_size, (length,), seed=4), device=engine.device)
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    one = _one_prefill(engine, length)
    with eager_prefill(engine):
        eager = _median_seconds(one, sync)
    graphed = _median_seconds(one, sync) if getattr(engine.runner, "prefill_graphs", None) is not None else eager
    theirs = _median_seconds(lambda: hf16(ids, use_cache=False, logits_to_keep=1), sync)
    return length / graphed, length / eager, length / theirs


@torch.no_grad()
def prefill_profiles(engine: Engine, length: int) -> str:
    """Profiler summaries of one eager and (when captured) one graphed prefill; run last, since the profiler
    may leave some launch overhead behind."""
    one = _one_prefill(engine, length)
    with eager_prefill(engine):
        profiles = [profile_summary(one, engine.device, title=f"profile: infinilm prefill of {length} tokens, eager")]
    if getattr(engine.runner, "prefill_graphs", None) is not None:
        profiles.append(profile_summary(one, engine.device, title=f"profile: infinilm prefill of {length} tokens, "
                                        "CUDA graph"))
    return "\n\n".join(profiles)


@torch.no_grad()
def hf_decode_tokens_per_s(model: torch.nn.Module, input_len: int, output_len: int) -> float:
    """transformers' generate, batch 1: (output_len - 1) tokens over the time past the first token."""
    ids = torch.tensor(_prompts(model.config.vocab_size, (input_len,), seed=2), device=model.device)
    return hf_generate_tokens_per_s(model, ids, output_len)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefill-len", type=int, default=2048)
    parser.add_argument("--input-len", type=int, default=128, help="prompt of the decode benchmark")
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--hf-output-len", type=int, default=64, help="transformers is slow: fewer tokens")
    parser.add_argument("--no-prefill-graphs", action="store_true", help="do not capture the prefill in a CUDA graph")
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, to try the script")
    json_option(parser)
    args = parser.parse_args(argv)
    device = model_device(args.smoke)
    if device is None:
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        start = time.perf_counter()
        build(path, SMOKE if args.smoke else MAMBA2_130M, device)
        options = EngineOptions(device=device, dtype=torch.bfloat16, num_blocks=4, max_num_seqs=4,
                                max_model_len=max(4096, args.prefill_len + 1),
                                max_num_batched_tokens=max(4096, args.prefill_len),
                                prefill_graph_lengths=() if args.no_prefill_graphs else (args.prefill_len,))
        engine = Engine.from_pretrained(path, options)
        setup = time.perf_counter() - start
        hf16, hf32 = hf_model(path, torch.bfloat16, device), hf_model(path, torch.float32, device)
        ok_prefill, prefill_line = check_prefill(engine, hf16, hf32)
        print(prefill_line)
        ok_decode, decode_line = check_decode(engine, hf16, hf32)
        print(decode_line)
        del hf32
        ours_prefill, eager_prefill, theirs_prefill = prefill_tokens_per_s(engine, hf16, args.prefill_len)
        ours1 = run_bench(engine, 1, args.input_len, args.output_len)
        theirs1 = hf_decode_tokens_per_s(hf16, args.input_len, args.hf_output_len)
        profiles = prefill_profiles(engine, args.prefill_len)
    prefill_x, decode_x = ours_prefill / theirs_prefill, ours1.decode_tokens_per_s / theirs1
    fast_prefill, fast_decode = prefill_x >= PREFILL_TARGET, decode_x >= DECODE_TARGET
    graphed = getattr(engine.runner, "prefill_graphs", None) is not None
    print(f"{'PASS' if fast_prefill else 'FAIL'} prefill {args.prefill_len} tokens speedup {prefill_x:.1f}x, "
          f"{'CUDA-graph' if graphed else 'eager'} prefill (eager: {eager_prefill / theirs_prefill:.1f}x; "
          f"target >= {PREFILL_TARGET:.0f}x)")
    print(f"{'PASS' if fast_decode else 'FAIL'} batch-1 decode speedup {decode_x:.1f}x "
          f"(target >= {DECODE_TARGET:.0f}x)")
    providers = ", ".join(f"{op}={p}" for op, p in engine.plan.providers_by_op().items())
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU smoke run, tiny shape"
    print(f"\n### infinilm, mamba2-130m shape (random weights, initializer_range 0.02, bf16), {where}, "
          f"torch {torch.__version__}\n")
    print(f"decode: input {args.input_len} tokens, infinilm output {args.output_len}, transformers output "
          f"{args.hf_output_len}; {engine.graph_status}; build + gates + load + capture {setup:.0f}s\n")
    print("| metric | infinilm | transformers | ratio |\n|---|---|---|---|")
    print(f"| prefill {args.prefill_len} tokens, batch 1 (tok/s){', CUDA graph' if graphed else ', eager'} | "
          f"{ours_prefill:.0f} | {theirs_prefill:.0f} | {prefill_x:.1f}x |")
    if graphed:
        print(f"| prefill {args.prefill_len} tokens, batch 1 (tok/s), eager | {eager_prefill:.0f} | "
              f"{theirs_prefill:.0f} | {eager_prefill / theirs_prefill:.1f}x |")
    print(f"| batch-1 decode (tok/s) | {ours1.decode_tokens_per_s:.0f} | {theirs1:.0f} | {decode_x:.1f}x |")
    step = p50_ms(ours1.decode_step_seconds)
    print(f"| decode step p50, batch 1 (ms) | {step:.2f} | {1e3 / theirs1:.2f} | |")
    print(f"\nproviders: {providers}")
    print(f"logits: {prefill_line}\ndecode: {decode_line}")
    print(f"\n{profiles}")
    if args.json:
        model = "mamba2-130m shape" if not args.smoke else "mamba2 tiny shape"
        src, n = "benchmarks/gpu_mamba2.py", args.prefill_len
        prefill = f"prefill {n} tokens, batch 1"
        rows = [record("model", src, model, "infinilm", prefill, ms=1e3 * n / ours_prefill, rate=ours_prefill,
                       metric="tok/s", timing="graph replay" if graphed else "eager")]
        if graphed:
            rows.append(record("model", src, model, "infinilm", prefill, ms=1e3 * n / eager_prefill,
                               rate=eager_prefill, metric="tok/s"))
        decode_graphs = "graph replay" if engine.graph_status.startswith("cuda graphs: on") else "eager"
        rows += [
            record("model", src, model, "transformers", prefill, role="peer", ms=1e3 * n / theirs_prefill,
                   rate=theirs_prefill, metric="tok/s"),
            record("model", src, model, "infinilm", "batch-1 decode", ms=step, rate=ours1.decode_tokens_per_s,
                   metric="tok/s", timing=decode_graphs),
            record("model", src, model, "transformers", "batch-1 decode", role="peer", ms=1e3 / theirs1,
                   rate=theirs1, metric="tok/s"),
        ]
        write_records(args.json, rows, device)
    return 0 if ok_prefill and ok_decode and fast_prefill and fast_decode else 1


if __name__ == "__main__":
    sys.exit(main())
