"""GemmAddRmsNorm's Triton kernel on CUDA: the last-tile count of the GEMV's ``ADD_NORM`` epilogue under real
concurrency (the CPU interpreter runs the programs one after another, so it cannot race).

At the o and down projections of Qwen3-0.6B and the out_proj of Mamba-2-130m, bf16, decode row counts: the output
and the residual within the tolerance rule of the float64 reference (outputs poisoned first) and the same bits on
every repeat (a program normalizing before the others stored their columns would vary or leave NaN); every
`_gemv` sweep variant as a `_gemv.TABLE` entry; CUDA graph replays (the counter reset by the last program) equal to
eager calls.

    python3 -m pytest -q -m gpu tests/test_gemm_add_rms_norm_gpu.py
"""

from __future__ import annotations

import pytest
import torch

import infiniops_py as ops
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16 = torch.bfloat16
SHAPES = [(1024, 2048), (1024, 3072), (768, 1536)]  # (N, K): Qwen3-0.6B o, down; Mamba-2-130m out_proj
REPEATS = 20


def _inputs(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * scale).to("cuda", BF16)

    return r(m, k), r(n, k, scale=k**-0.5), r(m, n), r(n, scale=0.1) + 1, r(n)


def _check_repeats(m: int, n: int, k: int, seed: int) -> None:
    x, w, r0, nw, bias = _inputs(m, n, k, seed)
    first: tuple[torch.Tensor, torch.Tensor] | None = None
    for i in range(REPEATS):
        residual, out = r0.clone(), torch.full((m, n), float("nan"), dtype=BF16, device="cuda")
        with ops.use("triton"):
            ops.gemm_add_rms_norm(x, w, residual, nw, 1e-6, bias=bias, out=out)
        if first is None:
            first = (out, residual)
            continue
        assert torch.equal(out, first[0]) and torch.equal(residual, first[1]), f"repeat {i} differs"
    assert first is not None
    r_ref = r0.double().cpu()
    ref, _ = ops.gemm_add_rms_norm(x.double().cpu(), w.double().cpu(), r_ref, nw.double().cpu(), 1e-6,
                                   bias=bias.double().cpu())
    rule = tolerance("gemm_add_rms_norm", "bfloat16")
    for got, want in zip(first, (ref, r_ref)):
        _, failure = compare("gemm_add_rms_norm", got.cpu(), want, rule, k=k)
        assert failure is None, failure


@pytest.mark.parametrize("m", [1, 2, 16, 40, 64])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_decode_rows_match_the_reference_bit_for_bit_on_every_repeat(m: int, n: int, k: int) -> None:
    _check_repeats(m, n, k, seed=m * 7 + n + k)


def _variants() -> list[tuple[object, int]]:
    from infiniops_triton import _gemv

    return [(v, 1) for v in _gemv.SWEEP_ONE_ROW] + [(v, m) for v in _gemv.SWEEP_TILE for m in (16, 64)]


@pytest.mark.parametrize(("variant", "m"), _variants(), ids=str)
def test_every_sweep_variant_as_a_table_entry(monkeypatch: pytest.MonkeyPatch, variant: object, m: int) -> None:
    """The plain product's `_gemv.TABLE` entry serves the fused call at the Qwen3-0.6B down projection."""
    from infiniops_triton import _gemv

    monkeypatch.setattr(_gemv, "TABLE", {(_gemv.row_class(m), 1024, 3072, False): variant})
    _check_repeats(m, 1024, 3072, seed=m)


@pytest.mark.parametrize("m", [1, 16])
def test_graph_replays_equal_eager_calls(m: int) -> None:
    """Five replays of one captured call (each adding into the same residual) give the bits of five eager calls."""
    x, w, r0, nw, bias = _inputs(m, 1024, 3072, seed=3)

    def call(residual: torch.Tensor, out: torch.Tensor) -> None:
        with ops.use("triton"):
            ops.gemm_add_rms_norm(x, w, residual, nw, 1e-6, bias=bias, out=out)

    eager_r, eager_out = r0.clone(), torch.empty(m, 1024, dtype=BF16, device="cuda")
    for _ in range(5):
        call(eager_r, eager_out)
    graph_r, graph_out = r0.clone(), torch.empty(m, 1024, dtype=BF16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(r0.clone(), torch.empty_like(graph_out))  # warm: compiled and tuned before the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(graph_r, graph_out)
    graph_r.copy_(r0)  # the capture ran nothing
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, eager_out) and torch.equal(graph_r, eager_r)
