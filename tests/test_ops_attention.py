"""FlashAttention: conformance of the torch and reference providers, the semantics the peers settle, and
the contract's argument checks (one ContractError per kind and entry point)."""

from __future__ import annotations

import inspect
import itertools
import math
import threading

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import infiniops_py as ip
from infiniops_py import ContractError, flash_attn_varlen, flash_attn_with_kvcache
from infiniops_py.dispatch import observing
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


def test_problem_key_normalizes_window_causal_and_scale() -> None:
    seen: list[tuple[tuple[object, ...], tuple[object, ...]]] = []
    q, k = torch.randn(5, 4, 64), torch.randn(7, 2, 64)
    with observing(lambda call: seen.append((call.key, call.args))):
        flash_attn_varlen(q, k, k, _cu([5]), _cu([7]), 5, 7, causal=True, window_size=(7, 3), softcap=30)
        flash_attn_varlen(q, k, k, _cu([5]), _cu([7]), 5, 7, window_size=(2, 9))
    (key1, args1), (key2, args2) = seen
    assert key1 == ("cpu", torch.float32, 64, 2, True, False, True, False, 0, False, False, False, False, 8, 8)
    assert args1[7] == pytest.approx(64**-0.5) and args1[9] == (-1, -1) and args1[10] == 30.0
    assert key2[5] is True and args2[9] == (2, 7)  # right 9 >= Sk: -1, then Sk as the left side is bounded


# --- the peers' arguments and semantics: flash-attention 2/3, vllm_flash_attn, vLLM's cache write -----------

def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
               bias: torch.Tensor | None = None, scale: float | None = None, softcap: float = 0.0
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 attention of one sequence written out: q ``[Sq, Hq, D]``, k/v ``[Sk, Hkv, D]`` (GQA: head h
    reads kv head h // (Hq // Hkv)), visible ``[Sq, Sk]``, bias ``[Hq, Sq, Sk]`` added after the softcap;
    returns the output ``[Sq, Hq, D]`` (0 on rows that see no key) and the log-sum-exp ``[Hq, Sq]`` (+inf there)."""
    q, k, v = q.double(), k.double(), v.double()
    hq, d = q.shape[1], q.shape[2]
    scale = d**-0.5 if scale is None else scale
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((hq, q.shape[0]), math.inf, dtype=torch.float64)
    for h in range(hq):
        g = h // (hq // k.shape[1])
        for i in range(q.shape[0]):
            keys = visible[i].nonzero().flatten()
            if not len(keys):
                continue
            s = k[keys, g] @ q[i, h] * scale
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            if bias is not None:
                s = s + bias[h, i, keys].double()
            lse[h, i] = torch.logsumexp(s, 0)
            out[i, h] = torch.softmax(s, 0) @ v[keys, g]
    return out, lse


def _window_visible(sq: int, sk: int, left: int, right: int, causal: bool = False) -> torch.Tensor:
    """``[Sq, Sk]``: key j in ``[i + Sk - Sq - left, i + Sk - Sq + right]`` (a side of -1 unbounded)."""
    diag = torch.arange(sq)[:, None] + sk - sq
    j = torch.arange(sk)[None, :]
    ok = torch.ones(sq, sk, dtype=torch.bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    if causal:
        ok &= j <= diag
    return ok


def _alibi_bias(slopes: torch.Tensor, sq: int, sk: int) -> torch.Tensor:
    """flash-attention's ALiBi: ``-slope * |i + Sk - Sq - j|``, ``[Hq, Sq, Sk]``."""
    dist = (torch.arange(sq)[:, None] + sk - sq - torch.arange(sk)[None, :]).abs().double()
    return -slopes.double()[:, None, None] * dist


_EDGE_WINDOWS = {  # window_size -> flash-attention's normalization with max_seqlen_k = 4 (Sq=6 queries over Sk=4 keys)
    (0, 6): (0, 4),  # right >= Sk is -1, then Sk: query 0 of 6 sees keys 0 to 2, not all four
    (2, -1): (2, 4),
    (9, 1): (4, 1),  # left >= Sk is -1, then Sk (which clips nothing)
}


@pytest.mark.parametrize("entry", ["varlen", "varlen-paged", "kvcache", "kvcache-paged"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_window_side_left_unbounded_becomes_max_seqlen_k_when_the_other_is_bounded(provider: str,
                                                                                    entry: str) -> None:
    """Sq=6 queries over Sk=4 keys, non-causal: flash-attention first turns a side >= max_seqlen_k into -1,
    then a -1 side into max_seqlen_k when the other side is bounded, so the first rows stay clipped."""
    sq, sk, hq, hkv, d = 6, 4, 2, 1, 16
    q, k, v = _randn(sq, hq, d, seed=80), _randn(sk, hkv, d, seed=81), _randn(sk, hkv, d, seed=82)
    for window, (left, right) in _EDGE_WINDOWS.items():
        want, _ = _attention(q, k, v, _window_visible(sq, sk, left, right))
        with ip.use(provider):
            if entry == "varlen":
                got = flash_attn_varlen(q, k, v, _cu([sq]), _cu([sk]), sq, sk, window_size=window)
            elif entry == "varlen-paged":
                kc, table = _paged(k, [sk], 2, seed=83, extra=0)
                vc, _ = _paged(v, [sk], 2, seed=83, extra=0)
                got = flash_attn_varlen(q, kc, vc, _cu([sq]), _cu([sk]), sq, sk, window_size=window,
                                        block_table=table[:, :2])
            else:
                table = None
                kc, vc = k[None].clone(), v[None].clone()  # capacity 4: flash-attention's seqlen_k
                if entry == "kvcache-paged":
                    (kc, table), (vc, _) = _paged(k, [sk], 2, seed=84, extra=0), _paged(v, [sk], 2, seed=84, extra=0)
                    table = table[:, :2]
                got = flash_attn_with_kvcache(q[None], kc, vc, cache_seqlens=torch.tensor([sk], dtype=torch.int32),
                                              block_table=table, window_size=window)[0]
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6, msg=f"window {window}")
    assert not torch.equal(_window_visible(sq, sk, 0, 4)[0], torch.ones(sk, dtype=torch.bool))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_kvcache_is_not_causal_unless_asked(provider: str) -> None:
    """flash-attention's ``flash_attn_with_kvcache`` defaults to ``causal=False``."""
    q, kc, vc = _randn(2, 3, 4, 16, seed=90), _randn(2, 7, 2, 16, seed=91), _randn(2, 7, 2, 16, seed=92)
    lens = torch.tensor([5, 7], dtype=torch.int32)
    with ip.use(provider):
        default = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
        plain = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=False)
        causal = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    assert torch.equal(default, plain)
    assert not torch.allclose(default, causal)


# The peers' signatures, as they stand: (name, default) in order; `REQUIRED` has no default.
REQUIRED = object()
_PEERS = {
    "flash_attn_varlen": [  # flash_attn 2 flash_attn_varlen_func; then vllm_flash_attn / flash-attention 3
        ("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED), ("cu_seqlens_q", REQUIRED), ("cu_seqlens_k", REQUIRED),
        ("max_seqlen_q", REQUIRED), ("max_seqlen_k", REQUIRED), ("dropout_p", 0.0), ("softmax_scale", None),
        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
        ("deterministic", False), ("return_attn_probs", False), ("block_table", None),
        ("seqused_k", None), ("return_softmax_lse", False), ("k_descale", None), ("v_descale", None),
    ],
    "flash_attn_with_kvcache": [  # flash_attn 2 flash_attn_with_kvcache; then flash-attention 3's descales
        ("q", REQUIRED), ("k_cache", REQUIRED), ("v_cache", REQUIRED), ("k", None), ("v", None),
        ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None),
        ("cache_leftpad", None), ("block_table", None), ("softmax_scale", None), ("causal", False),
        ("window_size", (-1, -1)), ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
        ("num_splits", 0), ("return_softmax_lse", False), ("k_descale", None), ("v_descale", None),
    ],
    "reshape_and_cache_flash": [  # vLLM's _custom_ops.reshape_and_cache_flash
        ("key", REQUIRED), ("value", REQUIRED), ("key_cache", REQUIRED), ("value_cache", REQUIRED),
        ("slot_mapping", REQUIRED), ("kv_cache_dtype", REQUIRED), ("k_scale", REQUIRED), ("v_scale", REQUIRED),
    ],
}
# Peer arguments we do not take (training or scheduling only: no dropout, no backward, no split hint).
_NOT_TAKEN = {"flash_attn_varlen": {"dropout_p", "deterministic", "return_attn_probs"},
              "flash_attn_with_kvcache": {"num_splits"}, "reshape_and_cache_flash": set()}
# Where the peer has no default, ours (vLLM passes them always; "auto" needs no scale).
_OUR_DEFAULTS = {("reshape_and_cache_flash", "kv_cache_dtype"): "auto", ("reshape_and_cache_flash", "k_scale"): None,
                 ("reshape_and_cache_flash", "v_scale"): None}


@pytest.mark.parametrize("op", list(_PEERS))
def test_defaults_and_argument_order_are_the_peers(op: str) -> None:
    """Every argument we share with the peer has its default; ours may be positional only where the peer's
    is, in the peer's order (k and v right after the caches); the peer arguments we do not take are listed."""
    params = inspect.signature(getattr(ip, op)).parameters
    peer = dict(_PEERS[op])
    assert set(peer) - set(params) == _NOT_TAKEN[op]
    assert set(params) <= set(peer), set(params) - set(peer)
    for name, p in params.items():
        want = _OUR_DEFAULTS.get((op, name), peer[name])
        got = REQUIRED if p.default is inspect.Parameter.empty else p.default
        assert got == want, f"{op}: {name} defaults to {got!r}, the peer's to {want!r}"
    positional = [n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == [n for n, _ in _PEERS[op]][:len(positional)]
    if op == "flash_attn_with_kvcache":
        assert positional[3:5] == ["k", "v"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_softmax_lse_is_each_rows_log_sum_exp_in_the_peers_layout(provider: str) -> None:
    """varlen: ``[Hq, total_q]``; kvcache: ``[B, Hq, Sq]``; float32; +inf on a row that sees no key."""
    lq, lk, hq, d = [5, 2], [3, 6], 4, 16
    q, k, v = _randn(7, hq, d, seed=100), _randn(9, 2, d, seed=101), _randn(9, 2, d, seed=102)
    with ip.use(provider):
        out, lse = flash_attn_varlen(q, k, v, _cu(lq), _cu(lk), 5, 6, causal=True, softcap=3.0,
                                     return_softmax_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (hq, 7)
    for b, (q0, k0) in enumerate(((0, 0), (5, 3))):
        want, want_lse = _attention(q[q0:q0 + lq[b]], k[k0:k0 + lk[b]], v[k0:k0 + lk[b]],
                                    _window_visible(lq[b], lk[b], -1, -1, causal=True), softcap=3.0)
        torch.testing.assert_close(out[q0:q0 + lq[b]].double(), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse[:, q0:q0 + lq[b]].double(), want_lse, rtol=1e-5, atol=1e-5)
    assert bool((lse[:, :2] == math.inf).all())  # 5 causal queries over 3 keys: rows 0 and 1 see none
    kc, vc = _randn(2, 6, 2, d, seed=103), _randn(2, 6, 2, d, seed=104)
    lens = torch.tensor([4, 0], dtype=torch.int32)
    with ip.use(provider):
        out, lse = flash_attn_with_kvcache(q[:6].view(2, 3, hq, d), kc, vc, cache_seqlens=lens,
                                           return_softmax_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (2, hq, 3)
    _, want_lse = _attention(q[:3], kc[0, :4], vc[0, :4], torch.ones(3, 4, dtype=torch.bool))
    torch.testing.assert_close(lse[0].double(), want_lse, rtol=1e-5, atol=1e-5)
    assert bool((lse[1] == math.inf).all()) and bool((out[1] == 0).all())


@pytest.mark.parametrize("provider", PROVIDERS)
def test_alibi_adds_minus_slope_times_the_bottom_right_distance(provider: str) -> None:
    """``-slope * |i + Sk - Sq - j|`` after the scale and the softcap, slopes ``[Hq]`` or ``[B, Hq]``."""
    lq, lk, hq, d = [3, 6], [7, 4], 4, 16
    q, k, v = _randn(9, hq, d, seed=110), _randn(11, 2, d, seed=111), _randn(11, 2, d, seed=112)
    slopes = torch.rand(2, hq, generator=_gen(113)) * 0.3
    for causal, softcap, per_sequence in ((False, 0.0, True), (True, 5.0, False)):
        arg = slopes if per_sequence else slopes[0]
        with ip.use(provider):
            got = flash_attn_varlen(q, k, v, _cu(lq), _cu(lk), 6, 7, causal=causal, softcap=softcap,
                                    alibi_slopes=arg)
        for b, (q0, k0) in enumerate(((0, 0), (3, 7))):
            s = slopes[b] if per_sequence else slopes[0]
            want, _ = _attention(q[q0:q0 + lq[b]], k[k0:k0 + lk[b]], v[k0:k0 + lk[b]],
                                 _window_visible(lq[b], lk[b], -1, -1, causal), _alibi_bias(s, lq[b], lk[b]),
                                 softcap=softcap)
            torch.testing.assert_close(got[q0:q0 + lq[b]].double(), want, rtol=1e-5, atol=1e-6)
    kc, vc = _randn(2, 8, 2, d, seed=114), _randn(2, 8, 2, d, seed=115)
    with ip.use(provider):
        got = flash_attn_with_kvcache(q[:4].view(2, 2, hq, d), kc, vc, cache_seqlens=torch.tensor([5, 8],
                                      dtype=torch.int32), alibi_slopes=slopes)
    want, _ = _attention(q[2:4], kc[1], vc[1], torch.ones(2, 8, dtype=torch.bool), _alibi_bias(slopes[1], 2, 8))
    torch.testing.assert_close(got[1].double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_seqused_k_limits_each_sequence_to_its_first_keys(provider: str, paged: bool) -> None:
    lq, lk, used = [2, 3, 1], [6, 9, 4], [4, 9, 0]
    q, k, v = _randn(6, 2, 16, seed=120), _randn(19, 1, 16, seed=121), _randn(19, 1, 16, seed=122)
    kk, vv, table = k, v, None
    if paged:
        (kk, table), (vv, _) = _paged(k, lk, 4, seed=123), _paged(v, lk, 4, seed=123)
    with ip.use(provider):
        got = flash_attn_varlen(q, kk, vv, _cu(lq), _cu(lk), 3, 9, causal=True, block_table=table,
                                seqused_k=torch.tensor(used, dtype=torch.int32))
    starts_q, starts_k = _cu(lq).tolist(), _cu(lk).tolist()
    for b in range(3):
        qb, kb, vb = q[starts_q[b]:starts_q[b + 1]], k[starts_k[b]:starts_k[b] + used[b]], v[
            starts_k[b]:starts_k[b] + used[b]]
        want, _ = _attention(qb, kb, vb, _window_visible(lq[b], used[b], -1, -1, causal=True))
        torch.testing.assert_close(got[starts_q[b]:starts_q[b + 1]].double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cache_batch_idx_reads_and_appends_the_chosen_cache_rows(provider: str) -> None:
    q, kc, vc = _randn(2, 1, 2, 16, seed=130), _randn(4, 8, 1, 16, seed=131), _randn(4, 8, 1, 16, seed=132)
    kn, vn = _randn(2, 1, 1, 16, seed=133), _randn(2, 1, 1, 16, seed=134)
    idx, lens = torch.tensor([3, 1], dtype=torch.int32), torch.tensor([2, 5], dtype=torch.int32)
    before_k = kc.clone()
    with ip.use(provider):
        got = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, cache_batch_idx=idx)
    expect_k = before_k.clone()
    expect_k[3, 2], expect_k[1, 5] = kn[0, 0], kn[1, 0]
    assert torch.equal(kc, expect_k)  # rows 0 and 2 untouched, the new keys at rows 3 and 1
    for b, (row, n) in enumerate(((3, 3), (1, 6))):
        want, _ = _attention(q[b], kc[row, :n], vc[row, :n], torch.ones(1, n, dtype=torch.bool))
        torch.testing.assert_close(got[b].double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cache_leftpad_starts_each_sequence_at_its_pad(provider: str) -> None:
    """Sequence b attends to cache rows ``leftpad[b]`` to ``cache_seqlens[b] + Sq_new``, aligned bottom-right
    over those keys; the padding rows (NaN) are never read."""
    q, kc, vc = _randn(2, 2, 2, 16, seed=140), _randn(2, 9, 1, 16, seed=141), _randn(2, 9, 1, 16, seed=142)
    pads, lens = [3, 0], [6, 4]
    for b, p in enumerate(pads):
        kc[b, :p], vc[b, :p] = math.nan, math.nan
    with ip.use(provider):
        got = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor(lens, dtype=torch.int32),
                                      cache_leftpad=torch.tensor(pads, dtype=torch.int32), causal=True)
    for b in range(2):
        sk = lens[b] - pads[b]
        want, _ = _attention(q[b], kc[b, pads[b]:lens[b]], vc[b, pads[b]:lens[b]],
                             _window_visible(2, sk, -1, -1, causal=True))
        torch.testing.assert_close(got[b].double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cache_seqlens_may_be_one_int_or_none_for_full_caches(provider: str) -> None:
    q, kc, vc = _randn(2, 1, 2, 16, seed=150), _randn(2, 6, 1, 16, seed=151), _randn(2, 6, 1, 16, seed=152)
    with ip.use(provider):
        as_int = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=4)
        as_tensor = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([4, 4], dtype=torch.int32))
        full = flash_attn_with_kvcache(q, kc, vc)
        everything = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=6)
        with pytest.raises(ContractError, match="cache_seqlens: is needed to append"):
            flash_attn_with_kvcache(q, kc, vc, q[:, :, :1], q[:, :, :1])
    assert torch.equal(as_int, as_tensor) and torch.equal(full, everything)
    assert not torch.allclose(as_int, full)


def _rotated(x: torch.Tensor, positions: list[int], angle: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x ``[S, H, D]`` rotated at `positions` by the first ``2 * angle.shape[1]`` dims, in float64."""
    x = x.double().clone()
    half = angle.shape[1]
    for s, p in enumerate(positions):
        for j in range(half):
            a, b = (2 * j, 2 * j + 1) if interleaved else (j, j + half)
            c, n = math.cos(float(angle[p, j])), math.sin(float(angle[p, j]))
            x1, x2 = x[s, :, a].clone(), x[s, :, b].clone()
            x[s, :, a], x[s, :, b] = x1 * c - x2 * n, x1 * n + x2 * c
    return x


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_rotary_rotates_the_new_keys_before_the_append_and_the_queries_at_their_positions(provider: str,
                                                                                         interleaved: bool) -> None:
    """rotary_dim 8 of head dim 16; the new k at ``cache_seqlens[b] + t`` (written rotated), q at
    ``cache_seqlens[b] + i`` when causal, else every query at ``cache_seqlens[b]``."""
    q, kc, vc = _randn(1, 2, 2, 16, seed=160), _randn(1, 8, 1, 16, seed=161), _randn(1, 8, 1, 16, seed=162)
    kn, vn = _randn(1, 2, 1, 16, seed=163), _randn(1, 2, 1, 16, seed=164)
    angle = torch.rand(8, 4, generator=_gen(165)) * 2 * math.pi
    cos, sin = angle.cos(), angle.sin()
    for causal in (True, False):
        k_cache, v_cache = kc.clone(), vc.clone()
        with ip.use(provider):
            got = flash_attn_with_kvcache(q, k_cache, v_cache, kn, vn, rotary_cos=cos, rotary_sin=sin,
                                          cache_seqlens=torch.tensor([3], dtype=torch.int32), causal=causal,
                                          rotary_interleaved=interleaved)
        new_keys = _rotated(kn[0], [3, 4], angle, interleaved)
        torch.testing.assert_close(k_cache[0, 3:5].double(), new_keys, rtol=1e-6, atol=1e-6)
        assert torch.equal(k_cache[0, :3], kc[0, :3]) and torch.equal(v_cache[0, 3:5], vn[0])
        qr = _rotated(q[0], [3, 4] if causal else [3, 3], angle, interleaved)
        want, _ = _attention(qr, k_cache[0, :5], v_cache[0, :5], _window_visible(2, 5, -1, -1, causal))
        torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-5)


def _fp8(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float8_e4m3fn)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_fp8_kv_cache_is_read_times_its_descales(provider: str) -> None:
    """float8_e4m3fn K/V with ``[B, Hkv]`` descales (flash-attention 3): keys and values read as ``x *
    descale``; q stays in its dtype; new fp8 k/v are appended as they are."""
    lq, lk, d = [2, 3], [5, 4], 16
    q = _randn(5, 4, d, seed=170)
    k8, v8 = _fp8(_randn(9, 2, d, seed=171)), _fp8(_randn(9, 2, d, seed=172))
    kd, vd = torch.rand(2, 2, generator=_gen(173)) + 0.5, torch.rand(2, 2, generator=_gen(174)) + 0.5
    with ip.use(provider):
        got = flash_attn_varlen(q, k8, v8, _cu(lq), _cu(lk), 3, 5, causal=True, k_descale=kd, v_descale=vd)
    for b, (q0, k0) in enumerate(((0, 0), (2, 5))):
        keys = k8[k0:k0 + lk[b]].double() * kd[b][None, :, None]
        values = v8[k0:k0 + lk[b]].double() * vd[b][None, :, None]
        want, _ = _attention(q[q0:q0 + lq[b]], keys, values, _window_visible(lq[b], lk[b], -1, -1, causal=True))
        torch.testing.assert_close(got[q0:q0 + lq[b]].double(), want, rtol=1e-5, atol=1e-5)
    kc, vc = _fp8(_randn(2, 6, 2, d, seed=175)), _fp8(_randn(2, 6, 2, d, seed=176))
    kn, vn = _fp8(_randn(2, 1, 2, d, seed=177)), _fp8(_randn(2, 1, 2, d, seed=178))
    with ip.use(provider):
        got = flash_attn_with_kvcache(q[:2].view(2, 1, 4, d), kc, vc, kn, vn, k_descale=kd,
                                      cache_seqlens=torch.tensor([3, 5], dtype=torch.int32))
    assert kc[1, 5].view(torch.uint8).equal(kn[1, 0].view(torch.uint8))  # the fp8 bits, as they came
    want, _ = _attention(q[1:2], kc[1].double() * kd[1][None, :, None], vc[1].double(), torch.ones(1, 6,
                         dtype=torch.bool))
    torch.testing.assert_close(got[1].double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_reshape_and_cache_flash_quantizes_into_an_fp8_cache(provider: str, dtype: torch.dtype) -> None:
    """vLLM's fp8 write: ``float8_e4m3fn(float32(x) / scale)``, rounded to nearest even, saturated at
    +-448, NaN kept; ``"auto"`` copies and leaves the scales unused."""
    key = (torch.randn(4, 2, 8, generator=_gen(180)) * 3).to(dtype)
    value = (torch.randn(4, 2, 8, generator=_gen(181)) * 3).to(dtype)
    key[0, 0, :3] = torch.tensor([5000.0, -5000.0, math.nan], dtype=dtype)  # saturate, and NaN stays NaN
    k_scale, v_scale = torch.tensor([0.05]), torch.tensor(0.02)
    kc = _fp8(torch.zeros(3, 2, 2, 8))
    vc = _fp8(torch.zeros(3, 2, 2, 8))
    slots = torch.tensor([5, 0, -1, 2])
    with ip.use(provider):
        ip.reshape_and_cache_flash(key, value, kc, vc, slots, "fp8", k_scale, v_scale)
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        for cache, x, scale in ((kc, key, 0.05), (vc, value, 0.02)):
            want = _fp8((x[i].float() / torch.tensor(scale, dtype=torch.float32)).clamp(-448, 448))
            assert cache[s // 2, s % 2].view(torch.uint8).equal(want.view(torch.uint8)), (i, s)
            deq = cache[s // 2, s % 2].double() * scale
            ok = x[i].isnan() | ((deq - x[i].double()).abs() <= 1e-3 + 0.1 * x[i].double().abs()) | (
                x[i].double().abs() > 448 * scale)
            assert bool(ok.all())  # vLLM's test: dequantized within atol 1e-3, rtol 0.1
    assert bool(kc[2, 1, 0, 2].isnan()) and float(kc[2, 1, 0, 0]) == 448.0 and float(kc[2, 1, 0, 1]) == -448.0
    assert not bool(kc[1, 1].view(torch.uint8).any()) and not bool(kc[2, 0].view(torch.uint8).any())  # unused
    cache, vcache = torch.zeros(3, 2, 2, 8, dtype=dtype), torch.zeros(3, 2, 2, 8, dtype=dtype)
    with ip.use(provider):
        ip.reshape_and_cache_flash(key, value, cache, vcache, slots, "auto", k_scale, v_scale)
    torch.testing.assert_close(cache[2, 1], key[0], rtol=0, atol=0, equal_nan=True)  # a plain copy


def test_reshape_and_cache_flash_checks_the_fp8_arguments() -> None:
    """An unknown kv_cache_dtype, a missing or malformed scale, a cache of the wrong dtype: each a
    ContractError naming the argument, before anything is written."""
    key, value = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    kc8, vc8 = _fp8(torch.zeros(2, 2, 1, 8)), _fp8(torch.zeros(2, 2, 1, 8))
    slots, scale = torch.tensor([0, 3]), torch.tensor([0.1])
    plain = torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8)
    cases = {
        "kv_cache_dtype": (kc8, vc8, "fp8_e5m2", scale, scale),
        "k_scale": (kc8, vc8, "fp8", None, scale),
        "v_scale": (kc8, vc8, "fp8", scale, torch.tensor([0.1, 0.2])),
        "key_cache": (*plain, "fp8", scale, scale),  # "fp8" needs float8_e4m3fn caches
        "value_cache": (kc8, plain[1], "fp8", scale, scale),
    }
    for argument, (kc, vc, *rest) in cases.items():
        with pytest.raises(ContractError) as info:
            ip.reshape_and_cache_flash(key, value, kc, vc, slots, *rest)
        assert info.value.argument == argument, str(info.value)
    with pytest.raises(ContractError) as info:
        ip.reshape_and_cache_flash(key, value, kc8, vc8, slots)  # "auto": the caches hold key's dtype
    assert info.value.argument == "key_cache"
    with pytest.raises(ContractError) as info:
        ip.reshape_and_cache_flash(key, value, kc8, vc8, slots, "fp8", scale.half(), scale)
    assert info.value.argument == "k_scale"
    assert not kc8.view(torch.uint8).any()
    ip.reshape_and_cache_flash(key, value, kc8, vc8, slots, "fp8", scale, scale)
    assert kc8.view(torch.uint8).any()


def test_the_cupy_cache_write_gates_an_fp8_cache() -> None:
    """CuPy's kernel copies in the key's dtype: an fp8 cache is a rejection that names the torch provider."""
    from infiniops_cupy.paged_cache import IMPLEMENTATIONS

    spec = ip.OPERATORS["reshape_and_cache_flash"]
    (impl,) = IMPLEMENTATIONS
    reasons = [r for r in impl.capability.reasons(spec.problem("cuda", "bfloat16", fp8_kv=True), environment=False)
               if r.field == "fp8_kv"]
    assert reasons and "torch provider" in reasons[0].fix
    assert not impl.capability.reasons(spec.problem("cuda", "bfloat16"), environment=False)


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
        ("dtype", "alibi_slopes", lambda a: a.update(alibi_slopes=torch.rand(4, dtype=torch.float16))),
        ("shape", "alibi_slopes", lambda a: a.update(alibi_slopes=torch.rand(3))),
        ("dtype", "seqused_k", lambda a: a.update(seqused_k=torch.tensor([2, 3]))),
        ("shape", "seqused_k", lambda a: a.update(seqused_k=torch.tensor([2], dtype=torch.int32))),
        ("index", "seqused_k", lambda a: a.update(seqused_k=torch.tensor([-1, 3], dtype=torch.int32))),
        ("index", "max_seqlen_k", lambda a: a.update(seqused_k=torch.tensor([10, 3], dtype=torch.int32))),
        ("value", "k_descale", lambda a: a.update(k_descale=torch.ones(2, 2))),  # k is not fp8
        ("shape", "v_descale", lambda a: a.update(k=a["k"].to(torch.float8_e4m3fn), v=a["v"].to(torch.float8_e4m3fn),
                                                  v_descale=torch.ones(2))),
        ("dtype", "v", lambda a: a.update(k=a["k"].to(torch.float8_e4m3fn))),
        ("value", "return_softmax_lse", lambda a: a.update(return_softmax_lse=1)),
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
        ("value", "cache_batch_idx", lambda a: a.update(cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32))),
        ("value", "cache_leftpad", lambda a: a.update(cache_leftpad=torch.tensor([0, 1], dtype=torch.int32))),
        ("value", "cache_seqlens", lambda a: a.update(cache_seqlens="3")),
        ("value", "cache_seqlens", lambda a: a.update(cache_seqlens=None)),  # None: full caches, no room to append
        ("dtype", "rotary_cos", lambda a: a.update(rotary_cos=torch.rand(16, 4).double(),
                                                   rotary_sin=torch.rand(16, 4))),
        ("shape", "rotary_cos", lambda a: a.update(rotary_cos=torch.rand(16, 9), rotary_sin=torch.rand(16, 9))),
        ("shape", "rotary_cos", lambda a: a.update(rotary_cos=torch.rand(15, 4), rotary_sin=torch.rand(15, 4))),
        ("shape", "rotary_sin", lambda a: a.update(rotary_cos=torch.rand(16, 4))),
        ("value", "rotary_interleaved", lambda a: a.update(rotary_interleaved=1)),
        ("value", "rotary_cos", lambda a: a.update(rotary_cos=torch.rand(16, 4), rotary_sin=torch.rand(16, 4),
                                                   k=None, v=None)),  # rotary rotates the new k: it needs k
        ("dtype", "k", lambda a: a.update(k=a["k"].double(), v=a["v"].double())),
        ("shape", "k_descale", lambda a: a.update(**{n: a[n].to(torch.float8_e4m3fn) for n in
                                                     ("k_cache", "v_cache", "k", "v")}, k_descale=torch.ones(2, 4))),
        ("dtype", "k", lambda a: a.update(k_cache=a["k_cache"].to(torch.float8_e4m3fn),
                                          v_cache=a["v_cache"].to(torch.float8_e4m3fn))),  # new k: the caches' dtype
        ("value", "return_softmax_lse", lambda a: a.update(return_softmax_lse="yes")),
    ]),
    "flash_attn_with_kvcache/contiguous": (lambda: _kvcache_args(), [
        ("index", "cache_batch_idx", lambda a: a.update(cache_batch_idx=torch.tensor([0, 2], dtype=torch.int32))),
        ("index", "cache_batch_idx", lambda a: a.update(cache_batch_idx=torch.tensor([1, 1], dtype=torch.int32))),
        ("dtype", "cache_batch_idx", lambda a: a.update(cache_batch_idx=torch.tensor([1, 0]))),
        ("index", "cache_leftpad", lambda a: a.update(cache_leftpad=torch.tensor([4, 0], dtype=torch.int32))),
        ("shape", "cache_leftpad", lambda a: a.update(cache_leftpad=torch.tensor([0], dtype=torch.int32))),
        ("index", "rotary_cos", lambda a: a.update(q=torch.randn(2, 3, 4, 16), causal=True,
                                                   rotary_cos=torch.rand(10, 8), rotary_sin=torch.rand(10, 8))),
        ("value", "k_cache", lambda a: a.update(k_cache=torch.randn(3, 10, 2, 16), v_cache=torch.randn(3, 10, 2, 16))),
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
    name = op.partition("/")[0]
    args = make()
    _call(name, dict(args))  # the unmodified call is valid
    args = make()
    mutate(args)  # type: ignore[operator]
    with pytest.raises(ContractError) as info:
        _call(name, args)
    assert info.value.argument == argument, str(info.value)
    assert f"{name}: {argument}:" in str(info.value)


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


def test_index_checks_on_cuda_skip_the_capture_query_by_default_and_never_check_while_capturing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA default (no scope, no ``INFINIOPS_CHECK_INDICES``) answers without asking whether the stream
    captures (issue #25: host cost per call); a check asked for by a scope or the switch is still off while
    capturing."""
    from infiniops_py.operators import _base

    cuda = torch.device("cuda")
    asked: list[bool] = []
    capturing = [False]

    def query() -> bool:
        asked.append(True)
        return capturing[0]

    monkeypatch.setattr(_base, "_capturing", query)
    monkeypatch.delenv("INFINIOPS_CHECK_INDICES", raising=False)
    assert not is_checked(cuda) and not asked
    with ip.checked_indices():
        assert is_checked(cuda) and len(asked) == 1
        capturing[0] = True
        assert not is_checked(cuda)
    monkeypatch.setenv("INFINIOPS_CHECK_INDICES", "1")
    assert not is_checked(cuda)
    capturing[0] = False
    assert is_checked(cuda)


def test_the_new_arguments_compile_into_one_custom_operator_node_each() -> None:
    """``return_softmax_lse`` (the ``with_lse`` overloads), ALiBi, seqused_k, an int cache_seqlens, rotary,
    cache_batch_idx and an fp8 cache write go through torch.compile(fullgraph=True) and match eager."""
    q, k, v = _randn(6, 4, 16, seed=190), _randn(6, 2, 16, seed=191), _randn(6, 2, 16, seed=192)
    slopes, used = torch.rand(4, generator=_gen(193)), torch.tensor([2, 3], dtype=torch.int32)
    angle = torch.rand(8, 4, generator=_gen(194))
    kc, vc = _randn(3, 8, 2, 16, seed=195), _randn(3, 8, 2, 16, seed=196)
    idx = torch.tensor([2, 0], dtype=torch.int32)

    def run(kc: torch.Tensor, vc: torch.Tensor, cache: torch.Tensor) -> list[torch.Tensor]:
        out, lse = flash_attn_varlen(q, k, v, _cu([3, 3]), _cu([3, 3]), 3, 3, causal=True, alibi_slopes=slopes,
                                     seqused_k=used, return_softmax_lse=True)
        out2, lse2 = flash_attn_with_kvcache(q.view(2, 3, 4, 16), kc, vc, k.view(2, 3, 2, 16), v.view(2, 3, 2, 16),
                                             rotary_cos=angle.cos(), rotary_sin=angle.sin(), cache_seqlens=4,
                                             cache_batch_idx=idx, causal=True, return_softmax_lse=True)
        ip.reshape_and_cache_flash(k, v, cache, cache.clone(), torch.arange(6), "fp8", torch.tensor(0.1),
                                   torch.tensor(0.1))
        return [out, lse, out2, lse2, kc, cache.float()]

    eager = run(kc.clone(), vc.clone(), _fp8(torch.zeros(2, 4, 2, 16)))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(run)(kc.clone(), vc.clone(), _fp8(torch.zeros(2, 4, 2, 16)))
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(run, fullgraph=True)(kc.clone(), vc.clone(), _fp8(torch.zeros(2, 4, 2, 16)))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unchecked_out_of_range_new_indices_are_padding_never_read_or_written(provider: str) -> None:
    """Unchecked: a cache_batch_idx out of range is a sequence that sees no key (output 0, lse +inf) and
    writes nothing; a seqused_k past a sequence's keys is clamped to them; a cache_leftpad past the keys
    leaves none."""
    q, kc, vc = _randn(2, 1, 2, 16, seed=200), _randn(2, 6, 1, 16, seed=201), _randn(2, 6, 1, 16, seed=202)
    kn, vn = _randn(2, 1, 1, 16, seed=203), _randn(2, 1, 1, 16, seed=204)
    before = kc.clone(), vc.clone()
    lens = torch.tensor([2, 3], dtype=torch.int32)
    with ip.use(provider), ip.unchecked_indices():
        out, lse = flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, return_softmax_lse=True,
                                           cache_batch_idx=torch.tensor([5, -1], dtype=torch.int32))
        assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
        assert bool((out == 0).all()) and bool((lse == math.inf).all())
        padded = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                         cache_leftpad=torch.tensor([9, 0], dtype=torch.int32))
        assert bool((padded[0] == 0).all()) and bool((padded[1] != 0).any())
        lq, lk = [1, 1], [3, 2]
        qv, k, v = _randn(2, 2, 16, seed=205), _randn(5, 1, 16, seed=206), _randn(5, 1, 16, seed=207)
        got = flash_attn_varlen(qv, k, v, _cu(lq), _cu(lk), 1, 9, seqused_k=torch.tensor([9, 1], dtype=torch.int32))
    want0, _ = _attention(qv[:1], k[:3], v[:3], torch.ones(1, 3, dtype=torch.bool))
    want1, _ = _attention(qv[1:], k[3:4], v[3:4], torch.ones(1, 1, dtype=torch.bool))
    torch.testing.assert_close(got.double(), torch.cat([want0, want1]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unchecked_max_seqlen_below_the_sequences_never_indexes_out_of_bounds(provider: str) -> None:
    """Unchecked, a max_seqlen_q of 0 (or below the longest sequence) with query rows breaks the contract:
    the numbers are unspecified, but no gather may leave its tensor (a device-side assert on CUDA)."""
    q, k, v = _randn(3, 2, 16, seed=210), _randn(4, 1, 16, seed=211), _randn(4, 1, 16, seed=212)
    for max_q in (0, 1):
        with ip.use(provider), ip.unchecked_indices():
            out, lse = flash_attn_varlen(q, k, v, _cu([1, 2]), _cu([2, 2]), max_q, 2, return_softmax_lse=True)
        assert out.shape == q.shape and lse.shape == (2, 3)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_append_of_no_new_tokens_is_valid_and_writes_nothing(provider: str, paged: bool) -> None:
    """k/v of 0 new tokens (an empty input: valid, does nothing) attend as a call without them and leave
    the caches as they were."""
    q, kc, vc = _randn(2, 1, 2, 16, seed=220), _randn(4, 8, 1, 16, seed=221), _randn(4, 8, 1, 16, seed=222)
    lens = torch.tensor([3, 8], dtype=torch.int32)
    table = {"block_table": torch.tensor([[2, 0], [1, 3]], dtype=torch.int32)} if paged else {}
    if not paged:
        kc, vc = kc[:2], vc[:2]
    before = kc.clone(), vc.clone()
    empty = _randn(2, 0, 1, 16, seed=223)
    with ip.use(provider):
        got = flash_attn_with_kvcache(q, kc, vc, empty, empty, cache_seqlens=lens, **table)
        want = flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, **table)
    assert torch.equal(got, want)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
