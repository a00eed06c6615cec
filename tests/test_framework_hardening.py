"""The framework layer against an adversarial user: one test per hardening fix.

1. a duplicate provider name or unusable declarations are refused at load, never replacing a provider;
2. a plugin constraint that raises rejects its own candidate, the others still serve;
3. overrides naming unknown operators or providers raise, warn or gate instead of being ignored;
4. malformed closure requests and problem fields raise a clear TypeError/ValueError;
5. the CLI rejects bad counts, sizes and paths with a one-line error and exit status 2.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fakes import correct_add, cpu_capability, registered

import infiniops_py as io
from infiniops_py import Capability, Check, GateError, Implementation, OneOf, Provider, hookimpl
from infiniops_py.cli import main
from infiniops_py.testing.tolerances import Allclose, tolerance

CPU32 = {"device_type": "cpu", "dtype": "float32"}


@pytest.fixture(autouse=True)
def _clean_runtime() -> Iterator[None]:
    yield
    io.reload()


class _Plugin:
    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    @hookimpl
    def infiniops_provider(self) -> Provider:
        return self.provider


def _assert_add_matches_reference(a: torch.Tensor, b: torch.Tensor) -> None:
    rule = tolerance("add", "float32")
    assert isinstance(rule, Allclose)
    torch.testing.assert_close(io.add(a, b).double(), a.double() + b.double(), rtol=rule.rtol, atol=rule.atol)


def test_duplicate_or_ill_declared_providers_are_refused_at_load() -> None:
    serving = io.resolve("add", **CPU32)
    impostor = Implementation("add", "torch", "torch.impostor", cpu_capability(), 1000, correct_add)
    try:
        dup = io.register_provider(_Plugin(Provider("torch", implementations=[impostor])), name="torch")
        assert dup.name == "torch [manual]" and not dup.loaded
        assert dup.error.startswith("duplicate provider name 'torch': also provided by ")
        assert io.resolve("add", **CPU32) is serving  # the first torch keeps serving
        assert {p.name for p in io.providers()} >= {"torch", "torch [manual]"}
    finally:
        io.unregister_provider("torch")
    assert "torch [manual]" not in {p.name for p in io.providers()}

    bad = Provider("bad", implementations=[
        Implementation("nope_op", "bad", "bad.unknown", cpu_capability(), 1, correct_add),
        Implementation("add", "other", "bad.foreign", cpu_capability(), 1, correct_add),
        Implementation("add", "bad", "bad.not_callable", cpu_capability(), 1, 5),  # type: ignore[arg-type]
        Implementation("add", "bad", "bad.not_a_capability", OneOf("device_type", ("cpu",)), 1,  # type: ignore[arg-type]
                       correct_add),
    ])
    try:
        p = io.register_provider(_Plugin(bad), name="bad")
        assert not p.loaded and not p.implementations
        for fact in ("'bad.unknown' is for unknown operator 'nope_op' (known: add, all_reduce,",
                     "'bad.foreign' declares provider='other', but it belongs to provider 'bad'",
                     "'bad.not_callable': fn is int, not callable",
                     "'bad.not_a_capability': capability is OneOf, not a Capability"):
            assert fact in p.error
        assert all(c.provider != "bad" for c in io.explain("add", **CPU32).candidates)
    finally:
        io.unregister_provider("bad")
    with pytest.raises(TypeError, match="argument 1 is tuple"):
        Capability(OneOf("device_type", ("cpu",)), ("dtype", "float32"))  # type: ignore[arg-type]


def test_a_raising_constraint_rejects_only_its_candidate() -> None:
    boom = Capability(OneOf("device_type", ("cpu",)), Check("boom", lambda p: 1 / 0, "boom"))
    with registered(("faulty", [("add", boom, 1000, correct_add)])):
        ex = io.explain("add", **CPU32)
        faulty = next(c for c in ex.candidates if c.provider == "faulty")
        assert "constraint boom raised ZeroDivisionError: division by zero" in str(faulty.rejections[0])
        assert ex.chosen is not None and ex.chosen.provider != "faulty"
        assert io.resolve("add", **CPU32).provider == ex.chosen.provider
        _assert_add_matches_reference(torch.randn(7) + 2, torch.rand(7) + 0.5)
        with io.use("faulty"), pytest.raises(GateError, match="constraint boom raised ZeroDivisionError"):
            io.resolve("add", **CPU32)
        assert main(["matrix", "--op", "add", "--device", "cpu", "--format", "json"]) == 0


def test_overrides_naming_unknown_operators_or_providers_are_not_ignored(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match=r"unknown operator\(s\) 'nope_op' \(known: add, all_reduce,"):
        io.use(provider="torch", op="nope_op")
    with pytest.raises(TypeError, match="use\\(provider=5\\): expected a name \\(str\\) or a sequence of names"):
        io.use(provider=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected names as str"):
        io.use(deny=["torch", None])  # type: ignore[list-item]

    caplog.set_level(logging.WARNING, logger="infiniops")
    with io.use(provider="zzz"), pytest.raises(GateError, match=r"provider 'zzz' is not loaded \(known: .*torch"):
        io.resolve("add", **CPU32)
    with io.use(deny="zzz"):
        io.resolve("add", **CPU32)
    assert "use(deny='zzz'): provider 'zzz' is not loaded (known: " in caplog.text

    caplog.clear()
    monkeypatch.setenv("INFINIOPS_PRIORITY", "rms_norm=nope;nope_op=torch")
    monkeypatch.setenv("INFINIOPS_DENY", "zzz")
    io.reload()
    warnings = [r.getMessage() for r in caplog.records if r.name == "infiniops"]
    assert any("INFINIOPS_PRIORITY for rms_norm: provider 'nope' is not loaded (known: " in w for w in warnings)
    assert any("INFINIOPS_PRIORITY: unknown operator 'nope_op', ignored (known: add," in w for w in warnings)
    assert any("INFINIOPS_DENY: provider 'zzz' is not loaded" in w for w in warnings)
    assert len(warnings) == 3  # once each, at reload; resolving logs nothing more
    io.resolve("rms_norm", **CPU32)
    assert len([r for r in caplog.records if r.name == "infiniops"]) == 3


def test_malformed_requests_and_fields_raise_clear_errors() -> None:
    with pytest.raises(TypeError, match=r"request 0 is \('rms_norm',\): expected a Problem or an \(op, fields\)"):
        io.resolve_closure([("rms_norm",)])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="request 1 is 'add'"):
        io.resolve_closure([("add", CPU32), "add"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"head_dim=\[64\] must be an int \(its default is 128\), got list"):
        io.explain("flash_attn_varlen", head_dim=[64])
    with pytest.raises(TypeError, match="causal=1 must be a bool"):
        io.make_problem("flash_attn_varlen", causal=1)
    with pytest.raises(TypeError, match="hidden_size=True must be an int"):
        io.make_problem("rms_norm", hidden_size=True)
    with pytest.raises(ValueError, match="head_dim=-3 must be >= 0"):
        io.make_problem("flash_attn_varlen", head_dim=-3)
    with pytest.raises(TypeError, match="device_type=0 must be a str"):
        io.make_problem("add", device_type=0)
    with pytest.raises(TypeError, match="pass one or the other"):
        io.explain(io.make_problem("add"), dtype="float16")
    size = int(torch.randint(1, 9, ()).item()) * 64
    chosen = io.resolve_closure([("rms_norm", {**CPU32, "hidden_size": size}), io.make_problem("add", **CPU32)])
    assert len(chosen) == 2


def test_cli_rejects_bad_counts_sizes_and_paths_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["check", "torch", "--max-examples", "0"], ["check", "torch", "--max-examples", "-1"],
                 ["explain", "flash_attn_varlen", "--head-dim", "-3"], ["explain", "rms_norm", "--width", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert "expected a whole number >= 1" in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    assert main(["matrix", "--op", "add", "--write", str(blocker / "matrix")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"infiniops matrix: cannot write {blocker / 'matrix'}: ") and err.count("\n") == 1
    assert main(["explain", "flash_attn_varlen", "--field", "head_dim=-3"]) == 2
    assert "head_dim=-3 must be >= 0" in capsys.readouterr().err
    assert main(["check", "torch", "--op", "add", "--json", str(tmp_path / "missing" / "r.json")]) == 2
    assert "--json" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["check", "torch", "--op", "add", "--reference-device", "cuda"]) == 2
        assert "this machine has no CUDA device" in capsys.readouterr().err


def test_the_no_cuda_fix_suggests_cpu_only_to_implementations_that_serve_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from infiniops_py import capability

    monkeypatch.setattr(capability, "_cuda_available", lambda: False)
    on_cuda = io.make_problem("add", device_type="cuda", dtype="float16")
    cuda_only = Capability(OneOf("device_type", ("cuda",)))
    either = Capability(OneOf("device_type", ("cuda", "cpu")))
    (only,) = cuda_only.reasons(on_cuda)
    (both,) = either.reasons(on_cuda)
    assert only.fix == "run on a machine with a CUDA GPU"
    assert both.fix == "run on a machine with a CUDA GPU, or use device_type=cpu"
    # a provider that needs CUDA whatever the device (CuPy) says so on a cpu problem, and offers no cpu fix
    needs_cuda = Capability(OneOf("device_type", ("cuda",)), capability.CudaAvailable(always=True))
    on_cpu = io.make_problem("add", device_type="cpu", dtype="float16")
    texts = [str(r) for r in needs_cuda.reasons(on_cpu)]
    assert any("is needed by this provider and not present on this machine" in t for t in texts), texts
    assert all("or use device_type=cpu" not in (r.fix or "") for r in needs_cuda.reasons(on_cpu))
