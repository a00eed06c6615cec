"""The conformance suite catches what it promises to catch, on hand-made faulty `add` providers."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from fakes import correct_add, cpu_capability, registered

import infiniops_py as io
from infiniops_py import Between, Capability, OneOf
from infiniops_py.testing.compare import bits_equal, compare
from infiniops_py.testing.conformance import cpu_copies, declared_pairs, poisoned, run_conformance
from infiniops_py.testing.tolerances import Allclose, LowPrecisionRule

EXAMPLES = 12


@pytest.fixture(autouse=True)
def _clean_runtime() -> Iterator[None]:
    yield
    io.reload()


def _run(name: str, fn, capability: Capability | None = None, **kwargs):  # type: ignore[no-untyped-def]
    with registered((name, [("add", capability or cpu_capability(), 1, fn)])):
        return run_conformance(name, max_examples=EXAMPLES, **kwargs)


def test_torch_add_conforms() -> None:
    report = run_conformance("torch", ops=["add"], max_examples=EXAMPLES)
    assert report.ok, report.render()
    assert [(r.op, r.dtype) for r in report.ops] == [("add", "float16"), ("add", "bfloat16"), ("add", "float32")]
    assert all(r.examples == EXAMPLES for r in report.ops)
    assert report.gates is not None and report.gates.checked > 0  # float64, mps, xpu: all gated


def test_a_correct_fake_passes_and_its_undeclared_problems_are_gated() -> None:
    # declares broadcasting only: the strategy's same-shape draws (0-D, or nothing to broadcast) are gated
    capability = cpu_capability(OneOf("broadcast", (True,)))
    with registered(("bcast", [("add", capability, 1, correct_add)])):
        report = run_conformance("bcast", max_examples=40)
    assert report.ok, report.render()
    [row] = report.ops
    assert row.gated > 0 and row.examples > row.gated
    assert report.gates is not None and report.gates.checked >= 4  # device_type x3, dtype x3, broadcast


def test_wrong_values_fail_with_the_worst_error() -> None:
    def off(input, other, alpha, out):  # type: ignore[no-untyped-def]
        return torch.add(input + 1e-2, other, alpha=alpha, out=out)

    report = _run("off", off)
    assert not report.ok
    [row] = report.ops
    assert row.failed == EXAMPLES
    assert "elements break rtol=1e-06, atol=0.0001" in row.failures[0].message
    assert row.failures[0].note  # the strategy's note says which shapes


def test_ignoring_out_fails() -> None:
    def fresh(input, other, alpha, out):  # type: ignore[no-untyped-def]
        return torch.add(input, other, alpha=alpha)

    report = run_conformance_many("fresh", fresh)
    assert report.ops[0].failed == report.ops[0].examples
    assert "returned another tensor" in report.ops[0].failures[0].message


def test_returning_another_object_than_out_fails() -> None:
    def copied(input, other, alpha, out):  # type: ignore[no-untyped-def]
        return torch.add(input, other, alpha=alpha, out=out).clone()  # out is right; the result is not out

    report = run_conformance_many("copied", copied)
    [row] = report.ops
    assert not report.ok and row.failed == row.examples
    assert ("copied's add implementation returned another tensor (shape" in row.failures[0].message
            and "returns the tensor it was handed as argument 3 (out) itself" in row.failures[0].message)


def test_mutating_an_input_fails() -> None:
    def zeroes_other(input, other, alpha, out):  # type: ignore[no-untyped-def]
        torch.add(input, other, alpha=alpha, out=out)
        if out is not other:
            other.zero_()  # after the sum: the result itself is right
        return out

    report = run_conformance_many("zeroes", zeroes_other)
    [row] = report.ops
    assert not report.ok and row.failed == row.examples
    assert "argument 'other' changed although the contract leaves it untouched" in row.failures[0].message


def test_writing_outside_the_outputs_fails() -> None:
    def overruns(input, other, alpha, out):  # type: ignore[no-untyped-def]
        torch.add(input, other, alpha=alpha, out=out)
        storage, end = out.untyped_storage(), (out.storage_offset() + out.numel()) * out.element_size()
        if out.is_contiguous() and storage.nbytes() >= end + out.element_size():  # room past the end of out
            storage[end] = 0  # one byte past the last element, as a kernel with an off-by-one bound writes
        return out

    report = run_conformance_many("overruns", overruns)
    [row] = report.ops
    assert not report.ok and row.failed > 0
    assert any("wrote outside its outputs" in f.message and "past the last element of" in f.message
               for f in row.failures), report.render()


def run_conformance_many(name: str, fn):  # type: ignore[no-untyped-def]
    with registered((name, [("add", cpu_capability(), 1, fn)])):
        return run_conformance(name, max_examples=40, gates=False)


def test_reading_uninitialized_memory_is_caught_by_poisoning() -> None:
    def lazy(input, other, alpha, out):  # type: ignore[no-untyped-def]
        scratch = torch.empty(out.shape, dtype=out.dtype)  # NaN under the suite's poisoning
        if out.numel():
            flat = scratch.view(-1)
            flat[1:] = torch.add(input, other, alpha=alpha).reshape(-1)[1:]  # forgets element 0
        out.copy_(scratch)
        return out

    report = run_conformance_many("lazy", lazy)
    assert report.ops[0].failed > 0
    assert "got nan" in report.ops[0].failures[0].message


def test_crashes_fail_and_are_reported() -> None:
    def crash(input, other, alpha, out):  # type: ignore[no-untyped-def]
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    report = _run("crash", crash)
    [row] = report.ops
    assert row.failed == EXAMPLES
    assert "crash raised RuntimeError: CUDA error: an illegal memory access" in row.failures[0].message
    assert "FAIL add float32 (crash.add.0)" in report.render()


def test_gate_checks_find_constraints_on_unknown_fields() -> None:
    capability = cpu_capability(OneOf("head_dim", (64,)))  # add has no head_dim: rejects every problem
    with registered(("confused", [("add", capability, 1, correct_add)])):
        report = run_conformance("confused", max_examples=3)
    assert report.gates is not None
    assert any("has no problem field 'head_dim'" in f.message for f in report.gates.failures)
    assert report.ops[0].gated == report.ops[0].examples  # and every case is gated


def test_gate_checks_reach_past_between_bounds() -> None:
    from infiniops_py.testing.gates import outside_values

    assert outside_values(Between("head_dim", 8, 256), [4, 8, 64, 300]) == [4, 7, 257, 300]
    assert outside_values(OneOf("width", (2, 3, 4)), [1, 2, 3, 4, 5]) == [1, 5]


def test_unknown_and_broken_providers_are_reported() -> None:
    assert declared_pairs("no-such-provider")[1].startswith("unknown provider 'no-such-provider'")
    report = run_conformance("no-such-provider")
    assert not report.ok and "unknown provider" in report.render()
    pairs, error = declared_pairs("torch", "cpu")
    assert not error and ("add", "bfloat16") in pairs


def test_compare_never_lets_nan_pass() -> None:
    ref = torch.tensor([1.0, math.nan, 3.0], dtype=torch.float64)
    assert compare("x", torch.tensor([1.0, math.nan, 3.0]), ref, Allclose(1e-6, 1e-4))[1] is None
    assert compare("x", torch.tensor([1.0, 2.0, 3.0]), ref, Allclose(1e-6, 1e-4))[1] is not None
    assert compare("x", torch.tensor([math.nan, math.nan, 3.0]), ref, Allclose(1.0, 1.0))[1] is not None
    assert compare("x", torch.tensor([1.0, math.nan]), ref[:2], Allclose(0.0, 0.0))[1] is None  # exact
    assert compare("x", torch.tensor([1.0, 2.0]), ref[:2], Allclose(0.0, 0.0))[1] is not None
    assert compare("x", torch.tensor([1.0, 2.0]), ref, Allclose(1.0, 1.0))[1].startswith("x: shape")


def test_compare_per_k_and_low_precision_rules() -> None:
    ref = torch.zeros(4, dtype=torch.float64) + 1.0
    got = ref + 5e-3
    per_k = Allclose(0.0, 0.0, atol_per_k=1e-4)
    assert "Case.k" in compare("y", got, ref, per_k)[1]
    assert compare("y", got, ref, per_k, k=64)[1] is None  # 6.4e-3 allowed
    assert compare("y", got, ref, per_k, k=16)[1] is not None  # 1.6e-3 allowed
    rule = LowPrecisionRule(2.0, 1e-5)
    low = ref + 3e-3  # the reference's own error in the low dtype
    assert compare("o", got, ref, rule, low=low)[1] is None  # 5e-3 <= 2 x 3e-3
    assert "the reference's own error" in compare("o", ref + 7e-3, ref, rule, low=low)[1]


def test_bits_equal_tells_signed_zeros_apart() -> None:
    assert bits_equal(torch.tensor([0.0, math.nan]), torch.tensor([0.0, math.nan]))
    assert not bits_equal(torch.tensor([0.0]), torch.tensor([-0.0]))


def test_cpu_copies_keep_aliasing_and_index_dtypes() -> None:
    qkv = torch.randn(3, 12, dtype=torch.float16)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    q, v, i = cpu_copies((qkv[:, :4], qkv[:, 8:], idx), torch.float64)
    assert q.dtype == v.dtype == torch.float64 and i.dtype == torch.int32
    assert q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    assert q.stride() == (12, 1) and v.storage_offset() == 8
    torch.testing.assert_close(v, qkv[:, 8:].double())


def test_poisoned_fills_empty_tensors_and_restores_settings() -> None:
    before = (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory)
    with poisoned():
        assert torch.empty(8).isnan().all()
    assert (torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory) == before


def test_a_seed_replays_the_same_cases() -> None:
    def wrong(input, other, alpha, out):  # type: ignore[no-untyped-def]
        return torch.sub(input, other, alpha=alpha, out=out)

    with registered(("wrong", [("add", cpu_capability(), 1, wrong)])):
        runs = [run_conformance("wrong", max_examples=8, gates=False, seed=seed) for seed in (7, 7, 8)]
    notes = [[f.note for f in r.ops[0].failures] for r in runs]
    assert notes[0] == notes[1] != notes[2]
