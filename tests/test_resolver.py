"""The resolver: ranking, cache, use() scopes, environment overrides, fallbacks, gate errors, closures."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from example_plugins import BROKEN, plugin_site
from fakes import correct_add, cpu_capability, fresh_env, registered

import infiniops_py as io
from infiniops_py import GateError, OneOf, Provider, dispatch, hookimpl, plugins
from infiniops_py.cli import main
from infiniops_py.resolver import Settings
from infiniops_py.runtime import get_resolver

CPU32 = {"device_type": "cpu", "dtype": "float32"}


@pytest.fixture(autouse=True)
def _clean_runtime() -> Iterator[None]:
    # set up before (so torn down after) monkeypatch: the reload sees the restored environment
    yield
    io.reload()


@pytest.fixture
def two_fakes() -> Iterator[None]:
    """``high`` (priority 40, float32 only) and ``low`` (priority 30, float32 and float16) serve add on cpu."""
    with registered(
        ("high", [("add", cpu_capability(), 40, correct_add)]),
        ("low", [("add", cpu_capability(dtypes=("float32", "float16")), 30, correct_add)]),
    ):
        yield


def test_highest_priority_accepting_implementation_wins(two_fakes: None) -> None:
    assert io.resolve("add", **CPU32).provider == "high"
    assert io.resolve("add", device_type="cpu", dtype="float16").provider == "low"
    ranking = [c.provider for c in io.explain("add", **CPU32).candidates]
    assert ranking[:2] == ["high", "low"]
    assert ranking[-1] == "reference"


def test_a_resolved_call_is_a_dict_lookup(two_fakes: None) -> None:
    resolver = get_resolver()
    calls = []
    original = resolver.resolve

    def counting(problem, overrides=()):  # type: ignore[no-untyped-def]
        calls.append(problem)
        return original(problem, overrides)

    resolver.resolve = counting  # type: ignore[method-assign]
    a, b = torch.randn(3), torch.randn(3)
    for _ in range(5):
        torch.testing.assert_close(io.add(a, b), a + b)
    assert len(calls) == 1
    assert [impl.provider for key, impl in resolver.cache.items() if key[0] == "add"] == ["high"]


def test_use_scopes_nest_and_restore(two_fakes: None) -> None:
    assert io.resolve("add", **CPU32).provider == "high"
    with io.use("low"):
        assert io.resolve("add", **CPU32).provider == "low"
        with io.use("reference", op="add"):
            assert io.resolve("add", **CPU32).provider == "reference"
        with io.use("high", op="gemm"):  # covers another operator only
            assert io.resolve("add", **CPU32).provider == "low"
        assert io.resolve("add", **CPU32).provider == "low"
    assert io.resolve("add", **CPU32).provider == "high"
    with io.use(deny="high"):
        assert io.resolve("add", **CPU32).provider == "low"


def test_use_follows_contextvars(two_fakes: None) -> None:
    seen: dict[str, str] = {}
    with io.use("low"):
        inherited = contextvars.copy_context()
        thread = threading.Thread(target=lambda: seen.update(thread=io.resolve("add", **CPU32).provider))
        thread.start()
        thread.join()
    assert seen["thread"] == "high"  # a new thread starts with an empty context
    assert inherited.run(lambda: io.resolve("add", **CPU32).provider) == "low"

    async def task(name: str) -> str:
        with io.use(name):
            await asyncio.sleep(0)
            return io.resolve("add", **CPU32).provider

    async def both() -> list[str]:
        return list(await asyncio.gather(task("low"), task("reference")))

    assert asyncio.run(both()) == ["low", "reference"]


def test_forced_provider_never_falls_back(two_fakes: None) -> None:
    with io.use("high"), pytest.raises(GateError) as err:
        io.resolve("add", device_type="cpu", dtype="float16")
    text = str(err.value)
    assert "high" in text and "dtype=float16 not in {float32}" in text
    assert "excludes" in text  # says which providers the scope left out


def test_priority_env_reorders(two_fakes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINIOPS_PRIORITY", "add=low,high")
    io.reload()
    assert io.resolve("add", **CPU32).provider == "low"
    assert io.fallbacks() == []


def test_deny_env_excludes(two_fakes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINIOPS_DENY", "add=high,low")
    io.reload()
    assert io.resolve("add", **CPU32).provider not in ("high", "low")


def test_fallback_is_recorded_and_strict_mode_raises(two_fakes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINIOPS_PRIORITY", "add=high")
    io.reload()
    chosen = io.resolve("add", device_type="cpu", dtype="float16")  # high rejects float16
    assert chosen.provider != "high"
    [fallback] = io.fallbacks()
    assert fallback.chosen == chosen.name and "high" in str(fallback)

    monkeypatch.setenv("INFINIOPS_STRICT", "1")
    io.reload()
    with pytest.raises(GateError, match="INFINIOPS_STRICT=1 forbids this fallback"):
        io.resolve("add", device_type="cpu", dtype="float16")
    assert io.resolve("add", **CPU32).provider == "high"  # no fallback needed: fine in strict mode


def test_sibling_implementation_is_not_a_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    with registered(("two", [("add", cpu_capability(OneOf("inplace", (True,))), 40, correct_add),
                             ("add", cpu_capability(), 35, correct_add)])):
        monkeypatch.setenv("INFINIOPS_STRICT", "1")
        io.reload()
        with io.use("two"):
            assert io.resolve("add", **CPU32).name == "two.add.1"


def test_gate_error_lists_every_candidate_most_likely_fix_first(two_fakes: None) -> None:
    problem = io.make_problem("add", device_type="xpu", dtype="float16")
    with io.use(("high", "low")), pytest.raises(GateError) as info:
        io.resolve(problem)
    err = info.value
    assert err.problem == problem
    reports = {c.provider: c for c in err.candidates}
    assert {r.field for r in reports["high"].rejections} == {"device_type", "dtype"}
    assert [r.field for r in reports["low"].rejections] == ["device_type"]
    assert err.candidates[0].provider == "low"  # one change away, so listed first
    text = str(err)
    assert text.splitlines()[0] == f"no provider can serve add for {problem.describe()}"
    assert "device_type=xpu not in {cpu}" in text
    assert "most likely fix: use device_type=cpu (to use low)" in text


def test_explain_ranks_without_running(two_fakes: None) -> None:
    ex = io.explain("add", device_type="cpu", dtype="float16")
    assert ex.chosen is not None and ex.chosen.provider == "low"
    high = next(c for c in ex.candidates if c.provider == "high")
    assert not high.accepted and high.rejections[0].field == "dtype"
    text = ex.render()
    assert "high" in text and "rejects" in text and "chosen" in text


def test_resolve_closure_reports_every_gap_at_once(two_fakes: None) -> None:
    ok = ("add", CPU32)
    gaps = [("add", {"device_type": "xpu", "dtype": "float32"}), ("add", {"device_type": "cpu", "dtype": "int8"})]
    assert len(io.resolve_closure([ok])) == 1
    with pytest.raises(GateError) as info:
        io.resolve_closure([ok, *gaps])
    err = info.value
    assert len(err.gaps) == 2
    assert str(err).startswith("2 operator problem(s) of this configuration have no provider")
    assert "device_type=xpu" in str(err) and "dtype=int8" in str(err)


def test_unknown_operator_and_field_are_value_errors() -> None:
    with pytest.raises(KeyError, match="unknown operator"):
        io.make_problem("no_such_op")
    with pytest.raises(ValueError, match="unknown problem field"):
        io.make_problem("add", head_dim=64)


def test_trace_calls_writes_one_json_line_per_call() -> None:
    code = ("import torch, infiniops_py as io\n"
            "a = torch.randn(4)\n"
            "io.add(a, a)\n"
            "io.add(a.double(), a.double())\n")
    env = fresh_env(INFINIOPS_TRACE_CALLS="1")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    assert len(records) == 2
    for record, dtype in zip(records, ("float32", "float64")):
        assert set(record) == {"operator_name", "device_type", "dtype", "provider", "implementation", "bucket"}
        assert record["operator_name"] == "add" and record["device_type"] == "cpu" and record["dtype"] == dtype
        assert record["bucket"] == {"numel": 4}
    assert records[1]["provider"] == "reference"  # nothing else declares float64


def test_trace_is_off_by_default() -> None:
    env = fresh_env()
    code = "import torch, infiniops_py as io; io.add(torch.randn(2), torch.randn(2))"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "operator_name" not in run.stderr


class _RaisingHook:
    """A plugin whose hook raises: registered, it is a provider that failed to load."""

    @hookimpl
    def infiniops_provider(self) -> Provider:
        raise RuntimeError("kernel cache corrupt")


def test_strict_mode_refuses_providers_named_but_not_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="infiniops")
    serving = io.resolve("add", **CPU32).provider
    cpu64 = {"device_type": "cpu", "dtype": "float64"}  # only the reference declares float64
    io.register_provider(_RaisingHook(), name="broken")
    try:
        for named, why in (("broken", "it failed to load: RuntimeError: kernel cache corrupt"), ("tpyo", "known: ")):
            monkeypatch.setenv("INFINIOPS_PRIORITY", f"add={named}")
            monkeypatch.delenv("INFINIOPS_STRICT", raising=False)
            caplog.clear()
            io.reload()
            assert io.resolve("add", **CPU32).provider == serving
            assert io.resolve("add", **cpu64).provider == "reference"  # a typo keeps the reference check on
            assert len(io.fallbacks()) == 2, named
            assert all(f"({named}: provider {named!r} is not loaded ({why}" in str(f) for f in io.fallbacks())
            warned = [r.getMessage() for r in caplog.records if repr(named) in r.getMessage()]
            assert len(warned) == 1 and f"INFINIOPS_PRIORITY for add: provider {named!r}" in warned[0], warned

            monkeypatch.setenv("INFINIOPS_STRICT", "1")
            io.reload()
            for fields in (CPU32, cpu64):
                with pytest.raises(GateError) as err:
                    io.resolve("add", **fields)
                assert str(err.value).startswith("INFINIOPS_STRICT=1 refuses to resolve while the configuration "
                                                 f"names what is not loaded: INFINIOPS_PRIORITY for add: provider "
                                                 f"{named!r} is not loaded ({why}")
            assert io.resolve("rms_norm", **CPU32) is not None  # the priority concerns add alone
    finally:
        io.unregister_provider("broken")

    monkeypatch.delenv("INFINIOPS_PRIORITY")
    monkeypatch.syspath_prepend(str(plugin_site(tmp_path, BROKEN)))
    for allowed, why in (("broken", "ImportError: infiniops_broken: libexample_kernels.so not found"),
                         ("nosuch", "no installed distribution has an entry point of that name")):
        monkeypatch.setenv("INFINIOPS_PROVIDERS", allowed)
        monkeypatch.delenv("INFINIOPS_STRICT", raising=False)
        io.reload()
        assert io.resolve("add", **CPU32).provider == "reference"
        [fallback] = io.fallbacks()
        assert f"{allowed}: provider {allowed!r} is not loaded (it failed to load: " in str(fallback)
        assert why in str(fallback)
        monkeypatch.setenv("INFINIOPS_STRICT", "1")
        io.reload()
        with pytest.raises(GateError) as err:
            io.resolve("rms_norm", **CPU32)
        assert f"INFINIOPS_PROVIDERS: provider {allowed!r} is not loaded (it failed to load: " in err.value.headline
        assert why in err.value.headline


def test_boolean_switches_parse_one_way_and_refuse_other_values(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    switches = ("INFINIOPS_STRICT", "INFINIOPS_TRACE_CALLS", "INFINIOPS_DISABLE_PLUGIN_AUTOLOAD")
    for word, on in (("false", False), ("0", False), ("no", False), ("OFF", False), ("", False),
                     ("1", True), ("true", True), (" Yes ", True), ("on", True)):
        for var in switches:
            monkeypatch.setenv(var, word)
        settings = Settings.from_env()
        assert (settings.strict, settings.trace) == (on, on), word
        assert (plugins.discover() == []) is on, word
    for var in switches:
        monkeypatch.delenv(var)
    for var in switches:
        monkeypatch.setenv(var, "maybe")
        with pytest.raises(ValueError, match=f"environment variable {var}='maybe' is not a boolean: use one of 1, "):
            io.reload()
        monkeypatch.setattr(dispatch, "_resolver", None)  # as in a fresh process
        assert main(["providers"]) == 2
        assert capsys.readouterr().err.startswith(f"infiniops providers: environment variable {var}='maybe' ")
        monkeypatch.delenv(var)

    caplog.set_level(logging.WARNING, logger="infiniops")
    monkeypatch.setenv("INFINIOPS_PROVIDERS", "TORCH")
    io.reload()
    assert ("INFINIOPS_PROVIDERS: provider 'TORCH' is not loaded (it failed to load: INFINIOPS_PROVIDERS names "
            "'TORCH', but no installed distribution has an entry point of that name in group infiniops.providers "
            "(installed: ") in caplog.text
    assert not {p.name: p for p in io.providers()}["TORCH"].loaded


def test_gate_report_of_several_problems_says_each_shared_reason_once() -> None:
    problems = [("rms_norm", {"device_type": "xpu", "hidden_size": 64}), ("add", {"device_type": "xpu"}),
                ("gemm", {"device_type": "xpu"}), ("add", {"device_type": "cpu", "dtype": "int8"})]
    with pytest.raises(GateError) as info:
        io.resolve_closure(problems)
    text = str(info.value)
    reason = "device_type=xpu not in {cpu, cuda}"
    assert text.count(reason) == 1, text  # once, numbered, not once per candidate and problem
    shared = next(line for line in text.splitlines() if reason in line)
    number = shared.split()[0]  # [n]
    assert shared.endswith("rejects torch, reference in 3 problems (rms_norm, add, gemm) (fix: use device_type in "
                           "{cpu, cuda})"), shared
    grouped = [line for line in text.splitlines() if f"torch, reference: {number}" in line]
    assert len(grouped) == 3, text  # each xpu problem: its candidates on one line, by reason number
    assert "dtype=int8 not in" in text  # what else is missing stays with its own problem


def test_explanation_render_says_the_most_likely_fix(two_fakes: None) -> None:
    text = io.explain("add", device_type="xpu", dtype="float16").render()
    assert text.splitlines()[-1] == "  most likely fix: use device_type=cpu (to use low)"


def test_meta_calls_are_served_inside_any_provider_scope_and_meta_is_no_candidate_elsewhere() -> None:
    meta = torch.device("meta")
    x = torch.empty(4, 8, device=meta)
    with io.use("torch"), io.use(deny="reference"):
        assert io.add(x, x).shape == (4, 8)
        assert io.rms_norm(x, torch.empty(8, device=meta)).is_meta
    report = io.explain("add", device_type="meta")
    assert [c.provider for c in report.candidates] == ["meta"] and report.chosen is not None
    assert "meta" not in {c.provider for c in io.explain("add", device_type="cpu").candidates}


def test_a_bad_index_check_switch_is_refused_when_the_runtime_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINIOPS_CHECK_INDICES", "banana")
    try:
        with pytest.raises(ValueError, match="INFINIOPS_CHECK_INDICES"):
            io.reload()
    finally:
        monkeypatch.delenv("INFINIOPS_CHECK_INDICES")
        io.reload()
