"""Token embedding (plain PyTorch lookup) and the LM head (a Gemm through `infiniops_py`).

Tensor parallelism (vLLM's ``VocabParallelEmbedding`` and ``ParallelLMHead``): each rank holds ``ceil(V / size)``
rows of the vocabulary (`infinilm.distributed.parallel.TensorParallel.vocab`; the last rank's tail rows are
zero padding). The embedding looks up the ids of its rows, writes zeros for the others, and one
`infiniops_py.all_reduce` sums the ranks' rows (every id is some rank's: the sum is that rank's row, exactly).
The LM head computes the logits of its rows and places them, among zeros, at their columns of a ``[B,
size * ceil(V / size)]`` buffer; one `infiniops_py.all_reduce` gathers the whole row on every rank (adding zeros
is exact), of which the first V columns are the logits, for rank 0 to sample from.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from infinilm.distributed.parallel import Shard, TensorParallel
from infiniops_py import all_reduce, gemm

__all__ = ["Embedding", "LMHead", "ParallelLMHead", "VocabParallelEmbedding"]


class Embedding:
    """Lookup in weight ``[V, H]``: int64 ids ``[T]`` -> ``[T, H]``."""

    __slots__ = ("weight",)

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype, device: torch.device) -> None:
        self.weight = torch.empty(vocab_size, hidden_size, dtype=dtype, device=device)

    def target(self) -> torch.Tensor:
        """What the checkpoint's embedding table loads into: the whole weight."""
        return self.weight

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LMHead:
    """Logits ``[B, V]`` = hidden ``[B, H]`` @ weight ``[V, H]``.T; weight may be the embedding's (tied)."""

    __slots__ = ("weight",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def target(self) -> torch.Tensor:
        """What the checkpoint's ``lm_head.weight`` loads into: the whole weight."""
        return self.weight

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return gemm(hidden, self.weight, trans_b=True)


class VocabParallelEmbedding:
    """This rank's rows ``[start, stop)`` of the table, in a weight ``[ceil(V / size), H]`` (padding rows zero):
    int64 ids ``[T]`` -> ``[T, H]``, the whole lookup on every rank (one all-reduce)."""

    __slots__ = ("start", "stop", "vocab_size", "weight")

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel, *, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.start, self.stop, rows = tp.vocab(vocab_size)
        self.vocab_size = vocab_size
        self.weight = torch.zeros(rows, hidden_size, dtype=dtype, device=device)

    def target(self) -> Shard:
        """This rank's rows of the checkpoint's ``[V, H]`` table."""
        n = self.stop - self.start
        return Shard(self.weight[:n], (self.vocab_size, self.weight.shape[1]), 0, ((self.start, self.stop),))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.stop - self.start)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill_(outside[:, None], 0))


class ParallelLMHead:
    """Logits ``[B, V]`` on every rank from this rank's rows of the head, weight ``[ceil(V / size), H]`` (the
    `VocabParallelEmbedding`'s when tied; padding rows zero): its ``[B, rows]`` Gemm, then one all-reduce of the
    ranks' logits placed side by side. The result is a ``[:, :V]`` view of the gathered ``[B, size * rows]``."""

    __slots__ = ("rank", "size", "start", "stop", "vocab_size", "weight")

    def __init__(self, weight: torch.Tensor, vocab_size: int, tp: TensorParallel) -> None:
        self.weight, self.vocab_size, self.rank, self.size = weight, vocab_size, tp.rank, tp.size
        self.start, self.stop, _ = tp.vocab(vocab_size)

    def target(self) -> Shard:
        """This rank's rows of the checkpoint's ``lm_head.weight`` ``[V, H]``."""
        n = self.stop - self.start
        return Shard(self.weight[:n], (self.vocab_size, self.weight.shape[1]), 0, ((self.start, self.stop),))

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = self.weight.shape[0]
        full = hidden.new_zeros(hidden.shape[0], self.size * rows)
        full[:, self.rank * rows:(self.rank + 1) * rows] = gemm(hidden, self.weight, trans_b=True)
        return all_reduce(full)[:, :self.vocab_size]
