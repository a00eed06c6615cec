"""Hostile or broken tuning files, timed implementations, plugins, and the arguments of ``infiniops tune``.

A tuning file that cannot be used is ignored with one warning and never hangs or exhausts the process (a FIFO, a
symlink to ``/dev/zero``, JSON nested too deep); two processes adding measurements to one cache file keep both;
``--write`` never replaces what is not a regular file. A timed implementation that exits, a timer that returns
no time, a slow implementation and a NaN budget are each contained. Two providers' implementations that share a
name are told apart, a declaration the ranking cannot use (``graph_safe="no"``) is refused at load, and a
plugin's import check that raises is listed by ``infiniops providers`` as what keeps it from running.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import _Plugin, cpu_capability, fresh_env, isolate_tuning, plant_not_a_file, registered, timed_gemm

import infiniops_py as io
from infiniops_py import Implementation, Provider, runtime
from infiniops_py.problem import Problem
from infiniops_py.tuning import store, tune_calls, tune_problem
from infiniops_py.tuning.store import Measurement, TuningFileError, TuningTable, read_file, write_file

SIZES = {"m": 4, "n": 8, "k": 8}
BUCKET = {"device_type": "cpu", "dtype": "float32", **SIZES}
TESTS = Path(__file__).parent


_gemm = timed_gemm


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Each test has its own cache folder, only the fakes (and reference) serve Gemm, no other INFINIOPS_*."""
    isolate_tuning(monkeypatch, tmp_path / "cache")
    monkeypatch.setenv("INFINIOPS_DENY", "gemm=torch,triton,cupy")
    io.reload()
    yield
    io.reload()


def _provider(name: str, *impls: Implementation) -> Provider:
    return io.register_provider(_Plugin(Provider(name=name, version="0", implementations=list(impls))), name=name)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The tuning file warnings: a file ignored, or entries of it skipped."""
    return [r.getMessage() for r in caplog.records if "tuning file" in r.getMessage()]


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


# -- reading tuning files -----------------------------------------------------------------------------------

def _head() -> dict[str, Any]:
    return {"format": store.FORMAT, "version": store.VERSION, "fingerprint": store.fingerprint("cpu", {})}


@pytest.mark.parametrize("text", [
    '{"format": "infiniops-tuning", "version": 1, "entries": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"format": "infiniops-tuning", "version": 1, "entries": [], "x": ' + "9" * 5000 + "}",
], ids=["nested too deep", "an int of 5000 digits"])
def test_json_that_python_cannot_parse_is_a_corrupt_file(tmp_path: Path, text: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TuningFileError, match="not a tuning file"):
        read_file(path, None)
    with caplog.at_level(logging.WARNING, logger="infiniops"):
        assert store._read_or_warn(path, store.fingerprint("cpu", {})) == []
    assert len(_warnings(caplog)) == 1


def test_a_file_over_the_size_limit_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps({**_head(), "entries": [], "pad": "x" * 4096}))
    monkeypatch.setattr(store, "MAX_BYTES", 1024)
    with pytest.raises(TuningFileError, match=r"larger than 1024 bytes"):
        read_file(path, None)


_READER = """
import logging, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # /dev/zero read whole would take them all
logging.basicConfig(level=logging.WARNING, format="%(message)s")
sys.path.insert(0, {tests!r})
import torch, infiniops_py as io
from fakes import cpu_capability, plant_not_a_file, registered, timed_gemm
with registered(("fake", [("gemm", cpu_capability(), 40, timed_gemm())])):
    path = io.runtime.get_resolver().tuning.cache_file("cpu") if {where!r} == "cache" else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        plant_not_a_file(path, {kind!r})
    print(path or "")
    print("chosen", io.explain("gemm", device_type="cpu", dtype="float32", m=4, n=8, k=8).chosen.provider)
"""


@pytest.mark.parametrize("kind", ["fifo", "symlink to /dev/zero", "directory"])
@pytest.mark.parametrize("where", ["INFINIOPS_TUNING", "cache"])
def test_a_tuning_file_that_is_not_a_regular_file_is_ignored_without_hanging(tmp_path: Path, kind: str,
                                                                            where: str) -> None:
    env = fresh_env(INFINIOPS_CACHE=str(tmp_path / "cache"), INFINIOPS_DENY="gemm=torch,triton,cupy")
    if where == "INFINIOPS_TUNING":
        path = tmp_path / "shipped.json"
        plant_not_a_file(path, kind)
        env["INFINIOPS_TUNING"] = str(path)
    script = _READER.format(tests=str(TESTS), where=where, kind=kind)
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    planted, chosen = run.stdout.splitlines()
    assert chosen == "chosen fake"
    name = planted or str(tmp_path / "shipped.json")
    warned = [x for x in run.stderr.splitlines() if "ignoring tuning file" in x]
    why = "Is a directory" if kind == "directory" else "not a regular file"
    assert len(warned) == 1 and name in warned[0] and why in warned[0], run.stderr


def _two_fakes() -> Any:
    """``slow`` (priority 40, sleeps 2 ms) and ``fast`` (priority 30) serve float32 Gemm on CPU."""
    return registered(("slow", [("gemm", cpu_capability(), 40, _gemm(0.002))]),
                      ("fast", [("gemm", cpu_capability(), 30, _gemm())]))


def _edit_entries(path: Path, edit: Any) -> None:
    data = json.loads(path.read_text())
    edit(data["entries"])
    path.write_text(json.dumps(data))


def test_a_time_beyond_the_float_range_is_one_warning_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    # Issue #30 (1): an int of 401 digits is valid JSON, and float() of it raised OverflowError out of the
    # reader, so every bucketed call (io.gemm here, rms_norm in the issue) failed until the file was deleted.
    with _two_fakes():
        tune_problem("gemm", sizes=SIZES)
        path = runtime.get_resolver().tuning.cache_file("cpu")
        _edit_entries(path, lambda entries: entries[0]["times_us"].update({"fast.gemm.0": 10**400}))
        with caplog.at_level(logging.WARNING, logger="infiniops"):
            for _ in range(2):
                io.reload()
                a, b = torch.randn(SIZES["m"], SIZES["k"]), torch.randn(SIZES["k"], SIZES["n"])
                torch.testing.assert_close(io.gemm(a, b), a @ b)
                assert io.explain("gemm", **BUCKET).chosen.provider == "slow"  # priority order
        warned = _warnings(caplog)
        assert len(warned) == 1 and str(path) in warned[0] and "401 digits" in warned[0], warned


def test_one_bad_entry_is_skipped_and_the_good_ones_are_kept_and_merged(caplog: pytest.LogCaptureFixture) -> None:
    # Issue #30 (6): one malformed entry made the whole cache file unreadable, and the next tune rewrote it
    # with only the new bucket: the two good buckets measured before were lost.
    with _two_fakes():
        for m in (1, 2):
            tune_problem("gemm", sizes={**SIZES, "m": m})
        path = runtime.get_resolver().tuning.cache_file("cpu")
        _edit_entries(path, lambda entries: entries.append({**entries[0], "times_us": {"fast.gemm.0": "quick"}}))
        with caplog.at_level(logging.WARNING, logger="infiniops"):
            io.reload()
            report = tune_problem("gemm", sizes={**SIZES, "m": 1})
            assert report.count("reused") == 1  # the good entry is still read
            assert io.explain("gemm", **{**BUCKET, "m": 2}).chosen.provider == "fast"
            tune_problem("gemm", sizes={**SIZES, "m": 4})  # a third bucket is merged into the file
        assert sorted(m.problem.bucket["m"] for m in read_file(path, None)) == [1, 2, 4]
        warned = _warnings(caplog)
        assert len(warned) == 1 and "skipped 1 of 3 entries" in warned[0] and "'quick'" in warned[0], warned


# -- writing tuning files -----------------------------------------------------------------------------------

def _measurement(tag: str) -> Measurement:
    return Measurement(Problem("gemm", "cpu", "float32", {"tag": tag}, {"m": 1, "n": 1, "k": 1}), {"x": 1e-6})


def test_two_writers_adding_at_once_keep_both_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each add reads the cache file, merges and rewrites it: a second writer in between was lost.
    first, second = TuningTable({"p": "1"}), TuningTable({"p": "1"})
    first.measurements("cpu"), second.measurements("cpu")  # both have read the (missing) file already
    inside, release = threading.Event(), threading.Event()
    read = store._read_or_warn

    def held_open(path: Path, fp: Any) -> list[Measurement]:
        found = read(path, fp)
        if threading.current_thread().name == "first":
            inside.set()
            release.wait(5)
        return found

    monkeypatch.setattr(store, "_read_or_warn", held_open)
    a = threading.Thread(target=first.add, args=([_measurement("a")],), name="first")
    b = threading.Thread(target=second.add, args=([_measurement("b")],), name="second")
    a.start()
    assert inside.wait(5)
    b.start()
    b.join(0.5)  # the second writer either waits for the first (locked) or writes now
    release.set()
    a.join(10)
    b.join(10)
    path = first.cache_file("cpu")
    assert sorted(m.problem.fields["tag"] for m in read_file(path, first.fingerprint("cpu"))) == ["a", "b"]


def test_write_never_replaces_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fp = store.fingerprint("cpu", {})
    link = tmp_path / "out.json"
    link.symlink_to("/dev/null")  # as /dev/stdout is a symlink to a terminal or a pipe
    with pytest.raises(OSError, match="not a regular file"):
        write_file(link, fp, [])
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary file left behind
    target = tmp_path / "real.json"
    target.write_text("old")
    alias = tmp_path / "alias.json"
    alias.symlink_to(target)  # a symlink to a regular file is written through as before (replaced)
    write_file(alias, fp, [])
    assert read_file(alias, fp) == []


def test_a_written_file_has_the_mode_the_umask_gives(tmp_path: Path) -> None:
    # mkstemp made every file 0600: a file written to ship could not be read by the service's user.
    old = os.umask(0o022)
    try:
        write_file(tmp_path / "shipped.json", store.fingerprint("cpu", {}), [])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shipped.json").stat().st_mode) == 0o644


# -- the tuner -------------------------------------------------------------------------------------------

class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


@pytest.mark.parametrize(("raised", "said"), [(SystemExit(3), "SystemExit: 3"),
                                              (_Unprintable(), "_Unprintable: (its message cannot be printed)")])
def test_an_implementation_that_exits_when_timed_is_recorded_as_failed(raised: BaseException, said: str) -> None:
    def exits(*args: Any, **kwargs: Any) -> None:
        raise raised

    with registered(("good", [("gemm", cpu_capability(), 40, _gemm())]),
                    ("exits", [("gemm", cpu_capability(), 30, exits)])):
        report = tune_problem("gemm", sizes=SIZES)
        m = report.results[0].measurement
        assert m is not None and set(m.times) == {"good.gemm.0"}
        assert m.failed["exits.gemm.0"] == said


@pytest.mark.parametrize("bad", [float("nan"), -1e-3, float("inf"), "fast", 10**400],
                         ids=["nan", "negative", "inf", "a string", "an int of 401 digits"])
def test_a_timer_that_returns_no_time_marks_the_implementation_failed(bad: Any) -> None:
    with registered(("one", [("gemm", cpu_capability(), 40, _gemm())]),
                    ("two", [("gemm", cpu_capability(), 30, _gemm())])):
        times = iter([bad, 1e-3])
        report = tune_problem("gemm", sizes=SIZES, timer=lambda fn, device: next(times))
        m = report.results[0].measurement
        assert set(m.times) == {"two.gemm.0"} and f"the timer returned {bad!r}" in m.failed["one.gemm.0"]
        io.reload()  # a new process reads the cache file: it must still be usable
        assert io.explain("gemm", **BUCKET).chosen.provider == "two"
    with pytest.raises(ValueError, match="a time in seconds >= 0"):
        Measurement(io.make_problem("gemm", **BUCKET), {"x": bad})


def test_the_budget_bounds_a_slow_implementation_and_keeps_nothing_of_its_bucket() -> None:
    with registered(("quick", [("gemm", cpu_capability(), 40, _gemm())]),
                    ("sleepy", [("gemm", cpu_capability(), 30, _gemm(0.4))])):
        start = time.perf_counter()
        report = tune_problem("gemm", sizes=SIZES, budget_s=0.2)
        assert time.perf_counter() - start < 1.5  # 8 calls of 0.4 s were made before
        r = report.results[0]
        assert r.status == "skipped" and "budget" in r.note and "sleepy.gemm.0" in r.note
        assert runtime.get_resolver().tuning.lookup(r.problem) is None


@pytest.mark.parametrize("budget", [float("nan"), -1.0])
def test_a_budget_that_is_no_bound_is_refused(budget: float) -> None:
    with pytest.raises(ValueError, match="budget_s"):
        tune_calls([], budget_s=budget)


def test_a_measurement_that_lacks_a_candidate_is_timed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tuned while 'quick' was denied; with the deny lifted, 'quick' had no time, the stale times ranked it last,
    # and the tuner said "reused" without timing it.
    with registered(("quick", [("gemm", cpu_capability(), 50, _gemm())]),
                    ("mid", [("gemm", cpu_capability(), 40, _gemm(0.001))]),
                    ("slow", [("gemm", cpu_capability(), 30, _gemm(0.002))])):
        monkeypatch.setenv("INFINIOPS_DENY", "gemm=torch,triton,cupy,quick")
        io.reload()
        assert set(tune_problem("gemm", sizes=SIZES).results[0].measurement.times) == {"mid.gemm.0", "slow.gemm.0"}
        monkeypatch.setenv("INFINIOPS_DENY", "gemm=torch,triton,cupy")
        io.reload()
        again = tune_problem("gemm", sizes=SIZES).results[0]
        assert again.status == "measured" and "quick.gemm.0" in again.measurement.times
        assert tune_problem("gemm", sizes=SIZES).results[0].status == "reused"  # now complete
        assert io.explain("gemm", **BUCKET).chosen.provider == "quick"


# -- declarations the ranking relies on -------------------------------------------------------------------

class _Truthless:
    def __bool__(self) -> bool:
        raise RuntimeError("no truth value")


class _LyingInt(int):
    def __neg__(self) -> int:
        raise RuntimeError("no negation")


@pytest.mark.parametrize(("field", "value", "said"), [
    ("graph_safe", "no", "graph_safe is str 'no', not a bool"),
    ("graph_safe", _Truthless(), "graph_safe is _Truthless"),
    ("priority", _LyingInt(5), "priority is _LyingInt 5, not an int"),
    ("provider", type("Str", (str,), {})("bad"), "provider is Str 'bad', not a str"),
    ("op", type("Str", (str,), {})("gemm"), "op is Str 'gemm', not a str"),
])
def test_a_declaration_of_a_type_the_ranking_cannot_trust_is_refused_at_load(field: str, value: Any,
                                                                           said: str) -> None:
    values: dict[str, Any] = {"op": "gemm", "provider": "bad", "name": "bad.gemm", "capability": cpu_capability(),
                              "priority": 50, "fn": _gemm(), "graph_safe": True, field: value}
    try:
        loaded = _provider("bad", Implementation(**values))
        assert said in loaded.error and not loaded.implementations
        with registered(("good", [("gemm", cpu_capability(), 10, _gemm())])):
            tune_problem("gemm", sizes=SIZES)
            assert io.explain("gemm", **BUCKET).chosen.provider == "good"
    finally:
        io.unregister_provider("bad")


# -- infiniops tune -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "said"), [
    (["--budget", "nan"], "--budget: expected a number of seconds >= 0"),
    (["--budget", "-1"], "--budget: expected a number of seconds >= 0"),
])
def test_tune_refuses_a_budget_that_is_no_bound(args: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    from infiniops_py.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["tune", "gemm", *args])
    assert exit_.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize(("args", "said"), [
    (["--dtype", "float128"], "unknown dtype 'float128'"),
    (["--dtype", "manual_seed"], "unknown dtype 'manual_seed'"),
    (["--device", "foo"], "unknown device 'foo'"),
    (["--size", "m=10000000", "--size", "n=10000000", "--size", "k=10000000"], "cannot make the inputs"),
    (["--write", "{tmp}"], "is not a regular file"),
    (["--write", "{tmp}/null"], "is not a regular file"),
])
def test_tune_says_what_is_wrong_with_its_arguments_without_a_traceback(
        args: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from infiniops_py.cli import main

    (tmp_path / "null").symlink_to("/dev/null")
    with registered(("one", [("gemm", cpu_capability(), 40, _gemm())]),
                    ("two", [("gemm", cpu_capability(), 30, _gemm())])):
        assert main(["tune", "gemm", *(a.format(tmp=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert (tmp_path / "null").is_symlink()


def test_tune_under_strict_mode_says_why_it_cannot_resolve(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from infiniops_py.cli import main

    monkeypatch.setenv("INFINIOPS_STRICT", "1")
    io.reload()
    with registered(("one", [("gemm", cpu_capability(), 40, _gemm())])):
        assert main(["tune", "gemm", "--dtype", "float64"]) == 1  # only the reference serves float64
    err = capsys.readouterr().err
    assert "infiniops tune: INFINIOPS_STRICT=1 forbids this fallback" in err and "Traceback" not in err


def test_an_infiniops_tuning_that_names_a_folder_is_warned_about_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "folder").mkdir()
    monkeypatch.setenv("INFINIOPS_TUNING", str(tmp_path / "folder"))
    io.reload()
    with caplog.at_level(logging.WARNING, logger="infiniops"), \
            registered(("one", [("gemm", cpu_capability(), 40, _gemm())])):
        assert io.explain("gemm", **BUCKET).chosen.provider == "one"
    assert len(_warnings(caplog)) == 1


# -- infiniops providers ------------------------------------------------------------------------------------

def test_providers_lists_a_plugin_whose_import_check_raises(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # `infiniops providers` called the plugin's Requires.reject itself, and what it raised ended the command.
    from infiniops_py.capability import Requires
    from infiniops_py.cli import main

    monkeypatch.setenv("COLUMNS", "300")  # the status cell on one line

    class Raising(Requires):
        def reject(self, problem: Problem) -> None:
            raise RuntimeError("the check raised")

    impl = Implementation("gemm", "bad", "bad.gemm", cpu_capability(Raising("os")), 5, _gemm())
    try:
        assert not _provider("bad", impl).error
        assert main(["providers"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("│ bad "))
        assert "loaded; cannot run: import=None (constraint needs os raised RuntimeError: the check raised)" in line
    finally:
        io.unregister_provider("bad")
