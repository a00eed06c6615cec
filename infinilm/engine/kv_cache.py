"""The paged KV cache: a block allocator and the per-layer ``[num_blocks, block_size, Hkv, D]`` tensors.

A sequence owns a list of block ids (its block table); token ``i`` of the sequence lives in block
``table[i // block_size]`` at offset ``i % block_size``, i.e. slot ``table[i // block_size] * block_size +
i % block_size``. The allocator never hands out a block twice and rejects a free of a block it does not
own, before changing anything, so a bug upstream cannot corrupt another sequence's cache.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import ClassVar

import torch

from infinilm.config import ConfigError, EngineOptions, ModelConfig
from infinilm.engine.memory import cache_units, check_cache_fits

__all__ = ["BlockAllocator", "CacheError", "KVCache", "slots_for"]


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
        """Blocks not held by any table."""
        return len(self._free)

    def blocks_needed(self, num_tokens: int, num_held: int = 0) -> int:
        """Blocks to add to a table of `num_held` blocks so that it holds `num_tokens` tokens."""
        return max(0, math.ceil(num_tokens / self.block_size) - num_held)

    def can_allocate(self, n: int) -> bool:
        """Whether `n` blocks are free."""
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
    WHAT: ClassVar[str] = "KV cache"

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

    @staticmethod
    def unit_bytes(config: ModelConfig, options: EngineOptions) -> int:
        """Bytes of one block of `config`'s cache under `options` (its dtype and block size)."""
        return KVCache.bytes_per_block(config.num_layers, options.block_size, config.num_kv_heads, config.head_dim,
                                       options.resolved_dtype(config))

    @classmethod
    def check_blocks(cls, config: ModelConfig, options: EngineOptions, num_blocks: int) -> None:
        """Refuse `num_blocks` blocks that cannot hold one sequence of ``max_model_len`` tokens.

        Raises:
            ConfigError: fewer blocks than one full-length sequence needs.
        """
        per_seq = options.blocks_per_seq(config)
        if num_blocks < per_seq:
            raise ConfigError(f"num_blocks={num_blocks} cannot hold one sequence of max_model_len="
                              f"{options.model_len(config)} ({per_seq} blocks of {options.block_size}); "
                              f"lower max_model_len or give more blocks")

    @classmethod
    def for_engine(cls, config: ModelConfig, options: EngineOptions, device: torch.device) -> KVCache:
        """The cache of ``options.num_blocks`` blocks, else as many as the memory budget holds
        (`infinilm.engine.memory.memory_budget`), at most every sequence at full length.

        Raises:
            ConfigError: the blocks cannot hold one full-length sequence, or need more memory than `device`
                has available (checked before allocating).
        """
        per_block = cls.unit_bytes(config, options)
        blocks = cache_units(options, device, per_block, options.max_num_seqs * options.blocks_per_seq(config))
        cls.check_blocks(config, options, blocks)
        check_cache_fits(cls.WHAT, blocks, per_block, options, device, now=True)
        return cls(config.num_layers, blocks, options.block_size, config.num_kv_heads, config.head_dim,
                   options.resolved_dtype(config), device)
