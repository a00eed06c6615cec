"""Hostile or broken plugins and tuning inputs, contained: two providers' implementations that share a name
are told apart by the ranking and by the tuner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import _Plugin, cpu_capability

import infiniops_py as io
from infiniops_py import Implementation, Provider
from infiniops_py.tuning import store, tune_problem

SIZES = {"m": 4, "n": 8, "k": 8}
BUCKET = {"device_type": "cpu", "dtype": "float32", **SIZES}
TESTS = Path(__file__).parent


def _gemm(delay: float = 0.0, calls: list[str] | None = None, name: str = "") -> Callable[..., Any]:
    def fn(a: torch.Tensor, b: torch.Tensor, *rest: Any, **kwargs: Any) -> torch.Tensor:
        if calls is not None:
            calls.append(name)
        if delay:
            time.sleep(delay)
        return torch.matmul(a, b, out=rest[-1] if rest else kwargs["out"])
    return fn


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test has its own cache folder, only the fakes (and reference) serve Gemm, no other INFINIOPS_*."""
    for name in ("INFINIOPS_TUNING", "INFINIOPS_PRIORITY", "INFINIOPS_STRICT", "INFINIOPS_TRACE_CALLS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INFINIOPS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("INFINIOPS_DENY", "gemm=torch,triton,cupy")
    store._WARNED.clear()
    io.reload()
    yield
    io.reload()


def _provider(name: str, *impls: Implementation) -> Provider:
    return io.register_provider(_Plugin(Provider(name=name, version="0", implementations=list(impls))), name=name)


# -- the resolver -----------------------------------------------------------------------------------------

def test_implementations_of_two_providers_that_share_a_name_are_told_apart() -> None:
    # Names are unique within a provider only: 'a' (priority 50, float32 only) and 'b' (float64 too) both
    # name theirs "gemm". Keyed by name, b's acceptance covered a's rejection, and a served float64.
    a_calls: list[str] = []
    a = Implementation("gemm", "a", "gemm", cpu_capability(), 50, _gemm(calls=a_calls, name="a"))
    b = Implementation("gemm", "b", "gemm", cpu_capability(dtypes=("float32", "float64")), 10, _gemm())
    try:
        assert not _provider("a", a).error and not _provider("b", b).error
        ex = io.explain("gemm", device_type="cpu", dtype="float64")
        assert ex.chosen is not None and ex.chosen.provider == "b"
        marks = [line for line in ex.render().splitlines() if line.endswith(": chosen")]
        assert marks == ["  2. b (gemm, priority 10): chosen"]
        assert [c.accepted for c in ex.candidates][:2] == [False, True]
        io.gemm(torch.randn(2, 3, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64))
        assert a_calls == []
    finally:
        io.unregister_provider("a")
        io.unregister_provider("b")


def test_measured_times_of_a_name_two_candidates_share_rank_neither() -> None:
    # A time under the shared name cannot say whose it is: neither is timed, the others are.
    a = Implementation("gemm", "a", "gemm", cpu_capability(), 50, _gemm(0.002))
    b = Implementation("gemm", "b", "gemm", cpu_capability(), 40, _gemm())
    c = Implementation("gemm", "c", "c.gemm", cpu_capability(), 30, _gemm())
    d = Implementation("gemm", "d", "d.gemm", cpu_capability(), 20, _gemm(0.002))
    try:
        for impl in (a, b, c, d):
            assert not _provider(impl.provider, impl).error
        report = tune_problem("gemm", sizes=SIZES)
        assert set(report.results[0].measurement.times) == {"c.gemm", "d.gemm"}
        ex = io.explain("gemm", **BUCKET)
        assert ex.chosen.provider == "c" and "c.gemm is the fastest measured" in ex.why
        assert [c.provider for c in ex.candidates] == ["c", "d", "a", "b", "reference"]
    finally:
        for name in ("a", "b", "c", "d"):
            io.unregister_provider(name)
