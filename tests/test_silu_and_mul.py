"""SiluAndMul on CPU: the reference and torch providers against the float64 reference and vLLM's native form,
the contract errors (one per kind, naming the argument), empty and meta inputs, out=, torch.compile, and the
conformance suite on the torch provider."""

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

PROVIDERS = ("reference", "torch")
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
META = torch.device("meta")


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _layouts(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {"2d": _randn(7, 2 * 40, dtype=dtype, seed=1), "strided": _randn(5, 2 * 33 + 9, dtype=dtype, seed=2)[:, :66],
            "3d": _randn(2, 3, 2 * 16, dtype=dtype, seed=3), "1d": _randn(2 * 24, dtype=dtype, seed=4),
            "gapped": _randn(2, 4, 2 * 8, dtype=dtype, seed=5)[:, :3]}


@pytest.mark.parametrize("layout", ["2d", "strided", "3d", "1d", "gapped"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("provider", PROVIDERS)
def test_matches_the_float64_reference(provider: str, dtype: torch.dtype, layout: str) -> None:
    x = _layouts(dtype)[layout]
    d = x.shape[-1] // 2
    x64 = x.double()
    expected = x64[..., :d] * torch.sigmoid(x64[..., :d]) * x64[..., d:]
    with io.use(provider):
        got = io.silu_and_mul(x)
    assert got.shape == (*x.shape[:-1], d) and got.dtype == dtype and got.is_contiguous()
    _, message = compare("silu_and_mul", got, expected, tolerance("silu_and_mul", str(dtype).removeprefix("torch.")))
    assert message is None, message


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_torch_provider_is_vllms_native_form_bit_for_bit(dtype: torch.dtype) -> None:
    """vLLM's test holds its kernel to ``SiluAndMul.forward_native`` exactly: SiLU rounded to the dtype, then
    the product."""
    x = _randn(9, 2 * 100, dtype=dtype, seed=6) * 3
    with io.use("torch"):
        got = io.silu_and_mul(x)
    assert torch.equal(got, F.silu(x[..., :100]) * x[..., 100:])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_out_is_written_and_returned(provider: str) -> None:
    x = _randn(4, 12)
    out = torch.full((4, 6), float("nan"))
    with io.use(provider):
        got = io.silu_and_mul(x, out=out)
    assert got is out
    torch.testing.assert_close(out, F.silu(x[:, :6]) * x[:, 6:])


def test_empty_inputs_give_empty_outputs_and_run_nothing() -> None:
    with io.use("reference"):
        assert io.silu_and_mul(torch.empty(0, 8)).shape == (0, 4)
        assert io.silu_and_mul(torch.empty(3, 0)).shape == (3, 0)


def _call(**over: Any) -> Callable[[], Any]:
    args: dict[str, Any] = {"x": torch.randn(4, 8), "out": None}
    args.update(over)
    return lambda: io.silu_and_mul(args.pop("x"), **args)


CONTRACT_ERRORS: list[tuple[str, str, Callable[[], Any]]] = [
    # (kind, argument named, call)
    ("type", "x", _call(x=[1.0, 2.0])),
    ("type", "out", _call(out=3)),
    ("dtype", "x", _call(x=torch.ones(4, 8, dtype=torch.int32))),
    ("shape", "x", _call(x=torch.randn(()))),
    ("shape", "x", _call(x=torch.randn(4, 7))),
    ("strides", "x", _call(x=torch.randn(8, 4).T)),
    ("shape", "out", _call(out=torch.empty(4, 8))),
    ("dtype", "out", _call(out=torch.empty(4, 4, dtype=torch.float16))),
    ("device", "out", _call(out=torch.empty(4, 4, device=META))),
    ("strides", "out", _call(out=torch.empty(4, 4).T)),
]


@pytest.mark.parametrize(("kind", "argument", "call"), CONTRACT_ERRORS,
                         ids=[f"{k}-{a}-{i}" for i, (k, a, _) in enumerate(CONTRACT_ERRORS)])
def test_contract_error_names_the_argument(kind: str, argument: str, call: Callable[[], Any]) -> None:
    with pytest.raises(ContractError) as info:
        call()
    assert info.value.argument == argument
    assert f"silu_and_mul: {argument}: " in str(info.value)


def test_out_sharing_memory_with_x_is_refused_before_any_kernel() -> None:
    buf = _randn(4, 8)
    before = buf.clone()
    with pytest.raises(ContractError, match="out: overlaps x"):
        io.silu_and_mul(buf, out=buf.view(-1)[:16].view(4, 4))  # out is x's first two rows
    assert torch.equal(buf, before)


def test_input_requiring_grad_is_refused() -> None:
    with pytest.raises(ContractError, match="x: requires_grad=True"):
        io.silu_and_mul(torch.randn(2, 4, requires_grad=True))


def test_meta_and_fake_inputs_give_the_output_shape_without_values() -> None:
    got = io.silu_and_mul(torch.empty(3, 5, 16, device=META))
    assert got.is_meta and got.shape == (3, 5, 8)
    with FakeTensorMode():
        fake = io.silu_and_mul(torch.empty(6, 32))
        assert fake.shape == (6, 16)
        with pytest.raises(ContractError, match="x: expected an even last dim"):
            io.silu_and_mul(torch.empty(6, 31))


def test_compiled_call_is_one_custom_operator_and_matches_eager() -> None:
    def mlp(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        io.silu_and_mul(x, out=out)
        return io.silu_and_mul(x * 2) + out

    x = _randn(5, 24)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(mlp)(x, torch.empty(5, 12))
    assert explained.graph_break_count == 0, explained.break_reasons
    compiled = torch.compile(mlp, fullgraph=True, backend="inductor")(x, torch.empty(5, 12))
    torch.testing.assert_close(compiled, mlp(x, torch.empty(5, 12)))


def test_torch_provider_conformance() -> None:
    from infiniops_py.testing.conformance import run_conformance

    report = run_conformance("torch", ops=["silu_and_mul"], max_examples=20)
    assert report.ok, report.render()
    assert {r.dtype for r in report.ops} == {"float16", "bfloat16", "float32"}
