"""RmsNormGemm in Triton on the CPU under the interpreter: the conformance suite; the decode rows in the GEMV
kernel's ``PRE_NORM`` prologue (the autotuned split-K configuration, each split computing the rows' mean square
itself, and `_gemv.TABLE` variants of every row class, ragged N and K, strided rows, a bias, with and without
``SWIGLU``) against the float64 reference with the tolerance rule, the output poisoned first, and bit-for-bit
against the Triton rms_norm then gemm (or gemm_swiglu) where the product's rounding is the same; more rows through
the RmsNorm kernel and the tiled Gemm."""

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


def _inputs(m: int, n: int, k: int, dtype: torch.dtype, swiglu: bool) -> tuple[torch.Tensor, ...]:
    rows = 2 * n if swiglu else n
    x = randn(m, k + 3, dtype=dtype, seed=41)[:, :k]
    norm_weight = randn(k, dtype=dtype, seed=44, scale=0.1) + 1
    w = randn(rows, k, dtype=dtype, seed=42, scale=k**-0.5)
    bias = randn(rows, dtype=dtype, seed=45)
    return x, norm_weight, w, bias


def _run(m: int, n: int, k: int, dtype: torch.dtype, swiglu: bool) -> torch.Tensor:
    x, nw, w, bias = _inputs(m, n, k, dtype, swiglu)
    out = torch.full((m, n), float("nan"), dtype=dtype)
    with infiniops_py.use("triton"):
        got = infiniops_py.rms_norm_gemm(x, nw, w, 1e-5, bias=bias, swiglu=swiglu, out=out)
    assert got is out
    ref = infiniops_py.rms_norm_gemm(x.double(), nw.double(), w.double(), 1e-5, bias=bias.double(), swiglu=swiglu)
    rule = tolerance("rms_norm_gemm", str(dtype).removeprefix("torch."))
    _, failure = compare("rms_norm_gemm", out, ref, rule, k=k)
    assert failure is None, failure
    return out


def test_rms_norm_gemm_conforms() -> None:
    assert_conformant("rms_norm_gemm", 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 37, 64), (1, 70, 100), (4, 40, 96), (16, 9, 50), (3, 24, 300),
                                          (20, 7, 32)])
def test_decode_rows_normalize_in_the_gemv_prologue(dtype: torch.dtype, swiglu: bool, m: int, n: int,
                                                    k: int) -> None:
    """Up to 16 rows run the GEMV kernel with PRE_NORM (the interpreter's split-K configuration: each split reads
    the whole row for its mean square; K 300 over several steps of the mean-square loop); 20 rows rms_norm then the
    tiled Gemm; all within the rule."""
    _run(m, n, k, dtype, swiglu)


@pytest.mark.parametrize("swiglu", [False, True])
def test_one_row_equals_rms_norm_then_the_gemv(swiglu: bool) -> None:
    """fp32 products summed in the same order: the prologue's normed tiles are the RmsNorm kernel's values, so the
    fused call equals rms_norm then the plain GEMV (or gemm_swiglu) of the same configuration closely."""
    x, nw, w, bias = _inputs(1, 40, 64, torch.bfloat16, swiglu)
    with infiniops_py.use("triton"):
        got = infiniops_py.rms_norm_gemm(x, nw, w, 1e-5, bias=bias, swiglu=swiglu)
        normed = infiniops_py.rms_norm(x, nw, 1e-5)
        want = (infiniops_py.gemm_swiglu(normed, w, bias) if swiglu
                else infiniops_py.gemm(normed, w, bias=bias, trans_b=True))
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize(("variant", "m", "n", "k"),
                         [(v, 1, 37, 70) for v in ONE_ROW] + [(v, m, 33, 50) for v in TILE for m in (7, 40)])
def test_a_table_variant_normalizes(monkeypatch: pytest.MonkeyPatch, variant: Variant, m: int, n: int, k: int,
                                    swiglu: bool) -> None:
    """The plain product's table entry serves the fused call: one row with the one-row knobs, 7 and 40 rows (a
    16- and a 64-row tile; 40 rows only through the table) with the tile's, the GEMV kernel alone."""
    monkeypatch.setattr(_gemv, "TABLE", {(_gemv.row_class(m), n, k, swiglu): variant})
    from infiniops_triton import rms_norm_gemm as module

    monkeypatch.setattr(module, "rms_norm", None)  # the two-launch path would call it
    _run(m, n, k, torch.bfloat16, swiglu)
