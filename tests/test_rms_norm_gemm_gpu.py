"""RmsNormGemm's Triton kernel on CUDA: the GEMV's ``PRE_NORM`` prologue compiled for the device (the CPU interpreter
checks its values, not the GPU's compile of it).

At the qkv and gate_up (with SwiGLU) projections of Qwen3-0.6B and the in_proj of Mamba-2-130m, bf16, decode row
counts: the output within the tolerance rule of the float64 reference (output poisoned first) and the same bits on
every repeat; every `_gemv` sweep variant as a `_gemv.TABLE` entry (split-K ones: each split computes the row's
mean square itself); CUDA graph replays equal to eager calls.

    python3 -m pytest -q -m gpu tests/test_rms_norm_gemm_gpu.py
"""

from __future__ import annotations

import pytest
import torch

import infiniops_py as ops
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16 = torch.bfloat16
SHAPES = [(4096, 1024, False), (3072, 1024, True), (3352, 768, False)]  # (N, K, swiglu): Qwen3 qkv, gate_up; in_proj
REPEATS = 10


def _inputs(m: int, n: int, k: int, swiglu: bool, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)

    def r(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=gen) * scale).to("cuda", BF16)

    rows = 2 * n if swiglu else n
    return r(m, k), r(k, scale=0.1) + 1, r(rows, k, scale=k**-0.5), r(rows)


def _check_repeats(m: int, n: int, k: int, swiglu: bool, seed: int) -> None:
    x, nw, w, bias = _inputs(m, n, k, swiglu, seed)
    first: torch.Tensor | None = None
    for i in range(REPEATS):
        out = torch.full((m, n), float("nan"), dtype=BF16, device="cuda")
        with ops.use("triton"):
            ops.rms_norm_gemm(x, nw, w, 1e-6, bias=bias, swiglu=swiglu, out=out)
        if first is None:
            first = out
            continue
        assert torch.equal(out, first), f"repeat {i} differs"
    assert first is not None
    ref = ops.rms_norm_gemm(x.double().cpu(), nw.double().cpu(), w.double().cpu(), 1e-6, bias=bias.double().cpu(),
                            swiglu=swiglu)
    _, failure = compare("rms_norm_gemm", first.cpu(), ref, tolerance("rms_norm_gemm", "bfloat16"), k=k)
    assert failure is None, failure


@pytest.mark.parametrize("m", [1, 2, 16, 40, 64])
@pytest.mark.parametrize(("n", "k", "swiglu"), SHAPES)
def test_decode_rows_match_the_reference_on_every_repeat(m: int, n: int, k: int, swiglu: bool) -> None:
    _check_repeats(m, n, k, swiglu, seed=m * 7 + n + k)


def _variants() -> list[tuple[object, int, bool]]:
    from infiniops_triton import _gemv

    return ([(v, 1, sw) for v in _gemv.SWEEP_ONE_ROW for sw in (False, True)]
            + [(v, m, sw) for v in _gemv.SWEEP_TILE for m in (16, 64) for sw in (False, True)])


@pytest.mark.parametrize(("variant", "m", "swiglu"), _variants(), ids=str)
def test_every_sweep_variant_as_a_table_entry(monkeypatch: pytest.MonkeyPatch, variant: object, m: int,
                                              swiglu: bool) -> None:
    """The product's `_gemv.TABLE` entry serves the fused call at the Qwen3-0.6B qkv (gate_up with SwiGLU)."""
    from infiniops_triton import _gemv

    n = 3072 if swiglu else 4096
    monkeypatch.setattr(_gemv, "TABLE", {(_gemv.row_class(m), n, 1024, swiglu): variant})
    _check_repeats(m, n, 1024, swiglu, seed=m)


@pytest.mark.parametrize("m", [1, 16])
def test_graph_replays_equal_eager_calls(m: int) -> None:
    """Replays of one captured call give the bits of an eager call."""
    x, nw, w, bias = _inputs(m, 4096, 1024, False, seed=3)

    def call(out: torch.Tensor) -> None:
        with ops.use("triton"):
            ops.rms_norm_gemm(x, nw, w, 1e-6, bias=bias, out=out)

    eager = torch.empty(m, 4096, dtype=BF16, device="cuda")
    call(eager)
    graph_out = torch.full((m, 4096), float("nan"), dtype=BF16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(torch.empty_like(graph_out))  # warm: compiled and tuned before the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(graph_out)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, eager)
