"""Sampling: greedy, and seeded temperature / min-p / top-k / top-p, with vLLM's penalties and logprobs.

Greedy is ``argmax`` (the first index wins a tie, as in `torch.argmax`). Random sampling scales the logits
by ``1 / temperature``, keeps the top-k, then the smallest most-likely set whose probability reaches
top-p (the most likely token always stays), and draws from the softmax with the request's own
`torch.Generator`, seeded from `SamplingParams.seed`: a seeded request gives the same tokens whatever
else shares its batch.

The scaling is ``(logits - max) / temperature`` in float64 (`scale_logits`): the softmax is the same (it is
shift-invariant), and every positive finite temperature, however small, gives finite scaled logits whose
maximum is 0, so a temperature far below the gaps between logits samples among the tied maxima (the limit of
the softmax) instead of dividing to ``inf`` and drawing from NaN. No threshold turns a small temperature
into greedy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq

import torch

from infinilm.engine.sequence import SamplingParams, Sequence

__all__ = ["apply_penalties", "filter_logits", "logprobs", "sample", "scale_logits"]


def scale_logits(row: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(row - row.max()) / temperature`` in float64, for a row ``[V]`` of logits in any float dtype.

    float64 holds every positive finite Python float (a float32 temperature would round 1e-300 to 0), and
    after the shift the maximum divides to exactly 0, so the result is never NaN for finite logits: entries
    far below the maximum go to -inf, which the softmax turns into probability 0.
    """
    row = row.double()
    return (row - row.max()) / temperature


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set to -inf the entries of `logits` ``[V]`` (float32 or float64) outside the top-k and the top-p nucleus."""
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens more likely than it already reach top_p
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter_(0, order, drop), float("-inf"))
    return logits


def apply_penalties(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """`row` ``[V]`` with `seq`'s repetition (prompt and output tokens), frequency and presence (output tokens)
    penalties applied, in float64 (vLLM's ``apply_penalties``: repetition first, then the additive ones)."""
    params = seq.params
    row = row.double()
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.tokens)), dtype=torch.int64, device=row.device)
        picked = row[seen]
        row = row.index_put((seen,), torch.where(picked > 0, picked / params.repetition_penalty,
                                                  picked * params.repetition_penalty))
    if seq.num_output and (params.frequency_penalty or params.presence_penalty):
        counts = torch.bincount(torch.tensor(seq.output, dtype=torch.int64, device=row.device),
                                minlength=row.numel())[: row.numel()].double()
        row = row - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).double()
    return row


def _min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop the entries whose probability is below `min_p` times the largest (scaled logits, max 0)."""
    if min_p <= 0.0:
        return logits
    return logits.masked_fill(logits < logits.max() + math.log(min_p), float("-inf"))


def _generator(seq: Sequence, device: torch.device) -> torch.Generator:
    if seq.generator is None:
        gen = torch.Generator(device=device)
        if seq.params.seed is not None:
            gen.manual_seed(seq.params.seed)
        else:
            gen.seed()
        seq.generator = gen
    return seq.generator


def _sample_one(row: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> torch.Tensor:
    logits = _min_p(scale_logits(row, params.temperature), params.min_p)
    logits = filter_logits(logits, params.top_k, params.top_p)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)


def sample(logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
    """One next token per row of `logits` ``[B, V]`` (any float dtype), row ``b`` for ``seqs[b]``.

    Raises:
        ValueError: the number of rows differs from the number of sequences.
    """
    if logits.shape[0] != len(seqs):
        raise ValueError(f"logits: {logits.shape[0]} rows for {len(seqs)} sequences")
    greedy = logits.argmax(dim=-1)
    rows = [b for b, s in enumerate(seqs) if s.params.temperature > 0 or s.params.penalized]
    if rows:
        greedy = greedy.clone()
        for b in rows:
            seq = seqs[b]
            row = apply_penalties(logits[b], seq) if seq.params.penalized else logits[b]
            if seq.params.temperature > 0:
                greedy[b] = _sample_one(row, seq.params, _generator(seq, logits.device))[0]
            else:
                greedy[b] = row.argmax()
    return greedy.tolist()


def logprobs(logits: torch.Tensor, seqs: Seq[Sequence], tokens: Seq[int]
             ) -> list[tuple[float, tuple[tuple[int, float], ...]] | None]:
    """Per row: the log-probability of ``tokens[b]`` and the ``seqs[b].params.logprobs`` most likely
    ``(token, logprob)`` pairs (most likely first), from ``log_softmax`` of the raw logits in float32 (vLLM's
    ``raw_logprobs``); None for a row whose request asks for none."""
    wanted = [b for b, s in enumerate(seqs) if s.params.logprobs is not None]
    out: list[tuple[float, tuple[tuple[int, float], ...]] | None] = [None] * len(seqs)
    if not wanted:
        return out
    index = torch.tensor(wanted, dtype=torch.int64, device=logits.device)
    lp = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    k = max(seqs[b].params.logprobs or 0 for b in wanted)
    chosen = lp.gather(1, torch.tensor([[tokens[b]] for b in wanted], dtype=torch.int64,
                                       device=logits.device)).squeeze(1).tolist()
    top_values, top_ids = (lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long()))
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    for i, b in enumerate(wanted):
        n = seqs[b].params.logprobs or 0
        out[b] = (chosen[i], tuple(zip(top_ids[i][:n], top_values[i][:n])))
    return out
