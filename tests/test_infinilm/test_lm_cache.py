"""The block allocator: allocation, growth, frees, and refusal of every misuse before any change."""

from __future__ import annotations

import pytest

from infinilm.engine.kv_cache import BlockAllocator, CacheError, KVCache, slots_for


def test_allocate_append_free_round_trip() -> None:
    alloc = BlockAllocator(num_blocks=6, block_size=4)
    table: list[int] = []
    alloc.append(table, 5)  # 2 blocks
    assert len(table) == 2 and alloc.num_free == 4
    alloc.append(table, 8)  # still 2
    assert len(table) == 2
    alloc.append(table, 9)  # a third
    assert len(table) == 3 and len(set(table)) == 3 and alloc.num_free == 3
    other = alloc.allocate(3)
    assert not set(other) & set(table) and alloc.num_free == 0
    alloc.free(table)
    alloc.free(other)
    assert alloc.num_free == 6


def test_exhaustion_raises_and_takes_nothing() -> None:
    alloc = BlockAllocator(num_blocks=3, block_size=4)
    table = alloc.allocate(2)
    grown = list(table)
    with pytest.raises(CacheError, match="1 of 3 free"):
        alloc.append(grown, 17)  # needs 3 more
    assert grown == table and alloc.num_free == 1 and not alloc.can_allocate(2)


@pytest.mark.parametrize("bad", [[0, 0], [5], [99], [-1]], ids=["twice", "not-allocated", "foreign", "negative"])
def test_bad_free_raises_before_freeing_anything(bad: list[int]) -> None:
    alloc = BlockAllocator(num_blocks=6, block_size=4)
    mine = alloc.allocate(3)  # 0, 1, 2
    with pytest.raises(CacheError, match="cannot free"):
        alloc.free([mine[1], *bad] if bad != [0, 0] else bad)
    assert alloc.num_free == 3
    alloc.free(mine)
    with pytest.raises(CacheError):
        alloc.free(mine)  # double free
    assert alloc.num_free == 6


def test_slots_and_cache_shapes() -> None:
    assert slots_for([7, 2], 2, 7, block_size=4) == [30, 31, 8, 9, 10]
    assert BlockAllocator(4, 16).blocks_needed(33, 1) == 2
    import torch

    cache = KVCache(num_layers=2, num_blocks=5, block_size=8, num_kv_heads=2, head_dim=16, dtype=torch.bfloat16,
                    device="cpu")
    assert len(cache.keys) == 2 and cache.values[1].shape == (5, 8, 2, 16)
    assert KVCache.bytes_per_block(2, 8, 2, 16, torch.bfloat16) == 2 * 2 * 8 * 2 * 16 * 2
