"""Paged-cache write, vLLM reshape_and_cache_flash semantics (DESIGN.md operator 5).

Public: reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping) -> None.
Implementation calling convention: fn(key, value, key_cache, value_cache, slot_mapping) -> None;
  key/value [T, Hkv, D] (strided views allowed, last stride 1); caches [num_blocks, block_size, Hkv, D];
  slot_mapping int64 [N], N <= T; slot s -> block s // block_size, offset s % block_size; s < 0 skipped.
  Implementations must never write out of bounds, even for an unchecked out-of-range slot (skip it).
Problem fields: head_dim, block_size, num_kv_heads (int).
"""

from __future__ import annotations

SPECS = ()  # placeholder: the contract module is being written
