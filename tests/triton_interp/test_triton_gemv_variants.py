"""The decode Gemm's `_gemv.TABLE` variants on the CPU under the Triton interpreter: each knob of `_gemv.Variant`
(per-step sums, split K, 16- to 64-row tiles, evict-first loads, the pipelined and unrolled one-row loop) computes
the product the public calls promise, 17 to 64 rows reach the kernel only through a table entry, and the table file
loads or is refused by name. tests/test_triton_sm90_compile.py compiles the GPU sweep's variants for sm_90."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from infiniops_triton import _gemv
from infiniops_triton._gemv import Variant
from interp_helpers import randn

import infiniops_py
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

# small steps (the interpreter's cost grows with the tile): every knob, on and off; one row, then 2 to 64 rows
ONE_ROW = (Variant(8, 16, 1, 4, 1, sum_each=True), Variant(4, 16, 3, 2, 1, evict=True, pipe=2, unroll=2),
           Variant(16, 32, 2, 4, 2))
TILE = (Variant(16, 32, 2, 4, 2, evict=True), Variant(32, 16, 1, 4, 1), Variant(16, 16, 3, 4, 1))
VARIANTS = (*ONE_ROW, *TILE)


def _cases(shapes: list[tuple[int, int, int]]) -> list[tuple[Variant, int, int, int]]:
    """Each shape with each variant of its row class."""
    return [(v, *shape) for shape in shapes for v in (ONE_ROW if shape[0] == 1 else TILE)]


def _key(m: int, n: int, k: int, swiglu: bool) -> tuple[int, int, int, bool]:
    return _gemv.row_class(m), n, k, swiglu


def _check(op: str, got: torch.Tensor, ref: torch.Tensor, k: int) -> None:
    _, failure = compare(op, got, ref, tolerance(op, str(got.dtype).removeprefix("torch.")), k=k)
    assert failure is None, failure


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[int, int, int, bool], Variant]:
    """`_gemv.TABLE`, emptied for the test and restored after it."""
    monkeypatch.setattr(_gemv, "TABLE", {})
    return _gemv.TABLE


@pytest.mark.parametrize(("variant", "m", "n", "k"), _cases([(1, 37, 70), (7, 33, 50), (29, 20, 48), (64, 9, 37)]))
def test_a_table_variant_computes_the_gemm(table: dict, variant: Variant, m: int, n: int, k: int) -> None:
    """The public Gemm with the shape's table entry: ragged N and K, a strided x, alpha, ``beta * c``, the bias;
    one row per class (1, 16, 32, 64) with the one-row knobs or the tile's; the output poisoned first."""
    dtype = torch.bfloat16
    x = randn(m, k + 3, dtype=dtype, seed=31)[:, :k]
    w = randn(n, k, dtype=dtype, seed=32, scale=k**-0.5)
    c = randn(m, n, dtype=dtype, seed=33)
    bias = randn(n, dtype=dtype, seed=34)
    table[_key(m, n, k, False)] = variant
    assert _gemv.serves(x, w.t(), torch.empty(m, n))
    out = torch.full((m, n), float("nan"), dtype=dtype)
    with infiniops_py.use("triton"):
        infiniops_py.gemm(x, w, c=c, bias=bias, alpha=0.5, beta=1.0, trans_b=True, out=out)
    _check("gemm", out, 0.5 * x.double() @ w.double().t() + c.double() + bias.double(), k)


@pytest.mark.parametrize(("variant", "m", "d", "k"), _cases([(1, 21, 40), (12, 17, 33), (40, 9, 50)]))
def test_a_table_variant_computes_gemm_swiglu_in_one_kernel(table: dict, monkeypatch: pytest.MonkeyPatch,
                                                            variant: Variant, m: int, d: int, k: int) -> None:
    """gemm_swiglu with the shape's table entry runs the GEMV kernel alone (no SiluAndMul, no tiled Gemm), also
    past 16 rows; its values within the gemm_swiglu rule of the float64 reference."""
    from infiniops_triton import gemm_swiglu as module

    dtype = torch.bfloat16
    x = randn(m, k + 5, dtype=dtype, seed=41)[:, :k]
    w = randn(2 * d, k, dtype=dtype, seed=42, scale=k**-0.5)
    bias = randn(2 * d, dtype=dtype, seed=43)
    table[_key(m, d, k, True)] = variant
    launched = []
    monkeypatch.setattr(module, "silu_and_mul", lambda *a: launched.append("silu_and_mul"))
    monkeypatch.setattr(module, "gemm", lambda *a: launched.append("gemm"))
    out = torch.full((m, d), float("nan"), dtype=dtype)
    with infiniops_py.use("triton"):
        infiniops_py.gemm_swiglu(x, w, bias, out=out)
    assert launched == []
    gate, up = (x.double() @ w.double().t() + bias.double()).chunk(2, dim=-1)
    _check("gemm_swiglu", out, torch.nn.functional.silu(gate) * up, k)


def test_rows_past_16_take_the_kernel_only_where_the_table_names_the_shape(table: dict) -> None:
    w = torch.empty(64, 32)
    for m in (17, 32, 33, 64):
        assert not _gemv.serves(torch.empty(m, 32), w.t(), torch.empty(m, 64))
    table[(32, 64, 32, False)] = VARIANTS[0]
    assert _gemv.serves(torch.empty(17, 32), w.t(), torch.empty(17, 64))
    assert _gemv.serves(torch.empty(32, 32), w.t(), torch.empty(32, 64))
    assert not _gemv.serves(torch.empty(33, 32), w.t(), torch.empty(33, 64))  # row class 64: not named
    assert not _gemv.serves(torch.empty(32, 48), torch.empty(64, 48).t(), torch.empty(32, 64))  # another K
    assert not _gemv.takes(32, 64, 32, 1, 1, k=32, swiglu=True)  # the SwiGLU entry is its own
    table[(64, 64, 32, False)] = VARIANTS[0]
    assert _gemv.serves(torch.empty(64, 32), w.t(), torch.empty(64, 64))
    assert not _gemv.takes(65, 64, 32, 1, 1, k=32)  # past the kernel's rows, whatever the table says
    assert [_gemv.row_class(m) for m in (1, 2, 16, 17, 32, 33, 64)] == [1, 16, 16, 32, 32, 64, 64]


def test_rows_past_16_without_an_entry_run_the_tiled_gemm_and_silu_and_mul(table: dict) -> None:
    from infiniops_triton import gemm_swiglu as module

    x, w = randn(20, 24, seed=51), randn(2 * 8, 24, seed=52, scale=0.2)
    out = torch.full((20, 8), float("nan"))
    module.gemm_swiglu(x, w, None, out)
    gate, up = (x.double() @ w.double().t()).chunk(2, dim=-1)
    _check("gemm_swiglu", out, torch.nn.functional.silu(gate) * up, 24)


def test_the_table_file_loads_and_bad_entries_are_named(tmp_path: Path) -> None:
    good = tmp_path / "table.json"
    good.write_text(json.dumps([{"rows": 32, "n": 3072, "k": 1024, "swiglu": True, "variant": list(TILE[0])},
                                {"rows": 1, "n": 1024, "k": 3072, "swiglu": False, "variant": [4, 1024]}]))
    assert _gemv.load_table(str(good)) == {(32, 3072, 1024, True): TILE[0],
                                           (1, 1024, 3072, False): Variant(4, 1024)}
    for entry, match in (({"rows": 1, "n": 8, "k": 8, "variant": [4, 64]}, "entry 0 is not"),  # no swiglu
                         ({"rows": 8, "n": 8, "k": 8, "swiglu": False, "variant": [4, 64]}, "entry 0: row class 8"),
                         ({"rows": 1, "n": 8, "k": 8, "swiglu": False, "variant": [4, 64, 0]}, "entry 0: .*range"),
                         ({"rows": 16, "n": 8, "k": 8, "swiglu": False, "variant": [8, 64]}, "entry 0: .*range"),
                         ({"rows": 1, "n": 8, "k": 8, "swiglu": False, "variant": [4]}, "entry 0 is not")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps([entry]))
        with pytest.raises(ValueError, match=f"bad.json: {match}"):
            _gemv.load_table(str(bad))


def test_scratch_grows_and_keeps_what_a_graph_may_still_address() -> None:
    device = torch.device("cpu")
    part, counter = _gemv._scratch(device, 10, 100)
    assert part.numel() >= 100 and counter.numel() >= 10 and not counter.any()
    assert _gemv._scratch(device, 10, 100)[0] is part  # enough: the same
    bigger, _ = _gemv._scratch(device, counter.numel() + 1, part.numel() + 1)
    assert bigger.numel() > part.numel()
    assert any(old[0] is part for old in _gemv._RETIRED)
