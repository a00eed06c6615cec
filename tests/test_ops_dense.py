"""Gemm, RmsNorm, fused add + RmsNorm, FusedQkNorm and the paged-cache write on CPU.

The reference and torch providers against the float64 reference (tolerance table), the contract
errors (one per kind and entry point, naming the argument), empty inputs and the semantics the peers
settle: c unread when beta == 0, V untouched, padding slots and padding key rows skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from fakes import cpu_capability, registered
from torch._subclasses.fake_tensor import FakeTensorMode

import infiniops_py as io
from infiniops_py import ContractError, unchecked_indices
from infiniops_py.testing.compare import compare
from infiniops_py.testing.conformance import cpu_copies
from infiniops_py.testing.tolerances import tolerance

PROVIDERS = ("reference", "torch")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
META = torch.device("meta")


def _randn(*shape: int, dtype: torch.dtype = torch.float32, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype)


def _f64(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.to(torch.float64) if tree.is_floating_point() else tree.clone()
    if isinstance(tree, dict):
        return {k: _f64(v) for k, v in tree.items()}
    return tree


def _check(op: str, got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, k: int | None = None) -> None:
    _, message = compare(op, got, ref, tolerance(op, io.operators._base.dtype_name(dtype)), k=k)
    assert message is None, message


def _run(provider: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(the provider's result on `args`, the float64 reference's result on float64 copies)."""
    args64 = tuple(_f64(a) for a in args)
    kwargs64 = _f64(kwargs)
    with io.use("reference"):
        expected = fn(*args64, **kwargs64)
    with io.use(provider):
        got = fn(*args, **kwargs)
    return got, expected


# --- agreement with the float64 reference -----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("batched", "trans_a", "trans_b"), [(False, False, True), (False, True, False),
                                                             (True, False, False)])
def test_gemm_matches_reference(provider: str, dtype: torch.dtype, batched: bool, trans_a: bool, trans_b: bool) -> None:
    m, n, k = 13, 24, 71
    lead = (2,) if batched else ()
    a = _randn(*lead, *((k, m) if trans_a else (m, k)), dtype=dtype, seed=1)
    b = _randn(*lead, *((n, k) if trans_b else (k, n)), dtype=dtype, seed=2)
    kwargs = {"c": _randn(m, 1, dtype=dtype, seed=3), "bias": _randn(n, dtype=dtype, seed=4), "alpha": -0.999,
              "beta": 100.001, "trans_a": trans_a, "trans_b": trans_b}
    got, expected = _run(provider, io.gemm, (a, b), kwargs)
    assert got.shape == (*lead, m, n) and got.dtype == dtype and got.is_contiguous()
    _check("gemm", got, expected, dtype, k=k)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_rms_norm_matches_reference(provider: str, dtype: torch.dtype) -> None:
    h = 769
    x = _randn(2, 9, 2 * h, dtype=dtype, scale=1 / (2 * h), seed=1)[..., :h]  # strided rows
    w = (1 + 0.1 * _randn(h, seed=2)).to(dtype)
    got, expected = _run(provider, io.rms_norm, (x, w), {"eps": 1e-5})
    assert got.shape == x.shape and got.is_contiguous()
    _check("rms_norm", got, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_fused_add_rms_norm_matches_reference(provider: str, dtype: torch.dtype) -> None:
    h = 256
    x = _randn(7, h, dtype=dtype, scale=1 / (2 * h), seed=1)
    residual = _randn(7, h, dtype=dtype, scale=1 / (2 * h), seed=2)
    w = (1 + 0.1 * _randn(h, seed=3)).to(dtype)
    x64, r64 = x.double(), residual.double()
    with io.use("reference"):
        io.fused_add_rms_norm(x64, r64, w.double())
    with io.use(provider):
        out = io.fused_add_rms_norm(x, residual, w)
    assert out[0] is x and out[1] is residual
    _check("fused_add_rms_norm", residual, r64, dtype)
    _check("fused_add_rms_norm", x, x64, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_fused_qk_norm_matches_reference_and_leaves_v_untouched(provider: str, dtype: torch.dtype) -> None:
    t, hq, hkv, d = 5, 16, 4, 128
    width = (hq + 2 * hkv) * d
    qkv = _randn(t, width + d, dtype=dtype, seed=1)[:, :width]  # strided rows
    v_before = qkv[:, (hq + hkv) * d :].clone()
    q_w, k_w = ((1 + 0.1 * _randn(d, seed=s)).to(dtype) for s in (2, 3))
    expected = qkv.double()
    with io.use("reference"):
        io.fused_qk_norm(expected, q_w.double(), k_w.double(), num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
    with io.use(provider):
        got = io.fused_qk_norm(qkv, q_w, k_w, num_q_heads=hq, num_kv_heads=hkv, head_dim=d)
    assert got is qkv
    _check("fused_qk_norm", qkv, expected, dtype)
    v_after = qkv[:, (hq + hkv) * d :]
    assert torch.equal(v_after.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       v_before.view(torch.int16 if dtype != torch.float32 else torch.int32))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("hnd", [False, True], ids=["NHD", "HND"])
def test_reshape_and_cache_flash_writes_exactly(provider: str, dtype: torch.dtype, hnd: bool) -> None:
    t, hkv, d, nb, bs = 9, 2, 80, 5, 8
    qkv = _randn(t, 4 * hkv * d, dtype=dtype, seed=1)  # key/value: strided views of a packed projection
    key = qkv[:, 2 * hkv * d : 3 * hkv * d].view(t, hkv, d)
    value = qkv[:, 3 * hkv * d :].view(t, hkv, d)
    shape = (nb, hkv, bs, d) if hnd else (nb, bs, hkv, d)
    caches = [_randn(*shape, dtype=dtype, seed=s) for s in (2, 3)]
    if hnd:
        caches = [c.transpose(1, 2) for c in caches]
    slots = torch.tensor([17, -1, 0, 39, 8, 9, -1])  # 7 tokens of the 9 key rows; rows 7 and 8 are padding
    before = [c.clone() for c in caches]
    with io.use(provider):
        io.reshape_and_cache_flash(key, value, caches[0], caches[1], slots)
    for cache, old, src in zip(caches, before, (key, value)):
        expected = old.clone()
        for i, s in enumerate(slots.tolist()):
            if s >= 0:
                expected[s // bs, s % bs] = src[i]
        assert torch.equal(cache, expected)


# --- semantics --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_gemm_never_reads_c_when_beta_is_zero(provider: str) -> None:
    a, b = _randn(6, 5, seed=1), _randn(5, 4, seed=2)
    c = torch.full((6, 4), math.nan)
    with io.use(provider):
        y = io.gemm(a, b, c=c, beta=0.0, alpha=2.0)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, 2 * a @ b)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_gemm_out_may_be_c(provider: str) -> None:
    a, b, c = _randn(6, 5, seed=1), _randn(5, 4, seed=2), _randn(6, 4, seed=3)
    expected = 0.5 * a @ b - 2.0 * c
    with io.use(provider):
        y = io.gemm(a, b, c=c, alpha=0.5, beta=-2.0, out=c)
    assert y is c
    torch.testing.assert_close(c, expected)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rms_norm_of_unflattenable_rows_and_in_place(provider: str) -> None:
    h = 64
    x = _randn(2, 5, h, seed=1)[:, :4]  # [2, 4, H] rows of a [2, 5, H] buffer: no single row stride
    w = 1 + 0.1 * _randn(h, seed=2)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    with io.use(provider):
        torch.testing.assert_close(io.rms_norm(x, w), expected)
        y = x.contiguous()
        assert io.rms_norm(y, w, out=y) is y
    torch.testing.assert_close(y, expected)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_fused_add_rms_norm_on_unflattenable_rows_is_in_place(provider: str) -> None:
    h = 32
    x = _randn(2, 5, h, seed=1)[:, :4]
    residual = _randn(2, 5, h, seed=2)[:, 1:]
    w = 1 + 0.1 * _randn(h, seed=3)
    total = x + residual
    with io.use(provider):
        io.fused_add_rms_norm(x, residual, w)
    torch.testing.assert_close(residual, total)
    torch.testing.assert_close(x, total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6) * w)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cache_write_skips_unchecked_out_of_range_slots_and_padding_rows(provider: str) -> None:
    key = torch.full((4, 1, 8), math.nan)  # rows past len(slot_mapping) are padding: never read
    key[:2] = _randn(2, 1, 8, seed=1)
    value = key.clone()
    caches = [_randn(2, 4, 1, 8, seed=s) for s in (2, 3)]
    before = [c.clone() for c in caches]
    with unchecked_indices(), io.use(provider):
        io.reshape_and_cache_flash(key, value, caches[0], caches[1], torch.tensor([8 + 3, 5]))
    for cache, old in zip(caches, before):
        assert torch.equal(cache[1, 1], key[1]) and not cache.isnan().any()
        cache[1, 1] = old[1, 1]
        assert torch.equal(cache, old)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_empty_inputs_do_nothing(provider: str) -> None:
    with io.use(provider):
        assert io.gemm(torch.randn(0, 3), torch.randn(3, 4)).shape == (0, 4)
        assert io.gemm(torch.randn(2, 0, 3), torch.randn(2, 3, 4), bias=torch.randn(4)).shape == (2, 0, 4)
        assert io.rms_norm(torch.randn(0, 8), torch.randn(8)).shape == (0, 8)
        x, r = torch.randn(0, 8), torch.randn(0, 8)
        got_x, got_r = io.fused_add_rms_norm(x, r, torch.randn(8))
        assert got_x is x and got_r is r
        qkv = torch.randn(0, 6 * 4)
        assert io.fused_qk_norm(qkv, torch.randn(4), torch.randn(4), num_q_heads=2, num_kv_heads=2,
                                head_dim=4) is qkv
        cache = torch.randn(2, 4, 1, 8)
        old = cache.clone()
        io.reshape_and_cache_flash(torch.randn(3, 1, 8), torch.randn(3, 1, 8), cache, cache.clone(),
                                   torch.empty(0, dtype=torch.int64))
        assert torch.equal(cache, old)


# --- results and aliasing, every operator -----------------------------------------------------------------

def _liar(spec: Any) -> Callable[..., Any]:
    """An implementation that runs `spec`'s reference, then returns a one-element tensor of zeros."""
    def fn(*args: Any) -> torch.Tensor:
        spec.reference(*args)
        return torch.zeros(1)
    return fn


RESULT_CALLS: dict[str, Callable[[], tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]] = {
    # op -> a builder of (public function, args, kwargs); `out` given where the function takes one
    "add": lambda: (io.add, (_randn(3, 4, seed=1), _randn(4, seed=2)), {"out": torch.empty(3, 4)}),
    "add-no-out": lambda: (io.add, (_randn(3, 4, seed=1), _randn(4, seed=2)), {}),
    "rms_norm": lambda: (io.rms_norm, (_randn(3, 8, seed=1), _randn(8, seed=2)), {"out": torch.empty(3, 8)}),
    "gemm": lambda: (io.gemm, (_randn(3, 5, seed=1), _randn(5, 4, seed=2)), {"out": torch.empty(3, 4)}),
    "flash_attn_varlen": lambda: (io.flash_attn_varlen, (
        _randn(5, 2, 8, seed=1), _randn(5, 2, 8, seed=2), _randn(5, 2, 8, seed=3),
        torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 2, 5], dtype=torch.int32), 3, 3), {}),
    "flash_attn_with_kvcache": lambda: (io.flash_attn_with_kvcache, (
        _randn(2, 1, 2, 8, seed=1), _randn(2, 4, 2, 8, seed=2), _randn(2, 4, 2, 8, seed=3)),
        {"cache_seqlens": torch.tensor([1, 3], dtype=torch.int32)}),
    "causal_conv1d": lambda: (io.causal_conv1d, (_randn(2, 4, 6, seed=1), _randn(4, 3, seed=2)),
                              {"return_final_states": True}),
    "causal_conv1d_update": lambda: (io.causal_conv1d_update, (
        _randn(2, 4, seed=1), _randn(2, 4, 3, seed=2), _randn(4, 3, seed=3)), {}),
    "selective_scan": lambda: (io.selective_scan, (
        _randn(1, 4, 2, 4, seed=1), _randn(1, 4, 2, seed=2).abs(), -_randn(2, seed=3).abs(),
        _randn(1, 4, 1, 8, seed=4), _randn(1, 4, 1, 8, seed=5)), {"return_final_states": True}),
    "selective_state_update": lambda: (io.selective_state_update, (
        _randn(2, 2, 4, 8, seed=1), _randn(2, 2, 4, seed=2), _randn(2, 2, seed=3).abs(), -_randn(2, seed=4).abs(),
        _randn(2, 1, 8, seed=5), _randn(2, 1, 8, seed=6)), {}),
}


@pytest.mark.parametrize("name", RESULT_CALLS)
def test_results_are_the_contract_objects_whatever_the_implementation_returns(name: str) -> None:
    op = name.removesuffix("-no-out")
    spec = io.operators.OPERATORS[op]
    fn, args, kwargs = RESULT_CALLS[name]()
    args_ref, kwargs_ref = cpu_copies((args, kwargs), None)
    with io.use("reference"):
        expected = fn(*args_ref, **kwargs_ref)
    with registered(("liar", [(op, cpu_capability(), 1, _liar(spec))])), io.use("liar"):
        got = fn(*args, **kwargs)
    if "out" in kwargs:
        assert got is kwargs["out"]
    pairs = zip(got, expected, strict=True) if isinstance(expected, tuple) else [(got, expected)]
    for g, e in pairs:
        assert isinstance(g, torch.Tensor) and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=0, atol=0)


def _buffer(n: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(n).astype(np.float32)


def _over(buf: np.ndarray, start: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of `shape` over ``buf[start:]``: a storage object of its own (``torch.from_numpy``), no view of
    another tensor, over memory other tensors of `buf` share."""
    return torch.from_numpy(buf[start:start + math.prod(shape)].reshape(shape))


def _ints(buf: np.ndarray, start: int, values: list[int], dtype: Any) -> torch.Tensor:
    """An index tensor written over the bytes of ``buf[start:]``, a storage object of its own."""
    ints = buf[start:].view(dtype)[:len(values)]
    ints[:] = values
    return torch.from_numpy(ints)


def _aliased_add() -> tuple[np.ndarray, Callable[[], Any]]:  # the issue's own case (errors of 12 before)
    buf = _buffer(16)
    t1 = _over(buf, 0, (8,))
    return buf, lambda: io.add(t1, t1, out=_over(buf, 2, (8,)))


def _aliased_rms_weight() -> tuple[np.ndarray, Callable[[], Any]]:  # weight is out's row 1
    buf = _buffer(32)
    return buf, lambda: io.rms_norm(_randn(4, 8), _over(buf, 8, (8,)), out=_over(buf, 0, (4, 8)))


def _aliased_rms_x() -> tuple[np.ndarray, Callable[[], Any]]:
    buf = _buffer(40)
    return buf, lambda: io.rms_norm(_over(buf, 0, (4, 8)), _randn(8), out=_over(buf, 8, (4, 8)))


def _aliased_gemm_c() -> tuple[np.ndarray, Callable[[], Any]]:  # c is not read when beta == 0, nor written
    buf = _buffer(24)
    return buf, lambda: io.gemm(_randn(4, 3), _randn(3, 4), c=_over(buf, 0, (4, 4)), beta=0.0,
                                out=_over(buf, 8, (4, 4)))


def _aliased_gemm_a() -> tuple[np.ndarray, Callable[[], Any]]:
    buf = _buffer(24)
    return buf, lambda: io.gemm(_over(buf, 0, (4, 4)), _randn(4, 4), out=_over(buf, 4, (4, 4)))


def _aliased_fused_residual() -> tuple[np.ndarray, Callable[[], Any]]:
    buf = _buffer(40)
    return buf, lambda: io.fused_add_rms_norm(_over(buf, 0, (4, 8)), _over(buf, 8, (4, 8)), _randn(8))


def _aliased_qk_weight() -> tuple[np.ndarray, Callable[[], Any]]:  # q_weight is row 1's first K head
    buf = _buffer(3 * 32)
    return buf, lambda: io.fused_qk_norm(_over(buf, 0, (3, 32)), _over(buf, 48, (4,)), _randn(4), num_q_heads=4,
                                         num_kv_heads=2, head_dim=4)


def _aliased_slot_mapping() -> tuple[np.ndarray, Callable[[], Any]]:
    buf = _buffer(2 * 4 * 8)
    slots = _ints(buf, 8, [0, 1], np.int64)  # in key_cache's first block
    return buf, lambda: io.reshape_and_cache_flash(_randn(2, 1, 8), _randn(2, 1, 8), _over(buf, 0, (2, 4, 1, 8)),
                                                   _randn(2, 4, 1, 8), slots)


def _aliased_conv_weight() -> tuple[np.ndarray, Callable[[], Any]]:
    buf = _buffer(2 * 4 * 3)
    return buf, lambda: io.causal_conv1d_update(_randn(2, 4), _over(buf, 0, (2, 4, 3)), _over(buf, 12, (4, 3)))


def _aliased_state_indices() -> tuple[np.ndarray, Callable[[], Any]]:
    buf = _buffer(2 * 2 * 4 * 8)
    indices = _ints(buf, 40, [1, 0], np.int32)
    return buf, lambda: io.selective_state_update(
        _over(buf, 0, (2, 2, 4, 8)), _randn(2, 2, 4), _randn(2, 2), -_randn(2).abs(), _randn(2, 1, 8),
        _randn(2, 1, 8), state_batch_indices=indices)


def _aliased_kv_k() -> tuple[np.ndarray, Callable[[], Any]]:  # the new k is the cache's second sequence
    buf = _buffer(2 * 4 * 8)
    return buf, lambda: io.flash_attn_with_kvcache(
        _randn(2, 1, 1, 8), _over(buf, 0, (2, 4, 1, 8)), _randn(2, 4, 1, 8),
        cache_seqlens=torch.tensor([0, 1], dtype=torch.int32), k=_over(buf, 32, (2, 1, 1, 8)), v=_randn(2, 1, 1, 8))


def _aliased_kv_seqlens() -> tuple[np.ndarray, Callable[[], Any]]:
    buf = _buffer(2 * 4 * 8)
    seqlens = _ints(buf, 60, [0, 1], np.int32)  # the last elements of v_cache
    return buf, lambda: io.flash_attn_with_kvcache(
        _randn(2, 1, 1, 8), _randn(2, 4, 1, 8), _over(buf, 0, (2, 4, 1, 8)), cache_seqlens=seqlens,
        k=_randn(2, 1, 1, 8), v=_randn(2, 1, 1, 8))


ALIASED: list[tuple[str, Callable[[], tuple[np.ndarray, Callable[[], Any]]]]] = [
    # (argument named, builder of (the shared buffer, the call))
    ("out", _aliased_add), ("out", _aliased_rms_weight), ("out", _aliased_rms_x), ("out", _aliased_gemm_c),
    ("out", _aliased_gemm_a), ("residual", _aliased_fused_residual), ("q_weight", _aliased_qk_weight),
    ("slot_mapping", _aliased_slot_mapping), ("weight", _aliased_conv_weight),
    ("state_batch_indices", _aliased_state_indices), ("k", _aliased_kv_k), ("cache_seqlens", _aliased_kv_seqlens),
]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(("argument", "build"), ALIASED, ids=[b.__name__.removeprefix("_aliased_") for _, b in ALIASED])
def test_overlap_through_another_storage_is_a_contract_error_before_any_kernel(
        provider: str, argument: str, build: Callable[[], tuple[np.ndarray, Callable[[], Any]]]) -> None:
    buf, call = build()
    before = buf.copy()
    with io.use(provider), pytest.raises(ContractError) as info:
        call()
    assert info.value.argument == argument, str(info.value)
    assert "overlaps" in str(info.value) or "shares memory" in str(info.value), str(info.value)
    assert before.tobytes() == buf.tobytes()  # nothing ran


# --- contract errors: one per kind and entry point, naming the argument -----------------------------------

def _gemm(**over: Any) -> Callable[[], Any]:
    args = {"a": torch.randn(4, 3), "b": torch.randn(3, 5), "c": None, "bias": None, "trans_b": False, "out": None}
    args.update(over)
    return lambda: io.gemm(args.pop("a"), args.pop("b"), **args)


def _rms(**over: Any) -> Callable[[], Any]:
    args = {"x": torch.randn(4, 8), "weight": torch.randn(8), "out": None}
    args.update(over)
    return lambda: io.rms_norm(args.pop("x"), args.pop("weight"), **args)


def _fused(**over: Any) -> Callable[[], Any]:
    args = {"x": torch.randn(4, 8), "residual": torch.randn(4, 8), "weight": torch.randn(8)}
    args.update(over)
    return lambda: io.fused_add_rms_norm(**args)


def _qk(**over: Any) -> Callable[[], Any]:
    args = {"qkv": torch.randn(3, (4 + 2 * 2) * 8), "q_weight": torch.randn(8), "k_weight": torch.randn(8),
            "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 8}
    args.update(over)
    return lambda: io.fused_qk_norm(args.pop("qkv"), args.pop("q_weight"), args.pop("k_weight"), **args)


def _cache(**over: Any) -> Callable[[], Any]:
    args = {"key": torch.randn(5, 2, 8), "value": torch.randn(5, 2, 8), "key_cache": torch.randn(3, 4, 2, 8),
            "value_cache": torch.randn(3, 4, 2, 8), "slot_mapping": torch.tensor([0, 5, -1, 11])}
    args.update(over)
    return lambda: io.reshape_and_cache_flash(**args)


CONTRACT_ERRORS: list[tuple[str, str, Callable[[], Any]]] = [
    # (kind, argument named, call)
    ("shape", "b", _gemm(b=torch.randn(4, 5))),
    ("shape", "bias", _gemm(bias=torch.randn(4))),
    ("shape", "c", _gemm(c=torch.randn(3, 5), beta=1.0)),
    ("dtype", "b", _gemm(b=torch.randn(3, 5, dtype=torch.float16))),
    ("dtype", "a", _gemm(a=torch.randint(0, 3, (4, 3)))),
    ("device", "b", _gemm(b=torch.randn(3, 5, device=META))),
    ("strides", "a", _gemm(a=torch.randn(8, 6)[::2, ::2])),
    ("strides", "out", _gemm(out=torch.randn(5, 4).T)),
    ("shape", "weight", _rms(weight=torch.randn(7))),
    ("dtype", "weight", _rms(weight=torch.randn(8, dtype=torch.bfloat16))),
    ("device", "weight", _rms(weight=torch.randn(8, device=META))),
    ("strides", "x", _rms(x=torch.randn(8, 4).T)),
    ("strides", "out", _rms(out=torch.randn(8, 4).T)),
    ("shape", "residual", _fused(residual=torch.randn(4, 9))),
    ("dtype", "residual", _fused(residual=torch.randn(4, 8, dtype=torch.float16))),
    ("device", "residual", _fused(residual=torch.randn(4, 8, device=META))),
    ("strides", "residual", _fused(residual=torch.randn(8, 4).T)),
    ("shape", "qkv", _qk(qkv=torch.randn(3, 7 * 8))),
    ("shape", "k_weight", _qk(k_weight=torch.randn(16))),
    ("dtype", "q_weight", _qk(q_weight=torch.randn(8, dtype=torch.float16))),
    ("device", "k_weight", _qk(k_weight=torch.randn(8, device=META))),
    ("strides", "qkv", _qk(qkv=torch.randn(64, 3).T)),
    ("value", "head_dim", _qk(head_dim=0)),
    ("shape", "value_cache", _cache(value_cache=torch.randn(3, 4, 2, 9))),
    ("shape", "slot_mapping", _cache(slot_mapping=torch.arange(6))),
    ("dtype", "slot_mapping", _cache(slot_mapping=torch.tensor([0, 1], dtype=torch.int32))),
    ("dtype", "value", _cache(value=torch.randn(5, 2, 8, dtype=torch.bfloat16))),
    ("device", "key_cache", _cache(key_cache=torch.randn(3, 4, 2, 8, device=META))),
    ("strides", "key", _cache(key=torch.randn(5, 8, 2).transpose(1, 2))),
    ("index", "slot_mapping", _cache(slot_mapping=torch.tensor([0, 12]))),
]


@pytest.mark.parametrize(("kind", "argument", "call"), CONTRACT_ERRORS,
                         ids=[f"{c.__qualname__.split('.')[0]}-{k}-{a}" for k, a, c in CONTRACT_ERRORS])
def test_contract_error_names_the_argument(kind: str, argument: str, call: Callable[[], Any]) -> None:
    with pytest.raises(ContractError) as info:
        call()
    assert info.value.argument == argument
    assert f": {argument}: " in str(info.value)


def test_out_of_range_slot_is_skipped_not_raised_when_unchecked() -> None:
    with unchecked_indices():
        _cache(slot_mapping=torch.tensor([0, 12]))()


# --- the conformance suite on the torch provider, briefly ---------------------------------------------------

def test_torch_provider_conformance() -> None:
    from infiniops_py.testing.conformance import run_conformance

    ops = ["gemm", "rms_norm", "fused_add_rms_norm", "fused_qk_norm", "reshape_and_cache_flash"]
    report = run_conformance("torch", ops=ops, max_examples=15)
    assert report.ok, report.render()
    assert {r.op for r in report.ops} == set(ops)


# --- repeated slots, meta inputs, inputs that require grad ---------------------------------------------------

_DENSE: dict[str, tuple[Callable[[], dict[str, Any]], Callable[..., Any]]] = {
    "gemm": (lambda: {"a": _randn(4, 3), "b": _randn(3, 5), "c": _randn(4, 5), "bias": _randn(5),
                      "out": torch.zeros(4, 5)}, lambda **a: _gemm(**a, beta=0.5)()),
    "add": (lambda: {"input": _randn(4, 3), "other": _randn(3), "out": torch.zeros(4, 3)},
            lambda **a: io.add(a.pop("input"), a.pop("other"), **a)),
    "rms_norm": (lambda: {"x": _randn(4, 8), "weight": _randn(8), "out": torch.zeros(4, 8)}, lambda **a: _rms(**a)()),
    "fused_add_rms_norm": (lambda: {"x": _randn(4, 8), "residual": _randn(4, 8), "weight": _randn(8)},
                           lambda **a: _fused(**a)()),
    "fused_qk_norm": (lambda: {"qkv": _randn(3, 64), "q_weight": _randn(8), "k_weight": _randn(8)},
                      lambda **a: _qk(**a)()),
    "reshape_and_cache_flash": (lambda: {"key": _randn(5, 2, 8), "value": _randn(5, 2, 8),
                                         "key_cache": _randn(3, 4, 2, 8), "value_cache": _randn(3, 4, 2, 8),
                                         "slot_mapping": torch.tensor([0, 5, -1, 11])}, lambda **a: _cache(**a)()),
}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_repeated_slot_is_rejected_when_checked(provider: str) -> None:
    """Two tokens naming one slot race (in vLLM's kernel too), so checked mode rejects them before any
    write; padding slots (< 0) may repeat."""
    make, call = _DENSE["reshape_and_cache_flash"]
    args = make()
    before = args["key_cache"].clone(), args["value_cache"].clone()
    with io.use(provider), io.checked_indices(), pytest.raises(ContractError) as info:
        call(**args | {"slot_mapping": torch.tensor([5, -1, -1, 5])})
    assert info.value.argument == "slot_mapping" and "slot 5 appears 2 times" in str(info.value)
    assert torch.equal(args["key_cache"], before[0]) and torch.equal(args["value_cache"], before[1])
    with io.use(provider), io.checked_indices():
        call(**args | {"slot_mapping": torch.tensor([-1, 7, -1, -1])})
    assert torch.equal(args["key_cache"][1, 3], args["key"][1])


@pytest.mark.parametrize("op", list(_DENSE))
def test_meta_inputs_give_the_output_shapes_without_reading_values(op: str) -> None:
    """Every entry point on meta tensors, with the index checks forced on: outputs of the CPU call's
    shapes and dtypes (None for the in-place cache write), no values read."""
    make, call = _DENSE[op]
    expected = call(**make())
    with io.checked_indices():
        got = call(**{k: v.to(META) for k, v in make().items()})
    got_list = list(got) if isinstance(got, tuple) else [got]
    expected_list = list(expected) if isinstance(expected, tuple) else [expected]
    assert len(got_list) == len(expected_list)
    for g, e in zip(got_list, expected_list):
        assert (g is None and e is None) or (g.is_meta and g.shape == e.shape and g.dtype == e.dtype)


@pytest.mark.parametrize("op", list(_DENSE))
def test_inputs_that_require_grad_are_rejected_before_any_kernel(op: str) -> None:
    """No operator has a backward (the torch provider raised torch's "out= arguments don't support
    automatic differentiation"): a tensor argument that requires grad, grad mode on, is a ContractError
    naming it, before anything is written, also through the custom operator of FakeTensor and traced
    calls; under ``torch.no_grad()`` the same call runs."""
    make, call = _DENSE[op]
    names = [k for k, v in make().items() if v.is_floating_point()]
    for name in names:
        args = make()
        args[name].requires_grad_()
        before = {k: v.detach().clone() for k, v in args.items()}
        with pytest.raises(ContractError) as info:
            call(**args)
        assert info.value.argument == name and "requires_grad" in str(info.value)
        assert all(torch.equal(args[k].detach(), v) for k, v in before.items())
        with torch.no_grad():
            call(**args)
        with FakeTensorMode() as mode, pytest.raises(ContractError, match=f": {name}: requires_grad"):
            call(**{k: mode.from_tensor(v) for k, v in args.items()})


@pytest.mark.parametrize("call", ["add_alpha", "gemm_beta", "rms_norm_eps"])
def test_a_scalar_beyond_the_float_range_is_a_contract_error(call: str) -> None:
    x, w = torch.randn(2, 4), torch.rand(4) + 0.5
    calls = {
        "add_alpha": lambda: io.add(x, x, alpha=10**400),
        "gemm_beta": lambda: io.gemm(x, x, c=x, beta=-(10**400), trans_b=True),
        "rms_norm_eps": lambda: io.rms_norm(x, w, 10**400),
    }
    with pytest.raises(ContractError, match="finite"):
        calls[call]()
