"""The paged KV cache: a block allocator and the per-layer ``[num_blocks, block_size, Hkv, D]`` tensors.

A sequence owns a list of block ids (its block table); token ``i`` of the sequence lives in block
``table[i // block_size]`` at offset ``i % block_size``, i.e. slot ``table[i // block_size] * block_size +
i % block_size``. The allocator never hands out a block twice and rejects a free of a block it does not
own, before changing anything, so a bug upstream cannot corrupt another sequence's cache.

`check_fits` refuses a cache (or a recurrent state pool) larger than the device's memory before it is
allocated, with the bytes it would need.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from pathlib import Path

import torch

from infinilm.config_checks import ConfigError

__all__ = ["BlockAllocator", "CacheError", "KVCache", "check_fits", "device_memory", "slots_for"]


class CacheError(RuntimeError):
    """An allocator misuse: a double free, a foreign block id, or more blocks than exist."""


class BlockAllocator:
    """Hands out KV-cache block ids from a free list.

    Attributes:
        num_blocks: blocks in the cache (ids ``0 .. num_blocks - 1``).
        block_size: tokens per block.
    """

    __slots__ = ("_free", "_used", "block_size", "num_blocks")

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise CacheError(f"num_blocks={num_blocks} and block_size={block_size} must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_needed(self, num_tokens: int, num_held: int = 0) -> int:
        """Blocks to add to a table of `num_held` blocks so that it holds `num_tokens` tokens."""
        return max(0, math.ceil(num_tokens / self.block_size) - num_held)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take `n` free blocks.

        Raises:
            CacheError: fewer than `n` blocks are free (nothing is taken then).
        """
        if n < 0 or n > len(self._free):
            raise CacheError(f"cannot allocate {n} block(s): {len(self._free)} of {self.num_blocks} free")
        blocks = [self._free.popleft() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def append(self, table: list[int], num_tokens: int) -> None:
        """Grow `table` in place so that it holds `num_tokens` tokens.

        Raises:
            CacheError: not enough free blocks (the table is left unchanged).
        """
        table.extend(self.allocate(self.blocks_needed(num_tokens, len(table))))

    def free(self, blocks: Iterable[int]) -> None:
        """Return `blocks` to the free list.

        Raises:
            CacheError: a block is not allocated (a double free or a foreign id), or listed twice;
                nothing is freed then.
        """
        blocks = list(blocks)
        bad = [b for b in blocks if b not in self._used]
        if bad or len(set(blocks)) != len(blocks):
            raise CacheError(f"cannot free block(s) {bad or blocks}: not allocated, or listed twice")
        self._used.difference_update(blocks)
        self._free.extend(blocks)


def slots_for(table: list[int], start: int, stop: int, block_size: int) -> list[int]:
    """The cache slots of tokens ``start .. stop - 1`` of a sequence with block table `table`."""
    return [table[i // block_size] * block_size + i % block_size for i in range(start, stop)]


class KVCache:
    """Per-layer key and value caches ``[num_blocks, block_size, Hkv, D]`` and their allocator."""

    __slots__ = ("allocator", "keys", "values")

    def __init__(
        self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype, device: torch.device | str,
    ) -> None:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.allocator = BlockAllocator(num_blocks, block_size)

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """Bytes one block takes over all layers, keys and values."""
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def _cpu_memory() -> int | None:
    """Bytes of host memory a process can ever hold on Linux: the cgroup v2 ``memory.max`` when one is set,
    else ``MemTotal + SwapTotal`` of ``/proc/meminfo``; None where neither is readable."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = "max"
    if limit.isdigit():
        return int(limit)
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return (int(fields["MemTotal"].split()[0]) + int(fields.get("SwapTotal", "0 kB").split()[0])) * 1024
    except (ValueError, OSError, KeyError, IndexError):
        return None


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """``(available, total)`` bytes of memory on `device`, or None when unknown.

    CUDA: ``torch.cuda.mem_get_info`` (free, total), None when CUDA is not available or the device index does
    not exist. CPU (Linux): the memory a process can ever hold (`_cpu_memory`) for both: ``MemAvailable``
    under-reports where the kernel reclaims caches on demand and on VMs whose memory grows as it is used, so
    on CPU only a size that can never fit is refused. None elsewhere.
    """
    if device.type == "cuda":
        index = device.index if device.index is not None else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    if device.type == "cpu":
        total = _cpu_memory()
        return None if total is None else (total, total)
    return None


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def check_fits(what: str, needed: int, device: torch.device, *, now: bool, fix: str) -> None:
    """Refuse, before allocating it, `what` (e.g. ``"num_blocks=8: the KV cache"``) of `needed` bytes on `device`.

    `now` False compares with the device's total memory (a size that can never fit, checked before any weight
    is read); True with the memory available at this moment (CUDA: free; CPU: the total, see `device_memory`),
    just before the allocation. Nothing is checked where `device_memory` does not know the memory.

    Raises:
        ConfigError: `needed` exceeds that memory; the message gives both sizes in bytes and `fix`.
    """
    memory = device_memory(device)
    if memory is None:
        return
    limit = memory[0] if now else memory[1]
    if needed > limit:
        kind = "available" if now else "total"
        raise ConfigError(f"{what} needs {needed} bytes ({_size(needed)}), more than the {limit} bytes "
                          f"({_size(limit)}) of {kind} memory on {device}; {fix}")
