"""Sampling: greedy argmax, top-k / top-p filtering, seeded draws that do not depend on the batch."""

from __future__ import annotations

import pytest
import torch

from infinilm.engine.sampling import filter_logits, sample, scale_logits
from infinilm.engine.sequence import SamplingParams, Sequence


def _seqs(*params: SamplingParams) -> list[Sequence]:
    return [Sequence([1], p) for p in params]


def test_greedy_is_argmax() -> None:
    logits = torch.randn(5, 300)
    assert sample(logits, _seqs(*[SamplingParams()] * 5)) == logits.argmax(-1).tolist()


def test_filters() -> None:
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.5])
    kept = filter_logits(logits, top_k=2, top_p=1.0)
    assert torch.isfinite(kept).tolist() == [False, True, True, False, False]
    probs = torch.softmax(logits, 0)  # 0.031, 0.62, 0.23, 0.084, 0.019
    kept = filter_logits(logits, top_k=0, top_p=float(probs[1]) + 0.01)  # needs the two most likely
    assert torch.isfinite(kept).tolist() == [False, True, True, False, False]
    kept = filter_logits(logits, top_k=0, top_p=0.01)  # the most likely token always stays
    assert torch.isfinite(kept).tolist() == [False, True, False, False, False]


def test_seeded_sampling_repeats_and_ignores_the_batch() -> None:
    logits = torch.randn(3, 64)
    hot = SamplingParams(temperature=1.5, top_k=40, top_p=0.95, seed=1234)
    draws = []
    for _ in range(2):
        seq = _seqs(hot)[0]
        draws.append([sample(logits[1:2], [seq])[0] for _ in range(20)])
    assert draws[0] == draws[1]
    seqs = _seqs(SamplingParams(), hot, SamplingParams(temperature=1.0, seed=9))
    batched = [sample(logits, seqs)[1] for _ in range(20)]
    assert batched == draws[0]
    assert len(set(draws[0])) > 1  # it samples, it is not argmax
    assert sample(logits, seqs)[0] == int(logits[0].argmax())


def test_top_k_one_is_greedy() -> None:
    logits = torch.randn(4, 50)
    seqs = _seqs(*[SamplingParams(temperature=0.7, top_k=1, seed=s) for s in range(4)])
    assert sample(logits, seqs) == logits.argmax(-1).tolist()


def test_a_tiny_temperature_samples_among_the_maxima_without_nan() -> None:
    """logits / 1e-300 in float32 was inf - inf = NaN in the softmax, and multinomial raised."""
    logits = torch.tensor([[0.5, 3.0, -2.0, 3.0, 1.0], [0.5, 3.0, -2.0, 2.9, 1.0]])
    for temperature in (1e-300, 5e-324, 1e-40):
        seqs = _seqs(*[SamplingParams(temperature=temperature, top_p=0.9, seed=s) for s in range(2)])
        draws = {tuple(sample(logits, seqs)) for _ in range(20)}
        assert {d[0] for d in draws} <= {1, 3} and {d[1] for d in draws} == {1}
        row = scale_logits(logits[0], temperature)
        assert not row.isnan().any() and row.max() == 0
        assert torch.softmax(row, -1).tolist() == [0.0, 0.5, 0.0, 0.5, 0.0]  # the limit: the tied maxima
    # a usual temperature gives the softmax of logits / temperature
    torch.testing.assert_close(torch.softmax(scale_logits(logits[1], 0.7), -1),
                               torch.softmax(logits[1].double() / 0.7, -1), rtol=1e-12, atol=1e-15)


def test_sampling_params_refuse_seeds_a_generator_cannot_take_and_non_integer_sizes() -> None:
    """A seed of 2**64 used to fail inside torch's manual_seed; -1 was silently the seed 2**64 - 1."""
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1 and SamplingParams(seed=0).seed == 0
    for seed in (2**64, -1):
        with pytest.raises(ValueError, match=rf"seed={seed} must be in \[0, 2\*\*64\)"):
            SamplingParams(seed=seed)
    for name, value in (("seed", 1.5), ("max_new_tokens", 2.5), ("top_k", True), ("top_k", 3.0)):
        with pytest.raises(ValueError, match=rf"{name}={value!r} must be an int"):
            SamplingParams(**{name: value})


def test_sampling_params_refuse_a_str_or_other_wrong_kinds_for_sequences_flags_and_numbers() -> None:
    """``stop_token_ids="x"`` passed (a str is iterable) and broke the first step (``int in "x"``); a str
    temperature raised TypeError; ``ignore_eos="no"`` was true."""
    for value in ("x", b"ab", 3, [1.5], [True], [-1], {1: 2}):
        with pytest.raises(ValueError, match=r"stop_token_ids=.* must be a tuple \(or a list\) of token ids"):
            SamplingParams(stop_token_ids=value)  # type: ignore[arg-type]
    for name, value in (("temperature", "1"), ("top_p", "0.5"), ("top_p", True)):
        with pytest.raises(ValueError, match=rf"{name}={value!r} must be a number"):
            SamplingParams(**{name: value})
    with pytest.raises(ValueError, match="ignore_eos='no' must be True or False"):
        SamplingParams(ignore_eos="no")  # type: ignore[arg-type]
    assert SamplingParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)  # a list is taken, stored as a tuple


def test_penalties_follow_vllm() -> None:
    """Repetition over prompt and output (divide positive, multiply negative), then frequency and presence over
    the output only."""
    from infinilm.engine.sampling import apply_penalties

    seq = Sequence([0, 1], SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25))
    seq.tokens += [2, 2, 3]
    row = torch.tensor([4.0, -4.0, 1.0, 1.0, 1.0])
    got = apply_penalties(row, seq)
    # token 0/1: prompt only (repetition); 2: output twice; 3: output once; 4: untouched
    want = torch.tensor([2.0, -8.0, 0.5 - 1.0 - 0.25, 0.5 - 0.5 - 0.25, 1.0], dtype=torch.float64)
    torch.testing.assert_close(got, want)


def test_greedy_with_a_penalty_takes_the_argmax_of_the_penalized_logits() -> None:
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    seq = Sequence([0], SamplingParams(repetition_penalty=2.0))
    assert sample(logits, [seq]) == [1]
    assert sample(logits, _seqs(SamplingParams())) == [0]


def test_min_p_drops_the_unlikely() -> None:
    logits = torch.tensor([[5.0, 5.0 - 0.1, -20.0, -20.0]])
    seqs = _seqs(*[SamplingParams(temperature=1.0, min_p=0.5, seed=s) for s in range(30)])
    draws = {sample(logits, [s])[0] for s in seqs}
    assert draws == {0, 1}


def test_logprobs_are_the_raw_log_softmax() -> None:
    from infinilm.engine.sampling import logprobs

    logits = torch.randn(3, 40)
    seqs = _seqs(SamplingParams(logprobs=3), SamplingParams(), SamplingParams(logprobs=0, temperature=1.0, seed=1))
    tokens = sample(logits, seqs)
    got = logprobs(logits, seqs, tokens)
    lp = torch.log_softmax(logits, -1)
    assert got[1] is None
    assert got[0][0] == pytest.approx(float(lp[0, tokens[0]]), abs=1e-6)
    assert [t for t, _ in got[0][1]] == lp[0].topk(3).indices.tolist()
    assert [v for _, v in got[0][1]] == pytest.approx(lp[0].topk(3).values.tolist(), abs=1e-6)
    assert got[2][0] == pytest.approx(float(lp[2, tokens[2]]), abs=1e-6) and got[2][1] == ()


@pytest.mark.parametrize("field, value", [("min_p", 1.5), ("presence_penalty", 2.5), ("frequency_penalty", -3.0),
                                          ("repetition_penalty", 0.0), ("logprobs", 21), ("logprobs", -1)])
def test_new_sampling_fields_are_range_checked(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def _poisoned_engine(checkpoint, bad_token: int):  # type: ignore[no-untyped-def]
    """The tiny llama engine with the embedding row of `bad_token` set to inf: a request whose prompt holds it
    gets non-finite logits (NaN after the attention and norms), the others are untouched."""
    from infinilm import Engine, EngineOptions

    path, _ = checkpoint("llama")
    engine = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=32))
    with torch.no_grad():
        engine.model.embed.weight[bad_token] = float("inf")
    return engine


def test_non_finite_logits_finish_their_request_with_an_error_and_leave_the_others(checkpoint) -> None:  # type: ignore[no-untyped-def]
    """Issue #30 item 2: a sampled request with non-finite logits raised `probability tensor contains inf/nan`
    out of `Engine.step`, failing every request of the step."""
    from infinilm import FinishReason

    engine = _poisoned_engine(checkpoint, bad_token=3)
    greedy_prompt = [5, 6, 7]
    solo = engine.generate([greedy_prompt], SamplingParams(max_new_tokens=4, ignore_eos=True))[0]
    bad = engine.add_request([9, 3, 4], SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=4, seed=1))
    good = engine.add_request(greedy_prompt, SamplingParams(max_new_tokens=4, ignore_eos=True))
    hot = engine.add_request([8, 8], SamplingParams(temperature=1.0, max_new_tokens=4, seed=2, ignore_eos=True))
    outputs = list(engine.stream())
    assert bad.finished and bad.finish_reason is FinishReason.ERROR and bad.output == []
    assert "non-finite" in (bad.error or "")
    assert [o.finished for o in outputs if o.seq is bad] == [True]
    assert good.output == solo and good.finish_reason is FinishReason.LENGTH
    assert len(hot.output) == 4 and engine.cache.allocator.num_free == engine.cache.allocator.num_blocks


def test_a_seeded_request_gives_the_same_tokens_alone_and_in_a_batch_of_32(checkpoint) -> None:  # type: ignore[no-untyped-def]
    """Issue #24: per-row seeds (the request's Philox key, its draw number the offset) whatever shares the step."""
    import random

    from infinilm import Engine, EngineOptions

    path, _ = checkpoint("llama")
    engine = Engine.from_pretrained(path, EngineOptions(block_size=8, max_model_len=64, num_blocks=160))
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 255) for _ in range(rng.randint(2, 12))] for _ in range(32)]
    hot = SamplingParams(max_new_tokens=10, temperature=0.9, top_k=50, top_p=0.95, seed=2**64 - 3, ignore_eos=True)
    alone = engine.generate([prompts[7]], hot)[0]
    others = [SamplingParams(max_new_tokens=10, temperature=1.2, seed=i, ignore_eos=True, presence_penalty=0.5)
              if i % 2 else SamplingParams(max_new_tokens=6, ignore_eos=True) for i in range(32)]
    seqs = [engine.add_request(p, hot if i == 7 else others[i]) for i, p in enumerate(prompts)]
    for _ in engine.stream():
        pass
    assert seqs[7].output == alone and len(set(alone)) > 1


def test_infinilm_generate_reports_non_finite_logits_and_exits_1(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue #30 item 2: `infinilm generate` with a sampled prompt of non-finite logits ended in a traceback."""
    from lm_helpers import hf_model

    from infinilm.cli import main

    model = hf_model("llama", tied=False)
    with torch.no_grad():
        model.model.embed_tokens.weight[3] = float("inf")
    model.save_pretrained(str(tmp_path))
    code = main(["generate", "--model", str(tmp_path), "--prompt", "9 3 4", "--max-new-tokens", "4",
                 "--temperature", "0.8", "--max-model-len", "64"])
    assert code == 1
    assert "non-finite" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_all_greedy_step_is_the_first_argmax_and_minus_one_where_the_max_is_not_finite(dtype) -> None:  # type: ignore[no-untyped-def]
    """The all-greedy path (NumPy on the CPU where it has the dtype, torch's ops otherwise): ties give the first
    index; a row holding a NaN or a +inf, or only -inf, gives -1; `sample_ids` the same ids as int32."""
    from infinilm.engine.sampling import sample_ids

    logits = torch.randint(-3, 4, (9, 40)).to(dtype)  # few distinct values: many ties
    logits[1, 7] = float("nan")
    logits[2, 30] = float("inf")
    logits[3] = float("-inf")
    logits[4, 0] = float("-inf")  # one -inf among finite logits changes nothing
    seqs = _seqs(*[SamplingParams()] * 9)
    expect = [-1 if not torch.isfinite(row.max()) else next(i for i, v in enumerate(row.tolist()) if v == row.max())
              for row in logits.double()]
    assert expect[1:4] == [-1, -1, -1]
    assert sample(logits, seqs) == expect
    ids = sample_ids(logits, seqs)
    assert ids.dtype == torch.int32 and ids.tolist() == expect
