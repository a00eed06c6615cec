"""GemmSwiglu: the packed gate/up projection and SwiGLU in one operator, equal to gemm then silu_and_mul."""

from __future__ import annotations

import pytest
import torch

import infiniops_py as ops
from infiniops_py import ContractError
from infiniops_py.testing.compare import compare
from infiniops_py.testing.conformance import run_conformance
from infiniops_py.testing.tolerances import tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_it_equals_gemm_then_silu_and_mul(dtype: torch.dtype, bias: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 40, generator=gen).to(dtype)[:, :33]  # strided rows
    w = (torch.randn(2 * 19, 33, generator=gen) * 33**-0.5).to(dtype)
    b = torch.randn(2 * 19, generator=gen).to(dtype) if bias else None
    out = torch.full((5, 19), float("nan"), dtype=dtype)
    ops.gemm_swiglu(x, w, b, out=out)
    two_step = ops.silu_and_mul(ops.gemm(x, w, bias=b, trans_b=True))
    torch.testing.assert_close(out, two_step)
    ref = ops.gemm_swiglu(x.double(), w.double(), None if b is None else b.double())
    _, failure = compare("gemm_swiglu", out, ref, tolerance("gemm_swiglu", str(dtype)[6:]), k=33)
    assert failure is None, failure


def test_no_k_and_no_rows() -> None:
    assert ops.gemm_swiglu(torch.empty(0, 8), torch.empty(6, 8)).shape == (0, 3)
    b = torch.tensor([1.0, -2.0, 3.0, 4.0])
    got = ops.gemm_swiglu(torch.empty(2, 0), torch.empty(4, 0), b)  # silu(bias_gate) * bias_up
    torch.testing.assert_close(got, (torch.nn.functional.silu(b[:2]) * b[2:]).expand(2, 2))


@pytest.mark.parametrize(("args", "argument"), [
    ((torch.randn(3), torch.randn(4, 3)), "x"),
    ((torch.randn(2, 3), torch.randn(5, 3)), "weight"),  # odd rows
    ((torch.randn(2, 3), torch.randn(4, 2)), "weight"),  # K differs
    ((torch.randn(2, 3), torch.randn(4, 3).t().contiguous().t()), "weight"),  # K not contiguous
    ((torch.randn(2, 3), torch.randn(4, 3, dtype=torch.float64)), "weight"),
    ((torch.randn(2, 3), torch.randn(4, 3), torch.randn(3)), "bias"),
    ((torch.randn(3, 2).t(), torch.randn(4, 3)), "x"),  # x's last stride
])
def test_bad_arguments_are_named(args: tuple[torch.Tensor, ...], argument: str) -> None:
    with pytest.raises(ContractError, match=f"gemm_swiglu: {argument}: "):
        ops.gemm_swiglu(*args)


def test_out_must_not_alias_the_inputs() -> None:
    x = torch.randn(2, 4)
    with pytest.raises(ContractError, match="gemm_swiglu: out: "):
        ops.gemm_swiglu(x, torch.randn(4, 4), out=x.view(4, 2)[:2])  # x's first row


def test_the_torch_provider_conforms() -> None:
    report = run_conformance("torch", ops=["gemm_swiglu"], max_examples=15)
    assert report.ok and all(r.examples - r.gated > 0 for r in report.ops), report.render()


def test_compile_and_fake_tensors_see_one_node() -> None:
    x, w = torch.randn(3, 8), torch.randn(6, 8)
    compiled = torch.compile(lambda a, b: ops.gemm_swiglu(a, b) * 2, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, w), ops.gemm_swiglu(x, w) * 2)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert ops.gemm_swiglu(torch.empty(3, 8), torch.empty(6, 8)).shape == (3, 3)
