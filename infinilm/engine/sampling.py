"""Sampling: one batched call of the ``top_k_top_p_sampling_from_logits`` operator per step, and logprobs.

Each row gets its request's options (vLLM's semantics: penalties on the raw logits, then temperature, min-p,
top-k, top-p; temperature 0 is the argmax, the first index on ties), its Philox seed (`SamplingParams.seed`, or
one drawn once per request) and its draw number as the offset: a seeded request gives the same tokens whatever
else shares its batch. A positive temperature below float32's smallest normal is raised to it, so it samples
among the tied maxima (the limit of the softmax), as ``(logits - max) / temperature`` in float64 did
(`scale_logits`); no threshold turns a small temperature into greedy. A row of non-finite logits gives -1.

`scale_logits`, `filter_logits` and `apply_penalties` are the per-row form of these semantics (float64, one row
at a time): the tests hold the operator's draws to them.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import numpy as np
import torch

from infinilm.engine.sequence import Sequence
from infiniops_py import top_k_top_p_sampling_from_logits

__all__ = ["apply_penalties", "filter_logits", "logprobs", "sample", "sample_ids", "scale_logits"]


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


def _seed(seq: Sequence) -> int:
    """The request's Philox seed (int64 bits): `SamplingParams.seed`, else one drawn once from torch's CPU
    generator."""
    if seq.seed is None:
        seed = seq.params.seed if seq.params.seed is not None else int(torch.randint(0, 2**63 - 1, ()))
        seq.seed = seed - 2**64 if seed >= 2**63 else seed  # the same 64 bits, as an int64
    return seq.seed


def _to(host: torch.Tensor, dev: torch.device) -> torch.Tensor:
    """`host` on `dev`: on CUDA through pinned memory (torch's caching host allocator), so that the copy never
    waits for the work queued before it (a copy from pageable memory may: async scheduling queues the next step
    while the device runs this one)."""
    return host.pin_memory().to(dev, non_blocking=True) if dev.type == "cuda" else host


def _penalties(logits: torch.Tensor, seqs: Seq[Sequence]) -> dict[str, torch.Tensor]:
    """The operator's penalty inputs for `seqs` (empty when none is penalized): the factors ``[B]``, the output
    counts ``[B, V]`` and the prompt mask, each by one ``scatter_add_`` over the padded ids."""
    if not any(s.params.penalized for s in seqs):
        return {}
    b, v = logits.shape
    dev = logits.device

    def counts(lists: list[list[int]]) -> torch.Tensor:
        width = max(1, max(len(x) for x in lists))
        ids = torch.tensor([x + [-1] * (width - len(x)) for x in lists], dtype=torch.int64).to(dev, non_blocking=True)
        return torch.zeros(b, v, dtype=torch.int32, device=dev).scatter_add_(1, ids.clamp_min(0), (ids >= 0).int())

    output = counts([s.output if s.params.penalized else [] for s in seqs])
    prompt = counts([s.tokens[: s.num_prompt] if s.params.penalized else [] for s in seqs]) > 0

    def factor(name: str) -> torch.Tensor:
        return torch.tensor([getattr(s.params, name) for s in seqs], dtype=torch.float32).to(dev, non_blocking=True)

    return {"repetition_penalty": factor("repetition_penalty"), "frequency_penalty": factor("frequency_penalty"),
            "presence_penalty": factor("presence_penalty"), "output_token_counts": output,
            "prompt_token_mask": prompt}


def sample(logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
    """One next token per row of `logits` ``[B, V]`` (any float dtype), row ``b`` for ``seqs[b]``: `sample_ids`,
    read to the host (the step's one synchronization).

    Raises:
        ValueError: the number of rows differs from the number of sequences.
    """
    if len(seqs) == logits.shape[0] and seqs and _all_greedy(seqs):
        ids = _greedy_numpy(logits)  # int64 (the int32 cast of `sample_ids` is one op more, for nothing here)
        return (ids if ids is not None else _greedy(logits)).tolist()
    return sample_ids(logits, seqs).tolist()


def _all_greedy(seqs: Seq[Sequence]) -> bool:
    """Whether every one of `seqs` is greedy and unpenalized (vLLM's all-greedy step)."""
    return all(s.params.plain_greedy for s in seqs)


_NUMPY_DTYPES = frozenset((torch.float16, torch.float32, torch.float64))


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    """vLLM's all-greedy step: the argmax of each row (the first on ties), int64, -1 for a row with a NaN, a +inf
    or no logit above -inf (the operator's answer for such a row: its max is not finite). On the CPU, for the
    dtypes NumPy has, by NumPy on the logits' memory (the same answer, without torch's per-op dispatch, which
    on rows this small costs more than the work)."""
    ids = _greedy_numpy(logits)
    if ids is not None:
        return torch.from_numpy(ids)
    top, ids = logits.max(-1)
    return torch.where(top.isfinite(), ids, -1)


def _greedy_numpy(logits: torch.Tensor) -> np.ndarray[Any, Any] | None:
    """`_greedy` by NumPy, int64, for CPU logits of a dtype NumPy has; None for any other."""
    if logits.device.type != "cpu" or logits.dtype not in _NUMPY_DTYPES:
        return None
    rows = (logits.detach() if logits.requires_grad else logits).numpy()
    ids = rows.argmax(-1)
    ids[~np.isfinite(rows.max(-1))] = -1
    return ids


def sample_ids(logits: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
    """The next tokens of `seqs` as int32 ``[B]`` on the logits' device, not read: the argmax for a batch of
    greedy, unpenalized requests (vLLM's all-greedy path), else one call of
    `top_k_top_p_sampling_from_logits` for the whole batch, each row with its request's options, seed and
    draw number (`Sequence.draws`, so a seeded request draws the same tokens in any batch). A row whose logits
    are non-finite gives -1 (the scheduler finishes that request with `FinishReason.ERROR`). Nothing here
    synchronizes with the device: the options go to it as non-blocking copies.

    Raises:
        ValueError: the number of rows differs from the number of sequences.
    """
    if logits.shape[0] != len(seqs):
        raise ValueError(f"logits: {logits.shape[0]} rows for {len(seqs)} sequences")
    dev = logits.device
    if not seqs:
        return torch.empty(0, dtype=torch.int32, device=dev)
    if _all_greedy(seqs):  # without per-row options
        return _greedy(logits).int()
    tiny = torch.finfo(torch.float32).tiny  # a positive temperature below it would round to 0 (greedy)
    # one option per row of these [3, B] tensors: each row is a contiguous [B] tensor on the device
    options = _to(torch.tensor([[s.params.temperature and max(s.params.temperature, tiny) for s in seqs],
                                [s.params.top_p for s in seqs], [s.params.min_p for s in seqs]],
                               dtype=torch.float32), dev)
    seeds = [_seed(s) if s.params.temperature > 0 else 0 for s in seqs]
    ints = _to(torch.tensor([[s.params.top_k for s in seqs], seeds, [s.draws for s in seqs]], dtype=torch.int64), dev)
    for s in seqs:
        s.draws += 1
    return top_k_top_p_sampling_from_logits(logits, ints[0].int(), options[1], temperature=options[0],
                                            min_p=options[2], seed=ints[1], offset=ints[2],
                                            **_penalties(logits, seqs))


def logprobs(logits: torch.Tensor, seqs: Seq[Sequence], tokens: Seq[int]
             ) -> list[tuple[float, tuple[tuple[int, float], ...]] | None]:
    """Per row: the log-probability of ``tokens[b]`` and the ``seqs[b].params.logprobs`` most likely
    ``(token, logprob)`` pairs (most likely first), from ``log_softmax`` of the raw logits in float32 (vLLM's
    ``raw_logprobs``); None for a row whose request asks for none or whose token is -1 (non-finite logits)."""
    wanted = [b for b, s in enumerate(seqs) if s.params.logprobs is not None and tokens[b] >= 0]
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
