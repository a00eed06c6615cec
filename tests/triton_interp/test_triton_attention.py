"""Triton flash_attn_varlen and flash_attn_with_kvcache on the CPU under the Triton interpreter.

First the conformance suite; then what its small random cases reach rarely: 16-row blocks, so that every
case crosses several query and key blocks and all three key loops (window edge, unmasked, diagonal) run;
the eager rescale the autotuner may pick; a negative scale; rows that see no key; forced split-K counts and
the combine kernel; unchecked out-of-range block ids; empty inputs; the head-dim gate; the split
heuristic; the GPU benchmark's own code (benchmarks/gpu_attention.py) at tiny sizes; and, in a process
without the interpreter, the tuned H200 configurations compiled for sm_90 (no GPU needed).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from infiniops_triton import flash_attn as tfa
from interp_helpers import assert_conformant

import infiniops_py
from infiniops_py import GateError, unchecked_indices
from infiniops_py.operators.flash_attn import in_input_dtype
from infiniops_py.testing.compare import bits_equal, compare
from infiniops_py.testing.tolerances import tolerance

OPS = ("flash_attn_varlen", "flash_attn_with_kvcache")
EXAMPLES = 4
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SMALL_BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 16}


def _bench() -> ModuleType:
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_attention.py"
    spec = importlib.util.spec_from_file_location("gpu_attention", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()


@pytest.mark.parametrize("op", OPS)
def test_conformance(op: str) -> None:
    assert_conformant(op, EXAMPLES)


# --- helpers ---------------------------------------------------------------------------------------


def _copies(args: dict[str, Any], dtype: torch.dtype | None = None) -> dict[str, Any]:
    return {n: (v.to(dtype) if dtype is not None and v.is_floating_point() else v.clone())
            if isinstance(v, torch.Tensor) else v for n, v in args.items()}


def _references(op: str, args: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """(float64 reference, reference in the input dtype, the latter's arguments after the call)."""
    fn = getattr(infiniops_py, op)
    with infiniops_py.use("reference"):
        ref = fn(**_copies(args, torch.float64))
        low_args = _copies(args)
        with in_input_dtype():  # flash-attention's baseline: its reference in the input dtype
            low = fn(**low_args)
    return ref, low, low_args


def _assert_close(op: str, got: torch.Tensor, args: dict[str, Any]) -> dict[str, Any]:
    ref, low, low_args = _references(op, args)
    _, failure = compare(op, got, ref, tolerance(op, str(got.dtype)[6:]), low=low)
    assert failure is None, failure
    return low_args


def _convention(op: str, args: dict[str, Any]) -> tuple[Any, ...]:
    """The implementation calling convention's positional arguments (fresh copies, scale filled in)."""
    a = _copies(args)
    scale = a.pop("softmax_scale", a["q"].shape[-1] ** -0.5)
    out = torch.empty_like(a["q"])
    if op == "flash_attn_varlen":
        return (a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"],
                scale, a["causal"], a["window_size"], a["softcap"], a.get("block_table"), out)
    return (a["q"], a["k_cache"], a["v_cache"], a["cache_seqlens"], a.get("block_table"), a.get("k"), a.get("v"),
            scale, a["causal"], a["window_size"], a["softcap"], out)


# --- varlen ----------------------------------------------------------------------------------------

# (lens_q, lens_k, Hq, Hkv, D, causal, window, softcap, block_size, softmax_scale)
VARLEN_CASES = {
    "causal Sq>Sk and Sq<Sk, GQA": ([40, 3, 17], [20, 50, 17], 4, 1, 64, True, (-1, -1), 0.0, 0, None),
    "window (7, 3), D=59": ([33, 20], [40, 20], 2, 2, 59, False, (7, 3), 0.0, 0, None),
    "causal window 9, softcap, paged 16": ([33, 5], [40, 50], 2, 1, 32, True, (9, -1), 5.0, 16, None),
    "negative scale, paged 32, D=80": ([30, 12], [45, 12], 3, 1, 80, False, (-1, 4), 0.0, 32, -0.2),
    "window (20, -1), softcap, empty sequences, D=96": ([0, 26, 9], [12, 0, 30], 4, 2, 96, False, (20, -1), 30.0, 0,
                                                        None),
}


def _varlen_args(case: str, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    lq, lk, hq, hkv, d, causal, window, softcap, page, scale = VARLEN_CASES[case]
    args = BENCH.varlen_case(lq, lk, hq, hkv, d, dtype, "cpu", causal=causal, window=window, softcap=softcap,
                             page=page, seed=seed)
    if scale is not None:
        args["softmax_scale"] = scale
    return args


def _loaders(case: str) -> list[bool]:
    """Tensor descriptors (TMA) read contiguous K/V with a head dim that keeps rows 16-byte aligned."""
    d, page = VARLEN_CASES[case][4], VARLEN_CASES[case][8]
    return [False, True] if page == 0 and d % 8 == 0 else [False]


@pytest.mark.parametrize(("case", "tma"), [(c, t) for c in VARLEN_CASES for t in _loaders(c)])
@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_small_blocks(dtype: torch.dtype, lazy: bool, case: str, tma: bool) -> None:
    args = _varlen_args(case, dtype, seed=len(case))
    config = {**SMALL_BLOCKS, "LAZY": lazy, "USE_TMA": tma}
    got = tfa.flash_attn_varlen(*_convention("flash_attn_varlen", args), config=config)
    _assert_close("flash_attn_varlen", got, args)


def test_varlen_tma_refuses_paged_kv() -> None:
    args = _varlen_args("causal window 9, softcap, paged 16", torch.float16, seed=1)
    with pytest.raises(ValueError, match="USE_TMA"):
        tfa.flash_attn_varlen(*_convention("flash_attn_varlen", args), config={**SMALL_BLOCKS, "USE_TMA": True})


def test_varlen_rows_that_see_no_key_are_zero() -> None:
    args = _varlen_args("causal Sq>Sk and Sq<Sk, GQA", torch.bfloat16, seed=3)
    with infiniops_py.use("triton"):
        got = infiniops_py.flash_attn_varlen(**args)
    # sequence 0 has 40 queries over 20 keys: bottom-right causal leaves its first 20 rows without a key
    assert bool((got[:20] == 0).all())
    assert bool((got[20:40].abs().amax(-1) > 0).all())
    _assert_close("flash_attn_varlen", got, args)


def test_varlen_empty_inputs() -> None:
    q = torch.randn(0, 4, 64, dtype=torch.float16)
    k = torch.randn(5, 2, 64, dtype=torch.float16)
    cu_q = torch.tensor([0, 0], dtype=torch.int32)
    cu_k = torch.tensor([0, 5], dtype=torch.int32)
    with infiniops_py.use("triton"):
        assert infiniops_py.flash_attn_varlen(q, k, k, cu_q, cu_k, 0, 5, causal=True).shape == (0, 4, 64)
        none = torch.tensor([0], dtype=torch.int32)
        assert infiniops_py.flash_attn_varlen(q, k[:0], k[:0], none, none, 0, 0).shape == (0, 4, 64)


def test_varlen_unchecked_out_of_range_blocks_are_skipped() -> None:
    args = _varlen_args("causal window 9, softcap, paged 16", torch.float16, seed=5)
    table, pages = args["block_table"], args["k"].shape[0]
    table[0, 1], table[1, 0] = pages + 7, -3  # keys 16..31 of sequence 0, all of sequence 1's first block
    with unchecked_indices():
        with infiniops_py.use("triton"):
            got = infiniops_py.flash_attn_varlen(**args)
        _assert_close("flash_attn_varlen", got, args)
    assert not bool(got.isnan().any())


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_varlen_unchecked_cu_seqlens_stay_inside_the_tensors(paged: bool) -> None:
    # cu_seqlens past the rows or below 0 (unchecked): unspecified numbers, but every q/k/v row read and every
    # out/lse row written lies inside its tensor: views into sentinel buffers show any access beyond them
    gen = torch.Generator().manual_seed(31)
    qbuf, obuf = torch.randn(64, 2, 32, generator=gen), torch.full((64, 2, 32), 7.0)
    lbuf = torch.full((2, 64), 7.0)
    kbuf, vbuf = torch.full((64, 1, 32), torch.nan), torch.full((64, 1, 32), torch.nan)
    kbuf[16:23], vbuf[16:23] = torch.randn(7, 1, 32, generator=gen), torch.randn(7, 1, 32, generator=gen)
    q, out, lse = qbuf[16:21], obuf[16:21], lbuf[:, 16:21]
    k, v, table = kbuf[16:23], vbuf[16:23], None
    if paged:
        k, v = torch.randn(1, 16, 1, 32, generator=gen), torch.randn(1, 16, 1, 32, generator=gen)
        table = torch.zeros(2, 1, dtype=torch.int32)  # one page of 16 keys per sequence
    for cu_q, cu_k in (([0, 32, 40], [-8, 20, 30]), ([3, 1, 5], [2**31 - 1, -2**31, 7])):
        q_lens = torch.tensor(cu_q, dtype=torch.int32)
        tfa.flash_attn_varlen(q, k, v, q_lens, torch.tensor(cu_k, dtype=torch.int32), 32, 40, 0.2, False,
                              (-1, -1), 0.0, table, out, softmax_lse=lse)
        assert bool((obuf[:16] == 7.0).all()) and bool((obuf[21:] == 7.0).all()), cu_q
        assert bool((lbuf[:, :16] == 7.0).all()) and bool((lbuf[:, 21:] == 7.0).all()), cu_q
        assert not bool(out.isnan().any()), cu_k  # no key row read outside k (NaN there)


# --- kvcache ---------------------------------------------------------------------------------------

# (batch, cached, Hq, Hkv, D, capacity, Sq, new, block_size, window, softcap)
KVCACHE_CASES = {
    "decode GQA 4, append": (3, [70, 0, 33], 8, 2, 64, 96, 1, 1, 0, (-1, -1), 0.0),
    "paged 16, Sq 3, window, softcap": (2, [50, 9], 4, 1, 32, 80, 3, 3, 16, (20, -1), 5.0),
    "paged 32, no append, D=96": (2, [64, 31], 2, 2, 96, 96, 2, 0, 32, (-1, -1), 0.0),
}


def _kvcache_args(case: str, dtype: torch.dtype, seed: int) -> dict[str, Any]:
    batch, cached, hq, hkv, d, capacity, sq, new, page, window, softcap = KVCACHE_CASES[case]
    return BENCH.kvcache_case(batch, cached, hq, hkv, d, dtype, "cpu", capacity=capacity, sq=sq, new=new, page=page,
                              window=window, softcap=softcap, seed=seed)


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case", list(KVCACHE_CASES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_kvcache_forced_splits(dtype: torch.dtype, case: str, splits: int) -> None:
    args = _kvcache_args(case, dtype, seed=len(case))
    conv = _convention("flash_attn_with_kvcache", args)
    got = tfa.flash_attn_with_kvcache(*conv, splits=splits)
    low_args = _assert_close("flash_attn_with_kvcache", got, args)
    assert bits_equal(conv[1], low_args["k_cache"]) and bits_equal(conv[2], low_args["v_cache"])


def test_kvcache_empty_cache_outputs_zero() -> None:
    args = _kvcache_args("paged 32, no append, D=96", torch.float16, seed=1)
    args["cache_seqlens"] = torch.zeros(2, dtype=torch.int32)
    with infiniops_py.use("triton"):
        got = infiniops_py.flash_attn_with_kvcache(**args)
    assert bool((got == 0).all())


def test_kvcache_unchecked_out_of_range_blocks_are_skipped() -> None:
    args = _kvcache_args("paged 16, Sq 3, window, softcap", torch.bfloat16, seed=2)
    args["block_table"][0, 3] = args["k_cache"].shape[0]  # holds positions 48..63: cached keys and the append
    args["block_table"][1, 0] = -1
    with unchecked_indices():
        with infiniops_py.use("triton"):
            mine = _copies(args)
            got = infiniops_py.flash_attn_with_kvcache(**mine)
        low_args = _assert_close("flash_attn_with_kvcache", got, args)
    assert bits_equal(mine["k_cache"], low_args["k_cache"]) and bits_equal(mine["v_cache"], low_args["v_cache"])


def test_kvcache_empty_batch() -> None:
    q = torch.randn(0, 1, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(0, 8, 2, 64, dtype=torch.bfloat16)
    lengths = torch.zeros(0, dtype=torch.int32)
    with infiniops_py.use("triton"):
        got = infiniops_py.flash_attn_with_kvcache(q, cache, cache.clone(), cache_seqlens=lengths)
    assert got.shape == (0, 1, 4, 64)


# --- the log-sum-exp, seqused_k, cache_batch_idx ---------------------------------------------------------


def _lse_check(op: str, got: tuple[torch.Tensor, torch.Tensor], args: dict[str, Any]) -> None:
    """Output and log-sum-exp within the tolerance rule of the float64 reference (the lse: fp32, +inf
    exactly where the reference has it)."""
    fn = getattr(infiniops_py, op)
    with infiniops_py.use("reference"):
        ref, ref_lse = fn(**_copies(args, torch.float64))
        with in_input_dtype():
            low, low_lse = fn(**_copies(args))
    rule = tolerance(op, str(got[0].dtype)[6:])
    for label, g, r, lo in (("out", got[0], ref, low), ("lse", got[1], ref_lse, low_lse)):
        _, failure = compare(f"{op} {label}", g, r, rule, low=lo)
        assert failure is None, failure
    assert got[1].dtype == torch.float32 and bool((got[1].isinf() == ref_lse.isinf()).all())


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_writes_the_log_sum_exp_and_takes_seqused_k(dtype: torch.dtype, tma: bool) -> None:
    """16-row blocks (every key loop runs); sequence 0 uses 13 of its 40 keys, sequence 1 none of its 50,
    sequence 2 all 17: its first rows see no key under the causal mask (lse +inf)."""
    args = _varlen_args("causal Sq>Sk and Sq<Sk, GQA", dtype, seed=11)
    args.update(seqused_k=torch.tensor([13, 0, 17], dtype=torch.int32), return_softmax_lse=True)
    conv = _convention("flash_attn_varlen", args)
    lse = torch.empty((args["q"].shape[1], args["q"].shape[0]), dtype=torch.float32)
    got = tfa.flash_attn_varlen(*conv, seqused_k=args["seqused_k"], softmax_lse=lse,
                                config={**SMALL_BLOCKS, "LAZY": True, "USE_TMA": tma})
    _lse_check("flash_attn_varlen", (got, lse), args)
    assert bool((lse[:, 40:43] == float("inf")).all())  # sequence 1 uses no key


@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_kvcache_writes_the_log_sum_exp_and_reads_the_cache_batch_idx_rows(dtype: torch.dtype, splits: int) -> None:
    """Three sequences in cache rows 4, 0 and 6 (5 out of range: unchecked, it sees no key and writes nothing)
    of a 7-row cache; the combine of 3 splits writes the log-sum-exp too."""
    args = _kvcache_args("decode GQA 4, append", dtype, seed=12)
    spare = torch.randn(7, *args["k_cache"].shape[1:], generator=torch.Generator().manual_seed(13)).to(dtype)
    for name in ("k_cache", "v_cache"):
        rows = spare.clone()
        rows[[4, 0, 6]] = args[name]
        args[name] = rows
    args.update(cache_batch_idx=torch.tensor([4, 0, 6], dtype=torch.int32), return_softmax_lse=True)
    for idx in ([4, 0, 6], [4, 9, 6]):
        case = {**_copies(args), "cache_batch_idx": torch.tensor(idx, dtype=torch.int32)}
        conv = _convention("flash_attn_with_kvcache", case)
        lse = torch.empty((3, case["q"].shape[2], case["q"].shape[1]), dtype=torch.float32)
        with unchecked_indices():
            got = tfa.flash_attn_with_kvcache(*conv, cache_batch_idx=case["cache_batch_idx"], softmax_lse=lse,
                                              splits=splits)
            _lse_check("flash_attn_with_kvcache", (got, lse), case)
            with infiniops_py.use("reference"):
                low = _copies(case)
                infiniops_py.flash_attn_with_kvcache(**low)
        assert bits_equal(conv[1], low["k_cache"]) and bits_equal(conv[2], low["v_cache"])  # rows 4, 0/none, 6
    assert bool((lse[1] == float("inf")).all()) and bool((got[1] == 0).all())


# --- flash-attention's window rule and defaults ----------------------------------------------------------


def _edge_case(entry: str) -> dict[str, Any]:
    """Sq=20 queries over a max_seqlen_k of 8 (16 for the paged decode: one block), non-causal."""
    gen = torch.Generator().manual_seed(len(entry))
    sq, hq, hkv, d = 20, 2, 1, 32
    sk = 16 if entry == "kvcache-paged" else 8
    q = torch.randn(sq, hq, d, generator=gen).half()
    k, v = (torch.randn(sk, hkv, d, generator=gen).half() for _ in range(2))
    if entry.startswith("varlen"):
        args: dict[str, Any] = {"q": q, "k": k, "v": v, "cu_seqlens_q": torch.tensor([0, sq], dtype=torch.int32),
                                "cu_seqlens_k": torch.tensor([0, sk], dtype=torch.int32), "max_seqlen_q": sq,
                                "max_seqlen_k": sk}
        if entry == "varlen-paged":  # two 16-row blocks, the keys in block 1
            args["k"], args["v"] = (torch.cat([torch.full((16, hkv, d), float("nan")).half(),
                                               torch.cat([t, torch.zeros(16 - sk, hkv, d).half()])]).view(2, 16, hkv, d)
                                    for t in (k, v))
            args["block_table"] = torch.tensor([[1]], dtype=torch.int32)
        return args
    args = {"q": q[None], "k_cache": k[None].clone(), "v_cache": v[None].clone(),
            "cache_seqlens": torch.tensor([sk], dtype=torch.int32)}
    if entry == "kvcache-paged":
        args["k_cache"], args["v_cache"] = k[None].clone(), v[None].clone()  # one block of 16
        args["block_table"] = torch.tensor([[0]], dtype=torch.int32)
    return args


@pytest.mark.parametrize("entry", ["varlen", "varlen-paged", "kvcache", "kvcache-paged"])
def test_a_window_side_left_unbounded_becomes_max_seqlen_k_when_the_other_is_bounded(entry: str) -> None:
    """flash-attention's normalization: ``window_size=(0, 30)`` over max_seqlen_k 8 is ``(0, 8)``, so query i
    sees keys ``[i - 12, i - 4]`` and the first four see none (all eight before the rule was matched)."""
    op = "flash_attn_varlen" if entry.startswith("varlen") else "flash_attn_with_kvcache"
    args = {**_edge_case(entry), "window_size": (0, 30)}
    with infiniops_py.use("triton"):
        got = getattr(infiniops_py, op)(**_copies(args))
    rows = got if op == "flash_attn_varlen" else got[0]
    if entry == "kvcache-paged":  # capacity 16, 16 keys: query 0 sees keys 0 to 12 (right = 16), not all 16
        q, k, v = args["q"][0, 0].double(), args["k_cache"][0, :13, 0].double(), args["v_cache"][0, :13, 0].double()
        want = torch.softmax(q @ k.T * q.shape[-1] ** -0.5, dim=-1) @ v
        torch.testing.assert_close(rows[0].double(), want, rtol=0, atol=2e-3)
    else:
        assert bool((rows[:4] == 0).all()) and bool((rows[4:].abs().amax(-1) > 0).all())
    _assert_close(op, got, args)


def test_kvcache_is_not_causal_unless_asked() -> None:
    args = _kvcache_args("paged 16, Sq 3, window, softcap", torch.float16, seed=4)
    args.pop("causal")
    with infiniops_py.use("triton"):
        default = infiniops_py.flash_attn_with_kvcache(**_copies(args))
        plain = infiniops_py.flash_attn_with_kvcache(**_copies(args), causal=False)
        causal = infiniops_py.flash_attn_with_kvcache(**_copies(args), causal=True)
    assert bits_equal(default, plain) and not torch.allclose(default.float(), causal.float())


# --- gates, heuristics ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_gates(op: str) -> None:
    with infiniops_py.use("triton"):
        with pytest.raises(GateError, match="head_dim"):
            infiniops_py.resolve(op, device_type="cpu", dtype="bfloat16", head_dim=512)
        with pytest.raises(GateError, match="block_size"):
            infiniops_py.resolve(op, device_type="cpu", dtype="bfloat16", paged=True, block_size=8)
        with pytest.raises(GateError, match="dtype"):
            infiniops_py.resolve(op, device_type="cpu", dtype="float64")
        assert infiniops_py.resolve(op, device_type="cpu", dtype="float16", head_dim=59).provider == "triton"
        gated = ("alibi", "fp8_kv", *(() if op == "flash_attn_varlen" else ("cache_leftpad", "rotary")))
        for field in gated:  # each with its reason, and the torch provider as the fix
            with pytest.raises(GateError, match=f"{field}.*use the torch provider"):
                infiniops_py.resolve(op, device_type="cpu", dtype="float16", **{field: True})
        served = ("return_softmax_lse", "seqused_k" if op == "flash_attn_varlen" else "cache_batch_idx")
        assert infiniops_py.resolve(op, device_type="cpu", dtype="float16", **dict.fromkeys(served, True)).provider \
            == "triton"


def test_launcher_rejects_head_dim_over_256() -> None:
    args = BENCH.varlen_case([3], [3], 1, 1, 320, torch.float16, "cpu")
    with pytest.raises(ValueError, match="head_dim 320"):
        tfa.flash_attn_varlen(*_convention("flash_attn_varlen", args))


def test_num_splits_heuristic() -> None:
    # SPLIT_WAVES programs per SM: 8 programs on 132 SMs -> 33 splits; 512 programs fill them unsplit
    assert tfa.SPLIT_WAVES == 2
    assert tfa.num_splits(programs=8, capacity=32768, num_sms=132, min_keys=256) == 33
    assert tfa.num_splits(programs=512, capacity=4096, num_sms=132, min_keys=256) == 1
    assert tfa.num_splits(programs=1, capacity=32768, num_sms=132, min_keys=256) == 64  # capped
    assert tfa.num_splits(programs=8, capacity=300, num_sms=132, min_keys=256) == 1  # too few keys to share
    assert tfa.num_splits(programs=4096, capacity=4096, num_sms=132, min_keys=256) == 1  # enough programs
    assert tfa.num_splits(programs=0, capacity=0, num_sms=132, min_keys=256) == 1


# --- the GPU benchmark's code, at tiny sizes on the CPU -----------------------------------------------


def test_gpu_benchmark_runs_at_tiny_sizes() -> None:
    def wall_ms(fn: Any) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3

    results: list[dict[str, Any]] = []
    BENCH.run(results, "cpu", scale=256, timer=wall_ms, dtypes=(torch.bfloat16,))
    checks = [r for r in results if r["kind"] == "check"]
    perf = [r for r in results if r["kind"] == "perf"]
    assert len(checks) == 7 and all(r["status"] == "PASS" for r in checks), BENCH.format_table(results)
    assert len(perf) == 2 and all(r["triton"] > 0 and r["torch"] > 0 for r in perf), BENCH.format_table(results)
    assert BENCH.format_table(results).count("\n") == len(results)
    assert BENCH.prefill_flops(4, 32, 4096, 128) == 2 * 4 * 32 * 4096**2 * 128
    assert BENCH.decode_kv_bytes(64, 4096, 8, 128) == 2 * 64 * 4096 * 8 * 128 * 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_kvcache_fused_combine_adapts_the_splits_to_each_context(dtype: torch.dtype,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """8 launched splits over 16-key blocks, one block per split at least: sequence 0 has 3 keys (one split
    writes the output directly), sequence 1 has 40 (3 splits, merged by the last), sequence 2 has 0 (zeros);
    the separate combine kernel gives the same within the tolerance rule, and the counters are back at 0 after
    each call."""
    monkeypatch.setattr(tfa, "MIN_SPLIT_BLOCKS", 1)
    monkeypatch.setattr(tfa, "DECODE_DEFAULTS", [(1 << 62, 1 << 62, {})])  # the module-level rules, fused
    args = _kvcache_args("paged 32, no append, D=96", dtype, seed=21)
    batch = args["q"].shape[0]
    lengths = [3, 40, 0][:batch] + [17] * max(0, batch - 3)
    args["cache_seqlens"] = torch.tensor(lengths, dtype=torch.int32)
    conv = _convention("flash_attn_with_kvcache", args)
    fused = tfa.flash_attn_with_kvcache(*conv, splits=8).clone()
    counters = [t for (dev, _), t in tfa._COUNTERS.items() if dev.type == "cpu"]
    assert counters and all(bool((t == 0).all()) for t in counters)
    _assert_close("flash_attn_with_kvcache", fused, args)
    try:
        tfa.FUSED_COMBINE = False
        separate = tfa.flash_attn_with_kvcache(*conv, splits=8)
    finally:
        tfa.FUSED_COMBINE = True
    _assert_close("flash_attn_with_kvcache", separate, args)
    if batch > 2:
        assert bool((fused[2] == 0).all())


# --- the decode launch settings (`config`, `DECODE_DEFAULTS`) ------------------------------------------

# (batch, cached, Hq, Hkv, D, capacity, Sq, new, block_size, window, softcap): paged, the decode kernel appends
LAUNCH_CASES = {
    "paged 16 decode, GQA 4, append": (3, [70, 0, 33], 8, 2, 64, 96, 1, 1, 16, (-1, -1), 0.0),
    "paged 16, Sq 3, window, softcap": KVCACHE_CASES["paged 16, Sq 3, window, softcap"],
}
SHORT = {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "min_split_keys": 16, "min_split_blocks": 1,
         "split_waves": 4}
LAUNCH_CONFIGS = {
    "new_first": {"new_first": True},
    "short, new_first": {**SHORT, "new_first": True},
    "short, separate combine": {**SHORT, "fused": False},
    "64-key blocks, 2 per split, new_first": {**SHORT, "BLOCK_N": 64, "min_split_blocks": 2, "new_first": True},
    "16-key blocks, 1 per split": {**SHORT, "BLOCK_N": 16, "maxnreg": 128},
}


@pytest.mark.parametrize("config", list(LAUNCH_CONFIGS))
@pytest.mark.parametrize("case", list(LAUNCH_CASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d).removeprefix("torch."))
def test_kvcache_launch_settings(dtype: torch.dtype, case: str, config: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each launch setting the sweep times (the new keys first or last, key blocks of 16 to 64, splits down to one
    block, the fused or the separate combine): the output within the tolerance rule, the new k/v in the cache bit
    for bit as the reference writes them; the settings with their own split rules split these contexts."""
    batch, cached, hq, hkv, d, capacity, sq, new, page, window, softcap = LAUNCH_CASES[case]
    args = BENCH.kvcache_case(batch, cached, hq, hkv, d, dtype, "cpu", capacity=capacity, sq=sq, new=new, page=page,
                              window=window, softcap=softcap, seed=len(case) + len(config))
    chosen: list[int] = []
    real = tfa.num_splits
    monkeypatch.setattr(tfa, "num_splits", lambda *a: chosen.append(real(*a)) or chosen[-1])
    conv = _convention("flash_attn_with_kvcache", args)
    conv[-1].fill_(float("nan"))  # out
    got = tfa.flash_attn_with_kvcache(*conv, config=LAUNCH_CONFIGS[config])
    low_args = _assert_close("flash_attn_with_kvcache", got, args)
    assert bits_equal(conv[1], low_args["k_cache"]) and bits_equal(conv[2], low_args["v_cache"])
    if "split_waves" in LAUNCH_CONFIGS[config]:
        assert chosen and chosen[-1] > 1, chosen


def test_decode_settings_take_the_first_row_that_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [(8, 256, {"split_waves": 8}), (64, 1 << 20, {"fused": False}), (1 << 62, 1 << 62, {})]
    monkeypatch.setattr(tfa, "DECODE_DEFAULTS", rows)
    assert tfa.decode_settings(8, 256) == {"split_waves": 8}
    assert tfa.decode_settings(8, 257) == {"fused": False}  # past the first row's capacity
    assert tfa.decode_settings(9, 16) == {"fused": False}
    assert tfa.decode_settings(65, 16) == {}
    tfa.decode_settings(8, 256)["split_waves"] = 1  # a copy: the table is unchanged
    assert rows[0][2] == {"split_waves": 8}
    monkeypatch.setattr(tfa, "DECODE_DEFAULTS", [])
    assert tfa.decode_settings(1, 1) == {}


def test_decode_settings_keep_their_tile_for_16_bit_inputs_that_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's tile is what the sweep measured (bf16): float32 and tiles past the shared memory autotune."""
    tile = {"BLOCK_N": 128, "num_warps": 8, "num_stages": 3, "maxnreg": 200}
    monkeypatch.setattr(tfa, "DECODE_DEFAULTS", [(1 << 62, 1 << 62, {**tile, "split_waves": 4})])
    assert tfa.decode_settings(8, 4096, 2, 128) == {**tile, "split_waves": 4}  # K/V stages: 192 KB
    assert tfa.decode_settings(8, 4096, 2, 256) == {"split_waves": 4}  # 384 KB
    assert tfa.decode_settings(8, 4096, 4, 64) == {"split_waves": 4}  # float32


def test_kvcache_reads_its_settings_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table row's split rules reach the launch (16 keys a split, 4 waves on the interpreter's 4 SMs: 4 splits
    for 2 programs over 96 keys), and a call's `config` overrides them key by key."""
    args = BENCH.kvcache_case(1, [50], 4, 2, 32, torch.float16, "cpu", capacity=96, page=16, seed=5)
    seen: list[tuple[Any, ...]] = []
    real = tfa.num_splits
    monkeypatch.setattr(tfa, "num_splits", lambda *a: seen.append(a) or real(*a))
    monkeypatch.setattr(tfa, "DECODE_DEFAULTS", [(1 << 62, 1 << 62, {"min_split_keys": 16, "split_waves": 4,
                                                                       "min_split_blocks": 1})])
    got = tfa.flash_attn_with_kvcache(*_convention("flash_attn_with_kvcache", args))
    _assert_close("flash_attn_with_kvcache", got, args)
    assert seen[-1] == (2, 96, 4, 16, 4)
    tfa.flash_attn_with_kvcache(*_convention("flash_attn_with_kvcache", args), config={"split_waves": 1})
    assert seen[-1] == (2, 96, 4, 16, 1)


@pytest.mark.parametrize(("config", "match"), [({"BLOCK_M": 16}, "unknown keys"),
                                               ({"BLOCK_N": 32, "num_warps": 4}, "together or none")])
def test_kvcache_rejects_a_bad_config_before_writing(config: dict[str, Any], match: str) -> None:
    args = BENCH.kvcache_case(2, [20, 7], 4, 2, 32, torch.float16, "cpu", capacity=48, page=16, seed=6)
    conv = _convention("flash_attn_with_kvcache", args)
    before = conv[1].clone(), conv[2].clone()
    with pytest.raises(ValueError, match=match):
        tfa.flash_attn_with_kvcache(*conv, config=config)
    assert bits_equal(conv[1], before[0]) and bits_equal(conv[2], before[1])


def test_decode_sweep_checks_its_variants_at_tiny_sizes() -> None:
    """benchmarks/gpu_sweep_decode.py's check on the CPU (its timing needs CUDA graphs): the committed defaults
    and a swept setting pass against SDPA in float64, a config the launcher rejects is a FAIL row."""
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_sweep_decode.py"
    spec = importlib.util.spec_from_file_location("gpu_sweep_decode", path)
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    shape = sweep.SMOKE_CASES["tiny B 2, ctx 70"]
    case = sweep.prepare_case(shape, torch.device("cpu"), smoke=True, capacity=96)
    rows = [sweep.run_variant("tiny", case, label, sweep.VARIANTS[label], torch.device("cpu"), smoke=True)
            for label in ("defaults", "short 16/4w/2s x4 new_first")]
    rows.append(sweep.run_variant("tiny", case, "partial tile", {"BLOCK_N": 32}, torch.device("cpu"), smoke=True))
    rows.append(sweep.run_variant("tiny", case, "skipped", {}, torch.device("cpu"), smoke=True, skip=True))
    assert [r["check"] for r in rows] == ["PASS", "PASS", "FAIL", "SKIP"], rows
    assert "together or none" in rows[2]["note"]
    assert sweep.best_index(rows) is None  # nothing timed on the CPU
    assert sweep.format_case("tiny", shape, rows).count("\n| ") == len(rows) + 1  # the header and a line each


# --- the prefill launch settings (`config`, `PREFILL_DEFAULTS`) ---------------------------------------------

@pytest.mark.parametrize(("config", "match"), [({"BLOCK_M": 16, "BLOCK_N": 16, "GROUP": 4}, "unknown keys"),
                                               ({"BLOCK_N": 16}, "needs BLOCK_M and BLOCK_N"),
                                               ({**SMALL_BLOCKS, "WARP_SPEC": True}, "unknown keys")])
def test_varlen_rejects_a_bad_config(config: dict[str, Any], match: str) -> None:
    args = _varlen_args("causal Sq>Sk and Sq<Sk, GQA", torch.float16, seed=2)
    with pytest.raises(ValueError, match=match):
        tfa.flash_attn_varlen(*_convention("flash_attn_varlen", args), config=config)


def test_prefill_settings_take_the_first_row_that_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    ws = {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "USE_TMA": True}
    plain = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3, "USE_TMA": False}
    rows = [(64, True, ws), (128, None, plain), (256, None, {})]
    monkeypatch.setattr(tfa, "PREFILL_DEFAULTS", rows)
    assert tfa.prefill_settings(64, True) == ws
    assert tfa.prefill_settings(64, False) == plain  # the first row is causal only
    assert tfa.prefill_settings(128, True) == plain
    assert tfa.prefill_settings(192, True) == {}
    tfa.prefill_settings(64, True)["BLOCK_M"] = 16  # a copy: the table is unchanged
    assert rows[0][2]["BLOCK_M"] == 128
    # gated to the autotuner: float32, paged / left window / softcap, past the shared memory
    assert tfa.prefill_settings(64, True, element_size=4) == {}
    assert tfa.prefill_settings(64, True, common=False) == {}
    monkeypatch.setattr(tfa, "PREFILL_DEFAULTS", [(256, None, {**plain, "BLOCK_N": 128})])
    assert tfa.prefill_settings(256, True) == {}  # 64 KB of Q + 3 x 2 x 64 KB of K/V stages
    monkeypatch.setattr(tfa, "PREFILL_DEFAULTS", [])
    assert tfa.prefill_settings(64, True) == {}


def test_varlen_reads_its_settings_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off the interpreter's fixed configuration, a table row reaches the launch of the common path (its tile, the
    rest filled in); a softcap keeps to the autotuner, and so does a row asking for TMA off CUDA."""
    row = {"BLOCK_M": 16, "BLOCK_N": 32, "LAZY": False}
    monkeypatch.setattr(tfa, "PREFILL_DEFAULTS", [(256, None, row)])
    monkeypatch.setattr(tfa, "_interpreting", lambda: False)
    seen: list[dict[str, Any]] = []
    real = tfa._PREFILL_FIXED
    monkeypatch.setattr(tfa, "_PREFILL_FIXED", lambda grid, *a, **kw: seen.append(kw) or real(grid, *a, **kw))
    args = _varlen_args("causal Sq>Sk and Sq<Sk, GQA", torch.bfloat16, seed=4)
    conv = _convention("flash_attn_varlen", args)
    conv[-1].fill_(float("nan"))
    got = tfa.flash_attn_varlen(*conv)
    _assert_close("flash_attn_varlen", got, args)
    assert len(seen) == 1 and {k: seen[0][k] for k in ("BLOCK_M", "BLOCK_N", "LAZY", "USE_TMA")} == {
        **row, "USE_TMA": False}
    tuned: list[Any] = []
    monkeypatch.setattr(tfa, "_PREFILL", type("Spy", (), {"launch": lambda self, *a, **kw: tuned.append(a)})())
    softcapped = _convention("flash_attn_varlen", {**args, "softcap": 5.0})
    tfa.flash_attn_varlen(*softcapped)
    assert len(seen) == 1 and len(tuned) == 1
    monkeypatch.setattr(tfa, "PREFILL_DEFAULTS", [(256, None, {**row, "USE_TMA": True})])
    tfa.flash_attn_varlen(*_convention("flash_attn_varlen", args))
    assert len(seen) == 1 and len(tuned) == 2


def test_prefill_sweep_checks_its_variants_at_tiny_sizes() -> None:
    """benchmarks/gpu_sweep_prefill.py's check on the CPU (its timing needs CUDA graphs): every variant passes
    against SDPA in float64, a config the launcher rejects is a FAIL row."""
    path = Path(__file__).parents[2] / "benchmarks" / "gpu_sweep_prefill.py"
    spec = importlib.util.spec_from_file_location("gpu_sweep_prefill", path)
    assert spec is not None and spec.loader is not None
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    shape = sweep.SMOKE_CASES["tiny D 64 causal GQA"]
    case = sweep.prepare_case(shape, torch.device("cpu"), smoke=True)
    labels = ("defaults", "128/64 4w 3s lazy", "128/128 8w 2s lazy")
    rows = [sweep.run_variant("tiny", case, label, sweep.VARIANTS[label], torch.device("cpu"), smoke=True)
            for label in labels]
    rows.append(sweep.run_variant("tiny", case, "no tile", {"BLOCK_M": 64}, torch.device("cpu"), smoke=True))
    rows.append(sweep.run_variant("tiny", case, "skipped", {}, torch.device("cpu"), smoke=True, skip=True))
    assert [r["check"] for r in rows] == ["PASS", "PASS", "PASS", "FAIL", "SKIP"], rows
    assert "needs BLOCK_M and BLOCK_N" in rows[3]["note"]
    assert sweep.best_index(rows) is None  # nothing timed on the CPU
    assert sweep.format_case("tiny", shape, rows).count("\n| ") == len(rows) + 1  # the header and a line each
    assert sweep.flops(4, 4096, 32, 128, True) == 2 * 4 * 32 * 4096**2 * 128
    # the proposed table: the fastest passing variant of each case without GQA, the autotuner's {} where it won
    timed = {"a": [dict(rows[1], us=2.0), dict(rows[2], us=1.0), dict(rows[3], us=0.5)],
             "b": [dict(rows[0], us=1.0), dict(rows[1], us=3.0)], "c": [dict(rows[2], us=1.0)]}
    shapes = {"a": (4, 4096, 32, 32, 128, True), "b": (4, 4096, 32, 32, 64, False), "c": (4, 4096, 32, 8, 64, True)}
    assert sweep.proposed_table(timed, shapes) == [(64, False, {}), (128, True, sweep.VARIANTS[labels[2]]),
                                                   (256, None, {})]
