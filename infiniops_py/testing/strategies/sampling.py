"""Strategies for sampling: many draws per logits row, checked as distributions (FlashInfer's ``test_sampling``
draws each row many times and compares the frequencies with the filtered probabilities; vLLM's ``test_sampler``
checks the greedy rows exactly).

A case draws R logits rows of V tokens (N(0, 1) times a scale, some entries -inf, now and then a NaN or +inf
row), options per row (temperature 0 / 0.5 / 1 / 1.7, top-k, top-p, min-p, and penalties over random output
counts and prompt masks), then samples each row S times in one call (``indices`` repeats the row; every draw
has its own fresh seed and offset). The compared output is one verdict per row (`verdicts`, 1.0 = pass): for a
sampled row ``min(1, p / alpha)``, p the chi-square p-value of its draws against the float64 filtered softmax
(`filtered_probs`, written from the definitions with pairwise comparisons, independent of the operator's sort)
and alpha = 1e-6 / R (a false failure once in a million cases); for a temperature-0 row, whether every draw is
the argmax of the penalized logits; for a non-finite row, whether every draw is -1. The suite compares the
provider's verdicts with the reference's bit for bit.

On `CaseContext.large` (GPU) runs, V reaches 32768 and Qwen's 151936, with up to 4000 draws per row; under the
Triton interpreter on the CPU, one row of at most 33 tokens gets 40 draws (the interpreter runs each in Python).
"""

from __future__ import annotations

import math
import os

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn

__all__ = ["STRATEGIES", "chi_square_p", "filtered_probs", "verdicts"]

_VOCAB = (2, 3, 8, 33, 100)
_DRAWS = 400
_INTERPRETED_DRAWS = 40  # the Triton interpreter runs one program per draw in Python
_LARGE_VOCAB = (*_VOCAB, 1000, 32768, 151936)
_LARGE_DRAWS = 4000
_LARGE_ELEMENTS = 2**26  # logits elements of a case, draws included (the float64 reference holds several copies)
_ALPHA = 1e-6


def filtered_probs(x: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """The sampling distribution of one penalized row `x` ``[V]`` (float64), from the definitions: z = (x - max) /
    temperature; keep z >= log(min_p), then the tokens with fewer than `top_k` strictly larger z (0 < k < V),
    then those whose strictly larger survivors hold less than `top_p` of the survivors' mass. "Strictly larger"
    is counted by binary search in the ascending order (`_above`), not by the operator's descending prefix."""
    z = (x - x.max()) / max(temperature, torch.finfo(torch.float32).tiny)
    keep = z > -math.inf
    if min_p > 0:
        keep &= z >= math.log(min_p)
    if 0 < top_k < z.numel():
        keep &= _above(z, torch.ones_like(z)) < top_k
    q = torch.where(keep, z.exp(), 0.0)
    if top_p < 1:
        keep &= _above(z, q / q.sum()) < top_p
        keep[z.argmax()] = True
    q = torch.where(keep, z.exp(), 0.0)
    return q / q.sum()


def _above(z: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """For each token v, the sum of `weight` over the tokens u with ``z[u] > z[v]``."""
    ascending, order = z.sort()
    suffix = weight[order].flip(0).cumsum(0).flip(0)  # suffix[i]: weight of sorted positions >= i
    first_above = torch.searchsorted(ascending, z, right=True)
    return torch.cat((suffix, suffix.new_zeros(1)))[first_above]


def penalized(x: torch.Tensor, repetition: float, frequency: float, presence: float, counts: torch.Tensor,
              prompt: torch.Tensor) -> torch.Tensor:
    """vLLM's penalties on one row, element by element (float64)."""
    seen = prompt | (counts > 0)
    x = torch.where(seen & (x > 0), x / repetition, torch.where(seen, x * repetition, x))
    return x - frequency * counts - presence * (counts > 0).double()


def chi_square_p(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """The p-value of `samples` (token ids) against `probs`: tokens expecting fewer than 5 draws pooled into one
    bin; a draw of a token of probability 0 (or out of range) gives 0."""
    n, v = samples.numel(), probs.numel()
    if bool(((samples < 0) | (samples >= v)).any()):
        return 0.0
    if bool((probs[samples.long()] <= 0).any()):
        return 0.0
    observed = torch.bincount(samples.long(), minlength=v).double()
    expected = probs * n
    big = expected >= 5
    o = torch.cat((observed[big], observed[~big].sum()[None]))
    e = torch.cat((expected[big], expected[~big].sum()[None]))
    o, e = o[e > 0], e[e > 0]
    if e.numel() < 2:
        return 1.0
    stat = float(((o - e) ** 2 / e).sum())
    return float(torch.special.gammaincc(torch.tensor((e.numel() - 1) / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def verdicts(result: torch.Tensor, args: tuple[object, ...], kwargs: dict[str, object]) -> list[torch.Tensor]:
    """One verdict per logits row, in float64 on the CPU (see the module docstring)."""
    logits, top_k, top_p, indices = (a.detach().cpu() for a in args)  # type: ignore[union-attr]
    get = {k: v.detach().cpu() for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    samples, rows = result.detach().cpu(), indices.long()
    r = logits.shape[0]
    alpha = _ALPHA / r
    out = torch.ones(r, dtype=torch.float64)
    for row in range(r):
        mine = rows == row
        b = int(mine.nonzero()[0, 0])
        x = logits[row].double()
        if "output_token_counts" in get:
            x = penalized(x, float(get["repetition_penalty"][row]), float(get["frequency_penalty"][row]),
                          float(get["presence_penalty"][row]), get["output_token_counts"][row].double(),
                          get["prompt_token_mask"][row])
        drawn = samples[mine]
        if bool((x.isnan() | (x == math.inf)).any() | (x == -math.inf).all()):
            out[row] = float(bool((drawn == -1).all()))
        elif float(get["temperature"][b]) <= 0:
            out[row] = float(bool((drawn == x.argmax()).all()))
        else:
            probs = filtered_probs(x, float(get["temperature"][b]), int(top_k[b]), float(top_p[b]),
                                   float(get["min_p"][b]))
            out[row] = min(1.0, chi_square_p(drawn, probs) / alpha)
    return [out]


def sampling_case(ctx: CaseContext) -> Case:
    gen = ctx.generator()
    draw = ctx.draw
    interpreted = ctx.device.type == "cpu" and ctx.impl.provider == "triton" and os.environ.get("TRITON_INTERPRET")
    r = 1 if interpreted else draw(st.integers(1, 3))
    penalized_ = ctx.pick("penalized", (False, True))
    v = draw(st.sampled_from(_LARGE_VOCAB if ctx.large else _VOCAB[:4] if interpreted else _VOCAB))
    draws = _LARGE_DRAWS if ctx.large else _INTERPRETED_DRAWS if interpreted else _DRAWS
    draws = max(min(draws, 100), min(draws, _LARGE_ELEMENTS // (r * v)))
    scale = draw(st.sampled_from((1.0, 3.0)))
    logits = randn(r, v, dtype=torch.float32, device=torch.device("cpu"), scale=scale, generator=gen)
    masked = torch.rand(r, v, generator=gen) < draw(st.sampled_from((0.0, 0.2)))
    masked[:, 0] = False
    logits = logits.masked_fill(masked, -math.inf)
    broken = draw(st.sampled_from((None, None, None, None, "nan", "inf")))
    if broken is not None and v > 1:
        logits[0, v // 2] = math.nan if broken == "nan" else math.inf
    options = [(draw(st.sampled_from((0.0, 0.5, 1.0, 1.7))), draw(st.sampled_from((0, 1, 2, 5, v))),
                draw(st.sampled_from((1.0, 0.9, 0.5, 0.1))), draw(st.sampled_from((0.0, 0.05, 0.3))))
               for _ in range(r)]
    per = torch.tensor(options, dtype=torch.float64).repeat_interleave(draws, 0)
    n = r * draws
    dev = ctx.device
    kwargs: dict[str, object] = {
        "temperature": per[:, 0].float().to(dev),
        "min_p": per[:, 3].float().to(dev),
        "seed": torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen, dtype=torch.int64).to(dev),
        "offset": torch.randint(0, 2**40, (n,), generator=gen, dtype=torch.int64).to(dev),
    }
    if penalized_:
        kwargs.update(
            repetition_penalty=torch.tensor([draw(st.sampled_from((1.0, 1.3, 0.8))) for _ in range(r)]).to(dev),
            frequency_penalty=torch.tensor([draw(st.sampled_from((0.0, 0.5))) for _ in range(r)]).to(dev),
            presence_penalty=torch.tensor([draw(st.sampled_from((0.0, 0.3))) for _ in range(r)]).to(dev),
            output_token_counts=torch.randint(0, 3, (r, v), generator=gen, dtype=torch.int32).to(dev),
            prompt_token_mask=(torch.rand(r, v, generator=gen) < 0.3).to(dev),
        )
    args = (logits.to(dev, ctx.dtype), per[:, 1].to(torch.int32).to(dev), per[:, 2].float().to(dev),
            torch.arange(r, device=dev).repeat_interleave(draws))
    ctx.record("vocab", v)
    return Case(args, kwargs, outputs=verdicts,
                note=f"logits[{r}, {v}] x{draws} draws (temperature, top_k, top_p, min_p) {options} "
                     f"penalized={penalized_} broken={broken}; output 0 = per-row verdict (1 = the draws pass)")


STRATEGIES = {"top_k_top_p_sampling_from_logits": sampling_case}
