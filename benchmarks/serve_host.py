"""CPU benchmark of ``infinilm serve``'s own cost per token: the server over a kernel-free stand-in engine (#24).

    python3 benchmarks/serve_host.py                      # ~1 min; the table for RESULTS.md
    python3 benchmarks/serve_host.py --step-ms 2 --num-prompts 128

The server runs in its own process (``--server``): the real `infinilm.serve` application (routes, engine
process or thread, streaming, detokenization with the demo checkpoint's byte-level tokenizer) over an `Engine`
whose model is `engine_host.StandIn` (no kernel; a vocabulary of the tokenizer's size), so a decode step costs
the engine's host work alone. The engine runs in a process of its own, as ``infinilm serve`` runs it by
default (`standin_engine` builds it there), or with ``--no-engine-process`` on a thread of the server
process. ``--step-ms`` adds a sleep to each forward (the GIL released, as a CUDA synchronization releases it):
a stand-in for the GPU's time per step. The client is ``infinilm bench-serve``'s, in this process (the
client never shares a GIL with the server), closed loop at ``--concurrency``, streaming, ``ignore_eos``.

Besides bench-serve's summary the server reports, at SIGTERM: the server's CPU time per output token (both
processes' with an engine process), split into the engine's (its thread, or its process) and the rest (the
event loop, mostly), and the engine steps' wall and CPU time: on a thread, a step's wall time above its CPU
time plus the sleep is time the engine thread waited for the GIL (in a process: for a core). ``--json``
prints these numbers as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import cProfile
import dataclasses
import functools
import gc
import json
import multiprocessing
import os
import pstats
import signal
import statistics
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
_ENGINE_STATS = "serve_host engine stats: "


def standin_engine(root: str, step_ms: float, gc_freeze: bool = True) -> Any:
    """The stand-in engine (the demo tokenizer's vocabulary; `step_ms` of sleep per forward), its steps timed into
    `_ENGINE`; built where the engine runs (the engine process, or the server's), so it must pickle by name.
    Without `gc_freeze` the engine process does not freeze its heap (the server's `freeze_heap`)."""
    import engine_host

    from infinilm import EngineOptions
    from infinilm.demo import demo_checkpoint
    from infinilm.engine import Engine
    from infinilm.engine.gates import plan
    from infinilm.tokenizer import load_tokenizer

    vocab = load_tokenizer(demo_checkpoint(Path(root))).get_vocab_size()
    cfg = dataclasses.replace(engine_host.config(), vocab_size=vocab)
    options = EngineOptions(block_size=16, num_blocks=2048, max_num_seqs=64, max_num_batched_tokens=8192,
                            max_model_len=512, async_scheduling=True)
    standin = engine_host.StandIn(8192)
    standin.table = torch.zeros(8192, vocab)
    standin.table[torch.arange(8192), 3 + torch.arange(8192) % (vocab - 3)] = 1.0  # varied printable bytes
    eng = Engine(cfg, options, plan(cfg, options), standin)
    sleep = step_ms / 1e3
    forward, step = standin.forward, eng.step
    stats = _ENGINE

    def slow_forward(*a: Any) -> torch.Tensor:
        if sleep:
            w = time.perf_counter()
            time.sleep(sleep)
            stats["slept"] += time.perf_counter() - w
        return forward(*a)

    def timed_step() -> Any:
        stats["serving"] = 1
        w, c = time.perf_counter(), time.thread_time()
        out = step()
        stats["wall"] += time.perf_counter() - w
        stats["engine_cpu"] = time.thread_time()  # the engine thread's whole CPU time so far
        stats["cpu"] += stats["engine_cpu"] - c
        stats["steps"] += bool(out)
        stats["tokens"] += len(out)
        return out

    standin.forward, eng.step = slow_forward, timed_step  # type: ignore[method-assign]
    if not gc_freeze:
        from infinilm.serve import engine_proc

        engine_proc.freeze_heap = lambda: None  # type: ignore[assignment]
    if multiprocessing.parent_process() is not None:  # the engine process: its stats when it ends
        cpu0 = time.process_time()
        _time_gc(stats)

        def report() -> None:
            stats["engine_cpu"] = time.process_time() - cpu0
            print(_ENGINE_STATS + json.dumps(stats), flush=True)

        atexit.register(report)
    return eng


def _time_gc(stats: dict[str, float]) -> None:
    """Add this process's garbage-collection time (seconds) to ``stats["gc"]`` once ``stats["serving"]`` is set
    (the startup's collections left out)."""
    began = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        elif stats.get("serving"):
            stats["gc"] = stats.get("gc", 0.0) + time.perf_counter() - began[0]

    gc.callbacks.append(callback)


_ENGINE: dict[str, float] = {"steps": 0, "tokens": 0, "wall": 0.0, "cpu": 0.0, "engine_cpu": 0.0, "slept": 0.0}


def _server(args: argparse.Namespace) -> int:
    """The ``--server`` process: the stand-in engine served on a free port until SIGTERM."""
    from infinilm.serve import server as server_module
    from infinilm.serve.engine_loop import EngineLoop
    from infinilm.serve.middleware import ACCESS_LOG
    from infinilm.tokenizer import load_tokenizer

    process = not args.no_engine_process
    profiles = {"event loop": cProfile.Profile(), "engine thread": cProfile.Profile()} if args.profile else {}
    if profiles and not process:
        run = EngineLoop._run

        def profiled_run(self: EngineLoop) -> None:
            profiles["engine thread"].runcall(run, self)

        EngineLoop._run = profiled_run  # type: ignore[method-assign]
    if args.no_gc_freeze:
        server_module.freeze_heap = lambda: None  # type: ignore[assignment]
    factory = functools.partial(standin_engine, args.server, args.step_ms, not args.no_gc_freeze)
    client, facts = server_module.start_engine(factory, process=process, max_waiting=256)
    tokenizer = load_tokenizer(Path(args.server))
    info = server_module.ModelInfo(name="bench", vocab_size=facts["vocab_size"], max_model_len=512,
                                   cache_block_size=16, cache_blocks=2048, tokenizer=tokenizer, eos_token_ids=(0,))
    sock = server_module._listen("127.0.0.1", 0)
    ns = argparse.Namespace(max_waiting=256, api_key=None, read_timeout=60.0, shutdown_timeout=5.0)
    ACCESS_LOG.disabled = True
    serve = server_module._serve(client, facts, info, sock, ns)
    server_stats: dict[str, float] = {}
    _time_gc(server_stats)
    on_output = client._on_output

    def first_output(out: Any) -> None:
        server_stats["serving"] = 1
        client._on_output = on_output  # type: ignore[method-assign]
        on_output(out)

    client._on_output = first_output  # type: ignore[method-assign]
    cpu0 = time.process_time()
    if profiles:
        profiles["event loop"].runcall(asyncio.run, serve)
    else:
        asyncio.run(serve)
    cpu = time.process_time() - cpu0
    for name, prof in profiles.items():
        if prof.getstats():
            print(f"--- {name}: tottime, top 25", flush=True)
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
    if not process:
        print(_ENGINE_STATS + json.dumps(_ENGINE), flush=True)
    print(_STATS + json.dumps({"process_cpu": cpu, "process": process, **server_stats}), flush=True)
    return 0


def _start(root: str, args: argparse.Namespace) -> tuple[subprocess.Popen[str], str, list[str]]:
    from gpu_serve import launch

    cmd = [sys.executable, __file__, "--server", root, "--step-ms", str(args.step_ms),
           *(["--profile"] if args.profile else []), *(["--no-engine-process"] if args.no_engine_process else []),
           *(["--no-gc-freeze"] if args.no_gc_freeze else [])]
    return launch(cmd, 120.0, os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--step-ms", type=float, default=0.0, help="sleep per forward (a stand-in GPU step)")
    parser.add_argument("--no-engine-process", action="store_true",
                        help="the engine on a thread of the server process (the server's option)")
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="the server and engine processes do not freeze their heaps after startup (the A/B)")
    parser.add_argument("--profile", action="store_true",
                        help="the server's cProfile: the event loop's, and the engine thread's (slower)")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--json", action="store_true", help="one JSON line of the numbers instead of the table")
    parser.add_argument("--ab", type=int, default=0, metavar="N",
                        help="N rounds of both ways, alternating (process, thread); prints each run and the medians")
    args = parser.parse_args(argv)
    if args.server is not None:
        return _server(args)
    if args.ab:
        return _ab(args)
    numbers, result, lines = _measure(args)
    if args.json:
        print(json.dumps(numbers))
        return 0 if result.failed == 0 else 1
    if args.profile:
        print("\n".join(x for x in lines[lines.index(next(x for x in lines if x.startswith("--- "))):]
                         if not x.startswith((_STATS, _ENGINE_STATS))))
    where = numbers["engine"]
    print(result.table())
    print(f"client CPU per output token (us)        {numbers['client_us']:.1f}")
    print(f"server CPU per output token (us)        {numbers['server_us']:.1f}   (engine: {where})")
    print(f"  engine {where} (us)                   {numbers['engine_us']:.1f}")
    print(f"  event loop and the rest (us)          {numbers['rest_us']:.1f}")
    print(f"engine step wall / CPU, mean (ms)       {numbers['step_wall_ms']:.3f} / {numbers['step_cpu_ms']:.3f}   "
          f"(sleep {args.step_ms:g} ms, slept {numbers['slept_ms']:.3f} ms; {numbers['tokens_per_step']:.1f} tokens "
          "per step)")
    return 0 if result.failed == 0 else 1


_COLUMNS = (("output_tok_s", "output tok/s", 0), ("client_us", "client us/tok", 1), ("server_us", "server us/tok", 1),
            ("engine_us", "engine us/tok", 1), ("rest_us", "rest us/tok", 1), ("step_wall_ms", "step wall ms", 2),
            ("step_cpu_ms", "step CPU ms", 2), ("slept_ms", "slept ms", 2), ("tokens_per_step", "tok/step", 1),
            ("server_gc_us", "server GC us/tok", 1), ("engine_gc_us", "engine process GC us/tok", 1))


def _ab(args: argparse.Namespace) -> int:
    """`args.ab` rounds of the engine process then the engine thread; a markdown table of each run, then the
    medians of each way."""
    runs: dict[str, list[dict[str, Any]]] = {"process": [], "thread": []}
    print("| engine | " + " | ".join(c[1] for c in _COLUMNS) + " |")
    print("|---" * (len(_COLUMNS) + 1) + "|")
    failed = 0
    for _ in range(args.ab):
        for thread in (False, True):
            numbers, result, _ = _measure(argparse.Namespace(**{**vars(args), "no_engine_process": thread}))
            runs[numbers["engine"]].append(numbers)
            failed += result.failed
            print(_row(numbers["engine"], numbers), flush=True)
    for way, got in runs.items():
        medians = {k: statistics.median(r[k] for r in got) for k, _, _ in _COLUMNS}
        print(_row(f"**{way}, median of {len(got)}**", medians))
    return 0 if failed == 0 else 1


def _row(name: str, numbers: dict[str, Any]) -> str:
    return f"| {name} | " + " | ".join(f"{numbers[k]:.{d}f}" for k, _, d in _COLUMNS) + " |"


def _measure(args: argparse.Namespace) -> tuple[dict[str, Any], Any, list[str]]:
    """One run: the server started, a warm-up pass, the measured pass, SIGTERM; its numbers, bench-serve's
    result and the server's lines."""
    from infinilm.serve.bench_client import run_bench_serve

    with tempfile.TemporaryDirectory() as tmp:
        proc, url, lines = _start(tmp, args)
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
    engine = json.loads(next(x for x in lines if x.startswith(_ENGINE_STATS))[len(_ENGINE_STATS):])
    server = json.loads(next(x for x in lines if x.startswith(_STATS))[len(_STATS):])
    tokens = engine["tokens"]  # warm-up included: the server's counters cover both passes
    total = server["process_cpu"] + (engine["engine_cpu"] if server["process"] else 0.0)
    numbers = {"engine": "process" if server["process"] else "thread", "step_ms": args.step_ms,
               "output_tok_s": result.output_throughput,
               "client_us": 1e6 * client_cpu / max(1, result.completed * args.output_len),
               "server_us": 1e6 * total / tokens, "engine_us": 1e6 * engine["engine_cpu"] / tokens,
               "rest_us": 1e6 * (total - engine["engine_cpu"]) / tokens,
               "step_wall_ms": 1e3 * engine["wall"] / engine["steps"],
               "step_cpu_ms": 1e3 * engine["cpu"] / engine["steps"], "tokens_per_step": tokens / engine["steps"],
               "slept_ms": 1e3 * engine["slept"] / engine["steps"], "failed": result.failed,
               "server_gc_us": 1e6 * server.get("gc", 0.0) / tokens,
               "engine_gc_us": 1e6 * engine.get("gc", 0.0) / tokens}
    return numbers, result, lines


if __name__ == "__main__":
    sys.exit(main())
