"""H200 serving benchmark (issue #24): ``infinilm serve`` on the Qwen3-0.6B shape, loaded by ``bench-serve``
greedy and sampled, in one run.

    python3 -m pip install -q --no-deps --no-build-isolation -e . -e providers/torch -e providers/triton \
        -e providers/cupy
    python3 benchmarks/gpu_serve.py [--num-prompts 512] [--concurrency 64]   # about 2 min on the H200
    python3 benchmarks/gpu_serve.py --no-engine-process                    # the engine on a thread (A/B)
    python3 benchmarks/gpu_serve.py --smoke                                # a tiny model on the CPU

The H200's image has no pydantic (the `serve` extra): download the extra's wheels for its Python 3.12 here,
into the git-ignored ``.whl`` (``python -m pip download aiohttp prometheus-client pydantic --python-version 3.12
--only-binary=:all: --platform manylinux2014_x86_64 -d .whl``), carry ``.whl`` with the call and install them
there first (``python3 -m pip install -q --no-index --find-links .whl aiohttp prometheus-client pydantic``).

The checkpoint is ``gpu_infinilm.QWEN3_0_6B`` with random weights (seed 0), served in bf16 with CUDA graphs,
``--max-num-seqs 64 --max-model-len 512 --num-blocks 2048`` and the engine's default async scheduling, on a free
loopback port, the engine in its own process (the server's default; ``--no-engine-process``: on a thread of the
server process, for the A/B). The client is ``infinilm bench-serve``'s (streaming completions of random
128-token prompts, 128 output tokens each, ``ignore_eos``, a closed loop at ``--concurrency``): one warm-up
pass of `concurrency` requests, then ``--num-prompts`` greedy and the same sampled at temperature 0.8, top_p 0.9
(issue #24's command). Prints both summaries and a PASS/FAIL line per target (30000 output tok/s greedy, 25000 sampled);
exit status 1 when a target is missed or a request failed, 2 when the server did not start.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)
from gpu_infinilm import QWEN3_0_6B, SMOKE, build

from infinilm.serve.bench_client import BenchServeResult, run_bench_serve

TARGETS = {"greedy": 30000.0, "sampled": 25000.0}
SAMPLED = {"temperature": 0.8, "top_p": 0.9}
_READY = " on http://"


def start_server(model: Path, device: str, timeout: float, extra: Sequence[str] = (),
                 ) -> tuple[subprocess.Popen[str], str, list[str]]:
    """Start ``infinilm serve`` on `model` (port 0, with the `extra` options) and wait for its ready line; returns
    the process, its URL and the lines it printed (kept growing by a reader thread)."""
    cmd = [sys.executable, "-c", "import sys; from infinilm.cli import main; sys.exit(main())", "serve",
           "--model", str(model), "--served-model-name", "bench", "--port", "0", "--device", device,
           "--max-num-seqs", "64", "--max-model-len", "512", "--num-blocks", "2048", "--disable-access-log", *extra]
    if device == "cuda":
        cmd += ["--dtype", "bfloat16"]
    return launch(cmd, timeout)


def launch(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
           ) -> tuple[subprocess.Popen[str], str, list[str]]:
    """Run the server command `cmd` and wait for its ready line (``... on http://HOST:PORT``); returns the
    process, its URL and the lines it printed (kept growing by a reader thread).

    Raises:
        RuntimeError: the server exited or printed no ready line within `timeout` seconds (it is killed).
    """
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if _READY in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.5):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the server did not start:\n" + "\n".join(lines[-30:]))
    line = next(x for x in lines if _READY in x)
    url = "http://" + line.split(_READY, 1)[1].split()[0].rstrip("/.,;")
    return proc, url, lines


def bench(url: str, num_prompts: int, concurrency: int, input_len: int, output_len: int,
          **sampling: float) -> BenchServeResult:
    return asyncio.run(run_bench_serve(url, num_prompts=num_prompts, concurrency=concurrency, input_len=input_len,
                                       output_len=output_len, **sampling))  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--smoke", action="store_true", help="a tiny model on the CPU, few requests")
    parser.add_argument("--start-timeout", type=float, default=300.0, help="seconds for the server to start")
    parser.add_argument("--no-engine-process", action="store_true",
                        help="serve with the engine on a thread of the server process (the A/B of the default)")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("needs a CUDA device (or --smoke)", file=sys.stderr)
        return 2
    device = "cpu" if args.smoke else "cuda"
    prompts, concurrency, io = (8, 4, (8, 4)) if args.smoke else (args.num_prompts, args.concurrency, (128, 128))
    os.environ.setdefault("INFINILM_TUNE_BUDGET", "20")
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), SMOKE if args.smoke else QWEN3_0_6B, device)
        began = time.perf_counter()
        try:
            extra = ["--no-engine-process"] if args.no_engine_process else []
            proc, url, lines = start_server(Path(tmp), device, args.start_timeout, extra)
        except RuntimeError as err:
            print(err, file=sys.stderr)
            return 2
        print(next(x for x in lines if _READY in x), f"({time.perf_counter() - began:.0f} s to start)")
        try:
            bench(url, concurrency, concurrency, *io)  # warm-up pass
            results = {"greedy": bench(url, prompts, concurrency, *io),
                       "sampled": bench(url, prompts, concurrency, *io, **SAMPLED)}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    ok = True
    for mode, result in results.items():
        extra = "" if mode == "greedy" else f" (temperature {SAMPLED['temperature']}, top_p {SAMPLED['top_p']})"
        print(f"\n### {mode}{extra}: {prompts} prompts, concurrency {concurrency}, {io[0]} / {io[1]} tokens\n")
        print(result.table())
        ok &= result.failed == 0
    print()
    for mode, target in TARGETS.items():
        got = results[mode].output_throughput
        passed = got >= target
        ok &= passed or args.smoke
        print(f"{'PASS' if passed else 'FAIL'} serve {mode}: {got:.0f} output tok/s (target >= {target:.0f})")
    print(f"server exit status {proc.returncode}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
