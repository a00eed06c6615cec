"""The CuPy provider on a machine without a CUDA device: installed, listed, and honestly gated."""

from __future__ import annotations

import pytest
import torch

import infiniops_py as ip

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA gating; GPU runs use check")


def _cupy() -> ip.Provider:
    found = {p.name: p for p in ip.providers()}
    assert "cupy" in found, f"cupy provider not discovered; providers: {sorted(found)}"
    return found["cupy"]


def test_cupy_provider_loads_and_lists_its_implementations() -> None:
    provider = _cupy()
    assert provider.loaded, provider.error
    ops = {impl.op for impl in provider.implementations}
    assert {"gemm", "add", "rms_norm", "fused_add_rms_norm", "fused_qk_norm", "reshape_and_cache_flash",
            "causal_conv1d_update", "selective_state_update"} <= ops


def test_every_cupy_implementation_is_gated_with_no_cuda_device() -> None:
    for impl in _cupy().implementations:
        problem = ip.make_problem(impl.op, device_type="cuda", dtype="float16")
        reasons = [str(r) for r in impl.capability.reasons(problem)]
        assert any("no CUDA device" in r for r in reasons), (impl.name, reasons)


def test_forcing_cupy_on_cpu_raises_a_gate_error_that_says_why() -> None:
    x = torch.randn(4, 8)
    with ip.use("cupy"), pytest.raises(ip.GateError) as err:
        ip.add(x, x)
    text = str(err.value)
    assert "cupy" in text and "no CUDA device" in text and "device_type=cpu" in text
    assert err.value.candidates[0].provider == "cupy"


def test_cupy_being_installed_changes_nothing_for_cpu_calls() -> None:
    x, y = torch.randn(3, 5), torch.randn(5)
    torch.testing.assert_close(ip.add(x, y, alpha=0.5), x + 0.5 * y)
    assert ip.resolve("add", device_type="cpu", dtype="float32").provider != "cupy"
