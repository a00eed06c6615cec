"""Sampling: greedy, and seeded temperature / top-k / top-p (Hugging Face `generate` semantics).

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

from collections.abc import Sequence as Seq

import torch

from infinilm.engine.sequence import SamplingParams, Sequence

__all__ = ["filter_logits", "sample", "scale_logits"]


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
    logits = filter_logits(scale_logits(row, params.temperature), params.top_k, params.top_p)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)


def sample(logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
    """One next token per row of `logits` ``[B, V]`` (any float dtype), row ``b`` for ``seqs[b]``.

    Raises:
        ValueError: the number of rows differs from the number of sequences.
    """
    if logits.shape[0] != len(seqs):
        raise ValueError(f"logits: {logits.shape[0]} rows for {len(seqs)} sequences")
    greedy = logits.argmax(dim=-1)
    random_rows = [b for b, s in enumerate(seqs) if s.params.temperature > 0]
    if random_rows:
        greedy = greedy.clone()
        for b in random_rows:
            greedy[b] = _sample_one(logits[b], seqs[b].params, _generator(seqs[b], logits.device))[0]
    return greedy.tolist()
