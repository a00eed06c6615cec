"""Paged-cache write, vLLM reshape_and_cache_flash semantics (DESIGN.md operator 5).

Public: reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping) -> None.
Implementation calling convention: fn(key, value, key_cache, value_cache, slot_mapping) -> None;
  key/value [T, Hkv, D] (strided views allowed, last stride 1); caches [num_blocks, block_size, Hkv, D];
  slot_mapping int64 [N], N <= T; slot s -> block s // block_size, offset s % block_size; s < 0 skipped.
  Implementations must never write out of bounds, even for an unchecked out-of-range slot (skip it).
  (Caches may be strided views too, last stride 1: e.g. the HND layout [num_blocks, Hkv, block_size, D]
  permuted to NHD, or the two halves of one [num_blocks, 2, block_size, Hkv, D] buffer.)
Problem fields: head_dim, block_size, num_kv_heads (int).
"""

from __future__ import annotations

import torch

from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    ContractError,
    OpSpec,
    check_device,
    check_dtype,
    check_index_range,
    check_no_grad,
    check_no_overlap,
    check_tensor,
    check_unique_indices,
    check_writable,
)
from infiniops_py.operators._torch_library import lowered

__all__ = ["SPECS", "reference", "reshape_and_cache_flash"]

_OP = "reshape_and_cache_flash"


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write each token's key and value into its slot of a paged KV cache (vLLM ``reshape_and_cache_flash``).

    Token ``i < N`` goes to block ``s // block_size``, offset ``s % block_size`` of both caches, where
    ``s = slot_mapping[i]``; ``s < 0`` marks a padding token, which is skipped. The token count is
    ``N = len(slot_mapping)``: rows of `key` past ``N`` are padding and are never read. Non-negative slots
    must be unique: in checked mode a repeated one raises; unchecked, which of the tokens lands in the slot
    is undefined (providers differ; vLLM's kernel races there too).

    Args:
        key, value: ``[T, Hkv, D]``, dtype float16/bfloat16/float32/float64, last stride 1 (strided views
            of a packed QKV projection are fine), same shape, dtype and device.
        key_cache, value_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype and device as `key`, last
            stride 1 (NHD, or an HND buffer viewed as NHD); updated in place.
        slot_mapping: int64 ``[N]``, ``N <= T``; in checked mode every value must be ``< num_blocks *
            block_size`` and no non-negative value may repeat.

    The caches are written in place, so neither may have a zero-stride (expanded) or otherwise
    self-overlapping dim, and neither may share memory (by address, whatever storage objects hold them)
    with the other, the new `key`/`value` or `slot_mapping` (the two halves of one
    ``[num_blocks, 2, block_size, Hkv, D]`` buffer share none). A rejected call writes nothing.

    Raises:
        ContractError: a non-tensor, a mismatched shape, dtype or device, a last stride other than 1,
            ``N > T``, an expanded or overlapping cache, a tensor that requires grad while grad mode is
            on, or (in checked mode) a slot ``>= num_blocks * block_size`` or a repeated slot.
    """
    if lowered(key):  # torch.compile / torch.export / FakeTensor: the custom operator
        torch.ops.infiniops.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping)
        return None
    for name, t in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
                    ("slot_mapping", slot_mapping)):
        check_tensor(_OP, name, t)
    check_no_grad(_OP, {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
                        "slot_mapping": slot_mapping})
    check_dtype(_OP, "key", key, FLOAT_DTYPES)
    dev, dt = key.device, key.dtype
    if key.dim() != 3:
        raise ContractError(_OP, "key", f"expected shape [T, Hkv, D], got {list(key.shape)}")
    t, hkv, d = key.shape
    if value.shape != key.shape:
        raise ContractError(_OP, "value", f"expected shape {list(key.shape)} (same as key), got {list(value.shape)}")
    if key_cache.dim() != 4 or key_cache.shape[2:] != (hkv, d):
        raise ContractError(
            _OP, "key_cache", f"expected shape [num_blocks, block_size, {hkv}, {d}], got {list(key_cache.shape)}"
        )
    if value_cache.shape != key_cache.shape:
        raise ContractError(
            _OP, "value_cache", f"expected shape {list(key_cache.shape)} (same as key_cache), "
            f"got {list(value_cache.shape)}"
        )
    for name, x in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        if x.dtype != dt:
            raise ContractError(_OP, name, f"expected dtype {dt} (same as key), got {x.dtype}")
        check_device(_OP, name, x, dev)
    for name, x in (("key", key), ("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        if x.stride(-1) != 1 and d > 1:
            raise ContractError(_OP, name, f"expected last stride 1, got strides {list(x.stride())}")
    if slot_mapping.dtype != torch.int64:
        raise ContractError(_OP, "slot_mapping", f"expected dtype torch.int64, got {slot_mapping.dtype}")
    check_device(_OP, "slot_mapping", slot_mapping, dev)
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] > t:
        raise ContractError(
            _OP, "slot_mapping", f"expected shape [N] with N <= {t} (key's tokens), got {list(slot_mapping.shape)}"
        )
    num_blocks, block_size = key_cache.shape[:2]
    check_writable(_OP, "key_cache", key_cache)
    check_writable(_OP, "value_cache", value_cache)
    check_no_overlap(_OP, "value_cache", value_cache, "key_cache", key_cache)
    for name, t in (("key", key[:slot_mapping.shape[0]]), ("value", value[:slot_mapping.shape[0]]),
                    ("slot_mapping", slot_mapping)):
        check_no_overlap(_OP, name, t, "key_cache", key_cache)
        check_no_overlap(_OP, name, t, "value_cache", value_cache)
    check_index_range(_OP, "slot_mapping", slot_mapping, num_blocks * block_size, allow_negative=True)
    check_unique_indices(_OP, "slot_mapping", slot_mapping, "slot")
    if slot_mapping.shape[0] == 0 or key_cache.numel() == 0:
        return
    SPEC.call((dev.type, dt, d, block_size, hkv), key, value, key_cache, value_cache, slot_mapping)


def reference(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Literal reference: a Python loop over the tokens, skipping padding and out-of-range slots (it reads
    `slot_mapping` on the host: one synchronization on CUDA; of tokens sharing a slot, the last lands)."""
    num_blocks, block_size = key_cache.shape[:2]
    for i, s in enumerate(slot_mapping.tolist()):
        if 0 <= s < num_blocks * block_size:
            key_cache[s // block_size, s % block_size] = key[i]
            value_cache[s // block_size, s % block_size] = value[i]


SPEC = OpSpec(
    name=_OP,
    fields={"head_dim": 128, "block_size": 16, "num_kv_heads": 8},
    function=reshape_and_cache_flash,
    reference=reference,
    doc="write key/value rows into a paged KV cache at slot_mapping (negative slots skipped)",
)
SPECS = (SPEC,)
