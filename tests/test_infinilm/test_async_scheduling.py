"""Async scheduling (`infinilm.engine.overlap`): the same tokens as the synchronous engine, none extra.

Each scenario runs the same requests through an engine with ``async_scheduling=False`` and one with True and
compares every request's tokens and finish reason; the driver also checks what the async engine streams: each
request's tokens in order, equal to its output, the finished flag once and on its last token, nothing after
it (the token the step in flight computed for a request that finished is dropped), every block and row free at
the end. Seeded sampled requests make the input tokens of each step vary (random weights' greedy outputs
repeat one token), so a wrong device-side input token would show.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from lm_helpers import CheckpointFactory
from test_mamba2 import hf_mamba2

from infinilm import ConfigError, Engine, EngineOptions, FinishReason, SamplingParams
from infinilm.engine.sequence import Sequence

GREEDY = SamplingParams(max_new_tokens=8, ignore_eos=True)


def _hot(seed: int, n: int = 8) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True)


def _prompts(n: int, seed: int, lo: int = 3, hi: int = 14, vocab: int = 255) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@dataclass
class Req:
    """One request of a scenario: it arrives after call `at` of ``step`` (0: before the first), and is
    cancelled after the call that emits its `cancel_after`-th token or the token `stop_on` (as the server
    cancels a request whose text reached a stop string)."""

    prompt: list[int]
    params: SamplingParams = GREEDY
    at: int = 0
    cancel_after: int | None = None
    stop_on: int | None = None


def _drive(engine: Engine, reqs: list[Req], check: Callable[[Engine], None] = lambda e: None
           ) -> list[tuple[list[int], FinishReason | None]]:
    """Run `reqs` to the end; each request's (output, finish reason). Asserts the stream is consistent."""
    seqs: dict[int, Sequence] = {}
    emitted: dict[int, list[int]] = {}
    done: set[int] = set()
    calls = 0
    while calls < 500 and (engine.has_work() or len(seqs) < len(reqs)):
        for i, r in enumerate(reqs):
            if r.at == calls and i not in seqs:
                seqs[i] = engine.add_request(r.prompt, r.params)
                emitted[i] = []
        by_id = {s.id: i for i, s in seqs.items()}
        for out in engine.step():
            i = by_id[out.seq.id]
            assert i not in done, f"request {i} got token {out.token} after it finished"
            emitted[i].append(out.token)
            assert out.seq.output == emitted[i], f"request {i}: streamed {emitted[i]}, output {out.seq.output}"
            if out.finished:
                done.add(i)
        calls += 1
        for i, r in enumerate(reqs):
            s = seqs.get(i)
            if s is None or s.finished:
                continue
            if (r.cancel_after is not None and len(emitted[i]) >= r.cancel_after) or (
                    r.stop_on is not None and r.stop_on in emitted[i]):
                assert engine.cancel(s)
                done.add(i)
        check(engine)
    assert not engine.has_work() and len(seqs) == len(reqs)
    assert engine.cache.allocator.num_free == engine.cache.allocator.num_blocks
    assert engine.rows.num_free == engine.rows.max_rows
    for i, s in seqs.items():
        assert emitted[i] == s.output and s.finished
    return [(seqs[i].output, seqs[i].finish_reason) for i in range(len(reqs))]


def _both(make: Callable[..., Engine], reqs: list[Req], **kw: object) -> list[tuple[list[int], FinishReason | None]]:
    """The requests' results with async scheduling off and on (asserted equal); returns them."""
    sync = _drive(make(async_scheduling=False), reqs)
    overlapped = make(async_scheduling=True)
    assert overlapped.async_scheduling
    assert _drive(overlapped, reqs, **kw) == sync
    return sync


def _llama(checkpoint: CheckpointFactory, **options: object) -> Callable[..., Engine]:
    path, _ = checkpoint("llama")
    return lambda **more: Engine.from_pretrained(path, EngineOptions(
        **{"block_size": 8, "max_model_len": 64, "num_blocks": 96, **options, **more}))


def test_mixed_finishes_arrivals_aborts_and_stops_give_the_same_tokens(checkpoint: CheckpointFactory) -> None:
    make = _llama(checkpoint)
    p = _prompts(10, seed=5)
    probe = make(async_scheduling=False).generate([p[3], p[6]], _hot(3, 8))  # tokens to stop on, mid-output
    stop3, stop6 = probe[0][3], probe[1][2]
    reqs = [
        Req(p[0], SamplingParams(max_new_tokens=1, ignore_eos=True)),  # done by its prefill
        Req(p[1], SamplingParams(max_new_tokens=2, ignore_eos=True)),
        Req(p[2], _hot(1, 9)),
        Req(p[3], SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=3, ignore_eos=True,
                                 stop_token_ids=(stop3,))),  # a stop token: FinishReason.EOS
        Req(p[4], SamplingParams(max_new_tokens=12), cancel_after=3),  # an abort mid-run
        Req(p[5], _hot(5, 12), at=2),  # arrives mid-run
        Req(p[6], _hot(3, 8), stop_on=stop6),  # a "stop string": cancelled once its token is streamed
        Req(p[7], _hot(7, 6), at=4),
        Req(p[8], GREEDY, at=4, cancel_after=1),
        Req(p[9], _hot(9, 3), at=9),  # arrives while the others drain
    ]
    results = _both(make, reqs)
    lengths = [len(out) for out, _ in results]
    assert lengths[:3] == [1, 2, 9] and lengths[4] == 3 and lengths[8] == 1
    assert results[3][1] is FinishReason.EOS and results[3][0][-1] == stop3 and len(results[3][0]) < 8
    assert results[6][1] is FinishReason.CANCELLED and results[6][0][-1] == stop6


def test_eos_ends_a_request_at_the_same_token(checkpoint: CheckpointFactory) -> None:
    path, _ = checkpoint("llama")
    p = _prompts(4, seed=8)
    eos = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=64)).generate(
        [p[0]], _hot(4, 10))[0][4]

    def make(**more: object) -> Engine:
        engine = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=64, **more))
        engine.scheduler.eos_token_ids = frozenset({eos})  # the config's EOS ids as the scheduler holds them
        return engine

    params = SamplingParams(max_new_tokens=10, temperature=1.0, top_p=0.95, seed=4)  # not ignore_eos
    results = _both(make, [Req(p[0], params), Req(p[1], _hot(2, 10)), Req(p[2], GREEDY, at=1)])
    assert results[0][1] is FinishReason.EOS and results[0][0][-1] == eos and len(results[0][0]) <= 5


@pytest.mark.parametrize("seed, num_blocks", [(1, 8), (4, 10)])  # (4, 10): a preempted request would finish
def test_preemption_under_a_tight_cache_gives_the_tokens_of_a_roomy_one(checkpoint: CheckpointFactory, seed: int,
                                                                         num_blocks: int) -> None:
    path, _ = checkpoint("llama")
    lengths = [5 + (i * 3 + seed) % 8 for i in range(6)]
    reqs = [Req(q, _hot(20 + i, n) if i % 2 else SamplingParams(max_new_tokens=n, ignore_eos=True))
            for i, (q, n) in enumerate(zip(_prompts(6, seed=seed, lo=5, hi=15), lengths))]
    roomy = _drive(Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=64,
                                                              async_scheduling=False)), reqs)

    def held(engine: Engine) -> None:  # a finished request's blocks stay held until the step in flight is read
        sched = engine.scheduler
        in_use = sum(len(s.block_table) for s in sched.running + sched.deferred)
        assert engine.cache.allocator.num_free + in_use == num_blocks

    tight = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=num_blocks,
                                                       async_scheduling=True))
    assert _drive(tight, reqs, held) == roomy
    assert tight.scheduler.num_preemptions > 0


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_a_batch_of_32(checkpoint: CheckpointFactory) -> None:
    path, _ = checkpoint("llama")
    engine = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=256,
                                                        async_scheduling=True))
    prompts = _prompts(32, seed=6)
    alone = engine.generate([prompts[17]], _hot(42, 10))[0]
    others = [engine.add_request(q, _hot(i, 4 + i % 7)) for i, q in enumerate(prompts) if i != 17]
    together = engine.add_request(prompts[17], _hot(42, 10))
    while engine.has_work():
        engine.step()
    assert together.output == alone and len(alone) == 10
    sync = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=256))
    assert sync.generate([prompts[17]], _hot(42, 10))[0] == alone  # and the synchronous engine's tokens
    assert all(s.num_output == 4 + i % 7 for i, s in zip((i for i in range(32) if i != 17), others))


def test_penalties_and_logprobs_run_their_steps_unoverlapped_with_the_same_results(
        checkpoint: CheckpointFactory) -> None:
    make = _llama(checkpoint)
    p = _prompts(3, seed=9)
    penalized = SamplingParams(max_new_tokens=8, temperature=1.0, seed=1, repetition_penalty=1.5,
                               frequency_penalty=0.5, ignore_eos=True)
    wants = SamplingParams(max_new_tokens=6, logprobs=2, ignore_eos=True)
    _both(make, [Req(p[0], penalized), Req(p[1], _hot(2)), Req(p[2], wants, at=3)])
    logged = []
    for flag in (False, True):
        engine = make(async_scheduling=flag)
        engine.add_request(p[2], wants)
        engine.add_request(p[1], _hot(2))
        logged.append([(o.token, o.logprob, o.top_logprobs) for o in engine.stream() if o.seq.params is wants])
    assert logged[0] == logged[1] and len(logged[0]) == 6 and logged[1][0][1] is not None


def test_mamba2_state_rows_give_the_same_tokens(tmp_path_factory: pytest.TempPathFactory) -> None:
    path: Path = tmp_path_factory.mktemp("mamba2-async")
    hf_mamba2(seed=3).save_pretrained(str(path))
    p = _prompts(5, seed=2, vocab=150)
    reqs = [Req(p[0], _hot(1, 7)), Req(p[1], GREEDY, cancel_after=2), Req(p[2], _hot(3, 5), at=2),
            Req(p[3], SamplingParams(max_new_tokens=2, ignore_eos=True)), Req(p[4], _hot(5, 9), at=3)]
    _both(lambda **more: Engine.from_pretrained(path, EngineOptions(num_blocks=4, max_model_len=64, **more)), reqs)


def test_the_option_is_a_flag_on_cuda_by_default_and_refused_under_tensor_parallelism() -> None:
    import torch

    assert not EngineOptions().schedules_async(torch.device("cpu"))
    assert EngineOptions().schedules_async(torch.device("cuda"))
    assert EngineOptions(async_scheduling=True).schedules_async(torch.device("cpu"))
    assert not EngineOptions(async_scheduling=False).schedules_async(torch.device("cuda"))
    assert not EngineOptions(tensor_parallel_size=2).schedules_async(torch.device("cuda"))
    with pytest.raises(ConfigError, match="async_scheduling='yes' must be True or False"):
        EngineOptions(async_scheduling="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tensor_parallel_size=2"):
        EngineOptions(async_scheduling=True, tensor_parallel_size=2)


def test_the_cli_flags_follow_vllm(checkpoint: CheckpointFactory) -> None:
    from infinilm.cli import _command_options, _parser

    path, _ = checkpoint("llama")
    for command in (["generate", "--prompt", "1 2"], ["serve"], ["bench"]):
        for flag, want in (([], None), (["--async-scheduling"], True), (["--no-async-scheduling"], False)):
            args = _parser().parse_args([command[0], "--model", str(path), *command[1:], *flag])
            assert _command_options(args).async_scheduling is want


def test_a_finished_request_keeps_its_blocks_until_the_step_in_flight_is_read(checkpoint: CheckpointFactory) -> None:
    make = _llama(checkpoint)
    counts = {}
    for flag in (False, True):
        engine = make(async_scheduling=flag)
        seq = engine.add_request(_prompts(1, seed=3)[0], SamplingParams(max_new_tokens=2, ignore_eos=True))
        counts[flag] = []
        while engine.has_work():
            out = engine.step()
            counts[flag].append((len(out), seq.finished, engine.cache.allocator.num_free))
        assert seq.num_output == 2
    total = make().cache.allocator.num_blocks
    left = counts[False][0][2]  # free while the request runs
    assert left < total and counts[False] == [(1, False, left), (1, True, total)]
    # async: the second call reads the token that ends it while the step after it is in flight, which computes
    # one more token for it: its blocks are freed (and that token dropped) by the third call, which emits nothing
    assert counts[True] == [(1, False, left), (1, True, left), (0, True, total)]


def test_a_full_set_of_rows_admits_a_request_once_a_finished_one_frees_its_row(checkpoint: CheckpointFactory) -> None:
    make = _llama(checkpoint, max_num_seqs=2)  # two rows: a request waits until a finished one's row is free
    p = _prompts(5, seed=12)
    reqs = [Req(q, _hot(i, 2 + i % 3)) for i, q in enumerate(p)]
    reqs[2].cancel_after = 1
    _both(make, reqs)


def test_the_mode_switches_only_while_the_engine_is_idle(checkpoint: CheckpointFactory) -> None:
    engine = _llama(checkpoint)(async_scheduling=False)
    seq = engine.add_request([1, 2, 3], GREEDY)
    with pytest.raises(RuntimeError, match="while the engine is idle"):
        engine.async_scheduling = True
    engine.cancel(seq)
    engine.async_scheduling = True
    assert engine.async_scheduling and "async scheduling: on" in engine.status
    assert engine.generate([[1, 2, 3]], GREEDY)[0] == _llama(checkpoint)().generate([[1, 2, 3]], GREEDY)[0]
