"""FlashAttention: conformance of the torch and reference providers, the semantics the peers settle, and
the contract's argument checks (one ContractError per kind and entry point)."""

from __future__ import annotations

import itertools
import math
import threading

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import infiniops_py as ip
from infiniops_py import ContractError, OpSpec, flash_attn_varlen, flash_attn_with_kvcache
from infiniops_py.operators._base import is_checked
from infiniops_py.testing.conformance import run_conformance

PROVIDERS = ("torch", "reference")
OPS = ("flash_attn_varlen", "flash_attn_with_kvcache")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_conformance(provider: str, op: str, dtype: str) -> None:
    """Random cases vs the float64 reference with the LowPrecisionRule of the tolerance table."""
    report = run_conformance(provider, ops=[op], dtypes=[dtype], max_examples=8 if provider == "torch" else 4,
                             gates=False)
    assert report.ok, report.render()
    assert sum(r.examples for r in report.ops) > 0


# --- helpers -------------------------------------------------------------------------------------------------

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def _naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: list[list[int]]) -> torch.Tensor:
    """One head, float64: query row i attends to the listed keys (empty -> 0)."""
    q, k, v = q.double(), k.double(), v.double()
    rows = []
    for i, keys in enumerate(visible):
        if not keys:
            rows.append(torch.zeros(q.shape[-1], dtype=q.dtype))
            continue
        p = torch.softmax(k[keys] @ q[i] / math.sqrt(q.shape[-1]), dim=0)
        rows.append(p @ v[keys])
    return torch.stack(rows)


def _varlen(provider: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lq: list[int], lk: list[int],
            **kwargs: object) -> torch.Tensor:
    with ip.use(provider):
        return flash_attn_varlen(q, k, v, _cu(lq), _cu(lk), max(lq, default=0), max(lk, default=0), **kwargs)


def _paged(k: torch.Tensor, lengths: list[int], block_size: int, seed: int, extra: int = 2
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack packed rows ``[total, H, D]`` into a shuffled paged cache (NaN in unused rows) and its table."""
    used = [-(-n // block_size) for n in lengths]
    num_blocks = sum(used) + extra
    ids = torch.randperm(num_blocks, generator=_gen(seed)).tolist()
    cache = torch.full((num_blocks, block_size, *k.shape[1:]), math.nan, dtype=k.dtype)
    table = torch.full((len(lengths), max(used, default=0) + 1), -1, dtype=torch.int32)
    start = 0
    for b, (n, m) in enumerate(zip(lengths, used)):
        blocks, ids = ids[:m], ids[m:]
        table[b, :m] = torch.tensor(blocks, dtype=torch.int32)
        for t in range(n):
            cache[blocks[t // block_size], t % block_size] = k[start + t]
        start += n
    return cache, table


# --- semantics -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("provider", PROVIDERS)
def test_causal_is_bottom_right_and_empty_rows_are_zero(provider: str) -> None:
    d = 16
    for sq, sk in ((3, 5), (5, 2)):
        q, k, v = _randn(sq, 1, d, seed=1), _randn(sk, 1, d, seed=2), _randn(sk, 1, d, seed=3)
        out = _varlen(provider, q, k, v, [sq], [sk], causal=True)
        visible = [list(range(max(0, min(sk, i + sk - sq + 1)))) for i in range(sq)]
        torch.testing.assert_close(out[:, 0].double(), _naive(q[:, 0], k[:, 0], v[:, 0], visible), rtol=1e-5,
                                   atol=1e-6)
        assert torch.equal(out[: max(0, sq - sk)], torch.zeros_like(out[: max(0, sq - sk)]))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_window_rows_without_keys_are_zero_not_nan(provider: str) -> None:
    q, k, v = _randn(6, 2, 8, seed=4), _randn(2, 2, 8, seed=5), _randn(2, 2, 8, seed=6)
    out = _varlen(provider, q, k, v, [6], [2], window_size=(-1, 0))
    assert out.isfinite().all()
    assert torch.equal(out[:4], torch.zeros_like(out[:4]))  # key j visible when j <= i + 2 - 6
    assert (out[4:] != 0).all()


@pytest.mark.parametrize("provider", PROVIDERS)
def test_single_query_causal_equals_non_causal(provider: str) -> None:
    lq, lk = [1, 1, 1], [7, 1, 30]
    q, k, v = _randn(3, 4, 32, seed=7), _randn(38, 2, 32, seed=8), _randn(38, 2, 32, seed=9)
    torch.testing.assert_close(_varlen(provider, q, k, v, lq, lk, causal=True), _varlen(provider, q, k, v, lq, lk),
                               rtol=1e-5, atol=1e-6)
    kc, vc = _randn(2, 9, 2, 32, seed=10), _randn(2, 9, 2, 32, seed=11)
    lens = torch.tensor([4, 9], dtype=torch.int32)
    with ip.use(provider):
        a = flash_attn_with_kvcache(q[:2, None], kc, vc, cache_seqlens=lens, causal=True)
        b = flash_attn_with_kvcache(q[:2, None], kc, vc, cache_seqlens=lens, causal=False)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_window_at_least_seqlen_k_is_unbounded(provider: str) -> None:
    lq, lk = [4, 9], [11, 9]
    q, k, v = _randn(13, 2, 16, seed=12), _randn(20, 2, 16, seed=13), _randn(20, 2, 16, seed=14)
    full = _varlen(provider, q, k, v, lq, lk)
    for window in ((11, 11), (50, -1), (-1, 11)):
        torch.testing.assert_close(_varlen(provider, q, k, v, lq, lk, window_size=window), full, rtol=0, atol=0)
    assert not torch.allclose(_varlen(provider, q, k, v, lq, lk, window_size=(2, 1)), full)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_gqa_query_head_reads_kv_head_h_over_group(provider: str) -> None:
    lq, lk = [5, 3], [6, 8]
    q, k, v = _randn(8, 6, 16, seed=15), _randn(14, 2, 16, seed=16), _randn(14, 2, 16, seed=17)
    gqa = _varlen(provider, q, k, v, lq, lk, causal=True)
    mha = _varlen(provider, q, k.repeat_interleave(3, dim=1), v.repeat_interleave(3, dim=1), lq, lk, causal=True)
    torch.testing.assert_close(gqa, mha, rtol=1e-5, atol=1e-6)
    tiled = _varlen(provider, q, k.repeat(1, 3, 1), v.repeat(1, 3, 1), lq, lk, causal=True)
    assert not torch.allclose(gqa, tiled)


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_paged_equals_contiguous(provider: str, block_size: int) -> None:
    lq, lk = [3, 1, 20, 2], [40, 17, 20, 0]
    q, k, v = _randn(26, 4, 32, seed=18), _randn(77, 2, 32, seed=19), \
        _randn(77, 2, 32, seed=20)
    kc, table = _paged(k, lk, block_size, seed=21)
    vc, _ = _paged(v, lk, block_size, seed=21)
    for kwargs in ({"causal": True}, {"window_size": (5, 3), "softcap": 50.0}):
        contiguous = _varlen(provider, q, k, v, lq, lk, **kwargs)
        paged = _varlen(provider, q, kc, vc, lq, lk, block_table=table, **kwargs)
        assert paged.isfinite().all()
        torch.testing.assert_close(paged, contiguous, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_kvcache_appends_exactly_the_new_rows_then_matches_varlen(provider: str, paged: bool) -> None:
    cached, new, hkv, d = [5, 0, 30], 2, 2, 32
    lengths = [n + new for n in cached]
    keys, values = _randn(sum(lengths), hkv, d, seed=30), _randn(sum(lengths), hkv, d, seed=31)
    starts = _cu(lengths).tolist()
    fresh = [torch.stack([t[starts[b] + n:starts[b + 1]] for b, n in enumerate(cached)]) for t in (keys, values)]
    rows: list[tuple[int, int]] = []  # where each new row lands, in (b, t) order
    if paged:
        (k_cache, table), (v_cache, _) = _paged(keys, lengths, 16, seed=32), _paged(values, lengths, 16, seed=32)
        rows = [(int(table[b, (n + t) // 16]), (n + t) % 16) for b, n in enumerate(cached) for t in range(new)]
    else:
        table = None
        k_cache, v_cache = torch.full((3, 40, hkv, d), math.nan), torch.full((3, 40, hkv, d), math.nan)
        for b, n in enumerate(lengths):
            k_cache[b, :n], v_cache[b, :n] = keys[starts[b]:starts[b + 1]], values[starts[b]:starts[b + 1]]
        rows = [(b, n + t) for b, n in enumerate(cached) for t in range(new)]
    for cache in (k_cache, v_cache):
        for row in rows:
            cache[row] = math.nan  # the new rows are not in the cache yet
    before = k_cache.clone(), v_cache.clone()
    q = _randn(3, new, 4, d, seed=33)
    with ip.use(provider):
        out = flash_attn_with_kvcache(q, k_cache, v_cache, fresh[0], fresh[1],
                                      cache_seqlens=torch.tensor(cached, dtype=torch.int32), block_table=table,
                                      causal=True)
    for cache, old, new_rows in zip((k_cache, v_cache), before, fresh):
        changed = ~((cache == old) | (cache.isnan() & old.isnan())).flatten(2).all(-1)
        assert sorted(map(tuple, changed.nonzero().tolist())) == sorted(rows)
        assert torch.equal(torch.stack([cache[row] for row in rows]), new_rows.flatten(0, 1))
    ref = _varlen(provider, q.flatten(0, 1), keys, values, [new] * 3, lengths, causal=True)
    torch.testing.assert_close(out.flatten(0, 1), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unchecked_out_of_range_block_is_skipped_not_read(provider: str) -> None:
    lk = [20, 9]
    k, v = _randn(29, 1, 16, seed=70), _randn(29, 1, 16, seed=71)
    kc, table = _paged(k, lk, 16, seed=72)
    vc, _ = _paged(v, lk, 16, seed=72)
    table[0, 1] = 1000  # the second block of sequence 0: keys 16..19 are skipped
    q = _randn(2, 1, 16, seed=73)
    with pytest.raises(ContractError, match="block_table"), ip.use(provider):
        flash_attn_varlen(q, kc, vc, _cu([1, 1]), _cu(lk), 1, 20, block_table=table)
    with ip.unchecked_indices(), ip.use(provider):
        out = flash_attn_varlen(q, kc, vc, _cu([1, 1]), _cu(lk), 1, 20, block_table=table)
    ref = _varlen("reference", q, torch.cat([k[:16], k[20:]]), torch.cat([v[:16], v[20:]]), [1, 1], [16, 9])
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    kc_before = kc.clone()
    with ip.unchecked_indices(), ip.use(provider):
        flash_attn_with_kvcache(q[:, None], kc, vc, cache_seqlens=torch.tensor([16, 30], dtype=torch.int32),
                                block_table=table, k=q[:, None], v=q[:, None])
    same = (kc == kc_before) | (kc.isnan() & kc_before.isnan())
    assert int((~same).flatten(1).any(-1).sum()) == 0  # block 1000 and position 30 (past 2 blocks) skipped


@pytest.mark.parametrize("provider", PROVIDERS)
def test_empty_inputs(provider: str) -> None:
    q, k = torch.randn(0, 2, 8), torch.randn(0, 2, 8)
    assert _varlen(provider, q, k, k, [], []).shape == (0, 2, 8)
    assert _varlen(provider, q, k, k, [0, 0], [0, 0], causal=True).shape == (0, 2, 8)
    out = _varlen(provider, torch.randn(3, 2, 8), k, k, [3], [0])
    assert torch.equal(out, torch.zeros(3, 2, 8))
    with ip.use(provider):
        out = flash_attn_with_kvcache(torch.randn(0, 1, 2, 8), torch.randn(0, 4, 2, 8), torch.randn(0, 4, 2, 8),
                                      cache_seqlens=torch.zeros(0, dtype=torch.int32))
    assert out.shape == (0, 1, 2, 8)


def test_problem_key_normalizes_window_causal_and_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[tuple[object, ...], tuple[object, ...]]] = []

    def spy(self: OpSpec, key: tuple[object, ...], *args: object) -> object:
        seen.append((key, args))
        return args[-1]

    monkeypatch.setattr(OpSpec, "call", spy)
    q, k = torch.randn(5, 4, 64), torch.randn(7, 2, 64)
    flash_attn_varlen(q, k, k, _cu([5]), _cu([7]), 5, 7, causal=True, window_size=(7, 3), softcap=30)
    flash_attn_varlen(q, k, k, _cu([5]), _cu([7]), 5, 7, window_size=(2, 9))
    (key1, args1), (key2, args2) = seen
    assert key1 == ("cpu", torch.float32, 64, 2, True, False, True, False, 0, False, False, False, False)
    assert args1[7] == pytest.approx(64**-0.5) and args1[9] == (-1, -1) and args1[10] == 30.0
    assert key2[5] is True and args2[9] == (2, 7)  # right 9 >= Sk: -1, then Sk as the left side is bounded


# --- contract errors -------------------------------------------------------------------------------------------

def _varlen_args() -> dict[str, object]:
    table = torch.tensor([[1, 0], [2, -1]], dtype=torch.int32)
    return {"q": torch.randn(5, 4, 16), "k": torch.randn(3, 8, 2, 16), "v": torch.randn(3, 8, 2, 16),
            "cu_seqlens_q": _cu([2, 3]), "cu_seqlens_k": _cu([9, 4]), "max_seqlen_q": 3, "max_seqlen_k": 9,
            "block_table": table}


def _kvcache_args() -> dict[str, object]:
    return {"q": torch.randn(2, 1, 4, 16), "k_cache": torch.randn(2, 10, 2, 16), "v_cache": torch.randn(2, 10, 2, 16),
            "cache_seqlens": torch.tensor([3, 9], dtype=torch.int32), "k": torch.randn(2, 1, 2, 16),
            "v": torch.randn(2, 1, 2, 16)}


def _paged_kvcache_args() -> dict[str, object]:
    args = _kvcache_args()
    args.update(k_cache=torch.randn(4, 8, 2, 16), v_cache=torch.randn(4, 8, 2, 16),
                block_table=torch.tensor([[0, 3], [1, 2]], dtype=torch.int32))
    return args


def _strided(t: torch.Tensor) -> torch.Tensor:
    return torch.randn(*t.shape, 2, dtype=t.dtype)[..., 0]


_CASES = {
    "flash_attn_varlen": (_varlen_args, [
        ("shape", "v", lambda a: a.update(v=torch.randn(3, 8, 1, 16))),
        ("shape", "k", lambda a: a.update(k=torch.randn(3, 8, 3, 16), v=torch.randn(3, 8, 3, 16))),
        ("shape", "cu_seqlens_k", lambda a: a.update(cu_seqlens_k=_cu([9]))),
        ("dtype", "k", lambda a: a.update(k=a["k"].half())),
        ("dtype", "cu_seqlens_q", lambda a: a.update(cu_seqlens_q=a["cu_seqlens_q"].long())),
        ("dtype", "block_table", lambda a: a.update(block_table=a["block_table"].long())),
        ("device", "v", lambda a: a.update(v=a["v"].to("meta"))),
        ("device", "cu_seqlens_k", lambda a: a.update(cu_seqlens_k=a["cu_seqlens_k"].to("meta"))),
        ("stride", "q", lambda a: a.update(q=_strided(a["q"]))),
        ("stride", "k", lambda a: a.update(k=_strided(a["k"]))),
        ("index", "block_table", lambda a: a["block_table"].__setitem__((0, 1), 3)),
        ("index", "cu_seqlens_q", lambda a: a.update(cu_seqlens_q=_cu([2, 4]))),
        ("index", "cu_seqlens_k", lambda a: a.update(cu_seqlens_k=torch.tensor([0, 9, 8], dtype=torch.int32))),
        ("index", "max_seqlen_k", lambda a: a.update(max_seqlen_k=8)),
        ("value", "window_size", lambda a: a.update(window_size=(-2, 0))),
        ("value", "softcap", lambda a: a.update(softcap=-1.0)),
    ]),
    "flash_attn_with_kvcache": (_paged_kvcache_args, [
        ("shape", "k", lambda a: a.update(k=torch.randn(2, 1, 1, 16), v=torch.randn(2, 1, 1, 16))),
        ("shape", "k_cache", lambda a: a.update(k_cache=torch.randn(4, 8, 2, 8), v_cache=torch.randn(4, 8, 2, 8))),
        ("shape", "cache_seqlens", lambda a: a.update(cache_seqlens=torch.tensor([3], dtype=torch.int32))),
        ("shape", "v", lambda a: a.pop("v")),
        ("dtype", "v_cache", lambda a: a.update(v_cache=a["v_cache"].double())),
        ("dtype", "cache_seqlens", lambda a: a.update(cache_seqlens=a["cache_seqlens"].long())),
        ("device", "k_cache", lambda a: a.update(k_cache=a["k_cache"].to("meta"))),
        ("device", "block_table", lambda a: a.update(block_table=a["block_table"].to("meta"))),
        ("stride", "v_cache", lambda a: a.update(v_cache=_strided(a["v_cache"]))),
        ("stride", "q", lambda a: a.update(q=_strided(a["q"]))),
        ("index", "block_table", lambda a: a["block_table"].__setitem__((1, 1), -1)),
        ("index", "cache_seqlens", lambda a: a.update(cache_seqlens=torch.tensor([3, 16], dtype=torch.int32))),
        ("index", "cache_seqlens", lambda a: a.update(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32))),
        ("value", "window_size", lambda a: a.update(window_size=(1,))),
    ]),
}


def _call(op: str, args: dict[str, object]) -> torch.Tensor:
    if op == "flash_attn_varlen":
        positional = [args.pop(n) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                                            "max_seqlen_k")]
        return flash_attn_varlen(*positional, **args)  # type: ignore[arg-type]
    return flash_attn_with_kvcache(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(("op", "kind", "argument", "mutate"),
                         [(op, *c) for op, (_, cases) in _CASES.items() for c in cases],
                         ids=lambda x: x if isinstance(x, str) else None)
def test_contract_error_names_the_argument(op: str, kind: str, argument: str, mutate: object) -> None:
    make, _ = _CASES[op]
    args = make()
    _call(op, dict(args))  # the unmodified call is valid
    args = make()
    mutate(args)  # type: ignore[operator]
    with pytest.raises(ContractError) as info:
        _call(op, args)
    assert info.value.argument == argument, str(info.value)
    assert f"{op}: {argument}:" in str(info.value)


def test_contract_non_paged_varlen_and_kvcache_shapes() -> None:
    q = torch.randn(4, 2, 8)
    with pytest.raises(ContractError, match="k: expected shape") as info:
        flash_attn_varlen(q, torch.randn(4, 1, 2, 8), torch.randn(4, 1, 2, 8), _cu([4]), _cu([4]), 4, 4)
    assert info.value.argument == "k"
    with pytest.raises(ContractError) as info:
        flash_attn_varlen(q, torch.randn(5, 2, 8), torch.randn(5, 2, 8), _cu([4]), _cu([4]), 4, 4)
    assert info.value.argument == "cu_seqlens_k"
    with pytest.raises(ContractError) as info:
        flash_attn_with_kvcache(q[None], torch.randn(2, 8, 2, 8), torch.randn(2, 8, 2, 8),
                                cache_seqlens=torch.tensor([1], dtype=torch.int32))
    assert info.value.argument == "k_cache"


# --- repeated append slots, meta inputs, inputs that require grad, index-check scopes -------------------------

_ENTRY_POINTS = {"flash_attn_varlen": _varlen_args, "flash_attn_with_kvcache": _kvcache_args,
                 "flash_attn_with_kvcache-paged": _paged_kvcache_args}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_two_appends_to_one_paged_slot_are_rejected_when_checked_and_shared_blocks_are_read(provider: str) -> None:
    """Sequences may share the blocks they read (a common prefix), but two new k/v rows landing in one
    cache slot would race (the reference appends in order, the torch provider in one scatter), so checked
    mode rejects them before anything is written."""
    args = _paged_kvcache_args()  # block_size 8; sequence 0 appends at 3 (block 0), sequence 1 at 9 (block 2)
    args["block_table"] = torch.tensor([[0, 3], [0, 2]], dtype=torch.int32)  # both read block 0
    with ip.use(provider), ip.checked_indices():
        out = _call("flash_attn_with_kvcache", dict(args))
    assert out.shape == (2, 1, 4, 16) and bool(out.isfinite().all())
    args = _paged_kvcache_args()
    args["block_table"] = torch.tensor([[0, 3], [1, 0]], dtype=torch.int32)  # sequence 1 appends at 11: block 0
    args["cache_seqlens"] = torch.tensor([3, 11], dtype=torch.int32)
    caches = [args["k_cache"].clone(), args["v_cache"].clone()]
    with ip.use(provider), ip.checked_indices(), pytest.raises(ContractError) as err:
        _call("flash_attn_with_kvcache", dict(args))
    assert err.value.argument == "block_table" and "cache slot (block * block_size + offset) 3 appears 2" in str(
        err.value)
    assert torch.equal(args["k_cache"], caches[0]) and torch.equal(args["v_cache"], caches[1])


@pytest.mark.parametrize("entry", list(_ENTRY_POINTS))
def test_meta_inputs_give_the_output_shape_without_reading_values(entry: str) -> None:
    """Each entry point on meta tensors, with the index checks forced on (cu_seqlens, cache_seqlens and
    block tables would be read): the output has the CPU call's shape and dtype."""
    op = entry.removesuffix("-paged")
    expected = _call(op, _ENTRY_POINTS[entry]())
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in _ENTRY_POINTS[entry]().items()}
    with ip.checked_indices():
        got = _call(op, meta)
    assert got.is_meta and got.shape == expected.shape and got.dtype == expected.dtype


@pytest.mark.parametrize("entry", list(_ENTRY_POINTS))
def test_inputs_that_require_grad_are_rejected_before_any_kernel(entry: str) -> None:
    """No backward exists (the torch provider gave NaN gradients with softcap and rows that see no key):
    a tensor argument that requires grad (grad mode on) is a ContractError naming it, before the caches
    are written, also through the custom operator of FakeTensor and traced calls; under
    ``torch.no_grad()`` the same call runs."""
    op, make = entry.removesuffix("-paged"), _ENTRY_POINTS[entry]
    names = [k for k, v in make().items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    assert len(names) >= 3
    for name in names:
        args = make()
        args[name] = args[name].requires_grad_()  # type: ignore[union-attr]
        before = {k: v.detach().clone() for k, v in args.items() if isinstance(v, torch.Tensor)}
        with pytest.raises(ContractError) as err:
            _call(op, dict(args))
        assert err.value.argument == name and "requires_grad" in str(err.value)
        assert all(torch.equal(args[k].detach(), v) for k, v in before.items())  # type: ignore[union-attr]
        with torch.no_grad():
            _call(op, dict(args))
        with FakeTensorMode() as mode, pytest.raises(ContractError, match=f": {name}: requires_grad"):
            _call(op, {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()})


def test_index_checks_default_per_device_and_a_scope_belongs_to_its_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked by default on CPU, not on CUDA (a check reads the values: a host sync on every call), never
    on meta; ``INFINIOPS_CHECK_INDICES`` forces either way; a `checked_indices()` / `unchecked_indices()`
    scope overrides both for the thread that entered it, and no other."""
    cpu, cuda, meta = torch.device("cpu"), torch.device("cuda"), torch.device("meta")
    monkeypatch.delenv("INFINIOPS_CHECK_INDICES", raising=False)
    assert (is_checked(cpu), is_checked(cuda), is_checked(meta)) == (True, False, False)
    monkeypatch.setenv("INFINIOPS_CHECK_INDICES", "1")
    assert (is_checked(cpu), is_checked(cuda), is_checked(meta)) == (True, True, False)
    monkeypatch.setenv("INFINIOPS_CHECK_INDICES", "0")
    with ip.checked_indices():
        assert (is_checked(cpu), is_checked(cuda), is_checked(meta)) == (True, True, False)
    assert (is_checked(cpu), is_checked(cuda)) == (False, False)
    monkeypatch.delenv("INFINIOPS_CHECK_INDICES")

    bad = _varlen_args()
    bad["block_table"][0, 1] = 3  # type: ignore[index]  # block 3 of 3: out of range
    entered, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def unchecked_thread() -> None:
        with ip.unchecked_indices():
            entered.set()
            release.wait(10)
            seen["unchecked"] = (is_checked(cpu), is_checked(cuda))
            seen["out"] = _call("flash_attn_varlen", dict(bad)).shape  # skipped, not raised

    def plain_thread() -> None:
        seen["plain"] = (is_checked(cpu), is_checked(cuda))  # no scope of its own: the defaults

    with ip.checked_indices():
        worker = threading.Thread(target=unchecked_thread)
        worker.start()
        assert entered.wait(10)
        seen["checked"] = (is_checked(cpu), is_checked(cuda))
        with pytest.raises(ContractError, match="block_table"):
            _call("flash_attn_varlen", dict(bad))
        plain = threading.Thread(target=plain_thread)
        plain.start()
        plain.join(10)
        release.set()
        worker.join(10)
    assert seen == {"checked": (True, True), "unchecked": (False, False), "plain": (True, False),
                    "out": torch.Size([5, 4, 16])}
