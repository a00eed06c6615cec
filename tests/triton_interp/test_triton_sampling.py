"""Triton sampling on the CPU under the Triton interpreter: the conformance suite (chi-square verdicts), then the
same tokens as the torch provider draw for draw (one Philox stream), over several column blocks with a ragged
last one, with penalties, argmax rows and non-finite rows."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from interp_helpers import assert_conformant, randn

import infiniops_py
from infiniops_py import top_k_top_p_sampling_from_logits

OP = "top_k_top_p_sampling_from_logits"


def test_conformance() -> None:
    assert_conformant(OP, 3)


def _draw(provider: str, logits: torch.Tensor, **kw: object) -> torch.Tensor:
    with infiniops_py.use(provider):
        return top_k_top_p_sampling_from_logits(logits, torch.tensor([0, 5, 40, 1, 0, 2000], dtype=torch.int32),
                                                torch.tensor([1.0, 0.9, 0.5, 1.0, 0.3, 0.8]), **kw)  # type: ignore[arg-type]


def test_the_same_tokens_as_the_torch_provider_over_ragged_column_blocks() -> None:
    v = 2 * 1024 + 300  # three blocks per pass, the last one masked
    logits = randn(6, v, seed=1, scale=2.0)
    kw = {"temperature": torch.tensor([1.0, 0.7, 1.3, 0.0, 0.5, 1.0]), "min_p": torch.tensor([0.0, 0.0, 0.05, 0, 0, 0]),
          "seed": torch.arange(6) * 1_000_003 - 2**40, "offset": torch.arange(6) + 2**35,
          "repetition_penalty": torch.full((6,), 1.2), "frequency_penalty": torch.full((6,), 0.3),
          "presence_penalty": torch.full((6,), 0.1),
          "output_token_counts": torch.randint(0, 3, (6, v), generator=torch.Generator().manual_seed(2),
                                               dtype=torch.int32),
          "prompt_token_mask": torch.rand(6, v, generator=torch.Generator().manual_seed(3)) < 0.2}
    for dtype in (torch.bfloat16, torch.float32):
        x = logits.to(dtype)
        got, want = _draw("triton", x, **kw), _draw("torch", x, **kw)
        assert got.tolist() == want.tolist()
        assert int(got[3]) == int(_draw("reference", x.double(), **kw)[3])  # the argmax row


def test_non_finite_rows_give_minus_one() -> None:
    logits = randn(6, 40, seed=4)
    logits[1, 3], logits[2, 5], logits[4] = math.nan, math.inf, -math.inf
    got = _draw("triton", logits, seed=torch.arange(6))
    assert [got[i] == -1 for i in range(6)] == [False, True, True, False, True, False]
    assert got.tolist() == _draw("torch", logits, seed=torch.arange(6)).tolist()


def test_per_row_values_out_of_range_are_clamped_alike() -> None:
    """min_p above 1 and top_p at or below 0 keep the maxima; a negative temperature is the argmax."""
    logits = randn(4, 50, seed=5)
    logits[:, 7] = logits.max() + 1
    kw = {"temperature": torch.tensor([1.0, 1.0, -2.0, 1.0]), "min_p": torch.tensor([3.0, 0.0, 0.0, 0.0]),
          "seed": torch.arange(4)}
    top_p = torch.tensor([1.0, -1.0, 1.0, 0.0])
    for provider in ("triton", "torch"):
        with infiniops_py.use(provider):
            got = top_k_top_p_sampling_from_logits(logits, 0, top_p, **kw)  # type: ignore[arg-type]
        assert got.tolist() == [7, 7, 7, 7], provider


def _ragged_case() -> tuple[torch.Tensor, dict[str, object]]:
    v = 2 * 1024 + 300
    logits = randn(6, v, seed=6, scale=2.0)
    kw: dict[str, object] = {"temperature": torch.tensor([1.0, 0.7, 1.3, 0.0, 0.5, 1.0]),
                             "seed": torch.arange(6) * 977 + 5, "offset": torch.arange(6),
                             "repetition_penalty": torch.full((6,), 1.1),
                             "output_token_counts": torch.randint(0, 2, (6, v), dtype=torch.int32,
                                                                  generator=torch.Generator().manual_seed(7))}
    return logits, kw


def test_a_row_split_over_programs_draws_what_the_torch_provider_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three programs per row (a ragged last chunk), each step its own launch: the partial counts and masses of
    the chunks and the chunks' draws combine into the single-program answer."""
    from infiniops_triton import sampling as triton_sampling

    monkeypatch.setattr(triton_sampling, "split", lambda n, v, device: (3, 1024))
    logits, kw = _ragged_case()
    for dtype in (torch.bfloat16, torch.float32):
        x = logits.to(dtype)
        assert _draw("triton", x, **kw).tolist() == _draw("torch", x, **kw).tolist()


def test_the_one_launch_form_with_its_barriers_draws_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's form (every step in one launch, the row's programs meeting at barriers) with one program per
    row, the only form the interpreter can run in one launch."""
    from infiniops_triton import sampling as triton_sampling

    monkeypatch.setattr(triton_sampling, "launch", functools.partial(triton_sampling.launch, one_launch=True))
    logits, kw = _ragged_case()
    assert _draw("triton", logits, **kw).tolist() == _draw("torch", logits, **kw).tolist()


def test_per_row_options_given_as_strided_views_draw_as_contiguous_ones() -> None:
    """Columns of one [N, 3] options tensor (the engine's old layout): each provider reads row b's own values."""
    logits = randn(5, 300, seed=8, scale=2.0)
    options = torch.tensor([[0.8, 0.9, 0.0], [1.2, 0.5, 0.05], [0.0, 1.0, 0.0], [0.7, 0.95, 0.0], [1.0, 0.3, 0.1]])
    ints = torch.tensor([[50, 3, 0], [5, 9, 1], [0, 0, 2], [1, 4, 3], [300, 7, 4]])
    strided = {"temperature": options[:, 0], "min_p": options[:, 2], "seed": ints[:, 1], "offset": ints[:, 2]}
    packed = {name: t.contiguous() for name, t in strided.items()}
    for provider in ("triton", "torch"):
        with infiniops_py.use(provider):
            got = top_k_top_p_sampling_from_logits(logits, ints[:, 0].int(), options[:, 1],
                                                   **strided)  # type: ignore[arg-type]
            want = top_k_top_p_sampling_from_logits(logits, ints[:, 0].int(), options[:, 1].contiguous(),
                                                    **packed)  # type: ignore[arg-type]
        assert got.tolist() == want.tolist(), provider


def test_a_small_top_k_is_searched_over_its_compacted_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows whose top-k is at most the number of 256-column groups keep only the tokens at or above the k-th
    largest group max (at least k of them) and are searched over those alone; a row whose candidates overflow
    the list (ties) and the rows of a larger k are searched over all their columns: all draw what torch draws."""
    from infiniops_triton import sampling as triton_sampling

    n, v = 8, 5000  # 20 groups
    logits = randn(n, v, seed=9, scale=3.0)
    logits[6] = 0.25  # every token tied: 5000 candidates, more than the list holds
    top_k = torch.tensor([1, 5, 20, 21, 0, 3, 3, 19], dtype=torch.int32)
    kw = {"top_k": top_k, "top_p": torch.tensor([0.9, 0.5, 1.0, 0.9, 0.3, 0.99, 0.9, 0.7]),
          "temperature": torch.tensor([0.8, 1.0, 0.7, 1.2, 1.0, 0.0, 1.0, 0.9]), "seed": torch.arange(n) * 31 + 7,
          "offset": torch.arange(n) * 3}
    counters = torch.zeros(2 * n, dtype=torch.int32)
    monkeypatch.setattr(triton_sampling, "launch", functools.partial(triton_sampling.launch, counters=counters))
    with infiniops_py.use("triton"):
        got = top_k_top_p_sampling_from_logits(logits, **kw)  # type: ignore[arg-type]
    with infiniops_py.use("torch"):
        want = top_k_top_p_sampling_from_logits(logits, **kw)  # type: ignore[arg-type]
    assert got.tolist() == want.tolist()
    compacted = counters[n:].tolist()
    assert [c > 0 for c in compacted] == [True, True, True, False, False, False, True, True]  # row 5 is greedy
    assert all(k <= c <= triton_sampling._CAP for c, k in zip(compacted, top_k.tolist()) if c > 0 and c != 5000)
    assert compacted[6] == v  # overflowed: the whole row's search


def test_a_compacted_row_draws_only_among_its_top_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nearly flat distributions (temperature 50), top_p 1: each of 32 compacted rows draws one of its k most
    likely tokens, and the draws are not all the argmax."""
    from infiniops_triton import sampling as triton_sampling

    n, v = 32, 5000
    logits = randn(n, v, seed=10, scale=3.0)
    top_k = torch.randint(1, 21, (n,), generator=torch.Generator().manual_seed(11), dtype=torch.int32)
    counters = torch.zeros(2 * n, dtype=torch.int32)
    monkeypatch.setattr(triton_sampling, "launch", functools.partial(triton_sampling.launch, counters=counters))
    with infiniops_py.use("triton"):
        got = top_k_top_p_sampling_from_logits(logits, top_k, 1.0, temperature=50.0,  # type: ignore[arg-type]
                                               seed=torch.arange(n) * 131 + 1)
    assert bool((counters[n:] > 0).all())
    rank = (logits > logits.gather(1, got.long()[:, None])).sum(1)
    assert bool((rank < top_k).all()), list(zip(rank.tolist(), top_k.tolist()))
    assert int((rank > 0).sum()) > n // 4
