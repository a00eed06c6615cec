"""Triton gemm, add, rms_norm, fused_add_rms_norm, fused_qk_norm and reshape_and_cache_flash on the CPU
under the Triton interpreter: the conformance suite, then the launch paths its small shapes do not reach
(several rows per program, host-side dimension loops, unchecked out-of-range slots, gates)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from interp_helpers import assert_conformant, check, randn

import infiniops_py
from infiniops_py import GateError
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

OPS = ("gemm", "add", "rms_norm", "fused_add_rms_norm", "fused_qk_norm", "reshape_and_cache_flash")
EXAMPLES = 10
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@pytest.mark.parametrize("op", OPS)
def test_conformance(op: str) -> None:
    assert_conformant(op, EXAMPLES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "hidden"), [(300, 8), (70, 3), (9, 769)])
def test_rms_norm_rows_per_program(dtype: torch.dtype, tokens: int, hidden: int) -> None:
    # small hidden sizes pack up to 256 rows per program: cover several programs and a ragged last one
    x = randn(tokens, hidden + 5, dtype=dtype, seed=1)[:, :hidden]  # strided rows
    w = (1 + 0.1 * randn(hidden, dtype=torch.float32, seed=2)).to(dtype)
    res = randn(tokens, hidden, dtype=dtype, seed=3)
    with infiniops_py.use("triton"):
        y = infiniops_py.rms_norm(x, w, 1e-6)
        x2, r2 = x.clone(), res.clone()
        infiniops_py.fused_add_rms_norm(x2, r2, w, 1e-6)
    with infiniops_py.use("reference"):
        ref = infiniops_py.rms_norm(x.double(), w.double(), 1e-6)
        x3, r3 = infiniops_py.fused_add_rms_norm(x.double(), res.double(), w.double(), 1e-6)
    check("rms_norm", y, ref)
    check("fused_add_rms_norm", x2, x3)
    check("fused_add_rms_norm", r2, r3)


def test_rms_norm_gates_rows_too_wide_for_registers() -> None:
    with infiniops_py.use("triton"), pytest.raises(GateError, match="hidden_size"):
        infiniops_py.resolve("rms_norm", device_type="cpu", dtype="bfloat16", hidden_size=65537)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_shapes_beyond_the_kernel_rank(dtype: torch.dtype) -> None:
    # every other dim of a rank-6 tensor: nothing merges, the launcher loops over the leading dims
    base = randn(2, 2, 3, 2, 2, 2, 3, 2, 2, 2, 3, 2, dtype=dtype, seed=4)
    a = base[:, 0, :, 0, :, 0, :, 0, :, 0, :, 0]  # [2, 3, 2, 3, 2, 3], no two dims mergeable
    b = randn(3, 1, 3, 1, 3, dtype=dtype, seed=5)
    with infiniops_py.use("triton"):
        got = infiniops_py.add(a, b, alpha=-0.5)
        inplace = a.clone()
        infiniops_py.add(inplace, b, alpha=2.0, out=inplace)
        scalar = infiniops_py.add(randn(dtype=dtype, seed=6), randn(dtype=dtype, seed=7))
    check("add", got, a.double() - 0.5 * b.double())
    check("add", inplace, a.double() + 2.0 * b.double())
    assert scalar.shape == ()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 4096), (3, 1000)])  # the flat kernel: whole blocks, then a ragged one
def test_add_flat_same_shape_and_in_place(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    a, b = randn(*shape, dtype=dtype, seed=15), randn(*shape, dtype=dtype, seed=16)
    with infiniops_py.use("triton"):
        got = infiniops_py.add(a, b, alpha=0.75)
        inplace = a.clone()
        infiniops_py.add(inplace, b, out=inplace)
    check("add", got, a.double() + 0.75 * b.double())
    check("add", inplace, a.double() + b.double())


def test_paged_cache_skips_out_of_range_slots_when_unchecked() -> None:
    key = randn(6, 2, 16, dtype=torch.bfloat16, seed=8)
    value = randn(6, 2, 16, dtype=torch.bfloat16, seed=9)
    key_cache = randn(3, 4, 2, 16, dtype=torch.bfloat16, seed=10)
    value_cache = randn(3, 4, 2, 16, dtype=torch.bfloat16, seed=11)
    slots = torch.tensor([5, 12, -1, 1000, 0], dtype=torch.int64)  # 12 = 3 * 4 is one past the last slot
    kc, vc = key_cache.clone(), value_cache.clone()
    with infiniops_py.use("triton"), infiniops_py.unchecked_indices():
        infiniops_py.reshape_and_cache_flash(key, value, kc, vc, slots)
    for t, s in ((0, 5), (4, 0)):
        key_cache[s // 4, s % 4], value_cache[s // 4, s % 4] = key[t], value[t]
    assert torch.equal(kc, key_cache)
    assert torch.equal(vc, value_cache)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_qk_norm_strided_rows_leave_v_and_padding_untouched(dtype: torch.dtype) -> None:
    hq, hkv, d = 5, 2, 24
    width = (hq + 2 * hkv) * d
    buf = randn(7, width + 8, dtype=dtype, seed=12)
    qkv = buf[:, :width]
    before = buf.clone()
    q_w = (1 + 0.1 * randn(d, dtype=torch.float32, seed=13)).to(dtype)
    k_w = (1 + 0.1 * randn(d, dtype=torch.float32, seed=14)).to(dtype)
    with infiniops_py.use("reference"):
        ref = infiniops_py.fused_qk_norm(qkv.double(), q_w.double(), k_w.double(), num_q_heads=hq,
                                         num_kv_heads=hkv, head_dim=d)
    with infiniops_py.use("triton"):
        infiniops_py.fused_qk_norm(qkv, q_w, k_w, num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
    check("fused_qk_norm", qkv, ref)
    assert torch.equal(buf[:, (hq + hkv) * d:], before[:, (hq + hkv) * d:])  # V heads and row padding


def test_gpu_benchmark_script_runs_end_to_end_at_small_sizes() -> None:
    # benchmarks/gpu_dense.py runs on the H200 only; here every code path but the real timer runs on the CPU
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_dense.py"
    spec = importlib.util.spec_from_file_location("gpu_dense", path)
    assert spec is not None and spec.loader is not None
    gpu_dense = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_dense)
    results: list[dict] = []
    gpu_dense.run(results, device="cpu", timer=lambda fn: (fn(), 1.0)[1], small=True)
    checks = [r for r in results if r["kind"] == "check"]
    perf = [r for r in results if r["kind"] == "perf"]
    assert len(checks) == 2 * len(gpu_dense.correctness_cases(torch.float32, "cpu", small=True))  # bf16, fp32
    assert all(r["status"] == "PASS" for r in checks), gpu_dense.format_table(checks)
    assert len(perf) == 9 and all("triton" in r for r in perf), gpu_dense.format_table(perf)
    assert len(gpu_dense.format_table(results).splitlines()) == len(results)


def test_gemm_autotune_candidates_follow_the_problem_class() -> None:
    # the interpreter runs one config, so the GPU's candidate choice is checked here as plain Python
    from infiniops_triton import gemm as triton_gemm

    half, single = torch.empty(1, dtype=torch.bfloat16), torch.empty(1, dtype=torch.float32)

    def pick(a: torch.Tensor, m: int, n: int) -> list[tuple[int, int, int]]:
        chosen = triton_gemm._prune([], {"A": a, "M": m, "N": n})
        return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in chosen]

    assert pick(half, 8192, 8192) == [(128, 256, 64), (128, 256, 64), (256, 128, 64), (128, 128, 64)]
    assert pick(half, 512, 8192) == [(128, 128, 64), (64, 128, 64)]
    assert pick(half, 1, 4096) == [(64, 128, 64)]
    assert all(k == 32 for _, _, k in pick(single, 8192, 8192))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 37, 64), (1, 5, 100), (3, 40, 96), (16, 33, 50)])
def test_gemm_decode_rows_take_the_gemv_kernel(dtype: torch.dtype, m: int, n: int, k: int) -> None:
    """A few rows by an nn.Linear weight (the decode projections) run the GEMV kernel: ragged N and K, a
    strided x, the residual c (beta), alpha and the bias; the output is poisoned first."""
    from infiniops_triton import _gemv

    x = randn(m, k + 3, dtype=dtype, seed=11)[:, :k]
    w = randn(n, k, dtype=dtype, seed=12, scale=0.2)
    c = randn(m, n, dtype=dtype, seed=13)
    bias = randn(n, dtype=dtype, seed=14)
    assert _gemv.serves(x, w.t(), torch.empty(m, n))
    out = torch.full((m, n), float("nan"), dtype=dtype)
    with infiniops_py.use("triton"):
        infiniops_py.gemm(x, w, c=c, bias=bias, alpha=0.5, beta=1.0, trans_b=True, out=out)
        plain = infiniops_py.gemm(x, w, trans_b=True)
    ref = 0.5 * x.double() @ w.double().t() + c.double() + bias.double()
    for got, want in ((out, ref), (plain, x.double() @ w.double().t())):
        _, failure = compare("gemm", got, want, tolerance("gemm", str(dtype).removeprefix("torch.")), k=k)
        assert failure is None, failure


def test_gemm_gemv_takes_only_decode_shapes() -> None:
    from infiniops_triton import _gemv

    w = torch.empty(64, 32)
    assert _gemv.serves(torch.empty(16, 32), w.t(), torch.empty(16, 64))
    assert not _gemv.serves(torch.empty(17, 32), w.t(), torch.empty(17, 64))  # the tiled kernel's
    assert not _gemv.serves(torch.empty(4, 32), torch.empty(32, 64), torch.empty(4, 64))  # N-contiguous b
    assert not _gemv.serves(torch.empty(32, 4).t(), w.t(), torch.empty(4, 64))  # a transposed
    assert not _gemv.serves(torch.empty(0, 32), w.t(), torch.empty(0, 64))


def test_gemm_swiglu_conforms() -> None:
    assert_conformant("gemm_swiglu", EXAMPLES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("m", "d", "k"), [(1, 37, 64), (1, 5, 100), (4, 40, 96), (16, 9, 50), (20, 7, 32)])
def test_gemm_swiglu_decode_rows_apply_the_activation_in_the_gemv_epilogue(dtype: torch.dtype, m: int, d: int,
                                                                          k: int) -> None:
    """Up to 16 rows run the GEMV kernel with SWIGLU (split K, ragged d and K, a bias); more rows the tiled Gemm
    then SiluAndMul; the same values as the torch provider within the tolerance rule."""
    x = randn(m, k + 3, dtype=dtype, seed=21)[:, :k]
    w = randn(2 * d, k, dtype=dtype, seed=22, scale=k**-0.5)
    bias = randn(2 * d, dtype=dtype, seed=23)
    out = torch.full((m, d), float("nan"), dtype=dtype)
    with infiniops_py.use("triton"):
        infiniops_py.gemm_swiglu(x, w, bias, out=out)
    ref = infiniops_py.gemm_swiglu(x.double(), w.double(), bias.double())
    _, failure = compare("gemm_swiglu", out, ref, tolerance("gemm_swiglu", str(dtype).removeprefix("torch.")), k=k)
    assert failure is None, failure
