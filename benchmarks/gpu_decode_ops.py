"""Decode-step timings of the decode fusions on the GPU: silu_and_mul, rotary_embedding, fused_qk_norm_rope.

    python3 benchmarks/gpu_decode_ops.py [--tokens 1,2,4,8,16,32,64] [--dtype bfloat16] [--calls 200]
                                         [--rounds 5] [--json FILE]

Qwen3-0.6B's shapes (hidden 1024, intermediate 3072, 16 query and 8 KV heads of 128, NeoX RoPE over the whole
head, a 40960-position cos/sin cache in the model dtype), at the token counts of a decode step (T = batch).
Each operator is computed several ways, on the same tensors:

- ``triton`` and ``torch``: the public function (``infiniops_py.<op>``: its checks, the resolver, the kernel)
  under ``use("triton")`` / ``use("torch")``, index checks at their CUDA default (off);
- ``composition``: the plain PyTorch a model runs without the operator: vLLM's ``forward_native``
  (``F.silu(x[..., :d]) * x[..., d:]``; the cache rows by ``index_select``, ``chunk``, the rotated halves by
  ``torch.cat``, written back with ``copy_``; ``F.rms_norm`` of the Q and K head views before that);
- ``separate`` (fused_qk_norm_rope only): ``fused_qk_norm`` then ``rotary_embedding``, the resolver's choice
  of each: what the model layer runs where no provider serves the fused operator.

Each way is timed twice: ``eager`` (CUDA events around `calls` back-to-back calls, per call: the rate a caller
gets, the host cost included where it exceeds the kernels) and ``graph`` (the call captured once in a CUDA
graph, CUDA events around `calls` replays, per replay: the device time without launch overhead); each figure
is the median of `rounds` rounds after a warm-up. The bandwidth is the bytes the operation must move (the
touched elements read and written, the cache rows and positions read) over the time. Before the timings,
each way's result at the largest T is checked against the float64 reference with the tolerance table (the
``check`` column: the worst error's share of the allowed error, or FAIL).

Exit status 0 when the ``triton`` and ``torch`` ways passed every check and were all timed, 1 otherwise (the
``composition`` and ``separate`` checks are shown, not required: they round more often than the fused kernels),
2 without a CUDA device. `run(device="cpu", ...)` runs
every path on the CPU (no graph column; eager by the host clock) for the test of this script, under the
Triton interpreter.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import infiniops_py as ops
from infiniops_py.testing.case_check import allowed_share
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

if (_HERE := str(Path(__file__).resolve().parent)) not in sys.path:
    sys.path.insert(0, _HERE)  # benchmarks/_common.py, also when a test loads this file by its path
from _common import captured, json_option, record, write_records

SOURCE = "benchmarks/gpu_decode_ops.py"
TOKENS = (1, 2, 4, 8, 16, 32, 64)
HIDDEN, INTERMEDIATE, HQ, HKV, D = 1024, 3072, 16, 8, 128  # Qwen3-0.6B
MAX_POSITION, THETA, EPS = 40960, 1e6, 1e-6
WAYS = ("triton", "torch", "composition", "separate")


@dataclass
class Way:
    """One way of computing an operator: a no-argument call on the case's tensors and its result."""

    name: str
    call: Callable[[], Any]


@dataclass
class Case:
    """An operator at one token count: the bytes it moves, its ways, and the float64 expected result of one
    call of any way on a fresh copy of the inputs (`check`)."""

    op: str
    tokens: int
    nbytes: int
    ways: list[Way]
    check: Callable[[str], tuple[torch.Tensor, torch.Tensor]]  # way name -> (got, expected), on fresh inputs


@dataclass
class Row:
    """One way of one case, measured: microseconds per call (NaN when not measured), the check's share of the
    allowed error (NaN: not checked; inf: failed), and what went wrong."""

    case: Case
    way: str
    eager_us: float = math.nan
    graph_us: float = math.nan
    share: float = math.nan  # worst error over allowed error at the check, NaN when not checked
    note: str = ""

    def gbs(self, us: float) -> float:
        """The bandwidth at `us` microseconds per call, GB/s."""
        return self.case.nbytes / us / 1e3 if us > 0 else math.nan

    @property
    def failed(self) -> bool:
        """One of this project's operators (``triton``, ``torch``) failed its check or could not be timed."""
        return self.way in ("triton", "torch") and (math.isinf(self.share) or math.isnan(self.eager_us))


def _cache(device: str, dtype: torch.dtype) -> torch.Tensor:
    """Qwen3's RoPE table: cos then sin of ``p * theta**(-2i / D)``, computed in float32, cast to `dtype`."""
    inv = 1.0 / (THETA ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    angles = torch.arange(MAX_POSITION, dtype=torch.float32)[:, None] * inv
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(device=device, dtype=dtype)


def _native_rope(positions: torch.Tensor, x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """vLLM's ``RotaryEmbedding.forward_native`` (NeoX, whole head) of ``[T, H * D]``: a new tensor."""
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    x = x.reshape(positions.shape[0], -1, D)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(1)


def _under(provider: str, fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        with ops.use(provider):
            return fn()

    return call


Ways = Callable[[tuple[Any, ...]], dict[str, Callable[[], Any]]]  # the inputs -> each way's call on them


def _checker(fresh: Callable[[], tuple[Any, ...]], ways: Ways, result: Callable[[tuple[Any, ...], Any], torch.Tensor]
             ) -> Callable[[str], tuple[torch.Tensor, torch.Tensor]]:
    """`check(way)`: that way's result on fresh inputs, and the reference provider's on float64 copies of them
    (`result` picks the output from the inputs and the call's return: the in-place operators' packed qkv)."""

    def check(way: str) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = fresh()
        expected_inputs = tuple(t.double() if torch.is_tensor(t) and t.is_floating_point() else t for t in inputs)
        got = result(inputs, ways(inputs)[way]())
        with ops.use("reference"):
            expected = result(expected_inputs, ways(expected_inputs)["reference"]())
        return got, expected

    return check


def _silu_case(device: str, dtype: torch.dtype, t: int, gen: torch.Generator) -> Case:
    def fresh() -> tuple[Any, ...]:
        return (torch.randn(t, 2 * INTERMEDIATE, generator=gen).to(device=device, dtype=dtype),)

    def ways(inputs: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
        (x,) = inputs
        def public() -> Any:
            return ops.silu_and_mul(x)

        return {"triton": _under("triton", public), "torch": _under("torch", public), "reference": public,
                "composition": lambda: F.silu(x[..., :INTERMEDIATE]) * x[..., INTERMEDIATE:]}

    inputs = fresh()
    es = dtype.itemsize
    return Case("silu_and_mul", t, 3 * t * INTERMEDIATE * es,
                [Way(n, c) for n, c in ways(inputs).items() if n != "reference"],
                _checker(fresh, ways, lambda _inputs, out: out))


def _rope_inputs(device: str, dtype: torch.dtype, t: int, gen: torch.Generator) -> tuple[Any, ...]:
    qkv = torch.randn(t, (HQ + 2 * HKV) * D, generator=gen).to(device=device, dtype=dtype)
    positions = torch.randint(0, 4096, (t,), generator=gen).to(device)
    weights = (1 + 0.1 * torch.randn(2, D, generator=gen)).to(device=device, dtype=dtype)
    return qkv, positions, _cache(device, dtype), weights[0], weights[1]


def _rotary_case(device: str, dtype: torch.dtype, t: int, gen: torch.Generator) -> Case:
    def fresh() -> tuple[Any, ...]:
        return _rope_inputs(device, dtype, t, gen)

    def ways(inputs: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
        qkv, positions, cache = inputs[:3]
        q, k = qkv[:, : HQ * D], qkv[:, HQ * D : (HQ + HKV) * D]

        def public() -> Any:
            return ops.rotary_embedding(positions, q, k, D, cache, True)

        def composition() -> None:
            q.copy_(_native_rope(positions, q, cache))
            k.copy_(_native_rope(positions, k, cache))

        return {"triton": _under("triton", public), "torch": _under("torch", public), "reference": public,
                "composition": composition}

    inputs = fresh()
    es, ces = dtype.itemsize, inputs[2].dtype.itemsize
    nbytes = 2 * t * (HQ + HKV) * D * es + t * D * ces + t * 8
    return Case("rotary_embedding", t, nbytes, [Way(n, c) for n, c in ways(inputs).items() if n != "reference"],
                _checker(fresh, ways, lambda inputs, _out: inputs[0]))


def _fused_case(device: str, dtype: torch.dtype, t: int, gen: torch.Generator) -> Case:
    heads = {"num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": D}

    def fresh() -> tuple[Any, ...]:
        return _rope_inputs(device, dtype, t, gen)

    def ways(inputs: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
        qkv, positions, cache, qw, kw = inputs
        q, k = qkv[:, : HQ * D], qkv[:, HQ * D : (HQ + HKV) * D]

        def public() -> Any:
            return ops.fused_qk_norm_rope(qkv, qw, kw, cache, positions, **heads, eps=EPS)

        def separate() -> None:
            ops.fused_qk_norm(qkv, qw, kw, **heads, eps=EPS)
            ops.rotary_embedding(positions, q, k, D, cache, True)

        def composition() -> None:
            q.copy_(_native_rope(positions, F.rms_norm(q.view(t, HQ, D), (D,), qw, EPS), cache))
            k.copy_(_native_rope(positions, F.rms_norm(k.view(t, HKV, D), (D,), kw, EPS), cache))

        return {"triton": _under("triton", public), "torch": _under("torch", public), "reference": public,
                "composition": composition, "separate": separate}

    inputs = fresh()
    es, ces = dtype.itemsize, inputs[2].dtype.itemsize
    nbytes = 2 * t * (HQ + HKV) * D * es + 2 * D * es + t * D * ces + t * 8
    return Case("fused_qk_norm_rope", t, nbytes, [Way(n, c) for n, c in ways(inputs).items() if n != "reference"],
                _checker(fresh, ways, lambda inputs, _out: inputs[0]))


BUILDERS: dict[str, Callable[[str, torch.dtype, int, torch.Generator], Case]] = {
    "silu_and_mul": _silu_case,
    "rotary_embedding": _rotary_case,
    "fused_qk_norm_rope": _fused_case,
}


# --- measurement ------------------------------------------------------------------------------------------------


def eager_us(fn: Callable[[], Any], device: str, calls: int, rounds: int) -> float:
    """Median over `rounds` of the microseconds per call of `calls` back-to-back calls: CUDA events on cuda,
    the host clock elsewhere."""
    samples = []
    for _ in range(rounds):
        if device.startswith("cuda"):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(calls):
                fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) * 1e3 / calls)
        else:
            begin = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - begin) / calls * 1e6)
    return statistics.median(samples)


def graph_us(fn: Callable[[], Any], calls: int, rounds: int) -> float:
    """Microseconds per replay of one call of `fn` captured in a CUDA graph (`_common.captured`)."""
    with captured(fn) as graph:
        return eager_us(graph.replay, "cuda", calls, rounds)


def _measure(case: Case, device: str, calls: int, rounds: int, check: bool) -> list[Row]:
    rows = []
    for way in case.ways:
        row = Row(case, way.name)
        try:
            if check:
                got, expected = case.check(way.name)
                tol = tolerance(case.op, str(got.dtype).removeprefix("torch."))
                _, failure = compare(case.op, got, expected, tol)
                row.share = allowed_share(got, expected, tol) if failure is None else math.inf
                row.note = failure or ""
            way.call()  # warm-up: Triton compiles here, the resolver fills its cache
            row.eager_us = eager_us(way.call, device, calls, rounds)
            if device.startswith("cuda"):
                row.graph_us = graph_us(way.call, calls, rounds)
        except Exception as err:  # report and go on: a gated or crashing way is a row with its reason
            row.note = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:160]
        rows.append(row)
    return rows


def run(device: str = "cuda", tokens: Sequence[int] = TOKENS, dtype: torch.dtype = torch.bfloat16, *,
        calls: int = 200, rounds: int = 5, only: Sequence[str] | None = None) -> list[Row]:
    """Every case of `only` (default: all three operators) at each of `tokens`; the checks at the largest T."""
    gen = torch.Generator().manual_seed(0)
    rows: list[Row] = []
    for op in only or BUILDERS:
        for t in tokens:
            case = BUILDERS[op](device, dtype, t, gen)
            rows += _measure(case, device, calls, rounds, check=t == max(tokens))
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows


COLUMNS = ("op", "T", "way", "bytes", "eager us", "eager GB/s", "graph us", "graph GB/s", "graph vs composition",
           "check", "note")


def _composition_graph(rows: Sequence[Row], row: Row) -> float:
    return next((r.graph_us for r in rows if r.case is row.case and r.way == "composition"), math.nan)


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def format_table(rows: Sequence[Row]) -> str:
    """A markdown table: one line per (operator, T, way)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        base = _composition_graph(rows, r)
        speedup = base / r.graph_us if r.graph_us > 0 else math.nan
        check = "-" if math.isnan(r.share) else ("FAIL" if math.isinf(r.share) else f"{r.share:.2f}")
        cells = (r.case.op, str(r.case.tokens), r.way, str(r.case.nbytes), _num(r.eager_us),
                 _num(r.gbs(r.eager_us)), _num(r.graph_us), _num(r.gbs(r.graph_us)),
                 "-" if math.isnan(speedup) else f"{speedup:.2f}x", check, r.note)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def records(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """The machine-readable records: one per row and timing that was measured."""
    out = []
    for r in rows:
        shape = f"{r.case.op} T{r.case.tokens} Qwen3-0.6B"
        role = "peer" if r.way == "composition" else "ours"
        for timing, us in (("eager", r.eager_us), ("graph replay", r.graph_us)):
            if math.isfinite(us):
                out.append(record("operator", SOURCE, r.case.op, r.way, shape, role=role, ms=us / 1e3,
                                  rate=r.gbs(us), metric="GB/s", timing=timing, note=r.note))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts, comma-separated")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--calls", type=int, default=200, help="calls (or replays) per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each figure is their median")
    parser.add_argument("--only", help="operators, comma-separated (default: all three)")
    json_option(parser)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_decode_ops: needs a CUDA device", file=sys.stderr)
        return 2
    tokens = [int(t) for t in args.tokens.split(",")]
    only = args.only.split(",") if args.only else None
    rows = run("cuda", tokens, getattr(torch, args.dtype), calls=args.calls, rounds=args.rounds, only=only)
    print(format_table(rows))
    if args.json:
        write_records(args.json, records(rows), "cuda")
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
