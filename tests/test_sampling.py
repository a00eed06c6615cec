"""The sampling operator (`top_k_top_p_sampling_from_logits`): its distributions against the filtered softmax
(chi-square, hypothesis drawing logits and options), exact argmax rows, per-row seeds independent of the batch,
non-finite rows, the contract's checks, and the custom operator."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import infiniops_py as ip
from infiniops_py import ContractError, top_k_top_p_sampling_from_logits
from infiniops_py.operators.sampling import philox_uniform
from infiniops_py.testing.conformance import run_conformance
from infiniops_py.testing.strategies.sampling import chi_square_p, filtered_probs

ALPHA = 1e-6  # a false failure once in a million runs


def test_the_conformance_suite_passes_for_the_torch_provider() -> None:
    report = run_conformance("torch", ops=["top_k_top_p_sampling_from_logits"], max_examples=15)
    assert report.ok, report.render()
    assert all(r.examples > 0 for r in report.ops)


@settings(max_examples=25, deadline=None, database=None)
@given(st.data())
def test_draws_follow_the_filtered_softmax(data: st.DataObject) -> None:
    """10,000 draws of one row, each with a fresh seed, against the float64 filtered softmax (chi-square)."""
    v = data.draw(st.sampled_from((2, 7, 50, 300)))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))
    logits = torch.randn(1, v, generator=gen) * data.draw(st.sampled_from((0.5, 2.0)))
    temperature = data.draw(st.sampled_from((0.3, 1.0, 2.0)))
    top_k = data.draw(st.sampled_from((0, 1, 3, 20)))
    top_p = data.draw(st.sampled_from((1.0, 0.95, 0.6, 0.2)))
    min_p = data.draw(st.sampled_from((0.0, 0.02, 0.2)))
    provider = data.draw(st.sampled_from(("torch", "reference")))
    n = 10_000
    with ip.use(provider):
        drawn = top_k_top_p_sampling_from_logits(logits, top_k, top_p, torch.zeros(n, dtype=torch.int64),
                                                 temperature=temperature, min_p=min_p)
    probs = filtered_probs(logits[0].double(), temperature, top_k, top_p, min_p)
    assert chi_square_p(drawn, probs) >= ALPHA, (v, temperature, top_k, top_p, min_p, provider)


def test_the_chi_square_check_catches_a_wrong_temperature() -> None:
    """The check can fail: draws at temperature 1.3 do not pass for the distribution at temperature 1."""
    logits = torch.linspace(-2, 2, 10)[None]
    drawn = top_k_top_p_sampling_from_logits(logits, 0, 1.0, torch.zeros(20_000, dtype=torch.int64),
                                             temperature=1.3)
    assert chi_square_p(drawn, filtered_probs(logits[0].double(), 1.0, 0, 1.0, 0.0)) < ALPHA


def test_the_distribution_is_the_engines_per_row_semantics() -> None:
    """The float64 oracle equals the per-row functions of infinilm's sampler (min-p, then top-k and top-p)."""
    from infinilm.engine.sampling import filter_logits, scale_logits

    gen = torch.Generator().manual_seed(3)
    for _ in range(20):
        row = torch.randn(40, generator=gen, dtype=torch.float64) * 2
        t, k, p = 0.7, int(torch.randint(0, 10, (), generator=gen)), float(torch.rand((), generator=gen))
        want = torch.softmax(filter_logits(scale_logits(row, t), k, p), -1)
        torch.testing.assert_close(filtered_probs(row, t, k, p, 0.0), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_temperature_zero_rows_are_exactly_the_argmax(dtype: torch.dtype) -> None:
    logits = (torch.randn(64, 1000) * 3).to(dtype)
    logits[5, 10] = logits[5, 20] = logits[5].max() + 1  # a tie: the first index wins
    temperature = torch.where(torch.arange(64) % 2 == 0, 0.0, 1.0)
    drawn = top_k_top_p_sampling_from_logits(logits, 50, 0.9, temperature=temperature, seed=7)
    want = logits.float().argmax(1).int()
    assert torch.equal(drawn[::2], want[::2])
    assert int(top_k_top_p_sampling_from_logits(logits, 0, 1.0, temperature=0.0)[5]) == 10


def test_a_rows_draw_depends_only_on_its_seed_and_offset() -> None:
    """Row 3 of a batch of 32 draws what it draws alone, whatever the other rows hold."""
    logits = torch.randn(32, 500)
    seed = torch.randint(0, 2**62, (32,))
    offset = torch.arange(32) * 5
    batched = top_k_top_p_sampling_from_logits(logits, 40, 0.9, seed=seed, offset=offset)
    for b in (0, 3, 31):
        alone = top_k_top_p_sampling_from_logits(logits[b:b + 1], 40, 0.9, seed=seed[b:b + 1],
                                                 offset=offset[b:b + 1])
        assert int(alone) == int(batched[b])
    shuffled = torch.randn(32, 500)
    shuffled[3] = logits[3]
    assert int(top_k_top_p_sampling_from_logits(shuffled, 40, 0.9, seed=seed, offset=offset)[3]) == int(batched[3])


def test_philox_matches_the_known_answer_of_the_random123_reference() -> None:
    """Philox-4x32-10 of counter 0 and key 0 is 0x6627e8d5 in its first word (Random123's kat_vectors)."""
    u = philox_uniform(torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64), 1, torch.float64)
    assert float(u[0, 0]) == ((0x6627E8D5 >> 8) + 0.5) * 2.0**-24


def test_non_finite_rows_sample_minus_one_and_the_others_are_unaffected() -> None:
    logits = torch.randn(4, 30)
    logits[1, 3] = math.nan
    logits[2, 7] = math.inf
    logits[3] = -math.inf
    seed = torch.arange(4)
    for temperature in (0.0, 1.0):
        drawn = top_k_top_p_sampling_from_logits(logits, 0, 1.0, temperature=temperature, seed=seed)
        assert drawn[1:].tolist() == [-1, -1, -1]
        alone = top_k_top_p_sampling_from_logits(logits[:1], 0, 1.0, temperature=temperature, seed=seed[:1])
        assert int(drawn[0]) == int(alone) >= 0


def test_penalties_follow_vllm() -> None:
    """Repetition over the prompt and output (divide positive, multiply negative), then frequency and presence."""
    logits = torch.tensor([[2.0, -4.0, 1.0, 1.0, 1.1]])
    counts = torch.tensor([[0, 0, 2, 1, 0]], dtype=torch.int32)
    prompt = torch.tensor([[True, True, False, False, False]])
    kw = {"repetition_penalty": torch.tensor([2.0]), "frequency_penalty": torch.tensor([0.5]),
          "presence_penalty": torch.tensor([0.25]), "output_token_counts": counts, "prompt_token_mask": prompt}
    # penalized: [1, -8, -0.75, -0.25, 1.1]: the argmax moves from 0 to 4
    assert int(top_k_top_p_sampling_from_logits(logits, 0, 1.0, temperature=0.0, **kw)) == 4
    assert int(top_k_top_p_sampling_from_logits(logits, 0, 1.0, temperature=0.0)) == 0


@pytest.mark.parametrize("call, name", [
    (lambda x: top_k_top_p_sampling_from_logits(x[0], 1, 1.0), "logits"),
    (lambda x: top_k_top_p_sampling_from_logits(x.int(), 1, 1.0), "logits"),
    (lambda x: top_k_top_p_sampling_from_logits(x, 1.5, 1.0), "top_k"),
    (lambda x: top_k_top_p_sampling_from_logits(x, 1, 1.5), "top_p"),
    (lambda x: top_k_top_p_sampling_from_logits(x, 1, 0.5, temperature=-1.0), "temperature"),
    (lambda x: top_k_top_p_sampling_from_logits(x, 1, 0.5, min_p=2.0), "min_p"),
    (lambda x: top_k_top_p_sampling_from_logits(x, torch.ones(3, dtype=torch.int32), 0.5), "top_k"),
    (lambda x: top_k_top_p_sampling_from_logits(x, 1, 0.5, seed=torch.zeros(2)), "seed"),
    (lambda x: top_k_top_p_sampling_from_logits(x, 1, 0.5, torch.tensor([0, 2])), "indices"),
    (lambda x: top_k_top_p_sampling_from_logits(x, 1, 0.5, repetition_penalty=torch.ones(2)), "output_token_counts"),
    (lambda x: top_k_top_p_sampling_from_logits(x, 1, 0.5, frequency_penalty=torch.ones(2),
                                                output_token_counts=torch.zeros(2, 4)), "output_token_counts"),
])
def test_bad_arguments_raise_contract_errors_naming_them(call, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ContractError, match=name):
        call(torch.randn(2, 4))


def test_empty_batches_and_the_custom_operator() -> None:
    assert top_k_top_p_sampling_from_logits(torch.randn(0, 5), 1, 1.0).shape == (0,)
    logits = torch.randn(3, 20)
    args = (logits, torch.full((3,), 5, dtype=torch.int32), torch.full((3,), 0.9), None, torch.ones(3),
            torch.zeros(3), torch.arange(3), torch.zeros(3, dtype=torch.int64), None, None, None, None, None)
    got = torch.ops.infiniops.top_k_top_p_sampling_from_logits(*args)
    want = top_k_top_p_sampling_from_logits(logits, 5, 0.9, seed=torch.arange(3), offset=0)
    assert got.dtype == torch.int32 and torch.equal(got, want)
    compiled = torch.compile(lambda x: top_k_top_p_sampling_from_logits(x, 5, 0.9, seed=torch.arange(3), offset=0),
                             backend="eager", fullgraph=True)
    assert torch.equal(compiled(logits), want)
