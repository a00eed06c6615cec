"""RmsNormGated on CPU: the torch provider against mamba_ssm's formula (transformers' ``MambaRMSNormGated`` per
group), the contract errors (one per kind, naming the argument), meta and fake inputs, a compiled call (one
custom operator), and the conformance suite on the torch provider."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import infiniops_py as io
from infiniops_py import ContractError
from infiniops_py.testing.compare import compare
from infiniops_py.testing.tolerances import tolerance

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
META = torch.device("meta")


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _mamba(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float, groups: int) -> torch.Tensor:
    """transformers' ``MambaRMSNormGated`` per group (mamba_ssm's ``norm_before_gate=False``), in float64."""
    y = (x.double() * F.silu(z.double())).unflatten(-1, (groups, -1))
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return y.flatten(-2) * w.double()


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_gate_then_norm_matches_mamba_per_group(dtype: torch.dtype, groups: int) -> None:
    zx = _randn(5, 2 * 64 + 3, dtype=dtype, seed=1)  # the gate a column slice of a packed buffer
    x, z, w = _randn(5, 64, dtype=dtype, seed=2), zx[:, :64], _randn(64, dtype=dtype, seed=3)
    out = torch.full((5, 64), float("nan"), dtype=dtype)
    with io.use("torch"):
        got = io.rms_norm_gated(x, w, None, z=z, eps=1e-5, group_size=64 // groups, norm_before_gate=False,
                                out=out)
    assert got is out
    _, failure = compare("rms_norm_gated", got, _mamba(x, z, w, 1e-5, groups),
                         tolerance("rms_norm_gated", str(dtype).removeprefix("torch.")))
    assert failure is None, failure


def test_norm_then_gate_with_bias_and_no_gate() -> None:
    x, z, w, b = _randn(3, 2, 16, seed=4), _randn(3, 2, 16, seed=5), _randn(16, seed=6), _randn(16, seed=7)
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w + b
    torch.testing.assert_close(io.rms_norm_gated(x, w, b, z=z), normed * F.silu(z))  # the defaults: before
    torch.testing.assert_close(io.rms_norm_gated(x, w, b), normed)


def _call(**over: Any) -> Callable[[], Any]:
    args: dict[str, Any] = {"x": torch.randn(4, 8), "weight": torch.ones(8), "bias": None, "z": torch.randn(4, 8),
                            "eps": 1e-6, "group_size": None, "norm_before_gate": False, "out": None}
    args.update(over)
    return lambda: io.rms_norm_gated(args.pop("x"), args.pop("weight"), args.pop("bias"), **args)


CONTRACT_ERRORS: list[tuple[str, Callable[[], Any]]] = [
    ("x", _call(x=[1.0])),
    ("x", _call(x=torch.ones(4, 8, dtype=torch.int32))),
    ("x", _call(x=torch.randn(()))),
    ("x", _call(x=torch.randn(8, 4).T, z=None)),
    ("weight", _call(weight=torch.ones(7))),
    ("weight", _call(weight=torch.ones(8, dtype=torch.float16))),
    ("weight", _call(weight=torch.ones(16)[::2])),
    ("bias", _call(bias=torch.ones(8, device=META))),
    ("z", _call(z=torch.randn(4, 7))),
    ("z", _call(z=torch.randn(4, 8, dtype=torch.bfloat16))),
    ("z", _call(z=torch.randn(8, 4).T)),
    ("eps", _call(eps=0.0)),
    ("group_size", _call(group_size=3)),
    ("group_size", _call(group_size=0)),
    ("group_size", _call(group_size=4.0)),
    ("norm_before_gate", _call(norm_before_gate=1)),
    ("out", _call(out=torch.empty(4, 7))),
    ("out", _call(out=torch.empty(8, 4).T)),
]


@pytest.mark.parametrize(("argument", "call"), CONTRACT_ERRORS,
                         ids=[f"{a}-{i}" for i, (a, _) in enumerate(CONTRACT_ERRORS)])
def test_contract_error_names_the_argument(argument: str, call: Callable[[], Any]) -> None:
    with pytest.raises(ContractError) as info:
        call()
    assert info.value.argument == argument
    assert f"rms_norm_gated: {argument}: " in str(info.value)


def test_out_sharing_memory_with_z_is_refused_before_any_kernel() -> None:
    zx = _randn(4, 16)
    before = zx.clone()
    with pytest.raises(ContractError, match="out: overlaps z"):
        io.rms_norm_gated(_randn(4, 8, seed=1), torch.ones(8), None, z=zx[:, :8], out=zx.view(-1)[:32].view(4, 8))
    assert torch.equal(zx, before)


def test_meta_and_fake_inputs_give_the_output_shape_without_values() -> None:
    got = io.rms_norm_gated(torch.empty(3, 16, device=META), torch.empty(16, device=META), None,
                            z=torch.empty(3, 16, device=META), group_size=8)
    assert got.is_meta and got.shape == (3, 16)
    with FakeTensorMode():
        assert io.rms_norm_gated(torch.empty(6, 32), torch.empty(32), z=torch.empty(6, 32)).shape == (6, 32)
        with pytest.raises(ContractError, match="group_size: expected None or a positive int dividing H = 32"):
            io.rms_norm_gated(torch.empty(6, 32), torch.empty(32), group_size=5)


def test_compiled_call_is_one_custom_operator_and_matches_eager() -> None:
    def norm(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return io.rms_norm_gated(x * 2, w, None, z=z, group_size=8, norm_before_gate=False) + 1

    x, z, w = _randn(5, 24, seed=8), _randn(5, 24, seed=9), _randn(24, seed=10)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(norm)(x, z, w)
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(norm, fullgraph=True, backend="inductor")(x, z, w)
    torch.testing.assert_close(compiled, norm(x, z, w))


def test_torch_provider_conformance() -> None:
    from infiniops_py.testing.conformance import run_conformance

    report = run_conformance("torch", ops=["rms_norm_gated"], max_examples=20)
    assert report.ok, report.render()
    assert {r.dtype for r in report.ops} == {"float16", "bfloat16", "float32"}
