"""Triton silu_and_mul, rotary_embedding and fused_qk_norm_rope on the CPU under the Triton interpreter: the
conformance suite, then the launch paths its small shapes do not reach (several column and head blocks, a
query/key boundary inside a program, head tiles that are no power of two in elements, unchecked out-of-range
positions), and the decode benchmark script end to end."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from interp_helpers import assert_conformant, check, randn

import infiniops_py

OPS = ("silu_and_mul", "rotary_embedding", "fused_qk_norm_rope")
EXAMPLES = 10
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _cache(rows: int, rotary_dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


@pytest.mark.parametrize("op", OPS)
def test_conformance(op: str) -> None:
    assert_conformant(op, EXAMPLES)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_silu_and_mul_many_column_blocks_and_a_ragged_last_one(dtype: torch.dtype) -> None:
    d = 2 * 1024 + 37  # three programs per row, the last one masked
    x = randn(3, 2 * d + 4, dtype=dtype, seed=1, scale=3.0)[:, : 2 * d]
    with infiniops_py.use("triton"):
        got = infiniops_py.silu_and_mul(x)
    with infiniops_py.use("reference"):
        ref = infiniops_py.silu_and_mul(x.double())
    check("silu_and_mul", got, ref)


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_rotary_heads_span_several_programs_with_query_and_key_in_one(is_neox: bool) -> None:
    """Hq=5, Hkv=3, D=256: 4 heads per program, so the second program turns query head 4 and key heads 0-2."""
    t, hq, hkv, d = 3, 5, 3, 256
    qkv = randn(t, (hq + 2 * hkv) * d, dtype=torch.bfloat16, seed=2)
    before = qkv.clone()
    cache, positions = _cache(20, 200), torch.tensor([19, 0, 7])  # partial rotary: 200 of 256 channels
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hkv) * d]
    q64, k64 = q.double(), k.double()
    with infiniops_py.use("reference"):
        infiniops_py.rotary_embedding(positions, q64, k64, d, cache.double(), is_neox)
    with infiniops_py.use("triton"):
        infiniops_py.rotary_embedding(positions, q, k, d, cache, is_neox)
    check("rotary_embedding", q, q64)
    check("rotary_embedding", k, k64)
    assert torch.equal(qkv[:, (hq + hkv) * d :], before[:, (hq + hkv) * d :])  # V untouched
    heads = qkv[:, : (hq + hkv) * d].view(t, hq + hkv, d)
    assert torch.equal(heads[..., 200:], before[:, : (hq + hkv) * d].view(t, hq + hkv, d)[..., 200:])


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_unchecked_out_of_range_positions_leave_their_tokens(is_neox: bool) -> None:
    t, hq, hkv, d = 4, 2, 1, 16
    cache = _cache(6, d)
    query, key = randn(t, hq * d, seed=3), randn(t, hkv * d, seed=4)
    qkv = randn(t, (hq + 2 * hkv) * d, seed=5)
    q_w, k_w = 1 + 0.1 * randn(d, seed=6), 1 + 0.1 * randn(d, seed=7)
    before = query.clone(), key.clone(), qkv.clone()
    positions = torch.tensor([6, 2, -1, 5])  # 6 is one past the cache's last row
    with infiniops_py.use("triton"), infiniops_py.unchecked_indices():
        infiniops_py.rotary_embedding(positions, query, key, d, cache, is_neox)
        infiniops_py.fused_qk_norm_rope(qkv, q_w, k_w, cache, positions, num_q_heads=hq, num_kv_heads=hkv,
                                        head_dim=d, is_neox=is_neox)
    for x, x0 in zip((query, key), before):
        assert torch.equal(x[[0, 2]], x0[[0, 2]])
    normed = before[2].double()
    with infiniops_py.use("reference"):
        infiniops_py.rotary_embedding(positions[[1, 3]], x64 := before[0][[1, 3]].double(), None, d, cache.double(),
                                      is_neox)
        infiniops_py.fused_qk_norm(normed, q_w.double(), k_w.double(), num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
    check("rotary_embedding", query[[1, 3]], x64)
    check("fused_qk_norm_rope", qkv[[0, 2]], normed[[0, 2]])  # normalized, not turned


@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_fused_partial_rotary_tiles_and_strided_rows(dtype: torch.dtype, is_neox: bool) -> None:
    """D=128 with rotary_dim 32: a head holds 16 + 16 pair channels and 96 (-> 128) pass-through ones, so the
    heads per program come from 2048 / 160, rounded down to a power of two; rows padded."""
    t, hq, hkv, d, rotary_dim = 5, 12, 2, 128, 32
    width = (hq + 2 * hkv) * d
    buf = randn(t, width + 8, dtype=dtype, seed=8)
    before = buf.clone()
    qkv = buf[:, :width]
    q_w, k_w = (1 + 0.1 * randn(d, seed=9)).to(dtype), (1 + 0.1 * randn(d, seed=10)).to(dtype)
    cache, positions = _cache(64, rotary_dim, dtype), torch.tensor([63, 1, 0, 40, 2])
    ref = qkv.double()
    with infiniops_py.use("reference"):
        infiniops_py.fused_qk_norm_rope(ref, q_w.double(), k_w.double(), cache.double(), positions, num_q_heads=hq,
                                        num_kv_heads=hkv, head_dim=d, is_neox=is_neox)
    with infiniops_py.use("triton"):
        infiniops_py.fused_qk_norm_rope(qkv, q_w, k_w, cache, positions, num_q_heads=hq, num_kv_heads=hkv,
                                        head_dim=d, is_neox=is_neox)
    check("fused_qk_norm_rope", qkv, ref)
    assert torch.equal(buf[:, (hq + hkv) * d :], before[:, (hq + hkv) * d :])  # V heads and row padding


def test_gpu_decode_benchmark_runs_every_way_end_to_end_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # benchmarks/gpu_decode_ops.py runs on the H200; here every path but the CUDA events and graphs runs
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_decode_ops.py"
    spec = importlib.util.spec_from_file_location("gpu_decode_ops", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["gpu_decode_ops"] = bench  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    rows = bench.run("cpu", tokens=(1, 3), calls=1, rounds=1)
    ways = {"silu_and_mul": {"triton", "torch", "composition"}, "rotary_embedding": {"triton", "torch", "composition"},
            "fused_qk_norm_rope": {"triton", "torch", "composition", "separate"}}
    assert {(r.case.op, r.case.tokens, r.way) for r in rows} == {(op, t, w) for op, ws in ways.items() for w in ws
                                                                 for t in (1, 3)}
    assert not any(r.failed for r in rows), bench.format_table(rows)
    ours = [r for r in rows if r.case.tokens == 3 and r.way in ("triton", "torch")]
    assert len(ours) == 6 and all(0 <= r.share <= 1 for r in ours), bench.format_table(rows)
    assert all(r.eager_us > 0 and r.case.nbytes > 0 for r in rows)
    assert len(bench.format_table(rows).splitlines()) == 2 + len(rows)
    assert len(bench.records(rows)) == len(rows)  # eager only on the CPU; `record` checks each one
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--tokens", "1"]) == 2
