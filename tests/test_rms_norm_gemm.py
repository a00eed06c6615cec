"""RmsNormGemm: the RMSNorm of x, then the projection (or the gate/up projection and SwiGLU) in one operator, equal
to rms_norm then gemm (gemm_swiglu)."""

from __future__ import annotations

import pytest
import torch

import infiniops_py as ops
from infiniops_py import ContractError
from infiniops_py.testing.compare import compare
from infiniops_py.testing.conformance import run_conformance
from infiniops_py.testing.tolerances import tolerance


def _inputs(dtype: torch.dtype, bias: bool, rows: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(5, 40, generator=gen).to(dtype)[:, :33]  # strided rows
    nw = (torch.randn(33, generator=gen) * 0.1 + 1).to(dtype)
    w = (torch.randn(rows, 33, generator=gen) * 33**-0.5).to(dtype)
    b = torch.randn(rows, generator=gen).to(dtype) if bias else None
    return x, nw, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("swiglu", [False, True])
def test_it_equals_rms_norm_then_gemm(dtype: torch.dtype, bias: bool, swiglu: bool) -> None:
    x, nw, w, b = _inputs(dtype, bias, 38 if swiglu else 19)
    n = 19
    out = torch.full((5, n), float("nan"), dtype=dtype)
    got = ops.rms_norm_gemm(x, nw, w, 1e-5, bias=b, swiglu=swiglu, out=out)
    assert got is out
    normed = ops.rms_norm(x, nw, 1e-5)
    want = ops.gemm_swiglu(normed, w, b) if swiglu else ops.gemm(normed, w, bias=b, trans_b=True)
    torch.testing.assert_close(out, want)
    ref = ops.rms_norm_gemm(x.double(), nw.double(), w.double(), 1e-5, bias=None if b is None else b.double(),
                            swiglu=swiglu)
    _, failure = compare("rms_norm_gemm", out, ref, tolerance("rms_norm_gemm", str(dtype)[6:]), k=33)
    assert failure is None, failure


def test_no_k_and_no_rows() -> None:
    assert ops.rms_norm_gemm(torch.empty(0, 8), torch.ones(8), torch.empty(6, 8)).shape == (0, 6)
    assert ops.rms_norm_gemm(torch.empty(3, 8), torch.ones(8), torch.empty(6, 8), swiglu=True).shape == (3, 3)
    b = torch.tensor([1.0, -2.0, 3.0, 4.0])
    got = ops.rms_norm_gemm(torch.empty(2, 0), torch.ones(0), torch.empty(4, 0), bias=b)  # the bias alone
    torch.testing.assert_close(got, b.expand(2, 4))
    got = ops.rms_norm_gemm(torch.empty(2, 0), torch.ones(0), torch.empty(4, 0), bias=b, swiglu=True)
    torch.testing.assert_close(got, (torch.nn.functional.silu(b[:2]) * b[2:]).expand(2, 2))


@pytest.mark.parametrize(("args", "kwargs", "argument"), [
    ((torch.randn(3), torch.ones(3), torch.randn(4, 3)), {}, "x"),
    ((torch.randn(2, 3), torch.ones(3), torch.randn(4, 2)), {}, "weight"),  # K differs
    ((torch.randn(2, 3), torch.ones(3), torch.randn(4, 3).t().contiguous().t()), {}, "weight"),
    ((torch.randn(2, 3), torch.ones(3), torch.randn(4, 3, dtype=torch.float64)), {}, "weight"),
    ((torch.randn(2, 3), torch.ones(3), torch.randn(5, 3)), {"swiglu": True}, "weight"),  # odd rows
    ((torch.randn(2, 3), torch.ones(4), torch.randn(4, 3)), {}, "norm_weight"),  # [N], not [K]
    ((torch.randn(2, 3), torch.ones(3, dtype=torch.float64), torch.randn(4, 3)), {}, "norm_weight"),
    ((torch.randn(3, 2).t(), torch.ones(3), torch.randn(4, 3)), {}, "x"),  # x's last stride
    ((torch.randn(2, 3), torch.ones(3), torch.randn(4, 3)), {"bias": torch.randn(3)}, "bias"),
    ((torch.randn(2, 3), torch.ones(3), torch.randn(4, 3)), {"swiglu": True, "bias": torch.randn(2)}, "bias"),
    ((torch.randn(2, 3), torch.ones(3), torch.randn(4, 3), 0.0), {}, "eps"),
    ((torch.randn(2, 3), torch.ones(3), torch.randn(4, 3)), {"swiglu": 1}, "swiglu"),
    ((torch.randn(2, 3), torch.ones(3), torch.randn(4, 3)), {"swiglu": True, "out": torch.empty(2, 4)}, "out"),
])
def test_bad_arguments_are_named(args: tuple[object, ...], kwargs: dict[str, object], argument: str) -> None:
    with pytest.raises(ContractError, match=f"rms_norm_gemm: {argument}: "):
        ops.rms_norm_gemm(*args, **kwargs)


def test_out_must_not_alias_the_inputs() -> None:
    x = torch.randn(2, 4)
    with pytest.raises(ContractError, match="rms_norm_gemm: "):
        ops.rms_norm_gemm(x, torch.ones(4), torch.randn(4, 4), out=x)


def test_the_torch_provider_conforms() -> None:
    report = run_conformance("torch", ops=["rms_norm_gemm"], max_examples=15)
    assert report.ok and all(r.examples - r.gated > 0 for r in report.ops), report.render()


def test_compile_and_fake_tensors_see_one_node() -> None:
    x, nw, w = torch.randn(3, 8), torch.rand(8) + 0.5, torch.randn(6, 8)

    def f(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.rms_norm_gemm(a, nw, b) * 2, ops.rms_norm_gemm(a, nw, b, swiglu=True)

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    for got, want in zip(compiled(x, w), f(x, w), strict=True):
        torch.testing.assert_close(got, want)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert ops.rms_norm_gemm(torch.empty(3, 8), torch.empty(8), torch.empty(6, 8)).shape == (3, 6)
        assert ops.rms_norm_gemm(torch.empty(3, 8), torch.empty(8), torch.empty(6, 8), swiglu=True).shape == (3, 3)
