"""Memory relations between tensors: whether two overlap, whether they are one view, a tensor's byte extent.

The operators use these to refuse outputs that alias their inputs; they read only shapes, strides and
addresses, never tensor data.
"""

from __future__ import annotations

from typing import Final

import torch

__all__ = ["byte_extent", "overlaps", "same_view"]

_OVERLAP_WORK: Final = 4096  # search steps before `overlaps` answers "yes" without proof


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether some byte of an element of `a` is also a byte of an element of `b` (numpy's
    ``shares_memory``): the two column halves of one matrix, or the key and value halves of one
    ``[num_blocks, 2, ...]`` cache, do not overlap. An empty tensor overlaps nothing; on meta, where every
    storage starts at address 0, tensors of different storages never overlap.

    The answer is exact except for layouts so tangled that the search gives up after `_OVERLAP_WORK`
    steps, which count as overlapping.
    """
    if not a.numel() or not b.numel():
        return False
    if (a.is_meta or b.is_meta) and a.untyped_storage()._cdata != b.untyped_storage()._cdata:  # no addresses
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    # byte ranges apart: the common case (a contiguous tensor's range is its nbytes)
    if a0 + (a.nbytes if a.is_contiguous() else byte_extent(a)) <= b0:
        return False
    if b0 + (b.nbytes if b.is_contiguous() else byte_extent(b)) <= a0:
        return False
    isa, isb = a.element_size(), b.element_size()
    # Solve  sum_i sa_i * i_i - sum_j sb_j * j_j + x - y = b0 - a0  over index vectors i, j in range and
    # byte offsets x < a's element size, y < b's: terms (stride in bytes, lowest, highest multiple).
    terms: dict[int, list[int]] = {1: [1 - isb, isa - 1]}
    for t, sign, size in ((a, 1, isa), (b, -1, isb)):
        for st, n in zip(t.stride(), t.shape):
            if n > 1 and st:
                lo_hi = terms.setdefault(st * size, [0, 0])
                lo_hi[0 if sign < 0 else 1] += sign * (n - 1)
    steps = sorted(((s, lo, hi) for s, (lo, hi) in terms.items()), reverse=True)
    rest = [(0, 0)] * (len(steps) + 1)  # rest[k]: (min, max) of the terms after the k-th
    for k in range(len(steps) - 1, -1, -1):
        s, lo, hi = steps[k]
        rest[k] = (rest[k + 1][0] + s * lo, rest[k + 1][1] + s * hi)
    work = [_OVERLAP_WORK]
    return _reachable(b0 - a0, steps, rest, 0, work)


def _span(t: torch.Tensor) -> int:
    """Elements from `t`'s first to its last element, both included (`t` not empty)."""
    span = 1
    for st, n in zip(t.stride(), t.shape):  # a plain loop: the operators' overlap checks run on every call
        span += st * (n - 1)
    return span


def byte_extent(t: torch.Tensor) -> int:
    """The bytes from the first byte of `t`'s lowest element to the last byte of its highest: every element
    lies in ``[t.data_ptr(), t.data_ptr() + byte_extent(t))`` (torch strides are never negative, so
    ``data_ptr`` is the lowest address). ``t.nbytes`` for a contiguous tensor, 0 for an empty one.

    Two tensors whose ranges are disjoint share no memory, whatever storage objects they belong to (two
    ``torch.from_numpy`` of views of one array are distinct storages over one buffer); the operators' hot
    paths compare these ranges and call `overlaps` only when they meet.
    """
    if not t.numel():
        return 0
    return _span(t) * t.element_size()


def _reachable(d: int, steps: list[tuple[int, int, int]], rest: list[tuple[int, int]], k: int,
               work: list[int]) -> bool:
    """Whether ``d = sum s * m`` over the terms ``(s, lo, hi)`` from the k-th on, each ``lo <= m <= hi``."""
    if not rest[k][0] <= d <= rest[k][1]:
        return False
    if k == len(steps):
        return True
    s, lo, hi = steps[k]
    low_rest, high_rest = rest[k + 1]
    first = max(lo, -((high_rest - d) // s))  # ceil((d - high_rest) / s)
    last = min(hi, (d - low_rest) // s)
    for m in range(first, last + 1):
        work[0] -= 1
        if work[0] < 0 or _reachable(d - s * m, steps, rest, k + 1, work):
            return True
    return False


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` are the same non-empty elements in the same order (``out=input`` in place)."""
    if a.data_ptr() != b.data_ptr() or a.shape != b.shape or a.stride() != b.stride() or not a.numel():
        return False
    return not a.is_meta or a.untyped_storage()._cdata == b.untyped_storage()._cdata
