"""CPU benchmark of ``infinilm serve``'s own cost per token: the server over a kernel-free stand-in engine (#24).

    python3 benchmarks/serve_host.py                      # ~1 min; the table for RESULTS.md
    python3 benchmarks/serve_host.py --step-ms 2 --num-prompts 128

The server runs in its own process (``--server``): the real `infinilm.serve` application (routes, engine
thread, streaming, detokenization with the demo checkpoint's byte-level tokenizer) over an `Engine` whose model
is `engine_host.StandIn` (no kernel; a vocabulary of the tokenizer's size), so a decode step costs the engine's
host work alone. ``--step-ms`` adds a sleep to each forward (the GIL released, as a CUDA synchronization
releases it): a stand-in for the GPU's time per step. The client is ``infinilm bench-serve``'s, in this
process (the two never share a GIL), closed loop at ``--concurrency``, streaming, ``ignore_eos``.

Besides bench-serve's summary the server reports, at SIGTERM: its CPU time split into the engine thread's
and the rest (the event loop, mostly), per output token, and the engine steps' wall and CPU time: a step's
wall time above its CPU time plus the sleep is time the engine thread waited for the GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)

_STATS = "serve_host stats: "


def _server(args: argparse.Namespace) -> int:
    """The ``--server`` process: the stand-in engine served on a free port until SIGTERM."""
    import engine_host

    from infinilm import EngineOptions
    from infinilm.demo import demo_checkpoint
    from infinilm.engine import Engine
    from infinilm.engine.gates import plan
    from infinilm.serve import server as server_module
    from infinilm.serve.engine_loop import EngineLoop
    from infinilm.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(demo_checkpoint(Path(args.server)))
    vocab = tokenizer.get_vocab_size()
    cfg = dataclasses.replace(engine_host.config(), vocab_size=vocab)
    options = EngineOptions(block_size=16, num_blocks=2048, max_num_seqs=64, max_num_batched_tokens=8192,
                            max_model_len=512, async_scheduling=True)
    standin = engine_host.StandIn(8192)
    standin.table = torch.zeros(8192, vocab)
    standin.table[torch.arange(8192), 3 + torch.arange(8192) % (vocab - 3)] = 1.0  # varied printable bytes
    eng = Engine(cfg, options, plan(cfg, options), standin)
    sleep = args.step_ms / 1e3
    forward, step = standin.forward, eng.step
    stats: dict[str, float] = {"steps": 0, "tokens": 0, "wall": 0.0, "cpu": 0.0, "thread_cpu": 0.0}

    def slow_forward(*a: Any) -> torch.Tensor:
        if sleep:
            time.sleep(sleep)
        return forward(*a)

    def timed_step() -> Any:
        w, c = time.perf_counter(), time.thread_time()
        out = step()
        stats["wall"] += time.perf_counter() - w
        stats["thread_cpu"] = time.thread_time()  # the engine thread's whole CPU time so far
        stats["cpu"] += stats["thread_cpu"] - c
        stats["steps"] += bool(out)
        stats["tokens"] += len(out)
        return out

    standin.forward, eng.step = slow_forward, timed_step  # type: ignore[method-assign]
    info = server_module.ModelInfo(name="bench", vocab_size=vocab, max_model_len=512, cache_block_size=16,
                                   cache_blocks=2048, tokenizer=tokenizer, eos_token_ids=(0,))
    sock = server_module._listen("127.0.0.1", 0)
    ns = argparse.Namespace(max_waiting=256, api_key=None, read_timeout=60.0, shutdown_timeout=5.0)
    from infinilm.serve.middleware import ACCESS_LOG

    ACCESS_LOG.disabled = True
    profiles = {"event loop": cProfile.Profile(), "engine thread": cProfile.Profile()} if args.profile else {}
    if profiles:
        run = EngineLoop._run

        def profiled_run(self: EngineLoop) -> None:
            profiles["engine thread"].runcall(run, self)

        EngineLoop._run = profiled_run  # type: ignore[method-assign]
    cpu0 = time.process_time()
    if profiles:
        profiles["event loop"].runcall(asyncio.run, server_module._serve(eng, info, sock, ns))
    else:
        asyncio.run(server_module._serve(eng, info, sock, ns))
    stats["process_cpu"] = time.process_time() - cpu0
    for name, prof in profiles.items():
        print(f"--- {name}: tottime, top 25", flush=True)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    print(_STATS + json.dumps(stats), flush=True)
    return 0


def _start(root: str, step_ms: float, profile: bool) -> tuple[subprocess.Popen[str], str, list[str]]:
    from gpu_serve import launch

    cmd = [sys.executable, __file__, "--server", root, "--step-ms", str(step_ms), *(["--profile"] if profile else [])]
    return launch(cmd, 120.0, os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--step-ms", type=float, default=0.0, help="sleep per forward (a stand-in GPU step)")
    parser.add_argument("--profile", action="store_true", help="the server's cProfile, per thread (slower)")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=None)
    args = parser.parse_args(argv)
    if args.server is not None:
        return _server(args)
    from infinilm.serve.bench_client import run_bench_serve

    with tempfile.TemporaryDirectory() as tmp:
        proc, url, lines = _start(tmp, args.step_ms, args.profile)
        try:
            bench = dict(num_prompts=args.num_prompts, concurrency=args.concurrency, input_len=args.input_len,
                         output_len=args.output_len, temperature=args.temperature, top_p=args.top_p)
            asyncio.run(run_bench_serve(url, **{**bench, "num_prompts": args.concurrency}))  # warm-up pass
            client0 = time.process_time()
            result = asyncio.run(run_bench_serve(url, **bench))
            client_cpu = time.process_time() - client0
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    stats = json.loads(next(x for x in lines if x.startswith(_STATS))[len(_STATS):])
    tokens = stats["tokens"]  # warm-up included: the server's counters cover both passes
    rest = stats["process_cpu"] - stats["thread_cpu"]
    if args.profile:
        print("\n".join(x for x in lines[lines.index(next(x for x in lines if x.startswith("--- "))):]
                         if not x.startswith(_STATS)))
    print(result.table())
    client_tokens = max(1, result.completed * args.output_len)
    print(f"client CPU per output token (us)        {1e6 * client_cpu / client_tokens:.1f}")
    print(f"server CPU per output token (us)        {1e6 * stats['process_cpu'] / tokens:.1f}")
    print(f"  engine thread (us)                    {1e6 * stats['thread_cpu'] / tokens:.1f}")
    print(f"  event loop and the rest (us)          {1e6 * rest / tokens:.1f}")
    print(f"engine step wall / CPU, mean (ms)       {1e3 * stats['wall'] / stats['steps']:.3f} / "
          f"{1e3 * stats['cpu'] / stats['steps']:.3f}   (sleep {args.step_ms:g} ms, {tokens / stats['steps']:.1f} "
          "tokens per step)")
    return 0 if result.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
