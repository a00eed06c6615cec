"""Speed of Hugging Face ``generate`` with ``kernelize(model)`` against without, Qwen3-0.6B shape (run on the H200).

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton \
        -e providers/cupy
    python3 benchmarks/gpu_kernelize.py [--json FILE]     # ~5-8 min; prints a markdown table for RESULTS.md
    python3 benchmarks/gpu_kernelize.py --tiny --device cpu --repeats 1   # a tiny model on the CPU (~1 min)

1. Builds transformers' ``Qwen3ForCausalLM`` from a ``Qwen3Config`` of Qwen/Qwen3-0.6B's shape (hidden 1024,
   28 layers, 16 query / 8 KV heads, head_dim 128, intermediate 3072, vocab 151936) with random weights
   (transformers' initialization, seed 0), bf16, on the device; ``--tiny`` a 2-layer model of the same family.
2. In this one process, on this one model object: ``generate`` as transformers runs it (its default
   attention, SDPA) and after ``infiniops_py.integrations.transformers.kernelize(model)`` (RMSNorm, the fused
   residual add + norm, the SwiGLU MLP as one gate|up projection and ``silu_and_mul``, RoPE and attention
   through the InfiniOps-Py operators; each decoder layer one forward over one q|k|v projection and
   ``fused_qk_norm_rope``, an unpadded decode step's attention through torch SDPA), switching with the report's
   ``restore()``. Greedy, prompts of random token ids (not 0, the pad id), batch 1 and batch 8, 128 new
   tokens (``min_new_tokens`` too, so an end-of-sequence token does not stop a row early). A full-length
   warm-up of each way first (Triton compiles and autotunes there); then `--repeats` rounds, each timing
   both ways in turn (neither always runs first), of a 1-token and a full-length ``generate``; the medians
   give
   - generate tokens/s: batch x new tokens over the full-length call (prefill included);
   - decode tokens/s: batch x (new tokens - 1) over (full-length time - 1-token time).
3. Prefill only: one forward of 1 x 2048 tokens (``use_cache=False``, the last position's logits), median of
   `--repeats` after two warm-ups, both ways in turn; tokens/s.
3b. transformers' static-cache fast path: ``generate(cache_implementation="static")``, whose decode steps
   transformers compiles itself on CUDA (its default ``CompileConfig``: inductor, ``reduce-overhead``), batch
   sizes ``--static-batches`` (default 1), on two model objects (the plain one and a kernelized copy, each
   keeping its compiled forward), rounds alternating as above after two warm-ups each (the compile and the CUDA
   graph capture); the graph breaks dynamo counted in all are printed.
4. Greedy tokens: the new tokens of the first timed full-length call of each way, compared per row; the
   count of leading tokens that agree is reported (bf16 kernels round differently, and with near-tied random
   logits one different argmax changes every token after it): information, unless ``--strict-tokens`` asks that
   every row agree on its first ``--match-tokens`` (default 8) tokens.
5. Logits: prefill logits at every position of prompts of 97, 256 and 700 tokens, kernelized bf16 and
   transformers bf16, each against transformers in float32 on the same weights; PASS when the kernelized
   model's worst error is at most 2x transformers-bf16's + 1e-2 and its argmax agrees with the float32 model's
   no less often (infinilm's rule, `infinilm.bench.compare_logits`).

Exit status: 0 when the logits check (and with ``--strict-tokens`` the token check) passes, 1 when not, 2 when
the device is not available.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when this file is loaded by its path
from _common import Record, json_option, record, write_records

# Qwen/Qwen3-0.6B config.json, the fields that shape the model.
QWEN3_0_6B: Final = {
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "attention_bias": False,
    "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645,
}
TINY: Final = {**QWEN3_0_6B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "bos_token_id": 510,
               "eos_token_id": 511}
SOURCE: Final = "benchmarks/gpu_kernelize.py"
PLAIN, KERNELIZED = "transformers", "transformers + kernelize"


def build(shape: dict[str, Any], device: str) -> torch.nn.Module:
    """transformers' Qwen3ForCausalLM of `shape`, its own random initialization (seed 0), bf16, eval mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**shape, dtype="bfloat16")).to(torch.bfloat16)
    return model.eval()


class Switch:
    """Puts one model in either way: `PLAIN` (transformers' own code) or `KERNELIZED` (``kernelize(model)``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.report: Any = None

    def __call__(self, way: str) -> None:
        from infiniops_py.integrations.transformers import kernelize

        if way == KERNELIZED and self.report is None:
            self.report = kernelize(self.model).infiniops_kernelized
        elif way == PLAIN and self.report is not None:
            self.report.restore()
            self.report = None


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def timed_generate(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int, **options: Any
                   ) -> tuple[float, torch.Tensor]:
    """Seconds of one greedy ``generate`` of exactly `new_tokens` tokens per row of `ids` (no padding), and
    its new tokens ``[batch, new_tokens]``; `options` go to ``generate`` (the static cache and its compile)."""
    sync = _sync(str(ids.device))
    mask = torch.ones_like(ids)
    sync()
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         do_sample=False, pad_token_id=0, **options)
    sync()
    return time.perf_counter() - start, out[:, ids.shape[1]:]


def timed_forward(model: torch.nn.Module, ids: torch.Tensor) -> float:
    """Seconds of one forward over `ids` without a cache, the last position's logits only."""
    sync = _sync(str(ids.device))
    sync()
    start = time.perf_counter()
    model(ids, use_cache=False, logits_to_keep=1)
    sync()
    return time.perf_counter() - start


def agreeing_prefix(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Per row of the ``[batch, n]`` token tensors `a` and `b`: how many leading tokens are equal."""
    same = (a == b).to(torch.int64)
    return same.cumprod(dim=1).sum(dim=1).tolist()


def bench_generate(model: torch.nn.Module, switch: Switch, batch: int, prompt: int, new_tokens: int, repeats: int,
                   seed: int) -> dict[str, Any]:
    """Both ways' generate and decode tokens/s (medians of `repeats` rounds, after a warm-up each), their
    median seconds per full-length call and the per-row count of agreeing leading tokens."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, prompt), generator=gen).to(model.device)
    for way in (PLAIN, KERNELIZED):
        switch(way)
        timed_generate(model, ids, new_tokens)  # warm-up: compiles, autotunes, allocates
    full: dict[str, list[float]] = {PLAIN: [], KERNELIZED: []}
    first: dict[str, list[float]] = {PLAIN: [], KERNELIZED: []}
    tokens: dict[str, torch.Tensor] = {}
    for r in range(repeats):
        for way in (PLAIN, KERNELIZED) if r % 2 == 0 else (KERNELIZED, PLAIN):
            switch(way)
            first[way].append(timed_generate(model, ids, 1)[0])
            seconds, out = timed_generate(model, ids, new_tokens)
            full[way].append(seconds)
            tokens.setdefault(way, out)
    return _rates(batch, new_tokens, full, first, tokens, label=f"batch {batch}")


def static_options(device: str) -> dict[str, Any]:
    """``generate``'s options for transformers' static-cache fast path: ``cache_implementation="static"``, whose
    decode steps transformers compiles itself on CUDA (its default ``CompileConfig``: inductor, CUDA graphs);
    elsewhere (the CPU dry run) the same compile is asked for explicitly, without CUDA graphs."""
    from transformers import CompileConfig

    options: dict[str, Any] = {"cache_implementation": "static"}
    if not device.startswith("cuda"):
        config = CompileConfig(mode="default")
        config._compile_all_devices = True
        options["compile_config"] = config
    return options


def bench_static(models: dict[str, torch.nn.Module], batch: int, prompt: int, new_tokens: int, repeats: int,
                 seed: int) -> dict[str, Any]:
    """`bench_generate` over transformers' static cache and its compiled decode (`static_options`), one model
    object per way (each keeps its own compiled forward), the rounds alternating which way runs first."""
    first_model = models[PLAIN]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, first_model.config.vocab_size, (batch, prompt), generator=gen).to(first_model.device)
    options = static_options(str(first_model.device))
    for way in (PLAIN, KERNELIZED):
        for _ in range(2):  # warm-up: the compile (and CUDA graph capture) of the decode step
            timed_generate(models[way], ids, new_tokens, **options)
    full: dict[str, list[float]] = {PLAIN: [], KERNELIZED: []}
    first: dict[str, list[float]] = {PLAIN: [], KERNELIZED: []}
    tokens: dict[str, torch.Tensor] = {}
    for r in range(repeats):
        for way in (PLAIN, KERNELIZED) if r % 2 == 0 else (KERNELIZED, PLAIN):
            first[way].append(timed_generate(models[way], ids, 1, **options)[0])
            seconds, out = timed_generate(models[way], ids, new_tokens, **options)
            full[way].append(seconds)
            tokens.setdefault(way, out)
    return _rates(batch, new_tokens, full, first, tokens, label=f"static cache, compiled, batch {batch}")


def _rates(batch: int, new_tokens: int, full: dict[str, list[float]], first: dict[str, list[float]],
           tokens: dict[str, torch.Tensor], *, label: str) -> dict[str, Any]:
    """Per way: generate and decode tokens/s from the medians of the full-length and 1-token calls; and the rows'
    agreeing leading tokens."""
    result: dict[str, Any] = {"batch": batch, "label": label, "distinct": len(torch.unique(tokens[PLAIN])),
                              "agree": agreeing_prefix(tokens[PLAIN], tokens[KERNELIZED])}
    for way in (PLAIN, KERNELIZED):
        t_full, t_first = statistics.median(full[way]), statistics.median(first[way])
        result[way] = {"generate": batch * new_tokens / t_full, "generate_ms": t_full * 1e3,
                       "decode": batch * (new_tokens - 1) / (t_full - t_first) if t_full > t_first else float("nan"),
                       "step_ms": (t_full - t_first) / (new_tokens - 1) * 1e3 if new_tokens > 1 else float("nan")}
    return result


def bench_prefill(model: torch.nn.Module, switch: Switch, length: int, repeats: int, seed: int) -> dict[str, float]:
    """Both ways' median seconds of a 1 x `length` forward (two warm-ups each first)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, model.config.vocab_size, (1, length), generator=gen).to(model.device)
    for way in (PLAIN, KERNELIZED):
        switch(way)
        for _ in range(2):
            timed_forward(model, ids)
    times: dict[str, list[float]] = {PLAIN: [], KERNELIZED: []}
    for r in range(repeats):
        for way in (PLAIN, KERNELIZED) if r % 2 == 0 else (KERNELIZED, PLAIN):
            switch(way)
            times[way].append(timed_forward(model, ids))
    return {way: statistics.median(t) for way, t in times.items()}


def table(generates: list[dict[str, Any]], prefill: dict[str, float], prefill_len: int) -> str:
    """The markdown table: tokens/s without and with kernelize, and the ratio."""
    lines = [f"| metric | {PLAIN} | {KERNELIZED} | speedup |", "|---|---|---|---|"]

    def line(label: str, a: float, b: float) -> None:
        lines.append(f"| {label} | {a:.0f} | {b:.0f} | {b / a:.2f}x |")

    for g in generates:
        line(f"generate, {g['label']} (tok/s, prefill included)", g[PLAIN]["generate"], g[KERNELIZED]["generate"])
        line(f"decode, {g['label']} (tok/s)", g[PLAIN]["decode"], g[KERNELIZED]["decode"])
    line(f"prefill 1 x {prefill_len} forward (tok/s)", prefill_len / prefill[PLAIN], prefill_len / prefill[KERNELIZED])
    return "\n".join(lines)


def token_line(generates: list[dict[str, Any]], new_tokens: int, need: int) -> tuple[bool, str]:
    """The PASS/FAIL line of the greedy-token check: every row's agreeing leading tokens >= `need`."""
    parts, ok = [], True
    for g in generates:
        agree = g["agree"]
        ok = ok and min(agree) >= min(need, new_tokens)
        parts.append(f"{g['label']}: first {min(agree)} of {new_tokens} tokens agree in every row (per row: "
                     f"{', '.join(map(str, agree))}; {g['distinct']} distinct tokens generated)")
    return ok, (f"{'PASS' if ok else 'FAIL'} greedy tokens with and without kernelize (rule: every row's first "
                f"{need} agree): " + "; ".join(parts))


def records(model_name: str, generates: list[dict[str, Any]], prefill: dict[str, float], prompt: int,
            new_tokens: int, prefill_len: int) -> list[Record]:
    """The table's numbers as records (eager rows: neither way captures CUDA graphs; the static-cache rows are
    transformers' compiled decode)."""
    out = []
    for way in (PLAIN, KERNELIZED):
        role = "ours" if way == KERNELIZED else "peer"
        for g in generates:
            m, label = g[way], g["label"]
            out.append(record("model", SOURCE, model_name, way, f"generate {label}, prompt {prompt}, "
                              f"{new_tokens} new", role=role, ms=m["generate_ms"], rate=m["generate"], metric="tok/s"))
            out.append(record("model", SOURCE, model_name, way, f"decode {label}", role=role, ms=m["step_ms"],
                              rate=m["decode"], metric="tok/s"))
        out.append(record("model", SOURCE, model_name, way, f"prefill 1 x {prefill_len} forward", role=role,
                          ms=prefill[way] * 1e3, rate=prefill_len / prefill[way], metric="tok/s"))
    return out


def check_logits(model: torch.nn.Module, switch: Switch, lengths: tuple[int, ...], seed: int) -> tuple[bool, str]:
    """Prefill logits at every position of one prompt per length: kernelized bf16 against transformers' bf16,
    both against transformers in float32 (a float32 copy of the same weights) as the reference, with infinilm's
    rule (`infinilm.bench.compare_logits`: the kernelized model's worst error at most 2x transformers-bf16's +
    1e-2, and its argmax agreeing with the reference no less often). Returns (ok, the report line)."""
    import copy

    from infinilm.bench import compare_logits

    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, model.config.vocab_size, (1, n), generator=gen).to(model.device) for n in lengths]
    switch(PLAIN)
    reference_model = copy.deepcopy(model).float()
    reference = [reference_model(ids).logits[0].float() for ids in prompts]
    del reference_model
    theirs = [model(ids).logits[0].float() for ids in prompts]
    switch(KERNELIZED)
    ours = [model(ids).logits[0].float() for ids in prompts]
    switch(PLAIN)
    check = compare_logits(ours, theirs, reference)
    return check.ok, check.line("logits of kernelized bf16").replace("infinilm", "kernelized")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="where the model runs (default cuda)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of the same family (and shorter runs)")
    parser.add_argument("--batches", type=_positive, nargs="+", default=None, help="generate batch sizes (1 8)")
    parser.add_argument("--static-batches", type=int, nargs="*", default=None,
                        help="batch sizes of the static-cache compiled decode (default 1; none to skip it: each "
                             "batch size compiles both ways)")
    parser.add_argument("--prompt-len", type=_positive, default=None, help="prompt tokens (128; --tiny 16)")
    parser.add_argument("--new-tokens", type=_positive, default=None, help="tokens generated (128; --tiny 8)")
    parser.add_argument("--prefill-len", type=_positive, default=None, help="prefill forward tokens (2048; --tiny 64)")
    parser.add_argument("--repeats", type=_positive, default=3, help="timed rounds, medians kept (default 3)")
    parser.add_argument("--match-tokens", type=_positive, default=8, help="leading greedy tokens that must agree")
    parser.add_argument("--strict-tokens", action="store_true",
                        help="fail when greedy tokens disagree early (random bf16 weights give near-tied logits, so "
                             "by default the logits check decides and the token count is information)")
    json_option(parser)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_kernelize: needs a CUDA device (or --device cpu)", file=sys.stderr)
        return 2
    batches = args.batches or ([1, 2] if args.tiny else [1, 8])
    static_batches = [1] if args.static_batches is None else args.static_batches
    if any(b < 1 for b in static_batches):
        parser.error(f"--static-batches: every batch size must be >= 1, got {static_batches}")
    prompt = args.prompt_len or (16 if args.tiny else 128)
    new_tokens = args.new_tokens or (8 if args.tiny else 128)
    prefill_len = args.prefill_len or (64 if args.tiny else 2048)
    model_name = "Qwen3 tiny shape" if args.tiny else "Qwen3-0.6B shape"
    start = time.perf_counter()
    model = build(TINY if args.tiny else QWEN3_0_6B, args.device)
    switch = Switch(model)
    attention = getattr(model.config, "_attn_implementation", "?")
    second = None
    if static_batches:  # made before inference mode: its parameters stay ordinary tensors
        import copy

        from infiniops_py.integrations.transformers import kernelize

        second = kernelize(copy.deepcopy(model))
    with torch.inference_mode():
        generates = [bench_generate(model, switch, b, prompt, new_tokens, args.repeats, seed=b) for b in batches]
        prefill = bench_prefill(model, switch, prefill_len, args.repeats, seed=0)
        logits_ok, logits = check_logits(model, switch, (13, 40) if args.tiny else (97, 256, 700), seed=7)
        switch(KERNELIZED)
        report = switch.report.render()
        switch(PLAIN)
        if static_batches:  # a second model object: each way keeps its own compiled decode
            models = {PLAIN: model, KERNELIZED: second}
            generates += [bench_static(models, b, prompt, new_tokens, args.repeats, seed=b) for b in static_batches]
            del models
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    tokens_ok, tokens = token_line(generates, new_tokens, args.match_tokens)
    ok = logits_ok and (tokens_ok or not args.strict_tokens)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"\n### transformers generate with and without kernelize, {model_name} (random weights, bf16), {where}, "
          f"torch {torch.__version__}\n")
    print(f"greedy; prompt {prompt} tokens, {new_tokens} new tokens; medians of {args.repeats} rounds after a "
          f"warm-up; transformers' attention without kernelize: {attention}; {time.perf_counter() - start:.0f} s "
          "in all\n")
    print(table(generates, prefill, prefill_len))
    print(f"\n{logits}\n{tokens}{'' if args.strict_tokens else ' (information only)'}")
    if static_batches:
        print(f"graph breaks in the compiled decode steps (both ways): {breaks}")
    print(f"\n{report}")
    if args.json:
        write_records(args.json, records(model_name, generates, prefill, prompt, new_tokens, prefill_len),
                      args.device)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
