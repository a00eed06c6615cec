"""Measured resolution: size buckets, the tuner, measured ranking, persistence, explain and the trace line.

Fake providers serve Gemm on the CPU: ``slow`` (priority 40) sleeps in every call, ``fast`` (priority 30) does
not, so the real timer orders them; where a tie is needed a fake timer returns controlled times.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import cpu_capability, isolate_tuning, registered, timed_gemm

import infiniops_py as io
from infiniops_py import GateError, runtime
from infiniops_py.problem import size_class
from infiniops_py.tuning import NOISE_MARGIN, CapturedCall, recording, tune_calls, tune_problem
from infiniops_py.tuning import timer as timer_module
from infiniops_py.tuning.store import Measurement, TuningFileError, read_file

SIZES = {"m": 4, "n": 8, "k": 8}
BUCKET = {"device_type": "cpu", "dtype": "float32", **SIZES}
SLEEP_S = 0.004


_gemm = timed_gemm


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test has its own cache folder and no INFINIOPS_* settings; the runtime is rebuilt after it."""
    isolate_tuning(monkeypatch, tmp_path / "cache")
    yield
    io.reload()


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture(autouse=True)
def _only_fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled providers' Gemm is denied: the fakes (and the last-resort reference) are the candidates."""
    monkeypatch.setenv("INFINIOPS_DENY", "gemm=torch,triton,cupy")
    io.reload()


@pytest.fixture
def fakes(calls: list[str]) -> Iterator[None]:
    """``slow`` (priority 40, sleeps SLEEP_S per call) and ``fast`` (priority 30) serve float32 Gemm on CPU."""
    with registered(("slow", [("gemm", cpu_capability(), 40, _gemm(SLEEP_S, calls, "slow"))]),
                    ("fast", [("gemm", cpu_capability(), 30, _gemm(0.0, calls, "fast"))])):
        yield


def _call() -> torch.Tensor:
    a, b = torch.randn(SIZES["m"], SIZES["k"]), torch.randn(SIZES["k"], SIZES["n"])
    return io.gemm(a, b)


def test_size_class_is_the_power_of_two_at_or_above() -> None:
    assert [size_class(n) for n in (0, 1, 2, 3, 4, 5, 100, 128, 129, 8192)] == [0, 1, 2, 4, 4, 8, 128, 128, 256, 8192]


def test_a_problem_takes_all_of_its_bucket_sizes_or_none() -> None:
    assert io.make_problem("gemm", m=100, n=4096, k=1000).bucket == {"m": 128, "n": 4096, "k": 1024}
    assert io.make_problem("gemm").bucket == {}
    with pytest.raises(ValueError, match="needs m, n, k; got m, missing n, k"):
        io.make_problem("gemm", m=1)
    with pytest.raises(TypeError, match="size m=True must be an int"):
        io.make_problem("gemm", m=True, n=1, k=1)


def test_the_dispatch_key_carries_the_bucket_of_the_call(fakes: None) -> None:
    with recording() as seen:
        _call()
    assert [c.problem.bucket for c in seen] == [{"m": 4, "n": 8, "k": 8}]
    assert seen[0].problem == io.make_problem("gemm", **BUCKET)


def test_recording_keeps_the_calls_of_its_own_thread_only(fakes: None) -> None:
    """A block records the calls of its thread: another thread's calls meanwhile (an engine's server thread)
    run unrecorded, and a recording block on that thread sees only its own."""
    started, stop = threading.Event(), threading.Event()
    theirs: list[list[CapturedCall]] = []

    def other() -> None:
        with recording() as seen:
            io.gemm(torch.randn(16, 8), torch.randn(8, 8))
            started.set()
            stop.wait(5)
        theirs.append(seen)

    thread = threading.Thread(target=other)
    with recording() as mine:
        thread.start()
        started.wait(5)
        _call()
        stop.set()
        thread.join()
    assert [c.problem.bucket for c in mine] == [{"m": 4, "n": 8, "k": 8}]
    assert [c.problem.bucket for c in theirs[0]] == [{"m": 16, "n": 8, "k": 8}]


def test_without_measurements_priority_decides(fakes: None, calls: list[str]) -> None:
    _call()
    assert calls == ["slow"]
    assert "nothing measured for this bucket" in io.explain("gemm", **BUCKET).why


def test_tuning_makes_the_fastest_win_over_priority(fakes: None, calls: list[str]) -> None:
    _call()  # a decision cached before tuning must not survive it
    report = tune_problem("gemm", sizes=SIZES)
    assert report.count("measured") == 1
    times = report.results[0].measurement.times
    assert times["slow.gemm.0"] >= SLEEP_S > times["fast.gemm.0"]
    calls.clear()
    _call()
    assert calls == ["fast"]
    ex = io.explain("gemm", **BUCKET)
    assert ex.chosen.name == "fast.gemm.0" and [c.provider for c in ex.candidates][:2] == ["fast", "slow"]
    assert "is the fastest measured" in ex.why


@pytest.mark.parametrize("graph_safe", [True, False])
def test_an_implementation_that_cannot_be_captured_is_never_promoted_by_time(calls: list[str],
                                                                            graph_safe: bool) -> None:
    # CuPy's cuBLAS Gemm was measured fastest for a bucket and chosen: every CUDA-graph capture of the engine
    # then failed (CuPy refuses cuBLAS calls during stream capture). Only graph-safe implementations are timed,
    # so the faster, lower-priority one wins by time only when it can be captured.
    from fakes import _Plugin

    from infiniops_py import Implementation, Provider

    fast = Implementation("gemm", "other", "other.gemm.0", cpu_capability(), 30, _gemm(0.0, calls, "other"),
                          graph_safe=graph_safe)
    io.register_provider(_Plugin(Provider(name="other", version="0", implementations=[fast])), name="other")
    try:
        with registered(("slow", [("gemm", cpu_capability(), 40, _gemm(SLEEP_S, calls, "slow"))])):
            report = tune_problem("gemm", sizes=SIZES)
            timed = [r.measurement.times for r in report.results if r.measurement is not None]
            assert any("other.gemm.0" in t for t in timed) == graph_safe, timed
            calls.clear()
            _call()
            assert calls == (["other"] if graph_safe else ["slow"])
    finally:
        io.unregister_provider("other")


def test_every_cupy_implementation_is_marked_not_graph_safe() -> None:
    from infiniops_cupy import infiniops_provider

    impls = infiniops_provider().implementations
    assert impls and not any(i.graph_safe for i in impls)


def test_a_tie_inside_the_noise_margin_goes_to_priority(fakes: None, calls: list[str]) -> None:
    table = {"slow": 1.0e-3, "fast": 1.0e-3 * (1 - NOISE_MARGIN / 2)}  # fast is faster, but inside the margin

    def fake_timer(fn: Callable[[], Any], device_type: str) -> float:
        fn()
        return table[calls[-1]]

    tune_problem("gemm", sizes=SIZES, timer=fake_timer)
    ex = io.explain("gemm", **BUCKET)
    assert ex.chosen.provider == "slow"
    assert "within 5% of fast.gemm.0" in ex.why and "higher priority (40 > 30)" in ex.why
    table["fast"] = 1.0e-3 * (1 - 2 * NOISE_MARGIN)  # outside the margin: the faster one wins
    tune_problem("gemm", sizes=SIZES, timer=fake_timer, force=True)
    assert io.explain("gemm", **BUCKET).chosen.provider == "fast"


def test_explain_shows_each_candidates_time_and_why(fakes: None) -> None:
    tune_problem("gemm", sizes=SIZES)
    text = io.explain("gemm", **BUCKET).render()
    assert "size bucket m<=4, n<=8, k<=8" in text
    assert "fast (fast.gemm.0, priority 30, measured " in text and "slow (slow.gemm.0, priority 40, measured " in text
    line = next(x for x in text.splitlines() if x.strip().startswith("chosen: "))
    assert line.strip().startswith("chosen: fast.gemm.0 ") and "; slow.gemm.0 " in line and "measured 20" in line
    assert "why: fast.gemm.0 is the fastest measured" in text


def test_overrides_win_over_measurement(fakes: None, calls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    tune_problem("gemm", sizes=SIZES)
    with io.use("slow"):
        assert io.explain("gemm", **BUCKET).chosen.provider == "slow"
        calls.clear()
        _call()
        assert calls == ["slow"]
    with io.use(deny="fast"):
        assert io.explain("gemm", **BUCKET).chosen.provider == "slow"
    monkeypatch.setenv("INFINIOPS_PRIORITY", "gemm=slow")
    io.reload()
    ex = io.explain("gemm", **BUCKET)
    assert ex.chosen.provider == "slow" and "INFINIOPS_PRIORITY prefers provider 'slow'" in ex.why
    monkeypatch.setenv("INFINIOPS_TUNING", "off")
    monkeypatch.delenv("INFINIOPS_PRIORITY")
    io.reload()
    assert io.explain("gemm", **BUCKET).chosen.provider == "slow"


def test_strict_mode_still_forbids_a_fallback_after_tuning(fakes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    tune_problem("gemm", sizes=SIZES)
    monkeypatch.setenv("INFINIOPS_STRICT", "1")
    io.reload()
    with io.use("slow"), pytest.raises(GateError):  # slow rejects float64: no silent fallback to fast
        io.resolve("gemm", device_type="cpu", dtype="float64", **SIZES)


def test_measurements_persist_and_a_later_process_reuses_them(fakes: None, tmp_path: Path) -> None:
    first = tune_problem("gemm", sizes=SIZES)
    path = runtime.get_resolver().tuning.cache_file("cpu")
    assert path is not None and path.parent == tmp_path / "cache" and path.is_file()
    saved = read_file(path, runtime.get_resolver().tuning.fingerprint("cpu"))
    assert [m.problem for m in saved] == [first.results[0].measurement.problem]
    assert saved[0].times == pytest.approx(first.results[0].measurement.times, abs=1e-9)  # kept to 1 ns
    io.reload()  # a new resolver reads the file again, as a new process does
    again = tune_problem("gemm", sizes=SIZES)
    assert again.count("reused") == 1 and again.count("measured") == 0
    assert io.explain("gemm", **BUCKET).chosen.provider == "fast"


def test_a_written_file_ships_to_another_cache(fakes: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tune_problem("gemm", sizes=SIZES)
    shipped = tmp_path / "h200.json"
    assert runtime.get_resolver().tuning.write(shipped, "cpu") == 1
    monkeypatch.setenv("INFINIOPS_CACHE", str(tmp_path / "elsewhere"))
    io.reload()
    assert io.explain("gemm", **BUCKET).chosen.provider == "slow"  # the new cache knows nothing
    monkeypatch.setenv("INFINIOPS_TUNING", str(shipped))
    io.reload()
    assert io.explain("gemm", **BUCKET).chosen.provider == "fast"


def _rewrite(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("damage", ["foreign", "corrupt", "bad entry"])
def test_a_foreign_or_corrupt_file_is_ignored_with_one_warning(
        fakes: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        damage: str) -> None:
    tune_problem("gemm", sizes=SIZES)
    shipped = tmp_path / "shipped.json"
    runtime.get_resolver().tuning.write(shipped, "cpu")
    if damage == "foreign":
        _rewrite(shipped, lambda d: d["fingerprint"].update(device="NVIDIA H200"))
    elif damage == "corrupt":
        shipped.write_text('{"format": "infiniops-tuning", "vers')
    else:
        _rewrite(shipped, lambda d: d["entries"][0].update(times_us={"fast.gemm.0": "quick"}))
    if damage == "bad entry":  # skipped, with the warning below; the file's other entries (none) are used
        assert read_file(shipped, runtime.get_resolver().tuning.fingerprint("cpu")) == []
    else:
        with pytest.raises(TuningFileError):
            read_file(shipped, runtime.get_resolver().tuning.fingerprint("cpu"))
    monkeypatch.setenv("INFINIOPS_CACHE", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("INFINIOPS_TUNING", str(shipped))
    with caplog.at_level(logging.WARNING, logger="infiniops"):
        for _ in range(3):
            io.reload()
            assert io.explain("gemm", **BUCKET).chosen.provider == "slow"  # ignored: priority decides
    warnings = [r.getMessage() for r in caplog.records if "tuning file" in r.getMessage()]
    assert len(warnings) == 1 and str(shipped) in warnings[0]
    if damage == "bad entry":
        assert "skipped 1 of 1 entries (the first, entry 0: " in warnings[0] and "'quick'" in warnings[0]
    if damage == "foreign":
        assert "device='NVIDIA H200' there" in warnings[0]


def test_the_trace_line_carries_the_bucket(fakes: None, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("INFINIOPS_TRACE_CALLS", "1")
    io.reload()
    _call()
    record = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert record["operator_name"] == "gemm" and record["bucket"] == {"m": 4, "n": 8, "k": 8}


def test_nothing_is_timed_during_cuda_graph_capture(fakes: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timer_module, "capturing", lambda: True)
    with pytest.raises(timer_module.CaptureError):
        timer_module.measure(lambda: None, "cpu")
    from infiniops_py.tuning import tuner

    monkeypatch.setattr(tuner, "capturing", lambda: True)
    report = tune_problem("gemm", sizes=SIZES)
    assert report.count("skipped") == 1 and "captured" in report.results[0].note


def test_tuning_is_bounded_in_time(fakes: None) -> None:
    with recording() as seen:
        for m in (1, 2, 4, 8):
            io.gemm(torch.randn(m, 8), torch.randn(8, 8))
    report = tune_calls(seen, budget_s=0.0)
    assert report.count("skipped") == 4 and all("budget" in r.note for r in report.results)


def test_an_implementation_that_raises_when_timed_is_never_chosen_by_time(calls: list[str]) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("kernel launch failed")

    with registered(("slow", [("gemm", cpu_capability(), 40, _gemm(SLEEP_S, calls, "slow"))]),
                    ("broken", [("gemm", cpu_capability(), 30, broken)])):
        tune_problem("gemm", sizes=SIZES)
        ex = io.explain("gemm", **BUCKET)
        assert ex.chosen.provider == "slow"
        assert ex.measurement is not None and "kernel launch failed" in ex.measurement.failed["broken.gemm.0"]
        assert "failed when timed: RuntimeError: kernel launch failed" in ex.render()


def test_a_measurement_round_trips_through_its_json() -> None:
    problem = io.make_problem("gemm", **BUCKET)
    m = Measurement(problem, {"a": 3.1e-5, "b": 7.2e-5}, dict(SIZES), {"c": "ValueError: no"}, "cpu x", "2026-12-01")
    back = Measurement.from_json(json.loads(json.dumps(m.as_json())))
    assert back.problem == problem and back.times == pytest.approx(m.times) and back.failed == m.failed
    assert (back.sizes, back.device, back.measured) == (m.sizes, m.device, m.measured)


def test_the_tune_command_times_an_operator_and_writes_a_file(fakes: None, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from infiniops_py.cli import main

    out_file = tmp_path / "tuned.json"
    sizes = [x for k, v in SIZES.items() for x in ("--size", f"{k}={v}")]
    assert main(["tune", "gemm", *sizes, "--write", str(out_file)]) == 0
    text = capsys.readouterr().out
    assert "gemm float32 m<=4, n<=8, k<=8: measured: fast.gemm.0 " in text
    assert "chosen: fast.gemm.0 " in text and "wrote 1 measurement(s)" in text
    assert [m.problem for m in read_file(out_file, None)] == [io.make_problem("gemm", **BUCKET)]
    assert main(["tune", "gemm", "--size", "q=1"]) == 2
    assert "unknown size(s) ['q']" in capsys.readouterr().err
    assert main(["tune", "all_reduce"]) == 2  # a collective has no size bucket
    assert "all_reduce has no size bucket" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["tune", "gemm", "--device", "cuda"]) == 2
        assert "--device cuda: this machine has no CUDA device" in capsys.readouterr().err
