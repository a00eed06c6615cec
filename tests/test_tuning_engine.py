"""The engine tunes and warms its closure's buckets at build (INFINILM_TUNE) and a second build reuses the times.

A tiny Qwen3 (tests/test_infinilm/lm_helpers.py) on the CPU; a fake ``fast`` provider serves Gemm next to the
bundled torch provider, so every Gemm bucket has two candidates to time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fakes import cpu_capability, isolate_tuning, registered

import infiniops_py as io
from infinilm import Engine, EngineOptions
from infinilm.engine.warmup import buckets, tuning_wanted

sys.path.insert(0, str(Path(__file__).resolve().parent / "test_infinilm"))
from lm_helpers import hf_model

OPTIONS = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 64, "num_blocks": 16}


def _matmul(a: torch.Tensor, b: torch.Tensor, c: Any, bias: Any, alpha: float, beta: float, trans_a: bool,
            trans_b: bool, out: torch.Tensor) -> torch.Tensor:
    op_a = a.transpose(-1, -2) if trans_a else a
    op_b = b.transpose(-1, -2) if trans_b else b
    y = torch.matmul(op_a, op_b) * alpha
    if c is not None:
        y = y + beta * c
    if bias is not None:
        y = y + bias
    return out.copy_(y)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3")
    hf_model("qwen3", tied=False).save_pretrained(str(path))
    return path


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    isolate_tuning(monkeypatch, tmp_path / "cache", "INFINIOPS_DENY", "INFINILM_TUNE_BUDGET")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with registered(("fast", [("gemm", cpu_capability(), 5, _matmul)])):
        yield
    torch.set_num_threads(threads)
    io.reload()


def test_tuning_at_build_is_off_on_cpu_unless_asked(qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("INFINILM_TUNE", raising=False)
    assert not tuning_wanted(torch.device("cpu")) and tuning_wanted(torch.device("cuda"))
    engine = Engine.from_pretrained(qwen3, EngineOptions(**OPTIONS))
    assert not engine.warmup.ran and engine.warmup.tuning.results == []
    monkeypatch.setenv("INFINILM_TUNE", "maybe")
    with pytest.raises(ValueError, match="INFINILM_TUNE"):
        tuning_wanted(torch.device("cpu"))


def test_the_buckets_are_the_prefill_classes_and_the_decode_batch_sizes(qwen3: Path) -> None:
    engine = Engine.from_pretrained(qwen3, EngineOptions(**OPTIONS))
    assert buckets(engine) == ([1, 2, 4, 8, 16, 32, 64], [1, 2, 4])


def test_a_second_build_reuses_the_tuning_of_the_first(qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINILM_TUNE", "1")
    first = Engine.from_pretrained(qwen3, EngineOptions(**OPTIONS)).warmup
    assert first.ran and first.tuning.count("measured") > 0
    gemm = [r for r in first.tuning.results if r.problem.op == "gemm"]
    assert {r.problem.bucket["m"] for r in gemm} >= {1, 2, 4, 8, 16, 32, 64}  # every prefill and decode class
    assert all(r.status == "measured" and set(r.measurement.times) == {"torch.addmm", "fast.gemm.0"} for r in gemm)
    assert all(r.problem in first.chosen for r in gemm)  # the second pass ran every bucket's winner
    io.reload()  # a new resolver reads the cache file, as a new process on the same machine does
    start = time.perf_counter()
    second = Engine.from_pretrained(qwen3, EngineOptions(**OPTIONS)).warmup
    assert second.tuning.count("measured") == 0 and second.tuning.count("reused") == first.tuning.count("measured")
    assert second.tuning.seconds < 1.0 and second.seconds < time.perf_counter() - start
    assert "reused" in second.summary() and "decode batch sizes up to 4" in second.summary()


def test_the_engine_runs_the_measured_winner(qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFINILM_TUNE", "1")
    engine = Engine.from_pretrained(qwen3, EngineOptions(**OPTIONS))
    for problem, impl in engine.warmup.chosen.items():
        m = io.explain(problem).measurement
        if m is not None and len(m.times) > 1:  # the winner is the measured order's first
            fastest = min(m.times, key=m.times.__getitem__)
            assert impl.name == fastest or m.times[impl.name] <= m.times[fastest] * 1.05
    out = engine.generate([[1, 2, 3]], None)
    assert len(out[0]) > 0


def test_bench_reports_the_cold_first_request_apart_from_the_steady_state(qwen3: Path, tmp_path: Path) -> None:
    from infinilm.bench import run_bench

    engine = Engine.from_pretrained(qwen3, EngineOptions(**OPTIONS))
    result = run_bench(engine, 2, 8, 3, repeats=2)
    assert result.runs == 2 and len(result.decode_step_seconds) == 2 * 2 and len(result.cold_decode_step_seconds) == 2
    assert result.cold_prefill_seconds > 0 and result.prefill_seconds > 0
    data = result.as_dict()
    assert data["runs"] == 2 and set(data["cold_first_request"]) == {"prefill_ms", "decode_step", "total_ms"}
    assert "cold first request: prefill" in result.table()


def test_the_tune_command_tunes_a_models_closure(qwen3: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from infiniops_py.cli import main

    monkeypatch.delenv("INFINILM_TUNE", raising=False)
    assert main(["tune", "--model", str(qwen3)]) == 0
    captured = capsys.readouterr()
    assert "gemm float32 m<=1, " in captured.out and ": measured: " in captured.out
    assert "tuning and warm-up: " in captured.err
    assert "INFINILM_TUNE" not in os.environ  # the command's switch does not outlive it
    assert main(["tune", "--model", str(qwen3), "--force"]) == 2


def test_the_warm_up_samples_once_so_a_compiling_sampler_compiles_before_the_first_request(
        qwen3: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton sampler compiles one kernel per logits dtype and row class (1, a multiple of 16, other): the
    warm-up calls the operator with sampled rows of the model's logits for each class up to the largest decode
    batch (4 here), as requests would (the greedy argmax needs none)."""
    from infinilm.engine import warmup

    seen: list[tuple[tuple[int, ...], torch.dtype, bool]] = []
    original = warmup.sample_ids

    def spy(logits: torch.Tensor, seqs: Any) -> torch.Tensor:
        seen.append((tuple(logits.shape), logits.dtype, all(s.params.temperature > 0 for s in seqs)))
        return original(logits, seqs)

    monkeypatch.setattr(warmup, "sample_ids", spy)
    monkeypatch.setenv("INFINILM_TUNE", "1")
    engine = Engine.from_pretrained(qwen3, EngineOptions(**OPTIONS))
    assert engine.warmup.ran
    assert seen == [((n, engine.config.vocab_size), torch.float32, True) for n in (1, 2, 4)]
    monkeypatch.setenv("INFINILM_TUNE", "0")
    seen.clear()
    Engine.from_pretrained(qwen3, EngineOptions(**OPTIONS))
    assert seen == []
