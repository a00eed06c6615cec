"""RoPE on CPU: the reference and torch providers against vLLM's ``forward_native`` written out in float64 (NeoX
and GPT-J pairs, partial rotary, packed-QKV views, no key), the index rule for out-of-range positions, the
contract errors (one per kind, naming the argument), empty and meta inputs, torch.compile, and the
conformance suite on the torch provider."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import infiniops_py as io
from infiniops_py import ContractError
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

PROVIDERS = ("reference", "torch")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
META = torch.device("meta")


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _cache(rows: int, rotary_dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


def _vllm_native(positions: torch.Tensor, x: torch.Tensor, head_size: int, cache: torch.Tensor,
                 is_neox: bool) -> torch.Tensor:
    """vLLM's ``RotaryEmbedding.forward_native`` with ``apply_rotary_emb_torch``, in float64, as a new tensor."""
    rotary_dim = cache.shape[1]
    cos, sin = cache.double().index_select(0, positions).chunk(2, dim=-1)
    x = x.double().reshape(positions.shape[0], -1, head_size)
    rot, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x1, x2 = torch.chunk(rot, 2, dim=-1) if is_neox else (rot[..., ::2], rot[..., 1::2])
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rot = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)
    return torch.cat((rot, passed), dim=-1)


def _check(got: torch.Tensor, expected: torch.Tensor) -> None:
    tol = tolerance("rotary_embedding", str(got.dtype).removeprefix("torch."))
    _, message = compare("rotary_embedding", got, expected.reshape(got.shape), tol)
    assert message is None, message


@pytest.mark.parametrize("rotary_dim", [32, 16], ids=["full", "partial"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("provider", PROVIDERS)
def test_packed_qkv_views_match_vllms_native_rope(provider: str, dtype: torch.dtype, is_neox: bool,
                                                   rotary_dim: int) -> None:
    """query and key as strided views of one packed projection (rows padded): both turn as vLLM's native path
    turns them; the channels past the rotary dim, V and the row padding come back bit for bit."""
    t, hq, hkv, d = 6, 3, 2, 32
    buf = _randn(t, (hq + 2 * hkv) * d + 5, dtype=dtype, seed=1)
    before = buf.clone()
    query, key = buf[:, : hq * d], buf[:, hq * d : (hq + hkv) * d]
    cache = _cache(50, rotary_dim, dtype)
    positions = torch.tensor([0, 49, 3, 3, 17, 1])
    want_q, want_k = (_vllm_native(positions, x, d, cache, is_neox) for x in (query, key))
    with io.use(provider):
        got = io.rotary_embedding(positions, query, key, d, cache, is_neox)
    assert got[0] is query and got[1] is key
    _check(query, want_q)
    _check(key, want_k)
    assert torch.equal(buf[:, (hq + hkv) * d :], before[:, (hq + hkv) * d :])  # V and the row padding
    heads = buf[:, : (hq + hkv) * d].view(t, hq + hkv, d)
    assert torch.equal(heads[..., rotary_dim:], before[:, : (hq + hkv) * d].view(t, hq + hkv, d)[..., rotary_dim:])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_pairs_are_halves_for_neox_and_neighbours_for_gptj(provider: str) -> None:
    """A quarter turn (cos 0, sin 1) maps each pair (x, y) to (-y, x): NeoX pairs channel i with i + R/2, GPT-J
    pairs 2i with 2i + 1."""
    cache = torch.tensor([[0.0, 0.0, 1.0, 1.0]])  # one position, rotary_dim 4: cos (0, 0), sin (1, 1)
    for is_neox, expected in ((True, [-3.0, -4.0, 1.0, 2.0, 5.0]), (False, [-2.0, 1.0, -4.0, 3.0, 5.0])):
        q = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
        with io.use(provider):
            io.rotary_embedding(torch.tensor([0]), q, None, 5, cache, is_neox)
        assert q.tolist() == [expected], is_neox


@pytest.mark.parametrize("provider", PROVIDERS)
def test_three_d_padded_heads_without_key(provider: str) -> None:
    """vLLM's sliced heads ``[T, H, D + 64][..., :D]`` with key None: only query turns."""
    t, h, d = 4, 5, 16
    buf = _randn(t, h, d + 64, seed=2)
    before = buf.clone()
    query = buf[..., :d]
    cache, positions = _cache(8, d), torch.tensor([7, 0, 2, 5])
    want = _vllm_native(positions, query, d, cache, True)
    with io.use(provider):
        got = io.rotary_embedding(positions, query, None, d, cache, True)
    assert got == (query, None)
    _check(query, want)
    assert torch.equal(buf[..., d:], before[..., d:])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_float32_cache_turns_low_precision_heads(provider: str) -> None:
    t, h, d = 5, 2, 64
    query = _randn(t, h * d, dtype=torch.bfloat16, seed=3)
    cache, positions = _cache(30, d), torch.tensor([29, 28, 0, 11, 12])
    want = _vllm_native(positions, query, d, cache, True)
    with io.use(provider):
        io.rotary_embedding(positions, query, None, d, cache, True)
    _check(query, want)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_out_of_range_positions_raise_when_checked_and_leave_the_token_when_unchecked(provider: str) -> None:
    t, h, d = 4, 2, 8
    cache = _cache(10, d)
    query, key = _randn(t, h * d, seed=4), _randn(t, h * d, seed=5)
    before = query.clone(), key.clone()
    for bad in (10, -1):
        positions = torch.tensor([1, bad, 9, 0])
        with io.use(provider), pytest.raises(ContractError) as info:  # CPU: checked by default
            io.rotary_embedding(positions, query, key, d, cache, True)
        assert info.value.argument == "positions" and f"index {bad} out of range" in str(info.value)
        assert torch.equal(query, before[0]) and torch.equal(key, before[1])  # nothing ran
    positions = torch.tensor([1, 10, 9, -3])
    with io.use(provider), io.unchecked_indices():
        io.rotary_embedding(positions, query, key, d, cache, True)
    for x, x0 in zip((query, key), before):
        assert torch.equal(x[[1, 3]], x0[[1, 3]])  # the tokens at positions 10 and -3: untouched
        _check(x[[0, 2]], _vllm_native(torch.tensor([1, 9]), x0[[0, 2]], d, cache, True))


def test_empty_batch_runs_nothing() -> None:
    q = torch.empty(0, 16)
    with io.use("reference"):
        assert io.rotary_embedding(torch.empty(0, dtype=torch.int64), q, None, 8, _cache(4, 8), True) == (q, None)


def _call(**over: Any) -> Callable[[], Any]:
    args: dict[str, Any] = {"positions": torch.tensor([0, 3, 1]), "query": torch.randn(3, 4 * 8),
                            "key": torch.randn(3, 2 * 8), "head_size": 8, "cos_sin_cache": _cache(4, 8),
                            "is_neox": True}
    args.update(over)
    return lambda: io.rotary_embedding(**args)


CONTRACT_ERRORS: list[tuple[str, str, Callable[[], Any]]] = [
    # (kind, argument named, call)
    ("type", "key", _call(key=[0.0])),
    ("value", "head_size", _call(head_size=0)),
    ("value", "head_size", _call(head_size=True)),
    ("value", "is_neox", _call(is_neox=1)),
    ("dtype", "query", _call(query=torch.ones(3, 32, dtype=torch.int64))),
    ("shape", "query", _call(query=torch.randn(3, 30))),
    ("shape", "query", _call(query=torch.randn(3, 4, 6))),
    ("strides", "query", _call(query=torch.randn(32, 3).T)),
    ("strides", "key", _call(key=torch.randn(3, 8, 2).transpose(1, 2))),  # [T, H, D] with channel stride 2
    ("dtype", "key", _call(key=torch.randn(3, 16, dtype=torch.float16))),
    ("device", "key", _call(key=torch.randn(3, 16, device=META))),
    ("shape", "key", _call(key=torch.randn(2, 16))),
    ("dtype", "positions", _call(positions=torch.tensor([0, 3, 1], dtype=torch.int32))),
    ("shape", "positions", _call(positions=torch.tensor([0, 3]))),
    ("device", "positions", _call(positions=torch.tensor([0, 3, 1], device=META))),
    ("shape", "cos_sin_cache", _call(cos_sin_cache=torch.randn(4, 8, 1))),
    ("shape", "cos_sin_cache", _call(cos_sin_cache=torch.randn(4, 10))),
    ("shape", "cos_sin_cache", _call(cos_sin_cache=torch.randn(4, 7))),
    ("shape", "cos_sin_cache", _call(cos_sin_cache=torch.randn(0, 8))),
    ("dtype", "cos_sin_cache", _call(cos_sin_cache=_cache(4, 8, torch.float64))),
    ("strides", "cos_sin_cache", _call(cos_sin_cache=torch.randn(8, 4).T)),
    ("overlap", "key", lambda: (lambda b: io.rotary_embedding(torch.tensor([0, 1]), b[:, :16], b[:, 8:24], 8,
                                                              _cache(4, 8), True))(torch.randn(2, 32))),
    # key's rows run past the end of a packed row into query's next row (columns 28..35 of rows 32 apart)
    ("overlap", "key", lambda: (lambda b: io.rotary_embedding(torch.tensor([0, 1]), b[:, :8],
                                                              b.view(-1)[28:].as_strided((2, 8), (32, 1)), 8,
                                                              _cache(4, 8), True))(torch.randn(3, 32))),
    ("overlap", "query", lambda: io.rotary_embedding(torch.tensor([0, 1]), torch.randn(1, 16).expand(2, 16), None,
                                                     8, _cache(4, 8), True)),
    ("index", "positions", _call(positions=torch.tensor([0, 4, 1]))),
]


@pytest.mark.parametrize(("kind", "argument", "call"), CONTRACT_ERRORS,
                         ids=[f"{k}-{a}-{i}" for i, (k, a, _) in enumerate(CONTRACT_ERRORS)])
def test_contract_error_names_the_argument(kind: str, argument: str, call: Callable[[], Any]) -> None:
    with pytest.raises(ContractError) as info:
        call()
    assert info.value.argument == argument, str(info.value)
    assert f"rotary_embedding: {argument}: " in str(info.value)


def test_cache_sharing_memory_with_the_heads_is_refused_before_any_kernel() -> None:
    qkv = _randn(2, 48, seed=6)
    before = qkv.clone()
    cache = qkv.view(-1)[88:].view(1, 8)  # the last 8 values: row 1's last K head
    with pytest.raises(ContractError, match="cos_sin_cache: overlaps key"):
        io.rotary_embedding(torch.tensor([0, 0]), qkv[:, :16], qkv[:, 32:], 8, cache, True)
    assert torch.equal(qkv, before)


def test_heads_requiring_grad_are_refused() -> None:
    with pytest.raises(ContractError, match="query: requires_grad=True"):
        io.rotary_embedding(torch.tensor([0]), torch.randn(1, 8, requires_grad=True), None, 8, _cache(2, 8), True)


def test_meta_and_fake_inputs_run_the_checks_without_values() -> None:
    q = torch.empty(3, 2, 8, device=META)
    with io.checked_indices():  # meta holds no values: the index check cannot run, and does not
        assert io.rotary_embedding(torch.empty(3, dtype=torch.int64, device=META), q, None, 8,
                                   _cache(4, 8).to(META), False) == (q, None)
    with FakeTensorMode():
        q = torch.empty(3, 16)
        io.rotary_embedding(torch.zeros(3, dtype=torch.int64), q, None, 8, torch.empty(4, 8), True)
        with pytest.raises(ContractError, match="cos_sin_cache: expected an even rotary_dim"):
            io.rotary_embedding(torch.zeros(3, dtype=torch.int64), q, None, 8, torch.empty(4, 12), True)


def test_compiled_call_is_one_custom_operator_and_matches_eager() -> None:
    def rope(positions: torch.Tensor, qkv: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        io.rotary_embedding(positions, qkv[:, :32], qkv[:, 32:48], 8, cache, True)
        return qkv * 1.0

    positions, qkv, cache = torch.tensor([2, 0, 1]), _randn(3, 64, seed=7), _cache(4, 8)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(rope)(positions, qkv.clone(), cache)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(rope, fullgraph=True, backend="inductor")(positions, qkv.clone(), cache)
    torch.testing.assert_close(compiled, rope(positions, qkv.clone(), cache), rtol=0, atol=0)


def test_torch_provider_conformance() -> None:
    from infiniops_py.testing.conformance import run_conformance

    report = run_conformance("torch", ops=["rotary_embedding"], max_examples=20)
    assert report.ok, report.render()
    assert {r.dtype for r in report.ops} == {"float16", "bfloat16", "float32"}
