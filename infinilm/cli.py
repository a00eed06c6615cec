"""The ``infinilm`` console script: ``generate``, ``check``, ``bench``, ``demo``, ``serve`` and ``bench-serve``.

Exit status: 0 on success, 1 when the gates reject the configuration (the gate report is printed and no
weight has been read), 2 for any other user error (a bad option, an unsupported config, a checkpoint that
does not fit the model, a tensor-parallel rank that failed).

``--tensor-parallel-size N`` splits the model across N processes, which the command starts itself (this one is
rank 0: the scheduler, the sampling and the output; the others stop when it exits). Under ``torchrun
--nproc-per-node N infinilm ...`` every process runs the command: rank 0 does the command's work, the others
load their shard and follow its steps.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence

from infinilm.config import ConfigError, EngineOptions, parse_dtype
from infinilm.distributed.launch import FollowerError
from infinilm.engine.gates import gate_report, parse_provider_overrides, plan
from infinilm.engine.kv_cache import CacheError
from infinilm.engine.loader import LoadError
from infinilm.models.registry import read_config
from infiniops_py import GateError

__all__ = ["main"]

# the first line of `infinilm --help`: plain text (the module doc's first line is reStructuredText)
_DESCRIPTION = ("Run Hugging Face checkpoints (Llama, Qwen2, Qwen3, Mistral, GLM-4, Gemma 2, Mamba-2) through the "
                "InfiniOps-Py operators: generate text, check a checkpoint, benchmark, serve an OpenAI-compatible "
                "API.")
_LLM_EXTRA = ("transformers", "safetensors", "tokenizers", "tqdm")  # the `llm` extra of pyproject.toml


def _engine_args(p: argparse.ArgumentParser, *, model: bool = True) -> None:
    if model:
        p.add_argument("--model", required=True, help="checkpoint directory (config.json + safetensors)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default: cpu)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block (default: 16)")
    p.add_argument("--num-blocks", type=int, default=None, help="KV-cache blocks (default: sized from memory)")
    p.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output (default: config's)")
    p.add_argument("--provider", action="append", default=[], metavar="OP=NAME",
                   help="force a provider for an operator (or NAME for all); repeatable")
    p.add_argument("--qk-norm", choices=("auto", "fused", "per_head"), default="auto",
                   help="Qwen3 q/k norm path (default: fused where a provider serves it)")
    p.add_argument("--add-norm", choices=("separate", "fused", "prologue"), default="separate",
                   help="the o/down (Mamba-2: out_proj) projections and the residual add + norm after them: "
                        "separate kernels (default, faster on the H200), one gemm_add_rms_norm, or each norm in "
                        "the next projection's prologue (rms_norm_gemm; o/down add the residual as the Gemm's c)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run decode steps eagerly on CUDA")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="launch each decode step before reading the last one's tokens, overlapping the host's work "
                        "with the device's (vLLM's flag; default: on CUDA, off on the CPU)")
    p.add_argument("--prefill-graph-lengths", type=int, nargs="+", default=(), metavar="N",
                   help="Mamba-2 on CUDA: capture the prefill of a lone prompt as CUDA graphs at these lengths")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split the model across N processes, one per device (default: 1)")


def _options(args: argparse.Namespace, **extra: int) -> EngineOptions:
    try:
        providers = parse_provider_overrides(args.provider)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return EngineOptions(
        device=args.device, dtype=parse_dtype(args.dtype) if args.dtype else None, block_size=args.block_size,
        num_blocks=args.num_blocks, max_model_len=args.max_model_len, providers=providers, qk_norm=args.qk_norm,
        add_norm=args.add_norm,
        cuda_graphs=not args.no_cuda_graphs, prefill_graph_lengths=tuple(args.prefill_graph_lengths),
        tensor_parallel_size=args.tensor_parallel_size, async_scheduling=args.async_scheduling, **extra,
    )


def _command_options(args: argparse.Namespace) -> EngineOptions:
    """The engine options of the command (the same on every tensor-parallel rank)."""
    if args.command == "bench":
        return _options(args, max_num_seqs=args.batch, max_num_batched_tokens=max(8192, args.batch * args.input_len))
    if args.command == "serve":
        return _options(args, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens)
    if args.command in ("generate", "demo"):
        return _options(args, max_num_seqs=1)
    return _options(args)


def _parser() -> argparse.ArgumentParser:
    from infiniops_py import __version__

    parser = argparse.ArgumentParser(prog="infinilm", description=_DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"infinilm (infiniops-py {__version__})")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text (or token ids) from a prompt, streaming")
    _engine_args(gen)
    gen.add_argument("--prompt", required=True, help="text (or space-separated token ids without tokenizer.json)")
    _sampling_args(gen)
    chk = sub.add_parser("check", help="the operator closure and its providers, or the gate report; then the "
                         "checkpoint's index and tensor headers against the model; reads no tensor data")
    _engine_args(chk)
    bench = sub.add_parser("bench", help="prefill and decode throughput and latency")
    _engine_args(bench)
    bench.add_argument("--batch", type=int, default=1)
    bench.add_argument("--input-len", type=int, default=128)
    bench.add_argument("--output-len", type=int, default=128)
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--repeats", type=int, default=3, help="steady-state runs after the cold one (default 3)")
    bench.add_argument("--json", metavar="FILE", help="also write the result (and the engine's status) to FILE")
    demo = sub.add_parser("demo", help="build a small Qwen3 checkpoint under the user cache dir and generate from it")
    _engine_args(demo, model=False)
    demo.add_argument("--prompt", default="InfiniOps")
    _sampling_args(demo, max_new_tokens=256)
    from infinilm.serve.commands import add_bench_serve_args, add_serve_args

    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, chat, streaming, metrics)")
    _engine_args(srv)
    add_serve_args(srv)
    add_bench_serve_args(sub.add_parser("bench-serve", help="load an OpenAI-compatible server: throughput, TTFT, ITL"))
    return parser


def _sampling_args(p: argparse.ArgumentParser, max_new_tokens: int = 64) -> None:
    p.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    p.add_argument("--temperature", type=_finite_float, default=0.0, help="0: greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=_finite_float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")


def _finite_float(text: str) -> float:
    """An argparse type: a float that is neither nan nor infinite (argparse's ``float`` takes both)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _check(args: argparse.Namespace) -> int:
    from infinilm.engine import Engine
    from infinilm.engine.checks import check_options, describe

    config = read_config(args.model)
    options = _options(args)
    check_options(config, options)
    gate_plan = plan(config, options)
    checkpoint = Engine.check_checkpoint(args.model, config, options, gate_plan)  # headers only, as generate
    print(f"{args.model}: {describe(config, options)}; the {len(checkpoint.headers)} tensor headers of "
          f"{len(checkpoint.files)} safetensors file(s) fit the model; every operator problem is served:")
    print(gate_plan.render())
    return 0


def _generate(args: argparse.Namespace, model: str, *, echo_prompt: bool = False) -> int:
    from infinilm.engine import Engine, check_prompt
    from infinilm.engine.sequence import SamplingParams
    from infinilm.tokenizer import StreamDecoder, load_tokenizer

    config = read_config(model)  # a missing or bad checkpoint is named before its tokenizer
    tokenizer = load_tokenizer(model)
    if tokenizer is not None:
        prompt = tokenizer.encode(args.prompt).ids
    else:
        try:
            prompt = [int(t) for t in args.prompt.replace(",", " ").split()]
        except ValueError:
            raise ConfigError(
                f"{model} has no tokenizer.json: --prompt must be token ids, got {args.prompt!r}") from None
    prompt = check_prompt(prompt, config.vocab_size, "--prompt")
    options = _command_options(args)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p, seed=args.seed, ignore_eos=args.ignore_eos)  # checked before loading
    engine = Engine.from_pretrained(model, options)
    seq = engine.add_request(prompt, params)
    decoder = StreamDecoder(tokenizer) if tokenizer is not None else None
    if echo_prompt and decoder is not None:  # the generated text then reads on from the prompt
        sys.stdout.write(args.prompt)
    start = time.perf_counter()
    for out in engine.stream():
        if out.token < 0:  # no token: the request failed (seq.error)
            continue
        new = seq.output[len(decoder.ids):] if decoder else seq.output[-1:]
        sys.stdout.write("".join(decoder.push(t) if decoder else f"{t} " for t in new))
        sys.stdout.flush()
    if decoder is not None:
        sys.stdout.write(decoder.flush())  # an incomplete last character, as U+FFFD
    elapsed = time.perf_counter() - start
    used = ", ".join(f"{op}={p}" for op, p in engine.plan.providers_by_op().items())
    print(f"\n[{len(prompt)} prompt tokens, {seq.num_output} generated ({seq.finish_reason.value}) in {elapsed:.2f}s; "
          f"prefill {_rate(engine.prefill_tokens, engine.prefill_seconds)} tok/s, decode "
          f"{_rate(engine.decode_tokens, engine.decode_seconds)} tok/s; {engine.status}; providers: {used}]")
    if seq.error is not None:
        print(f"infinilm generate: error: {seq.error}", file=sys.stderr)
        return 1
    return 0


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds:.1f}" if seconds > 0 else "-"


def _bench(args: argparse.Namespace) -> int:
    from infinilm.bench import check_bench_args, count_decode_step, run_bench
    from infinilm.engine import Engine

    check_bench_args(args.batch, args.input_len, args.output_len, args.seed)  # before the model loads
    options = _command_options(args)
    engine = Engine.from_pretrained(args.model, options)
    result = run_bench(engine, args.batch, args.input_len, args.output_len, seed=args.seed, repeats=args.repeats)
    count = count_decode_step(engine, args.batch, args.input_len, seed=args.seed)  # after the timed runs
    print(result.table())
    print(count.line())
    print(f"{engine.status}; providers: "
          + ", ".join(f"{op}={p}" for op, p in engine.plan.providers_by_op().items()))
    print(engine.warmup.summary())
    if args.json:
        import json

        status = {"graph_status": engine.graph_status, "threads_status": engine.threads_status,
                  "async_scheduling": engine.async_scheduling,
                  "warmup": engine.warmup.summary(),
                  "providers": engine.plan.providers_by_op(), "decode_step_count": count.as_dict()}
        with open(args.json, "w") as f:
            json.dump({**result.as_dict(), **status}, f, indent=1)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from infinilm.demo import demo_checkpoint

    path = demo_checkpoint()
    print(f"demo checkpoint (a small Qwen3 taught one sentence, byte-level tokenizer): {path}")
    print(f"prompt {args.prompt!r} (the model knows one sentence only: a prompt that does not start it gives "
          "noise), then what it generates:")
    return _generate(args, str(path), echo_prompt=True)


def _torchrun_follower(args: argparse.Namespace) -> bool:
    """Whether this process is a rank > 0 that torchrun started for a command that runs the model."""
    return (args.command in ("generate", "bench", "serve", "demo") and args.tensor_parallel_size > 1
            and os.environ.get("RANK", "0") not in ("", "0"))


def _follow(args: argparse.Namespace) -> int:
    """A rank > 0 under torchrun: load this rank's shard with the command's options, follow rank 0's steps."""
    from infinilm.engine import Engine

    if args.command == "demo":
        from infinilm.demo import demo_checkpoint

        model = str(demo_checkpoint())
    else:
        model = args.model
    Engine.from_pretrained(model, _command_options(args)).follow()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    try:
        if _torchrun_follower(args):
            return _follow(args)
        if args.command == "check":
            return _check(args)
        if args.command == "generate":
            return _generate(args, args.model)
        if args.command == "bench":
            return _bench(args)
        if args.command in ("serve", "bench-serve"):
            from infinilm.serve import commands

            if args.command == "bench-serve":
                return commands.run_bench_serve(args)
            return commands.run_serve(args, _command_options(args))
        return _demo(args)
    except GateError as err:
        print(gate_report(err), file=sys.stderr)
        return 1
    except (ConfigError, LoadError, CacheError, ValueError, FollowerError) as err:
        print(f"infinilm {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if err.name not in _LLM_EXTRA:
            raise
        print(f"infinilm {args.command}: error: {err.name} is not installed "
              "(fix: pip install 'infiniops-py[llm]')", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
