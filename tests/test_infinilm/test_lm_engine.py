"""The engine under pressure: admission control, preemption, cancellation, stops, and a 500-request soak."""

from __future__ import annotations

import random

import pytest
from lm_helpers import CheckpointFactory

from infinilm import Engine, EngineOptions, FinishReason, SamplingParams
from infinilm.sequence import SeqStatus


def _engine(checkpoint: CheckpointFactory, **options: object) -> Engine:
    path, _ = checkpoint("llama")
    return Engine.from_pretrained(path, EngineOptions(**{"block_size": 8, "max_model_len": 64, **options}))


def _prompts(n: int, seed: int, lo: int = 1, hi: int = 15) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 255) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def test_exhausted_blocks_queue_requests_and_every_output_stays_right(checkpoint: CheckpointFactory) -> None:
    prompts = _prompts(6, seed=1, lo=5, hi=15)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    roomy = _engine(checkpoint, num_blocks=64)
    expected = [roomy.generate([p], params)[0] for p in prompts]

    tight = _engine(checkpoint, num_blocks=8)  # 64 token slots: about two of these requests at a time
    seqs = [tight.add_request(p, params) for p in prompts]
    queued_while_running = 0
    while tight.has_work():
        tight.step()
        sched = tight.scheduler
        queued_while_running += bool(sched.waiting and sched.running)
        assert tight.cache.allocator.num_free + sum(len(s.block_table) for s in sched.running) == 8
    assert queued_while_running > 0
    assert tight.scheduler.num_preemptions > 0  # decodes outgrew the cache: recompute preemption ran
    assert [s.output for s in seqs] == expected
    assert all(s.finish_reason is FinishReason.LENGTH for s in seqs)
    assert tight.cache.allocator.num_free == 8


def test_cancellation_frees_blocks_of_running_and_waiting_requests(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=16, max_num_seqs=2)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    a, b, c = (engine.add_request(p, params) for p in _prompts(3, seed=2, lo=9, hi=12))
    engine.step()
    engine.step()
    assert a.status is SeqStatus.RUNNING and c.status is SeqStatus.WAITING
    free, held = engine.cache.allocator.num_free, len(a.block_table)
    assert held > 0 and engine.cancel(a)
    assert engine.cache.allocator.num_free == free + held and a.block_table == []
    assert engine.cancel(c) and c not in engine.scheduler.waiting
    assert not engine.cancel(a)  # already finished
    while engine.has_work():
        engine.step()
    assert (a.finish_reason, b.finish_reason, c.finish_reason) == (
        FinishReason.CANCELLED, FinishReason.LENGTH, FinishReason.CANCELLED)
    assert c.output == [] and b.num_output == 20
    assert engine.cache.allocator.num_free == 16


def test_stop_tokens_and_eos_end_a_request(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=32)
    prompt = _prompts(1, seed=3)[0]
    free_run = engine.generate([prompt], SamplingParams(max_new_tokens=10, ignore_eos=True))[0]
    stop = free_run[3]
    seq = engine.add_request(prompt, SamplingParams(max_new_tokens=10, stop_token_ids=(stop,)))
    list(engine.stream())
    assert seq.output == free_run[: free_run.index(stop) + 1]
    assert seq.finish_reason is FinishReason.EOS
    ignoring = engine.add_request(prompt, SamplingParams(max_new_tokens=10, stop_token_ids=(stop,), ignore_eos=True))
    list(engine.stream())
    assert ignoring.output == free_run and ignoring.finish_reason is FinishReason.LENGTH


def test_seeded_sampling_is_reproducible_across_batches(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=32)
    prompt, other = _prompts(2, seed=4)
    hot = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=7, ignore_eos=True)
    alone = engine.generate([prompt], hot)[0]
    together = engine.generate([other, prompt], hot)[1]
    assert alone == together


def test_requests_that_can_never_run_are_rejected_up_front(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=8)
    with pytest.raises(ValueError, match="at least one token"):
        engine.add_request([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.add_request([1, 256])
    with pytest.raises(ValueError, match="max_model_len"):
        engine.add_request([1] * 64)
    assert not engine.has_work()


def test_soak_of_500_short_requests_leaves_every_block_free(checkpoint: CheckpointFactory) -> None:
    engine = _engine(checkpoint, num_blocks=24, max_num_seqs=32, block_size=4)
    rng = random.Random(5)
    prompts = _prompts(500, seed=6, lo=1, hi=8)
    seqs, cancelled = [], set()
    pending = list(prompts)
    while pending or engine.has_work():
        for _ in range(rng.randint(0, 40)):
            if pending:
                params = SamplingParams(max_new_tokens=rng.randint(1, 6), ignore_eos=rng.random() < 0.5)
                seqs.append(engine.add_request(pending.pop(), params))
        engine.step()
        if seqs and rng.random() < 0.3:
            victim = rng.choice(seqs)
            if engine.cancel(victim):
                cancelled.add(victim.id)
    assert len(seqs) == 500 and all(s.finished for s in seqs)
    for s in seqs:
        if s.id in cancelled:
            assert s.finish_reason is FinishReason.CANCELLED
        elif s.finish_reason is FinishReason.LENGTH:
            assert s.num_output == s.params.max_new_tokens
        else:
            assert s.output[-1] in engine.config.eos_token_ids and not s.params.ignore_eos
    assert cancelled
    assert engine.cache.allocator.num_free == 24
    assert not engine.scheduler.waiting and not engine.scheduler.running


def test_unchecked_index_mode_gives_the_same_tokens(checkpoint: CheckpointFactory,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from infiniops_py.operators import _base

    seen: list[bool] = []
    real = _base.is_checked
    monkeypatch.setattr(_base, "is_checked", lambda device: seen.append(real(device)) or seen[-1])
    prompts = _prompts(3, seed=8)
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    checked = _engine(checkpoint, num_blocks=16).generate(prompts, params)
    assert seen and all(seen)  # the default on CPU: every index is range-checked
    seen.clear()
    assert _engine(checkpoint, num_blocks=16, check_indices=False).generate(prompts, params) == checked
    assert seen and not any(seen)
