"""Contract hardening: the bad inputs an adversarial tester found, each rejected before any kernel runs.

One test per finding: every rejection is a `ContractError` naming the argument, and a rejected call leaves
the tensors it would write (residuals, caches, states) bit for bit unchanged. Accepted corner cases (an
out sharing a storage without sharing elements, an empty batch, a window wider than the keys) are
compared with the float64 reference.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import infiniops_py as io
from infiniops_py import ContractError
from infiniops_py.operators._base import check_writable, overlaps, unchecked_indices
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

I32 = torch.int32


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype)


def _rejects(fn: Callable[[], Any], argument: str, *untouched: torch.Tensor) -> ContractError:
    """`fn()` raises a ContractError naming `argument`, and leaves every tensor of `untouched` as it was."""
    before = [t.clone() for t in untouched]
    with pytest.raises(ContractError) as info:
        fn()
    assert info.value.argument == argument, str(info.value)
    assert f": {argument}: " in str(info.value)
    for t, b in zip(untouched, before, strict=True):  # bit for bit: an uninitialised `out` may hold NaNs
        same = torch.equal(t.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
        assert same, f"a rejected call wrote into a tensor ({argument})"
    return info.value


# --- 1. fused_add_rms_norm: expanded or overlapping in-place tensors -------------------------------------

def test_fused_add_rms_norm_rejects_expanded_and_overlapping_tensors() -> None:
    w = _randn(8, seed=1)
    row, res = _randn(1, 8, seed=2), _randn(4, 8, seed=3)
    msg = _rejects(lambda: io.fused_add_rms_norm(row.expand(4, 8), res, w, 1e-6), "x", res, row)
    assert "zero stride" in str(msg)
    x = _randn(4, 8, seed=4)
    _rejects(lambda: io.fused_add_rms_norm(x, row.expand(4, 8), w, 1e-6), "residual", x, row)
    base = _randn(5, 8, seed=5)
    msg = _rejects(lambda: io.fused_add_rms_norm(base[:4], base[1:5], w, 1e-6), "residual", base)
    assert "overlaps x" in str(msg)
    _rejects(lambda: io.fused_add_rms_norm(x, res, x[0], 1e-6), "weight", x, res)


def test_fused_add_rms_norm_overlap_check_on_meta() -> None:
    """On meta every data_ptr is 0: separate tensors pass the contract; views of one storage do not."""
    meta = torch.device("meta")
    x, r, w = (torch.empty(4, 8, device=meta), torch.empty(4, 8, device=meta), torch.empty(8, device=meta))
    got = io.fused_add_rms_norm(x, r, w, 1e-6)  # past every check: the meta provider has nothing to compute
    assert got[0] is x and got[1] is r
    base = torch.empty(5, 8, device=meta)
    _rejects(lambda: io.fused_add_rms_norm(base[:4], base[1:5], w, 1e-6), "residual")


# --- 2. in-place outputs that alias, overlap or are expanded ---------------------------------------------

def test_reshape_and_cache_flash_rejects_aliased_caches() -> None:
    t, nb, bs, h, d = 4, 3, 4, 2, 8
    key, value = _randn(t, h, d, seed=1), _randn(t, h, d, seed=2)
    kc, vc = _randn(nb, bs, h, d, seed=3), _randn(nb, bs, h, d, seed=4)
    slots = torch.randperm(nb * bs, generator=torch.Generator().manual_seed(5))[:t]
    rc = io.reshape_and_cache_flash
    _rejects(lambda: rc(key, value, kc, kc, slots), "value_cache", kc)
    buf = _randn(nb * bs * h * d + h * d, seed=6)
    k_half, v_half = buf[: nb * bs * h * d].view(nb, bs, h, d), buf[h * d:].view(nb, bs, h, d)
    _rejects(lambda: rc(key, value, k_half, v_half, slots), "value_cache", buf)
    _rejects(lambda: rc(key, value, kc[:1].expand(nb, bs, h, d), vc, slots), "key_cache", kc, vc)
    _rejects(lambda: rc(kc[0, :t], value, kc, vc, slots), "key", kc, vc)
    # the two halves of one [num_blocks, 2, block_size, Hkv, D] buffer share no element: accepted
    both = _randn(nb, 2, bs, h, d, seed=7)
    expected = both.double()
    for i, s in enumerate(slots.tolist()):
        expected[s // bs, 0, s % bs], expected[s // bs, 1, s % bs] = key[i].double(), value[i].double()
    rc(key, value, both[:, 0], both[:, 1], slots)
    assert torch.equal(both.double(), expected)


def test_flash_attn_with_kvcache_rejects_aliased_written_caches() -> None:
    b, s, hq, hkv, d = 2, 8, 4, 2, 8
    q = _randn(b, 1, hq, d, seed=1)
    kc, vc = _randn(b, s, hkv, d, seed=2), _randn(b, s, hkv, d, seed=3)
    kn, vn = _randn(b, 1, hkv, d, seed=4), _randn(b, 1, hkv, d, seed=5)
    lens = torch.tensor([3, 5], dtype=I32)

    def call(**kw: Any) -> torch.Tensor:
        args = {"q": q, "k_cache": kc, "v_cache": vc, "cache_seqlens": lens, "k": kn, "v": vn, **kw}
        return io.flash_attn_with_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), **args)

    _rejects(lambda: call(v_cache=kc), "v_cache", kc)
    _rejects(lambda: call(k_cache=kc[:1].expand(b, s, hkv, d)), "k_cache", kc, vc)
    _rejects(lambda: call(k=kc[:, 2:3]), "k", kc, vc)
    _rejects(lambda: call(v=vc[:, 6:7]), "v", kc, vc)
    # without new k/v the caches are only read: one tensor may serve as both
    got = call(v_cache=kc, k=None, v=None)
    with io.use("reference"):
        expected = call(q=q.double(), k_cache=kc.double(), v_cache=kc.double(), k=None, v=None)
    with io.use("reference"):
        low = call(v_cache=kc, k=None, v=None)
    _, message = compare("flash_attn_with_kvcache", got, expected,
                         tolerance("flash_attn_with_kvcache", "float32"), low=low)
    assert message is None, message


def test_fused_qk_norm_rejects_weights_aliasing_qkv_and_expanded_qkv() -> None:
    t, hq, hkv, d = 3, 4, 2, 8
    qkv = _randn(t, (hq + 2 * hkv) * d, seed=1)
    qw, kw = _randn(d, seed=2), _randn(d, seed=3)
    heads = {"num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d}
    _rejects(lambda: io.fused_qk_norm(qkv, qkv[0, :d], kw, **heads), "q_weight", qkv)
    _rejects(lambda: io.fused_qk_norm(qkv, qw, qkv[1, -d:], **heads), "k_weight", qkv)
    row = _randn(1, (hq + 2 * hkv) * d, seed=4)
    _rejects(lambda: io.fused_qk_norm(row.expand(t, -1), qw, kw, **heads), "qkv", row)


def test_recurrent_states_reject_expanded_or_aliased_updates() -> None:
    slots, dim, w = 3, 4, 4
    x, weight = _randn(2, dim, seed=1), _randn(dim, w, seed=2)
    state = _randn(slots, dim, w - 1, seed=3)
    idx = torch.tensor([0, 2], dtype=I32)
    cu = io.causal_conv1d_update
    _rejects(lambda: cu(state[:2, :, 0], state, weight, conv_state_indices=idx), "x", state)
    overlapping = state.view(-1).as_strided((slots, dim, w - 1), (1, w - 1, 1))  # rows share addresses
    _rejects(lambda: cu(x, overlapping, weight, conv_state_indices=idx), "conv_state", state)
    h, p, n = 2, 3, 4
    st = _randn(slots, h, p, n, seed=4)
    args = (_randn(2, h, p, seed=5), _randn(2, h, seed=6), -torch.rand(h, generator=torch.Generator().manual_seed(7)),
            _randn(2, 1, n, seed=8), _randn(2, 1, n, seed=9))
    su = io.selective_state_update
    _rejects(lambda: su(st, st[:2, :, 0, :p], *args[1:], state_batch_indices=idx), "x", st)
    _rejects(lambda: su(st[:1].expand(slots, h, p, n), *args, state_batch_indices=idx), "state", st)


def test_check_writable_rejects_only_self_overlapping_layouts() -> None:
    base = _randn(6, 8, seed=1)
    for ok in (base, base.t(), base[:, ::2], base[1:4, 2:6], base.view(2, 3, 8).permute(2, 0, 1)):
        check_writable("op", "t", ok)
    for bad in (base[:1].expand(6, 8), base.as_strided((4, 8), (2, 1))):
        with pytest.raises(ContractError, match="op: t: "):
            check_writable("op", "t", bad)


def _shares_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Brute force: the byte addresses of every element of `a` and `b` intersect."""
    def addresses(t: torch.Tensor) -> set[int]:
        out: set[int] = set()
        for index in itertools.product(*(range(n) for n in t.shape)):
            start = t.data_ptr() + sum(i * s for i, s in zip(index, t.stride())) * t.element_size()
            out.update(range(start, start + t.element_size()))
        return out
    return bool(addresses(a) & addresses(b))


def test_overlaps_matches_brute_force_on_random_views() -> None:
    gen = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    buf = torch.randn(256)
    raw = buf.view(torch.uint8)

    def draw() -> torch.Tensor:
        rank = int(torch.randint(1, 4, (), generator=gen))
        shape = torch.randint(0, 5, (rank,), generator=gen).tolist()
        stride = [(0, 1, 2, 3, 5, 8, 12)[i] for i in torch.randint(0, 7, (rank,), generator=gen).tolist()]
        offset = int(torch.randint(0, 40, (), generator=gen))
        if torch.rand((), generator=gen) < 0.2:  # another element size over the same bytes
            return raw.as_strided(shape, stride, 3 * offset)
        return buf.as_strided(shape, stride, offset)

    for _ in range(300):
        a, b = draw(), draw()
        assert overlaps(a, b) == _shares_bytes(a, b), (a.shape, a.stride(), b.shape, b.stride())


# --- 3. add: out sharing a storage without sharing elements ----------------------------------------------

def test_add_accepts_disjoint_views_of_one_storage_and_rejects_real_overlap() -> None:
    a = _randn(4, 8, seed=1)
    expected = a[:, :4].double() + 0.5 * a[:, 4:].double()
    right = a[:, 4:].clone()
    out = io.add(a[:, :4], a[:, 4:], alpha=0.5, out=a[:, :4])
    _, message = compare("add", out, expected, tolerance("add", "float32"))
    assert message is None, message
    assert torch.equal(a[:, 4:], right)
    sq = _randn(4, 4, seed=2)
    _rejects(lambda: io.add(sq, sq.t(), out=sq), "out", sq)
    _rejects(lambda: io.add(a[:3], a[:3].clone(), out=a[1:4]), "out", a)
    g = _randn(8, 5, seed=3)  # gemm likewise: out in the storage of a and b, no element shared
    expected = g[:2, :3].double() @ g[2:5].double()
    out = io.gemm(g[:2, :3], g[2:5], out=g[6:8])
    _, message = compare("gemm", out, expected, tolerance("gemm", "float32"), k=3)
    assert message is None, message
    _rejects(lambda: io.gemm(g[:2, :3], g[2:5], out=g[1:3]), "out", g)


# --- 4. non-tensors and bad scalars ----------------------------------------------------------------------

def _calls() -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """Every public function with valid arguments (all by keyword where the signature allows)."""
    t, h, d = 4, 2, 8
    q3, k3 = _randn(t, 4, d, seed=1), _randn(t, h, d, seed=2)
    cu = torch.tensor([0, t], dtype=I32)
    bt = torch.tensor([[0]], dtype=I32)
    x4, dt3 = _randn(1, 3, 2, 4, seed=3), torch.rand(1, 3, 2)
    bc = _randn(1, 3, 1, 5, seed=4)
    return {
        "gemm": (lambda a, b, **kw: io.gemm(a, b, **kw), {"a": _randn(3, 4, seed=5), "b": _randn(4, 2, seed=6),
                                                           "c": _randn(3, 2, seed=7), "bias": _randn(2, seed=8),
                                                           "out": torch.empty(3, 2)}),
        "add": (lambda input, other, **kw: io.add(input, other, **kw),
                {"input": _randn(4, seed=9), "other": _randn(4, seed=10), "out": torch.empty(4)}),
        "rms_norm": (lambda x, weight, **kw: io.rms_norm(x, weight, **kw),
                     {"x": _randn(2, 8, seed=11), "weight": _randn(8, seed=12), "out": torch.empty(2, 8)}),
        "fused_add_rms_norm": (lambda x, residual, weight: io.fused_add_rms_norm(x, residual, weight),
                               {"x": _randn(2, 8, seed=13), "residual": _randn(2, 8, seed=14),
                                "weight": _randn(8, seed=15)}),
        "fused_qk_norm": (lambda qkv, q_weight, k_weight: io.fused_qk_norm(
            qkv, q_weight, k_weight, num_q_heads=2, num_kv_heads=1, head_dim=d),
            {"qkv": _randn(t, 4 * d, seed=16), "q_weight": _randn(d, seed=17), "k_weight": _randn(d, seed=18)}),
        "reshape_and_cache_flash": (io.reshape_and_cache_flash,
                                    {"key": k3, "value": _randn(t, h, d, seed=19),
                                     "key_cache": _randn(2, 4, h, d, seed=20),
                                     "value_cache": _randn(2, 4, h, d, seed=21),
                                     "slot_mapping": torch.arange(t)}),
        "flash_attn_varlen": (lambda q, k, v, cu_seqlens_q, cu_seqlens_k, **kw: io.flash_attn_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, t, t, **kw),
            {"q": q3, "k": _randn(1, t, h, d, seed=22), "v": _randn(1, t, h, d, seed=23),
             "cu_seqlens_q": cu, "cu_seqlens_k": cu, "block_table": bt}),
        "flash_attn_with_kvcache": (lambda q, k_cache, v_cache, **kw: io.flash_attn_with_kvcache(
            q, k_cache, v_cache, **kw),
            {"q": _randn(1, 1, 4, d, seed=24), "k_cache": _randn(1, t, h, d, seed=25),
             "v_cache": _randn(1, t, h, d, seed=26), "cache_seqlens": torch.tensor([2], dtype=I32),
             "block_table": bt, "k": _randn(1, 1, h, d, seed=27), "v": _randn(1, 1, h, d, seed=28)}),
        "causal_conv1d": (lambda x, weight, **kw: io.causal_conv1d(x, weight, **kw),
                          {"x": _randn(1, 4, 5, seed=29), "weight": _randn(4, 3, seed=30), "bias": _randn(4, seed=31),
                           "seq_idx": torch.zeros(1, 5, dtype=I32), "initial_states": _randn(1, 4, 2, seed=32)}),
        "causal_conv1d_update": (lambda x, conv_state, weight, **kw: io.causal_conv1d_update(
            x, conv_state, weight, **kw),
            {"x": _randn(1, 4, seed=33), "conv_state": _randn(2, 4, 2, seed=34), "weight": _randn(4, 3, seed=35),
             "bias": _randn(4, seed=36), "conv_state_indices": torch.tensor([1], dtype=I32)}),
        "selective_scan": (lambda x, dt, A, B, C, **kw: io.selective_scan(x, dt, A, B, C, **kw),
                           {"x": x4, "dt": dt3, "A": -torch.rand(2), "B": bc, "C": _randn(1, 3, 1, 5, seed=37),
                            "D": _randn(2, seed=38), "z": _randn(1, 3, 2, 4, seed=39), "dt_bias": _randn(2, seed=40),
                            "initial_states": _randn(1, 2, 4, 5, seed=41), "seq_idx": torch.zeros(1, 3, dtype=I32)}),
        "selective_state_update": (lambda state, x, dt, A, B, C, **kw: io.selective_state_update(
            state, x, dt, A, B, C, **kw),
            {"state": _randn(2, 2, 4, 5, seed=42), "x": _randn(1, 2, 4, seed=43), "dt": torch.rand(1, 2),
             "A": -torch.rand(2), "B": _randn(1, 1, 5, seed=44), "C": _randn(1, 1, 5, seed=45),
             "D": _randn(2, seed=46), "z": _randn(1, 2, 4, seed=47), "dt_bias": _randn(2, seed=48),
             "state_batch_indices": torch.tensor([1], dtype=I32)}),
        "silu_and_mul": (lambda x, **kw: io.silu_and_mul(x, **kw),
                         {"x": _randn(3, 8, seed=49), "out": torch.empty(3, 4)}),
        "rotary_embedding": (lambda positions, query, key, cos_sin_cache: io.rotary_embedding(
            positions, query, key, d, cos_sin_cache, True),
            {"positions": torch.tensor([0, 2, 1, 3]), "query": _randn(t, 2 * d, seed=50),
             "key": _randn(t, d, seed=51), "cos_sin_cache": _randn(5, d, seed=52)}),
        "fused_qk_norm_rope": (lambda qkv, q_weight, k_weight, cos_sin_cache, positions: io.fused_qk_norm_rope(
            qkv, q_weight, k_weight, cos_sin_cache, positions, num_q_heads=2, num_kv_heads=1, head_dim=d),
            {"qkv": _randn(t, 4 * d, seed=53), "q_weight": _randn(d, seed=54), "k_weight": _randn(d, seed=55),
             "cos_sin_cache": _randn(5, d, seed=56), "positions": torch.tensor([0, 2, 1, 3])}),
    }


_TENSOR_ARGS = [(op, name) for op, (_, kw) in _calls().items() for name in kw]


@pytest.mark.parametrize(("op", "name"), _TENSOR_ARGS, ids=[f"{o}-{n}" for o, n in _TENSOR_ARGS])
def test_every_tensor_argument_rejects_a_non_tensor(op: str, name: str) -> None:
    fn, kwargs = _calls()[op]
    fn(**kwargs)  # the valid call runs
    for bad in (kwargs[name].tolist(), 1.5):
        message = str(_rejects(lambda bad=bad: fn(**{**kwargs, name: bad}), name))
        assert "expected a torch.Tensor" in message and f"got {type(bad).__name__}" in message


def _other_layouts(t: torch.Tensor) -> dict[str, torch.Tensor]:
    """`t` in each layout other than strided that it converts to: sparse COO, the compressed sparse layouts
    (2-D only) and MKLDNN (float32 only)."""
    made = {"sparse_coo": t.to_sparse()}
    if t.dim() == 2:
        made.update(sparse_csr=t.to_sparse_csr(), sparse_csc=t.to_sparse_csc(),
                    sparse_bsr=t.to_sparse_bsr((1, 1)))
    if t.dtype is torch.float32 and torch.backends.mkldnn.is_available():
        made["_mkldnn"] = t.to_mkldnn()  # torch names the layout torch._mkldnn
    return made


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state")
@pytest.mark.parametrize(("op", "name"), _TENSOR_ARGS, ids=[f"{o}-{n}" for o, n in _TENSOR_ARGS])
def test_every_tensor_argument_rejects_a_sparse_or_mkldnn_tensor(op: str, name: str) -> None:
    # Issue #30 (5): add raised torch's RuntimeError, gemm's check raised on a CSR tensor's missing strides,
    # an MKLDNN x reached rms_norm's kernel (NotImplementedError), and a sparse `other` of add was accepted.
    fn, kwargs = _calls()[op]
    written = [t for t in kwargs.values() if t.layout is torch.strided]
    for layout, bad in _other_layouts(kwargs[name]).items():
        message = str(_rejects(lambda bad=bad: fn(**{**kwargs, name: bad}), name, *written))
        assert f"got layout torch.{layout}" in message and "a strided tensor" in message, message


_BAD_SCALARS = [
    ("gemm", "alpha", "2"), ("gemm", "alpha", True), ("gemm", "beta", float("nan")), ("gemm", "beta", float("inf")),
    ("gemm", "trans_a", 1), ("gemm", "trans_b", "yes"),
    ("add", "alpha", None), ("add", "alpha", float("inf")), ("add", "alpha", torch.tensor(2.0)),
    ("rms_norm", "eps", 0.0), ("rms_norm", "eps", -1e-6), ("rms_norm", "eps", "1e-6"),
    ("rms_norm", "eps", float("nan")),
    ("fused_add_rms_norm", "eps", 0), ("fused_qk_norm", "eps", float("inf")), ("fused_qk_norm", "num_q_heads", True),
    ("flash_attn_varlen", "softmax_scale", float("nan")), ("flash_attn_varlen", "softmax_scale", "x"),
    ("flash_attn_varlen", "softcap", -1.0), ("flash_attn_varlen", "softcap", float("inf")),
    ("flash_attn_varlen", "causal", "no"), ("flash_attn_varlen", "causal", 1),
    ("flash_attn_varlen", "window_size", (True, 2)), ("flash_attn_varlen", "window_size", (1.5, 2)),
    ("flash_attn_varlen", "window_size", (-2, 0)), ("flash_attn_varlen", "window_size", 3),
    ("flash_attn_with_kvcache", "causal", None), ("flash_attn_with_kvcache", "softmax_scale", float("inf")),
    ("causal_conv1d", "activation", "relu"), ("causal_conv1d", "activation", True),
    ("causal_conv1d", "return_final_states", 1), ("causal_conv1d_update", "activation", "gelu"),
    ("selective_scan", "dt_softplus", 1), ("selective_scan", "return_final_states", "yes"),
    ("selective_scan", "dt_limit", ("0", 1.0)), ("selective_state_update", "dt_softplus", None),
]


@pytest.mark.parametrize(("op", "name", "value"), _BAD_SCALARS, ids=[f"{o}-{n}-{v!r}" for o, n, v in _BAD_SCALARS])
def test_bad_scalars_are_contract_errors(op: str, name: str, value: object) -> None:
    fn, kwargs = _calls()[op]
    positional = {"fused_add_rms_norm": ("eps",), "fused_qk_norm": ("eps", "num_q_heads")}
    if name in positional.get(op, ()):  # these wrappers fix the argument: call the public function directly
        tensors = list(kwargs.values())
        extra = {"num_q_heads": 2, "num_kv_heads": 1, "head_dim": 8} if op == "fused_qk_norm" else {}
        call = getattr(io, op)
        _rejects(lambda: call(*tensors, **{**extra, name: value}), name, *tensors)
    else:
        _rejects(lambda: fn(**{**kwargs, name: value}), name)


# --- 5. empty batches do nothing -------------------------------------------------------------------------

def test_empty_batch_update_ignores_slot_count() -> None:
    state = _randn(3, 4, 3, seed=1)
    before = state.clone()
    out = io.causal_conv1d_update(torch.empty(0, 4), state, _randn(4, 4, seed=2))
    assert out.shape == (0, 4) and torch.equal(state, before)
    st = _randn(3, 2, 4, 5, seed=3)
    before = st.clone()
    y = io.selective_state_update(st, torch.empty(0, 2, 4), torch.empty(0, 2), -torch.rand(2), torch.empty(0, 1, 5),
                                  torch.empty(0, 1, 5))
    assert y.shape == (0, 2, 4) and torch.equal(st, before)


# --- 6. windows wider than the keys are unbounded (flash-attention's rule) -------------------------------

@pytest.mark.parametrize("window", [(-1, 2), (-1, 5), (2, -1), (3, 7)])
def test_window_at_least_max_seqlen_k_is_unbounded_even_when_sq_exceeds_sk(window: tuple[int, int]) -> None:
    """flash_api.cpp sets window_size_left/right >= seqlen_k to -1; PEERS.md settles it. With Sq=8 > Sk=2,
    DESIGN.md's literal window would hide every key from the first rows; the pinned rule shows them all."""
    sq, sk, hq, hkv, d = 8, 2, 2, 1, 8
    q, k, v = _randn(sq, hq, d, seed=1), _randn(sk, hkv, d, seed=2), _randn(sk, hkv, d, seed=3)
    cuq, cuk = torch.tensor([0, sq], dtype=I32), torch.tensor([0, sk], dtype=I32)
    got = io.flash_attn_varlen(q, k, v, cuq, cuk, sq, sk, window_size=window)
    assert torch.equal(got, io.flash_attn_varlen(q, k, v, cuq, cuk, sq, sk))
    with io.use("reference"):
        expected = io.flash_attn_varlen(q.double(), k.double(), v.double(), cuq, cuk, sq, sk)
        low = io.flash_attn_varlen(q, k, v, cuq, cuk, sq, sk)
    _, message = compare("flash_attn_varlen", got, expected, tolerance("flash_attn_varlen", "float32"), low=low)
    assert message is None, message
    assert got[0].abs().amax() > 0  # row 0 sees the keys the literal formula would hide
    kc, vc = k[None].clone(), v[None].clone()
    cached = io.flash_attn_with_kvcache(q[None], kc, vc, cache_seqlens=torch.tensor([sk], dtype=I32), causal=False,
                                        window_size=window)  # capacity S_max = Sk = 2
    rule = tolerance("flash_attn_with_kvcache", "float32")
    _, message = compare("flash_attn_with_kvcache", cached[0], expected, rule, low=low)
    assert message is None, message


# --- 6. scalars given as Python ints beyond int64 ----------------------------------------------------------

def test_int_scalars_beyond_int64_are_used_as_floats() -> None:
    # The hostile pass of issue #30: alpha/beta/dt_limit given as ints of 30 digits passed the checks (finite
    # reals) and then reached torch as ints: OverflowError ("int too big to convert") from inside the kernel.
    big = 10**30
    kw = _calls()
    a, b, c = kw["gemm"][1]["a"], kw["gemm"][1]["b"], kw["gemm"][1]["c"]
    torch.testing.assert_close(io.gemm(a, b, c=c, alpha=big, beta=-big), io.gemm(a, b, c=c, alpha=1e30, beta=-1e30))
    x, y = kw["add"][1]["input"], kw["add"][1]["other"]
    torch.testing.assert_close(io.add(x, y, alpha=big), io.add(x, y, alpha=1e30))
    s = kw["selective_scan"][1]
    args = (s["x"], s["dt"], s["A"], s["B"], s["C"])
    for limit, same in (((0, big), (0.0, 1e30)), ((-big, 10**400), (-1e30, math.inf))):
        torch.testing.assert_close(io.selective_scan(*args, dt_limit=limit), io.selective_scan(*args, dt_limit=same))


def test_a_block_table_without_columns_is_refused_in_unchecked_mode_too() -> None:
    # The hostile pass of issue #30: a [B, 0] block table passed the shape check; unchecked (no value checks,
    # as on CUDA by default) the torch provider then indexed column -1 of it (RuntimeError from the kernel).
    kw = _calls()
    for op in ("flash_attn_varlen", "flash_attn_with_kvcache"):
        fn, args = kw[op]
        bad = {**args, "block_table": torch.zeros(1, 0, dtype=I32)}
        for scope in (io.checked_indices, unchecked_indices):
            with scope():
                message = str(_rejects(lambda fn=fn, bad=bad: fn(**bad), "block_table",
                                       *(t for t in args.values() if isinstance(t, torch.Tensor))))
            assert "max_blocks >= 1" in message, message


@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "rms_norm_gated"])
def test_an_int_eps_past_int64_is_its_float(op: str) -> None:
    # check_real's float goes on to the provider: an int eps (even 2**70, past int64) gives the float eps's
    # result and a fused residual is written once, not left half-updated by an OverflowError
    x, r = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(3, 8, dtype=torch.bfloat16)
    w = torch.ones(8, dtype=torch.bfloat16)

    def run(eps: float) -> list[torch.Tensor]:
        xs, rs = x.clone(), r.clone()
        with io.use("reference"):
            if op == "fused_add_rms_norm":
                io.fused_add_rms_norm(xs, rs, w, eps)
                return [xs, rs]
            if op == "rms_norm":
                return [io.rms_norm(xs, w, eps)]
            return [io.rms_norm_gated(xs, w, eps=eps)]

    for got, want in zip(run(2**70), run(float(2**70)), strict=True):
        assert torch.equal(got, want)
