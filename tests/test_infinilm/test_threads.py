"""The CPU engine's thread count (`infinilm.engine.threads`): the user's choice kept, the calibration's decision
(on fixed step times: no test here depends on timing), and the count applied inside the engine's calls only."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from lm_helpers import CheckpointFactory

from infinilm import Engine, EngineOptions, SamplingParams
from infinilm.engine import threads


@pytest.fixture
def four_default_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's default taken as 4 threads, the current count 4, no thread variable in the environment."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "default_threads", lambda: 4)
    torch.set_num_threads(4)  # the autouse fixture of conftest.py restores the count afterwards


def _timed(monkeypatch: pytest.MonkeyPatch, seconds: dict[int, float | None]) -> list[int]:
    """The calibration's timings replaced by `seconds` per thread count (each step still runs once, at that
    count); returns the counts it asked for."""
    asked: list[int] = []

    def fixed(step: Callable[[], object], n: int) -> float | None:
        with threads.using_threads(n):
            step()
        asked.append(n)
        return seconds[n]

    monkeypatch.setattr(threads, "_median_step_s", fixed)
    return asked


@pytest.mark.usefixtures("four_default_threads")
def test_one_thread_wins_unless_the_default_is_clearly_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _timed(monkeypatch, {1: 0.004, 4: 0.020})
    assert threads.calibrate_threads(lambda: None) == (
        1, "cpu threads: 1 (calibrated: decode step 4.00 ms at 1 thread, 20.00 ms at 4)")
    assert asked == [1, 4]
    _timed(monkeypatch, {1: 0.010, 4: 0.009})  # faster, but by less than MARGIN
    assert threads.calibrate_threads(lambda: None)[0] == 1
    _timed(monkeypatch, {1: 0.010, 4: 0.010 / threads.MARGIN})
    assert threads.calibrate_threads(lambda: None)[0] == 4
    asked = _timed(monkeypatch, {1: None, 4: 0.001})  # a step over SLOW_S at one thread: keep torch's count
    assert threads.calibrate_threads(lambda: None) == (None, "cpu threads: 4 (torch's default: a decode step takes "
                                                             "over 250 ms)")
    assert asked == [1]
    _timed(monkeypatch, {1: 0.2, 4: None})  # over SLOW_S at torch's count (a loaded machine): one thread
    assert threads.calibrate_threads(lambda: None) == (1, "cpu threads: 1 (calibrated: decode step 200.00 ms at 1 "
                                                          "thread, over 250 ms at 4)")
    assert torch.get_num_threads() == 4


@pytest.mark.usefixtures("four_default_threads")
@pytest.mark.parametrize("how", ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "set_num_threads"])
def test_a_users_count_is_kept_and_never_timed(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    asked = _timed(monkeypatch, {1: 0.001, 4: 1.0, 3: 1.0})
    if how == "set_num_threads":
        torch.set_num_threads(3)
        why = "torch.set_num_threads(3), not torch's default of 4"
    else:
        monkeypatch.setenv(how, "4")
        why = f"{how}=4"
    count = torch.get_num_threads()
    assert threads.calibrate_threads(lambda: None) == (None, f"cpu threads: {count} (the user's: {why})")
    assert asked == []


def test_using_threads_restores_the_callers_count_also_after_an_error() -> None:
    torch.set_num_threads(2)
    with threads.using_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(KeyError), threads.using_threads(1):
        raise KeyError("x")
    assert torch.get_num_threads() == 2
    with threads.using_threads(None):
        assert torch.get_num_threads() == 2


def test_default_threads_counts_cores() -> None:
    assert threads.default_threads() >= 1


@pytest.mark.usefixtures("four_default_threads")
@pytest.mark.parametrize("family", ["qwen3", "mamba2"])
def test_the_engine_runs_its_steps_at_its_count_and_leaves_the_callers(checkpoint: CheckpointFactory,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       family: str) -> None:
    """The calibration runs the engine's own decode step of padding rows (each kind of runner); the engine then
    runs at its count and hands the caller's back."""
    path, _ = checkpoint(family)
    _timed(monkeypatch, {1: 0.001, 4: 0.010})
    engine = Engine.from_pretrained(path, EngineOptions(block_size=8, num_blocks=16, max_model_len=64))
    assert engine.cpu_threads == 1 and engine.threads_status.startswith("cpu threads: 1 (calibrated: ")
    assert engine.status == f"cuda graphs: off (not on CUDA); {engine.threads_status}"
    seen = []
    forward = engine.model.forward

    def counting(*args: object) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return forward(*args)

    monkeypatch.setattr(engine.model, "forward", counting)
    assert len(engine.generate([[3, 4, 5]], SamplingParams(max_new_tokens=3))[0]) == 3
    assert seen == [1, 1, 1] and torch.get_num_threads() == 4
