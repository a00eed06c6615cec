"""GemmAddRmsNorm in Triton on the CPU under the interpreter: the conformance suite; the decode rows in the GEMV
kernel's ``ADD_NORM`` epilogue (the autotuned split-K configuration and `_gemv.TABLE` variants of every row class,
ragged N and K, strided rows, a bias) against the float64 reference with the tolerance rule, the output poisoned
first; the counter left at zero for the next call (a CUDA graph's replay); more rows through the tiled Gemm and
FusedAddRmsNorm."""

from __future__ import annotations

import pytest
import torch
from infiniops_triton import _gemv
from infiniops_triton._gemv import Variant
from interp_helpers import assert_conformant, randn

import infiniops_py
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
ONE_ROW = (Variant(8, 16, 1, 4, 1), Variant(4, 16, 3, 2, 1, sum_each=True))
TILE = (Variant(16, 32, 2, 4, 2), Variant(32, 16, 1, 4, 1))


def _inputs(m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    x = randn(m, k + 3, dtype=dtype, seed=41)[:, :k]
    w = randn(n, k, dtype=dtype, seed=42, scale=k**-0.5)
    residual = randn(m, n + 2, dtype=dtype, seed=43)[:, :n]
    norm_weight = randn(n, dtype=dtype, seed=44, scale=0.1) + 1
    bias = randn(n, dtype=dtype, seed=45)
    return x, w, residual, norm_weight, bias


def _check(out: torch.Tensor, residual: torch.Tensor, inputs: tuple[torch.Tensor, ...], k: int) -> None:
    """`out` and `residual` within the rule of the float64 reference run on `inputs` (residual before the call)."""
    x, w, r0, nw, bias = (t.double() for t in inputs)
    r_ref = r0.clone()
    ref, _ = infiniops_py.gemm_add_rms_norm(x, w, r_ref, nw, 1e-5, bias=bias)
    rule = tolerance("gemm_add_rms_norm", str(out.dtype).removeprefix("torch."))
    for got, want in ((out, ref), (residual, r_ref)):
        _, failure = compare("gemm_add_rms_norm", got, want, rule, k=k)
        assert failure is None, failure


def _run(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    inputs = _inputs(m, n, k, dtype)
    x, w, residual, nw, bias = inputs
    before = residual.clone()
    out = torch.full((m, n), float("nan"), dtype=dtype)
    with infiniops_py.use("triton"):
        got, updated = infiniops_py.gemm_add_rms_norm(x, w, residual, nw, 1e-5, bias=bias, out=out)
    assert got is out and updated is residual
    _check(out, residual, (x, w, before, nw, bias), k)


def test_gemm_add_rms_norm_conforms() -> None:
    assert_conformant("gemm_add_rms_norm", 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 37, 64), (1, 70, 100), (4, 40, 96), (16, 9, 50), (3, 2100, 24),
                                          (20, 7, 32)])
def test_decode_rows_add_and_normalize_in_the_gemv_epilogue(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    """Up to 16 rows run the GEMV kernel with ADD_NORM (the interpreter's split-K configuration: several column
    tiles, the last one normalizing; rows past 2048 columns in two passes); 20 rows the tiled Gemm then
    FusedAddRmsNorm; both within the rule."""
    _run(m, n, k, dtype)


def test_the_counter_is_zero_after_each_call() -> None:
    """The last program resets the column-tile counter: the same call twice gives the same values (a CUDA graph
    replays the kernel with the counters as the previous replay left them)."""
    inputs = _inputs(2, 48, 40, torch.float32)
    x, w, residual, nw, bias = inputs
    outs = []
    for _ in range(2):
        r = residual.clone()
        with infiniops_py.use("triton"):
            outs.append(infiniops_py.gemm_add_rms_norm(x, w, r, nw, 1e-5, bias=bias)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    _, counters = _gemv._scratch(x.device, 1, 1)
    assert not counters.any()


@pytest.mark.parametrize(("variant", "m", "n", "k"),
                         [(v, 1, 37, 70) for v in ONE_ROW] + [(v, m, 33, 50) for v in TILE for m in (7, 40)])
def test_a_table_variant_adds_and_normalizes(monkeypatch: pytest.MonkeyPatch, variant: Variant, m: int, n: int,
                                             k: int) -> None:
    """The plain product's table entry serves the fused call: one row with the one-row knobs, 7 and 40 rows (a
    16- and a 64-row tile; 40 rows only through the table) with the tile's, the GEMV kernel alone."""
    monkeypatch.setattr(_gemv, "TABLE", {(_gemv.row_class(m), n, k, False): variant})
    from infiniops_triton import gemm_add_rms_norm as module

    monkeypatch.setattr(module, "fused_add_rms_norm", None)  # the tiled path would call it
    _run(m, n, k, torch.bfloat16)
