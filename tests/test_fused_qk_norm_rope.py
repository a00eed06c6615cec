"""FusedQkNormRope on CPU: the reference and torch providers against FusedQkNorm then RoPE in float64 (NeoX and
GPT-J, partial rotary, strided rows, V untouched), the index rule for out-of-range positions, the contract
errors (one per kind, naming the argument), empty and meta inputs, torch.compile, and the conformance suite on
the torch provider."""

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
HQ, HKV, D = 4, 2, 32
HEADS = {"num_q_heads": HQ, "num_kv_heads": HKV, "head_dim": D}


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _cache(rows: int, rotary_dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    inv = 1.0 / (10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


def _weights(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    w = 1 + 0.1 * _randn(2, D, seed=9)
    return w[0].to(dtype), w[1].to(dtype)


def _separate64(qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor,
                is_neox: bool) -> torch.Tensor:
    """`fused_qk_norm` then `rotary_embedding` on float64 copies (the reference provider): the expected qkv."""
    qkv = qkv.double()
    with io.use("reference"):
        io.fused_qk_norm(qkv, qw.double(), kw.double(), **HEADS)
        io.rotary_embedding(positions, qkv[:, : HQ * D], qkv[:, HQ * D : (HQ + HKV) * D], D, cache.double(), is_neox)
    return qkv


@pytest.mark.parametrize("rotary_dim", [D, D // 4], ids=["full", "partial"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("provider", PROVIDERS)
def test_is_the_norm_then_the_rotation_and_leaves_v_untouched(provider: str, dtype: torch.dtype, is_neox: bool,
                                                              rotary_dim: int) -> None:
    t, width = 7, (HQ + 2 * HKV) * D
    buf = _randn(t, width + 6, dtype=dtype, seed=1)  # strided rows
    before = buf.clone()
    qkv = buf[:, :width]
    qw, kw = _weights(dtype)
    cache, positions = _cache(40, rotary_dim, dtype), torch.tensor([0, 39, 5, 5, 12, 1, 30])
    expected = _separate64(qkv, qw, kw, cache, positions, is_neox)
    with io.use(provider):
        got = io.fused_qk_norm_rope(qkv, qw, kw, cache, positions, **HEADS, is_neox=is_neox)
    assert got is qkv
    _, message = compare("fused_qk_norm_rope", qkv, expected,
                         tolerance("fused_qk_norm_rope", str(dtype).removeprefix("torch.")))
    assert message is None, message
    assert torch.equal(buf[:, (HQ + HKV) * D :], before[:, (HQ + HKV) * D :])  # V heads and the row padding


@pytest.mark.parametrize("provider", PROVIDERS)
def test_float32_cache_on_bfloat16_heads(provider: str) -> None:
    qkv = _randn(3, (HQ + 2 * HKV) * D, dtype=torch.bfloat16, seed=2)
    qw, kw = _weights(torch.bfloat16)
    cache, positions = _cache(8, D), torch.tensor([7, 0, 3])
    expected = _separate64(qkv, qw, kw, cache, positions, True)
    with io.use(provider):
        io.fused_qk_norm_rope(qkv, qw, kw, cache, positions, **HEADS)
    _, message = compare("fused_qk_norm_rope", qkv, expected, tolerance("fused_qk_norm_rope", "bfloat16"))
    assert message is None, message


@pytest.mark.parametrize("provider", PROVIDERS)
def test_out_of_range_positions_raise_when_checked_and_are_normalized_unturned_when_unchecked(provider: str) -> None:
    t = 4
    qkv = _randn(t, (HQ + 2 * HKV) * D, seed=3)
    before = qkv.clone()
    qw, kw = _weights(torch.float32)
    cache = _cache(10, D)
    with io.use(provider), pytest.raises(ContractError) as info:  # CPU: checked by default
        io.fused_qk_norm_rope(qkv, qw, kw, cache, torch.tensor([1, 10, 2, 3]), **HEADS)
    assert info.value.argument == "positions" and "index 10 out of range" in str(info.value)
    assert torch.equal(qkv, before)  # nothing ran
    with io.use(provider), io.unchecked_indices():
        io.fused_qk_norm_rope(qkv, qw, kw, cache, torch.tensor([1, 10, 2, -1]), **HEADS)
    normed = before.double()
    with io.use("reference"):
        io.fused_qk_norm(normed, qw.double(), kw.double(), **HEADS)
    torch.testing.assert_close(qkv[[1, 3]].double(), normed[[1, 3]], rtol=1e-5, atol=1e-5)  # normalized, not turned
    expected = _separate64(before[[0, 2]], qw, kw, cache, torch.tensor([1, 2]), True)
    torch.testing.assert_close(qkv[[0, 2]].double(), expected, rtol=1e-5, atol=1e-5)


def test_empty_batch_runs_nothing() -> None:
    qkv = torch.empty(0, (HQ + 2 * HKV) * D)
    qw, kw = _weights(torch.float32)
    with io.use("reference"):
        assert io.fused_qk_norm_rope(qkv, qw, kw, _cache(4, D), torch.empty(0, dtype=torch.int64), **HEADS) is qkv


def _call(**over: Any) -> Callable[[], Any]:
    args: dict[str, Any] = {"qkv": torch.randn(3, (HQ + 2 * HKV) * D), "q_weight": torch.randn(D),
                            "k_weight": torch.randn(D), "cos_sin_cache": _cache(4, D),
                            "positions": torch.tensor([0, 3, 1]), **HEADS}
    args.update(over)
    return lambda: io.fused_qk_norm_rope(args.pop("qkv"), args.pop("q_weight"), args.pop("k_weight"),
                                         args.pop("cos_sin_cache"), args.pop("positions"), **args)


CONTRACT_ERRORS: list[tuple[str, str, Callable[[], Any]]] = [
    # (kind, argument named, call)
    ("type", "cos_sin_cache", _call(cos_sin_cache=None)),
    ("shape", "qkv", _call(qkv=torch.randn(3, 7 * D))),
    ("strides", "qkv", _call(qkv=torch.randn((HQ + 2 * HKV) * D, 3).T)),
    ("dtype", "qkv", _call(qkv=torch.ones(3, (HQ + 2 * HKV) * D, dtype=torch.int32))),
    ("shape", "k_weight", _call(k_weight=torch.randn(D + 1))),
    ("dtype", "q_weight", _call(q_weight=torch.randn(D, dtype=torch.float16))),
    ("device", "k_weight", _call(k_weight=torch.randn(D, device=META))),
    ("value", "head_dim", _call(head_dim=0)),
    ("value", "num_kv_heads", _call(num_kv_heads=2.0)),
    ("value", "eps", _call(eps=0.0)),
    ("value", "is_neox", _call(is_neox="yes")),
    ("shape", "cos_sin_cache", _call(cos_sin_cache=torch.randn(4, D + 2))),
    ("dtype", "cos_sin_cache", _call(cos_sin_cache=_cache(4, D, torch.float16))),
    ("strides", "cos_sin_cache", _call(cos_sin_cache=torch.randn(D, 4).T)),
    ("dtype", "positions", _call(positions=torch.tensor([0.0, 1.0, 2.0]))),
    ("shape", "positions", _call(positions=torch.tensor([[0, 3, 1]]))),
    ("overlap", "qkv", _call(qkv=torch.randn(1, (HQ + 2 * HKV) * D).expand(3, -1))),
    ("index", "positions", _call(positions=torch.tensor([0, -1, 1]))),
]


@pytest.mark.parametrize(("kind", "argument", "call"), CONTRACT_ERRORS,
                         ids=[f"{k}-{a}-{i}" for i, (k, a, _) in enumerate(CONTRACT_ERRORS)])
def test_contract_error_names_the_argument(kind: str, argument: str, call: Callable[[], Any]) -> None:
    with pytest.raises(ContractError) as info:
        call()
    assert info.value.argument == argument, str(info.value)
    assert f"fused_qk_norm_rope: {argument}: " in str(info.value)


def test_weight_sharing_memory_with_qkv_is_refused_before_any_kernel() -> None:
    qkv = _randn(3, (HQ + 2 * HKV) * D, seed=4)
    before = qkv.clone()
    with pytest.raises(ContractError, match="q_weight: overlaps qkv"):
        io.fused_qk_norm_rope(qkv, qkv[2, -D:], torch.randn(D), _cache(4, D), torch.tensor([0, 1, 2]), **HEADS)
    assert torch.equal(qkv, before)


def test_meta_and_fake_inputs_run_the_checks_without_values() -> None:
    qkv = torch.empty(3, (HQ + 2 * HKV) * D, device=META)
    weights, cache = torch.empty(D, device=META), _cache(4, D).to(META)
    with io.checked_indices():
        assert io.fused_qk_norm_rope(qkv, weights, weights, cache, torch.empty(3, dtype=torch.int64, device=META),
                                     **HEADS) is qkv
    with FakeTensorMode():
        qkv = torch.empty(3, (HQ + 2 * HKV) * D)
        io.fused_qk_norm_rope(qkv, torch.empty(D), torch.empty(D), torch.empty(4, D), torch.zeros(3, dtype=torch.int64),
                              **HEADS)
        with pytest.raises(ContractError, match="positions: expected shape \\[3\\]"):
            io.fused_qk_norm_rope(qkv, torch.empty(D), torch.empty(D), torch.empty(4, D),
                                  torch.zeros(2, dtype=torch.int64), **HEADS)


def test_compiled_call_is_one_custom_operator_and_matches_eager() -> None:
    def attention_in(qkv: torch.Tensor, qw: torch.Tensor, kw: torch.Tensor, cache: torch.Tensor,
                     positions: torch.Tensor) -> torch.Tensor:
        io.fused_qk_norm_rope(qkv, qw, kw, cache, positions, **HEADS, is_neox=False)
        return qkv * 1.0

    qkv, (qw, kw), cache, positions = _randn(3, (HQ + 2 * HKV) * D, seed=5), _weights(torch.float32), _cache(4, D), \
        torch.tensor([3, 0, 2])
    torch._dynamo.reset()
    explained = torch._dynamo.explain(attention_in)(qkv.clone(), qw, kw, cache, positions)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(attention_in, fullgraph=True, backend="inductor")(qkv.clone(), qw, kw, cache, positions)
    torch.testing.assert_close(compiled, attention_in(qkv.clone(), qw, kw, cache, positions), rtol=0, atol=0)


def test_torch_provider_conformance() -> None:
    from infiniops_py.testing.conformance import run_conformance

    report = run_conformance("torch", ops=["fused_qk_norm_rope"], max_examples=20)
    assert report.ok, report.render()
    assert {r.dtype for r in report.ops} == {"float16", "bfloat16", "float32"}


def test_triton_launch_parameters_are_powers_of_two_for_every_head_and_rotary_dim() -> None:
    # Triton refuses a num_warps that is not a power of two: D 80 with rotary_dim 20 gave 3 warps on the H200
    from infiniops_triton.fused_qk_norm_rope import launch_params

    def power_of_two(n: int) -> bool:
        return n > 0 and n & (n - 1) == 0

    for heads in (1, 3, 24, 72):
        for head_dim in range(2, 257, 2):
            for rotary_dim in range(2, head_dim + 1, 2):
                block_h, block_r, block_p, warps = launch_params(heads, head_dim, rotary_dim)
                assert all(map(power_of_two, (block_h, block_r, warps))), (heads, head_dim, rotary_dim)
                assert block_p == 0 or power_of_two(block_p)
