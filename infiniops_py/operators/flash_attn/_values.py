"""FlashAttention's checked-mode checks: they read index tensors (sequence starts and lengths, cached
lengths, block tables, left padding) on the host, so the public functions call them only when `is_checked`
(by default on CPU; on CUDA inside ``checked_indices()`` or with ``INFINIOPS_CHECK_INDICES=1``). Each raises
`ContractError` naming the argument and the offending entry."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch

from infiniops_py.operators._base import ContractError, check_index_range, check_unique_indices

__all__ = ["check_append_slots", "check_cache_seqlens", "check_leftpad", "check_rotary_positions",
           "check_seqlens", "check_seqused", "check_used_blocks"]


def check_rotary_positions(op: str, last: Sequence[int], seqlen_ro: int) -> None:
    """Each sequence's last rotated query position (``cache_seqlens[b] + Sq - 1``) must be in the table."""
    for i, p in enumerate(last):
        if p >= seqlen_ro:
            raise ContractError(op, "rotary_cos", f"sequence {i} rotates query position {p}, but the table has "
                                                  f"{seqlen_ro} positions")


def check_leftpad(op: str, leftpad: torch.Tensor, cached: Sequence[int]) -> None:
    for i, (p, n) in enumerate(zip(leftpad.tolist(), cached)):
        if not 0 <= p <= n:
            raise ContractError(op, "cache_leftpad", f"cache_leftpad[{i}]={p} must be in [0, cache_seqlens[{i}]"
                                                     f"={n}]")


def check_seqlens(op: str, name: str, cu: torch.Tensor, total: int | None, total_text: str,
                  max_seqlen: int | None) -> list[int]:
    """Check cumulative sequence starts (and, unless `max_seqlen` is None, that no length exceeds it);
    returns the lengths."""
    starts = cu.tolist()
    if starts[0] != 0:
        raise ContractError(op, name, f"must start at 0, got {starts[0]}")
    lengths = [b - a for a, b in pairwise(starts)]
    for i, n in enumerate(lengths):
        if n < 0:
            raise ContractError(op, name, f"must not decrease: {name}[{i + 1}]={starts[i + 1]} < {starts[i]}")
    if total is not None and starts[-1] != total:
        raise ContractError(op, name, f"must end at {total_text}={total}, got {starts[-1]}")
    longest = max(lengths, default=0)
    if max_seqlen is not None and longest > max_seqlen:
        which = "max_seqlen_q" if name.endswith("_q") else "max_seqlen_k"
        raise ContractError(op, which, f"{max_seqlen} is below the longest sequence of {name} ({longest})")
    return lengths


def check_seqused(op: str, seqused_k: torch.Tensor, rows: Sequence[int] | None, max_seqlen_k: int) -> list[int]:
    """Check the keys used per sequence: >= 0, <= its `rows` (its cu_seqlens_k length; None when paged, where
    the block table bounds it) and <= `max_seqlen_k`; returns them."""
    used = seqused_k.tolist()
    for i, n in enumerate(used):
        if n < 0 or (rows is not None and n > rows[i]):
            bound = "" if rows is None else f", <= its {rows[i]} keys in cu_seqlens_k"
            raise ContractError(op, "seqused_k", f"seqused_k[{i}]={n} must be >= 0{bound}")
        if n > max_seqlen_k:
            raise ContractError(op, "max_seqlen_k", f"{max_seqlen_k} is below seqused_k[{i}]={n}")
    return used


def check_cache_seqlens(op: str, cache_seqlens: torch.Tensor, new: int, capacity: int) -> list[int]:
    """Check cached lengths; returns the attended lengths ``cache_seqlens[b] + new``."""
    lengths = []
    for i, n in enumerate(cache_seqlens.tolist()):
        if n < 0:
            raise ContractError(op, "cache_seqlens", f"cache_seqlens[{i}]={n} is negative")
        if n + new > capacity:
            raise ContractError(op, "cache_seqlens", f"cache_seqlens[{i}]={n} plus {new} new tokens exceeds the "
                                                     f"cache capacity {capacity} per sequence")
        lengths.append(n + new)
    return lengths


def check_used_blocks(op: str, table: torch.Tensor, lengths: Sequence[int], num_blocks: int,
                      block_size: int) -> None:
    """Every block id a sequence uses must be in [0, num_blocks); capacity must hold the sequence."""
    capacity = table.shape[1] * block_size
    for i, n in enumerate(lengths):
        if n > capacity:
            raise ContractError(op, "block_table", f"sequence {i} has {n} keys but {table.shape[1]} blocks of "
                                                   f"{block_size} hold {capacity}")
    used = torch.arange(table.shape[1], device=table.device)[None, :] < torch.tensor(
        [-(-n // block_size) for n in lengths], device=table.device, dtype=torch.long)[:, None]
    check_index_range(op, "block_table", table[used], num_blocks, allow_negative=False)


def check_append_slots(op: str, table: torch.Tensor, lengths: Sequence[int], new: int, block_size: int) -> None:
    """No two new k/v rows may land in one paged-cache slot (sequences whose tables share the block they
    append to): which write would land is undefined. Sequences may share the blocks they only read."""
    if not new:
        return
    pos = (torch.tensor(lengths, dtype=torch.long, device=table.device)[:, None] - new
           + torch.arange(new, device=table.device))  # [B, new]: cache_seqlens[b] + t, < capacity (checked)
    blocks = table.gather(1, pos // block_size).long()
    check_unique_indices(op, "block_table", (blocks * block_size + pos % block_size).flatten(),
                         "new k/v rows' cache slot (block * block_size + offset)")

