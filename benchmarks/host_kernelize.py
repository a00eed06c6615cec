"""Host time per decode step of transformers ``generate`` with and without ``kernelize``, on the CPU.

    python benchmarks/host_kernelize.py [--layers 8] [--hidden 256] [--batch 1] [--new-tokens 33] [--repeats 5]
    python benchmarks/host_kernelize.py --triton-stub   # the Triton provider's host path, its launches stubbed

A Qwen3 model (transformers' ``Qwen3ForCausalLM``, random weights, seed 0, float32, on the CPU) small enough that
its arithmetic is a small part of a decode step (hidden 256, 8 layers, 4 query / 2 KV heads of 64, intermediate
512, vocab 1024 by default): the step then costs what transformers' eager decode costs the host on a GPU, Python
and the operators' calls. In one process, on one model object, switching with the report's ``restore()``:
greedy ``generate`` of 1 and of `--new-tokens` tokens (``min_new_tokens`` too) from a 16-token prompt, each way
warmed up once, then `--repeats` rounds alternating which way runs first. Printed per way: the median microseconds
per decode step, (full-length time - 1-token time) / (new tokens - 1), and the ratio plain / kernelized (above 1:
kernelize is faster). Times are this thread's CPU time (``time.thread_time``: other processes on a shared machine
do not count), with one torch thread.

By default the providers are the resolved ones for the CPU (the torch provider: real arithmetic both ways, but its
operators are torch compositions, not the GPU's call path). ``--triton-stub`` runs the kernelized way with the Triton
provider declared for the CPU (it serves what it serves on CUDA, by its priority; the rest goes to the torch
provider, as there) under Triton's interpreter with every launch stubbed out, as ``benchmarks/host_overhead.py``
does, in bfloat16 with unchecked indices (as on CUDA): exactly the host path the GPU runs, the kernels' results
left unwritten (the tokens are meaningless; ``min_new_tokens`` keeps the length), the plain way's arithmetic real.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if "--triton-stub" in sys.argv:  # before anything imports Triton
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["INFINIOPS_TRITON_INTERPRET_CPU"] = "1"

import torch

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)


def build(layers: int, hidden: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A small Qwen3ForCausalLM (`dtype`, CPU, eval mode), transformers' own initialization with seed 0."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=1022, eos_token_id=1023)
    return Qwen3ForCausalLM(config).to(dtype).eval()


def seconds(model: torch.nn.Module, ids: torch.Tensor, new_tokens: int) -> float:
    """This thread's CPU seconds of one greedy ``generate`` of exactly `new_tokens` tokens per row."""
    start = time.thread_time()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                   do_sample=False, pad_token_id=0)
    return time.thread_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=33)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--triton-stub", action="store_true", help="the Triton provider, launches stubbed, bf16")
    args = parser.parse_args(argv)
    from infiniops_py.integrations.transformers import kernelize
    from infiniops_py.operators._base import unchecked_indices

    torch.set_num_threads(1)
    scope: Any = contextlib.nullcontext
    if args.triton_stub:
        from host_overhead import stub_launches

        stub_launches()

        def scope() -> contextlib.ExitStack:
            stack = contextlib.ExitStack()
            stack.enter_context(unchecked_indices())
            return stack
    model = build(args.layers, args.hidden, torch.bfloat16 if args.triton_stub else torch.float32)
    ids = torch.randint(1, 1000, (args.batch, 16), generator=torch.Generator().manual_seed(0))
    report: Any = None

    def way(kernelized: bool) -> None:
        nonlocal report
        if kernelized and report is None:
            with scope():
                report = kernelize(model).infiniops_kernelized
        elif not kernelized and report is not None:
            report.restore()
            report = None

    steps: dict[bool, list[float]] = {False: [], True: []}
    with torch.inference_mode():
        for k in (False, True):
            way(k)
            with scope() if k else contextlib.nullcontext():
                seconds(model, ids, args.new_tokens)
        for r in range(args.repeats):
            for k in (False, True) if r % 2 == 0 else (True, False):
                way(k)
                with scope() if k else contextlib.nullcontext():
                    one = seconds(model, ids, 1)
                    full = seconds(model, ids, args.new_tokens)
                steps[k].append((full - one) / (args.new_tokens - 1) * 1e6)
    plain, ours = statistics.median(steps[False]), statistics.median(steps[True])
    how = "Triton provider, launches stubbed, bfloat16" if args.triton_stub else "resolved providers, float32"
    print(f"host_kernelize: Qwen3 {args.layers} layers, hidden {args.hidden}, batch {args.batch}, CPU, {how}, "
          f"torch {torch.__version__}; us per decode step (median of {args.repeats}): transformers {plain:.0f}, "
          f"kernelized {ours:.0f}, ratio {plain / ours:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
