"""GemmAddRmsNorm: a projection, then the residual add and RMSNorm in one operator, equal to gemm then
fused_add_rms_norm."""

from __future__ import annotations

import pytest
import torch

import infiniops_py as ops
from infiniops_py import ContractError
from infiniops_py.testing.compare import compare
from infiniops_py.testing.conformance import run_conformance
from infiniops_py.testing.tolerances import tolerance


def _inputs(dtype: torch.dtype, bias: bool) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(5, 40, generator=gen).to(dtype)[:, :33]  # strided rows
    w = (torch.randn(19, 33, generator=gen) * 33**-0.5).to(dtype)
    r = torch.randn(5, 24, generator=gen).to(dtype)[:, :19]  # strided rows
    nw = (torch.randn(19, generator=gen) * 0.1 + 1).to(dtype)
    b = torch.randn(19, generator=gen).to(dtype) if bias else None
    return x, w, r, nw, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_it_equals_gemm_then_fused_add_rms_norm(dtype: torch.dtype, bias: bool) -> None:
    x, w, r, nw, b = _inputs(dtype, bias)
    r0 = r.clone()
    out = torch.full((5, 19), float("nan"), dtype=dtype)
    got, residual = ops.gemm_add_rms_norm(x, w, r, nw, 1e-5, bias=b, out=out)
    assert got is out and residual is r
    y, r2 = ops.gemm(x, w, bias=b, trans_b=True), r0.clone()
    ops.fused_add_rms_norm(y, r2, nw, 1e-5)
    torch.testing.assert_close(out, y)
    torch.testing.assert_close(r, r2)
    r_ref = r0.double()
    ref, _ = ops.gemm_add_rms_norm(x.double(), w.double(), r_ref, nw.double(), 1e-5,
                                   bias=None if b is None else b.double())
    rule = tolerance("gemm_add_rms_norm", str(dtype)[6:])
    for g, want in ((out, ref), (r, r_ref)):
        _, failure = compare("gemm_add_rms_norm", g, want, rule, k=33)
        assert failure is None, failure


def test_no_k_and_no_rows() -> None:
    got, r = ops.gemm_add_rms_norm(torch.empty(0, 8), torch.empty(6, 8), torch.empty(0, 6), torch.ones(6))
    assert got.shape == r.shape == (0, 6)
    b, r = torch.tensor([1.0, -2.0, 3.0, 4.0]), torch.ones(2, 4)
    got, _ = ops.gemm_add_rms_norm(torch.empty(2, 0), torch.empty(4, 0), r, torch.ones(4), bias=b)  # r += bias
    torch.testing.assert_close(r, (b + 1).expand(2, 4))
    torch.testing.assert_close(got, torch.nn.functional.rms_norm(r, (4,), eps=1e-6))


@pytest.mark.parametrize(("args", "argument"), [
    ((torch.randn(3), torch.randn(4, 3), torch.randn(1, 4), torch.ones(4)), "x"),
    ((torch.randn(2, 3), torch.randn(4, 2), torch.randn(2, 4), torch.ones(4)), "weight"),  # K differs
    ((torch.randn(2, 3), torch.randn(4, 3).t().contiguous().t(), torch.randn(2, 4), torch.ones(4)), "weight"),
    ((torch.randn(2, 3), torch.randn(4, 3, dtype=torch.float64), torch.randn(2, 4), torch.ones(4)), "weight"),
    ((torch.randn(2, 3), torch.randn(4, 3), torch.randn(2, 5), torch.ones(4)), "residual"),  # N differs
    ((torch.randn(2, 3), torch.randn(4, 3), torch.randn(4, 2).t(), torch.ones(4)), "residual"),  # last stride
    ((torch.randn(2, 3), torch.randn(4, 3), torch.randn(2, 4), torch.ones(5)), "norm_weight"),
    ((torch.randn(3, 2).t(), torch.randn(4, 3), torch.randn(2, 4), torch.ones(4)), "x"),  # x's last stride
])
def test_bad_arguments_are_named(args: tuple[torch.Tensor, ...], argument: str) -> None:
    with pytest.raises(ContractError, match=f"gemm_add_rms_norm: {argument}: "):
        ops.gemm_add_rms_norm(*args)


def test_a_bad_bias_eps_or_expanded_residual_is_refused_before_any_write() -> None:
    x, w, r = torch.randn(2, 3), torch.randn(4, 3), torch.randn(2, 4)
    before = r.clone()
    with pytest.raises(ContractError, match="gemm_add_rms_norm: bias: "):
        ops.gemm_add_rms_norm(x, w, r, torch.ones(4), bias=torch.randn(3))
    with pytest.raises(ContractError, match="gemm_add_rms_norm: eps: "):
        ops.gemm_add_rms_norm(x, w, r, torch.ones(4), 0.0)
    with pytest.raises(ContractError, match="gemm_add_rms_norm: residual: "):
        ops.gemm_add_rms_norm(x, w, torch.randn(1, 4).expand(2, 4), torch.ones(4))
    assert torch.equal(r, before)


def test_written_tensors_must_not_alias_the_inputs() -> None:
    x, w = torch.randn(2, 4), torch.randn(4, 4)
    with pytest.raises(ContractError, match="gemm_add_rms_norm: "):
        ops.gemm_add_rms_norm(x, w, x, torch.ones(4))  # the residual is x
    r = torch.randn(2, 4)
    with pytest.raises(ContractError, match="gemm_add_rms_norm: "):
        ops.gemm_add_rms_norm(x, w, r, torch.ones(4), out=r)  # out is the residual


def test_the_torch_provider_conforms() -> None:
    report = run_conformance("torch", ops=["gemm_add_rms_norm"], max_examples=15)
    assert report.ok and all(r.examples - r.gated > 0 for r in report.ops), report.render()


def test_compile_and_fake_tensors_see_one_node() -> None:
    x, w, nw = torch.randn(3, 8), torch.randn(6, 8), torch.rand(6) + 0.5

    def f(a: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, res = ops.gemm_add_rms_norm(a, b, r, nw)
        return out * 2, res

    r1 = torch.randn(3, 6)
    r2 = r1.clone()
    compiled = torch.compile(f, fullgraph=True, backend="eager")
    got, want = compiled(x, w, r1), f(x, w, r2)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(r1, r2)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out, res = ops.gemm_add_rms_norm(torch.empty(3, 8), torch.empty(6, 8), torch.empty(3, 6), torch.empty(6))
        assert out.shape == res.shape == (3, 6)


@pytest.mark.parametrize("provider", ["torch", "reference"])
def test_an_int_eps_reaches_the_provider_as_the_float_it_was_checked_as(provider: str) -> None:
    # eps is a finite real number > 0: an int is one, even past int64 (2**70), but torch's scalar arithmetic
    # refuses such an int; the reference wrote the residual, then raised OverflowError
    gen = torch.Generator().manual_seed(3)
    x, w, r = (torch.randn(s, generator=gen) for s in ((2, 3), (4, 3), (2, 4)))
    nw = torch.rand(4, generator=gen) + 0.5
    want_r = r.clone()
    with ops.use(provider):
        want, _ = ops.gemm_add_rms_norm(x, w, want_r, nw, float(2**70))
        got, _ = ops.gemm_add_rms_norm(x, w, r, nw, 2**70)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(r, want_r)
