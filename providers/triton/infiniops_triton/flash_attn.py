"""FlashAttention in Triton: varlen prefill and decode over a (paged) KV cache (flash-attention semantics).

``flash_attn_varlen`` runs `attn_fwd_kernel` (FlashAttention-2 forward, Hopper-tuned: 128-row query
blocks, exp2 with log2(e) folded into the scale, causal blocks split into an unmasked part and the
diagonal, lazy rescale, longest blocks first; contiguous 16-bit K/V are read through per-sequence TMA
tensor descriptors on sm_90+, or through pointers, whichever the autotuner times faster; `PREFILL_DEFAULTS`
may fix the configuration instead). ``flash_attn_with_kvcache``
appends the new k/v into the cache, then runs the split-K decode kernel (all GQA heads of a kv head per
program, so the cache is read once) and, when the batch alone cannot fill the GPU, the combine kernel.

Both follow the contract of `infiniops_py.operators.flash_attn` (bottom-right causal mask, GQA head
``h // (Hq // Hkv)``, windows as the contract normalizes them, softcap, rows that see no key output 0,
out-of-range block ids skipped) and write the log-sum-exp when asked (``return_softmax_lse``); the prefill
takes ``seqused_k``, the decode ``cache_batch_idx``. ALiBi, fp8 K/V, ``cache_leftpad`` and rotary are gated
in the capabilities (the torch provider serves them).
Tested: float16, bfloat16 and float32 (scores in float64, rounded once; p @ v in IEEE fp32), head dims `HEAD_DIMS`,
paged block sizes `BLOCK_SIZES`, any GQA ratio. On CUDA the block sizes are autotuned (the first call of
each head dim, dtype and flag set times a few configurations); under ``TRITON_INTERPRET=1`` one small
configuration runs.

Device-side tensor descriptors need a little global scratch memory per launch: unless the caller has set
one, the prefill installs a torch allocator with ``triton.set_allocator`` (the scratch is freed after the
launch, so do not capture the prefill in a CUDA graph; the decode path needs none).
"""

from __future__ import annotations

import math
from typing import Any, Final

import torch
import triton

from infiniops_py import Capability, Implementation, OneOf
from infiniops_triton._common import (
    INTERPRET,
    PRIORITY,
    base_constraints,
    cdiv,
    next_power_of_2,
    pdl,
    raw_stream,
    sm_count,
)
from infiniops_triton._decode_kernels import append_kv_kernel, combine_kernel, decode_split_kernel, decode_split_tuned
from infiniops_triton._fastlaunch import Launcher
from infiniops_triton._flash_attn_kernels import LOG2E, SMEM_BUDGET, attn_fwd_kernel, attn_fwd_tuned, tma_layout_ok
from infiniops_triton._launch import Tuned

__all__ = ["BLOCK_SIZES", "DECODE_DEFAULTS", "HEAD_DIMS", "IMPLEMENTATIONS", "PREFILL_DEFAULTS", "PREFILL_KEYS",
           "decode_settings", "flash_attn_varlen", "flash_attn_with_kvcache", "prefill_settings"]

HEAD_DIMS: Final = (32, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
BLOCK_SIZES: Final = (16, 32, 64, 128, 256)  # paged block sizes (0 = contiguous K/V)
MAX_HEAD_DIM: Final = 256
_GROUP: Final = 8  # (sequence, head) pairs whose query blocks are interleaved, longest first
_INTERPRET_PREFILL: Final = {"BLOCK_M": 32, "BLOCK_N": 32, "LAZY": True, "USE_TMA": False}
# The prefill kernel's settings (`flash_attn_varlen`'s `config`): BLOCK_M, BLOCK_N, LAZY (rescale only when a
# row's max grew past 2**8), USE_TMA (per-sequence tensor descriptors), num_warps, num_stages.
PREFILL_KEYS: Final = frozenset({"BLOCK_M", "BLOCK_N", "LAZY", "USE_TMA", "num_warps", "num_stages"})
# The prefill launch's settings, the first row whose bounds hold: (largest head dim, causal (None: either),
# settings); {} autotunes (`attn_fwd_tuned`). A row applies to the path the sweep measures: 16-bit inputs,
# contiguous K/V that tensor descriptors can read when the row asks for them, no left window, no softcap, tiles
# within the shared memory; every other launch autotunes. benchmarks/gpu_sweep_prefill.py times the candidates
# and prints its winners as rows; edit here.
PREFILL_DEFAULTS: list[tuple[int, bool | None, dict[str, Any]]] = [
    (MAX_HEAD_DIM, None, {}),  # the autotuned kernel until the H200 sweep picks
]
_INTERPRET_DECODE_BLOCK_N: Final = 16
# Float32 inputs: "fp64" computes the scores q.k in float64 (FP64 tensor cores) and rounds them once; with
# "ieee" (a sequential fp32 dot) or "tf32x3" large-logit rows over 4096 keys at head dim 256 erred by 2.3x and
# 1.4x what the fp32 rule allows (H200, .gpu diagnostic, 2026-11-30); "fp64" is what the conformance
# suite runs. Module-level so such a comparison can switch it.
FP32_PRECISION = "fp64"
# Decode: merge the key splits in the decode kernel itself, each tile using as many of the launched splits as
# its context fills with MIN_SPLIT_BLOCKS key blocks each (`infiniops_triton._decode_kernels`). Module-level so
# a comparison can switch the separate combine kernel back on.
FUSED_COMBINE = True
MIN_SPLIT_BLOCKS = 4
FOLD_APPEND = True  # the decode kernel writes the new k/v of a paged cache itself
SPLIT_WAVES = 2  # programs per SM the launched splits aim at (`num_splits`)
_TILE_KEYS: Final = ("BLOCK_N", "num_warps", "num_stages", "maxnreg")
DECODE_KEYS: Final = frozenset({"BLOCK_N", "num_warps", "num_stages", "maxnreg", "min_split_blocks",
                                "min_split_keys", "split_waves", "fused", "new_first"})
# The decode launch's settings by launch size, the first row whose bounds hold: (most programs = batch x kv heads
# x row tiles, most capacity = block table width x block size in keys (the engine's max model length, not the
# context: the host cannot see the lengths), settings). Settings (`flash_attn_with_kvcache`'s `config`): BLOCK_N,
# num_warps, num_stages, maxnreg (the first three together or none: none autotunes them), min_split_keys (keys
# of the capacity a launched split covers at least, host side), min_split_blocks (key blocks a split takes at
# least, device side: a short context uses fewer of the launched splits), split_waves (programs per SM the
# splits aim at), fused (the last split merges), new_first (APPEND: the new keys and the cache write before the
# cache loop). benchmarks/gpu_sweep_decode.py times the candidates and prints its winners as rows; edit here.
DECODE_DEFAULTS: list[tuple[int, int, dict[str, Any]]] = [  # the H200 sweep's winners (benchmarks/RESULTS.md)
    (64, 1 << 62, {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "min_split_keys": 32, "min_split_blocks": 1,
                   "split_waves": 4, "fused": False}),  # few programs: many short splits, a separate combine
    (256, 1 << 62, {"BLOCK_N": 32, "num_warps": 4, "num_stages": 2, "min_split_keys": 32, "min_split_blocks": 1,
                    "split_waves": 2}),
    (1 << 62, 1 << 62, {}),  # the rest: the autotuned kernel, the module-level split rules
]
_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}
_PREFILL = Tuned(attn_fwd_tuned)  # the prefill and decode kernels, tuned once per key
_PREFILL_FIXED = Launcher(attn_fwd_kernel)  # a fixed configuration (`PREFILL_DEFAULTS`, a call's `config`)
_DECODE = Tuned(decode_split_tuned)
_DECODE_FIXED = Launcher(decode_split_kernel)  # a fixed configuration (`DECODE_DEFAULTS`, a call's `config`)
_APPEND_KV = Launcher(append_kv_kernel)  # the decode path's plain kernels
_COMBINE = Launcher(combine_kernel)


def _interpreting() -> bool:
    return INTERPRET


# --- prefill ---------------------------------------------------------------------------------------


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Device-side tensor descriptors need global scratch memory: install a torch allocator unless the
    caller installed one (Triton's default raises)."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _scales(q: torch.Tensor, softmax_scale: float, softcap: float) -> tuple[torch.Tensor, float, float]:
    """(q, qk_scale, softcap_scale) in the kernels' log2 units; a negative scale moves its sign into q,
    so the kernels may assume ``qk_scale >= 0`` (the max of the scores commutes with it)."""
    if softmax_scale < 0:
        q, softmax_scale = -q, -softmax_scale
    if softcap > 0:
        return q, softcap * LOG2E, softmax_scale / softcap
    return q, softmax_scale * LOG2E, 0.0


def _window(causal: bool, window_size: tuple[int, int]) -> tuple[bool, bool, int, int]:
    """(HAS_LEFT, HAS_RIGHT, left, right): causal is a right window of 0."""
    left, right = window_size
    has_right = causal or right >= 0
    return left >= 0, has_right, max(left, 0), 0 if causal else max(right, 0)


def _check_head_dim(op: str, d: int) -> int:
    if d > MAX_HEAD_DIM:
        raise ValueError(f"triton {op}: head_dim {d} > {MAX_HEAD_DIM} (the accumulator lives in registers); "
                         "use the torch provider")
    return max(16, next_power_of_2(d))


def prefill_settings(head_dim: int, causal: bool, *, element_size: int = 2, common: bool = True,
                     block_d: int | None = None) -> dict[str, Any]:
    """The `PREFILL_DEFAULTS` row of a prefill launch at `head_dim` (a copy), {} (autotune) where it does not
    apply: inputs of `element_size` bytes other than 2, not `common` (paged K/V, a left window or a softcap), or
    tiles past the shared memory (`block_d`: the padded head dim). The launch also autotunes a row asking for
    USE_TMA where the layout does not allow it."""
    for most_d, mask, settings in PREFILL_DEFAULTS:
        if head_dim <= most_d and (mask is None or mask == causal):
            found = dict(settings)
            if not found:
                return found
            bd = block_d or max(16, triton.next_power_of_2(head_dim))
            smem = (found["BLOCK_M"] * bd + found.get("num_stages", 2) * 2 * found["BLOCK_N"] * bd) * element_size
            return found if element_size == 2 and common and smem <= SMEM_BUDGET else {}
    return {}


def _check_prefill_config(config: dict[str, Any], tma_ok: bool) -> dict[str, Any]:
    """`config` with its defaults filled in (USE_TMA off, LAZY on)."""
    unknown = set(config) - PREFILL_KEYS
    if unknown:
        raise ValueError(f"triton flash_attn_varlen: config has unknown keys {sorted(unknown)}; "
                         f"known: {sorted(PREFILL_KEYS)}")
    missing = {"BLOCK_M", "BLOCK_N"} - set(config)
    if missing:
        raise ValueError(f"triton flash_attn_varlen: config needs BLOCK_M and BLOCK_N, missing {sorted(missing)}")
    config = {"USE_TMA": False, "LAZY": True, **config}
    if config["USE_TMA"] and not tma_ok:
        raise ValueError("triton flash_attn_varlen: USE_TMA needs contiguous K/V and 16-byte aligned q/k/v rows, "
                         "heads and head dim")
    return config


def flash_attn_varlen(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool, window_size: tuple[int, int],
    softcap: float, block_table: torch.Tensor | None, out: torch.Tensor, *, seqused_k: torch.Tensor | None = None,
    softmax_lse: torch.Tensor | None = None, config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Varlen attention (flash-attention ``flash_attn_varlen_func``), the contract's calling convention.

    q ``[total_q, Hq, D]``, k/v ``[total_k, Hkv, D]`` or paged ``[num_pages, block_size, Hkv, D]`` with
    `block_table` int32 ``[B, max_blocks]``; cu_seqlens int32 ``[B + 1]``; writes and returns `out`
    ``[total_q, Hq, D]``, and `softmax_lse` fp32 ``[Hq, total_q]`` when given; `seqused_k` int32 ``[B]`` (keys
    per sequence). `config` forces ``BLOCK_M``, ``BLOCK_N`` and optionally the other `PREFILL_KEYS` instead of
    the `PREFILL_DEFAULTS` row (`prefill_settings`; {} autotunes); the interpreter uses a small fixed one unless
    a `config` is given.

    Raises:
        ValueError: head_dim > 256, or a `config` with an unknown key, without BLOCK_M / BLOCK_N, or asking
        for TMA where the layout does not allow it.
    """
    block_d = _check_head_dim("flash_attn_varlen", q.shape[-1])
    batch = cu_seqlens_q.shape[0] - 1
    if batch <= 0 or q.shape[0] == 0 or max_seqlen_q == 0:
        return out
    num_heads_q, head_dim = q.shape[1], q.shape[2]
    paged = block_table is not None
    q, qk_scale, softcap_scale = _scales(q, softmax_scale, softcap)
    has_left, has_right, left, right = _window(causal, window_size)
    if paged:
        kb, kt, kh, vb, vt, vh = *k.stride()[:3], *v.stride()[:3]
        table, stride_btb, max_blocks, num_pages, page = block_table, block_table.stride(0), block_table.shape[1], \
            k.shape[0], k.shape[1]
    else:
        kb, kt, kh, vb, vt, vh = 0, k.stride(0), k.stride(1), 0, v.stride(0), v.stride(1)
        table, stride_btb, max_blocks, num_pages, page = cu_seqlens_k, 0, 0, 0, 1
    num_bh = batch * num_heads_q
    used = cu_seqlens_k if seqused_k is None else seqused_k  # a placeholder pointer when not used
    lse = out if softmax_lse is None else softmax_lse
    args = (q, k, v, out, cu_seqlens_q, cu_seqlens_k, table, used, lse, q.stride(0), q.stride(1), kb, kt, kh, vb,
            vt, vh, out.stride(0), out.stride(1), stride_btb, 0 if softmax_lse is None else softmax_lse.stride(0),
            num_bh, num_heads_q, num_heads_q // k.shape[-2], max_seqlen_q, max_blocks, num_pages, q.shape[0],
            0 if paged else k.shape[0], qk_scale, softcap_scale, left, right)
    meta = {"HEAD_DIM": head_dim, "BLOCK_D": block_d, "GROUP": _GROUP, "HAS_LEFT": has_left, "HAS_RIGHT": has_right,
            "SOFTCAP": softcap > 0, "PAGED": paged, "PAGE_SIZE": page,
            "PRECISION": FP32_PRECISION if q.dtype == torch.float32 else "tf32", "HAS_SEQUSED": seqused_k is not None,
            "HAS_LSE": softmax_lse is not None}
    if q.is_cuda:
        _ensure_allocator()
    if config is None and _interpreting():
        config = _INTERPRET_PREFILL
    elif config is None:
        config = prefill_settings(head_dim, has_right and right == 0, element_size=q.element_size(),
                                  common=not (paged or has_left or softcap > 0), block_d=block_d) or None
        if config is not None and config.get("USE_TMA") and not (q.is_cuda and tma_layout_ok(q, k, v, paged)):
            config = None
    if config is None:
        def grid(m: dict[str, Any]) -> tuple[int]:
            return (num_bh * cdiv(max_seqlen_q, m["BLOCK_M"]),)

        key = (head_dim, has_left, has_right, softcap > 0, paged, q.dtype, k.dtype, cu_seqlens_q.dtype, table.dtype,
               seqused_k is not None, softmax_lse is not None)
        _PREFILL.launch(key, grid, *args, **meta)
        return out
    config = _check_prefill_config(config, tma_layout_ok(q, k, v, paged))
    _PREFILL_FIXED((num_bh * cdiv(max_seqlen_q, config["BLOCK_M"]),), *args, **meta, **config)
    return out


# --- decode ----------------------------------------------------------------------------------------


def split_counters(device: torch.device, programs: int) -> torch.Tensor:
    """Zeroed int32 counters, one per decode tile, of `device` and its current stream (see
    `infiniops_triton._decode_kernels`: the fused kernel leaves them at 0); grown to a power of two as needed.

    A first allocation during CUDA-graph capture is captured with its zero fill, which then runs at each
    replay: harmless, the counters are 0 already."""
    key = (device, raw_stream(device))
    found = _COUNTERS.get(key)
    if found is None or found.numel() < programs:
        found = _COUNTERS[key] = torch.zeros(next_power_of_2(max(programs, 1024)), dtype=torch.int32,
                                             device=device)
    return found


def num_splits(programs: int, capacity: int, num_sms: int, min_keys: int, waves: float = SPLIT_WAVES) -> int:
    """How many programs share the keys of one (sequence, kv head, row tile).

    Decode programs do equal, memory-bound work: with `waves` (default `SPLIT_WAVES`) of them per SM in total
    every SM stays busy (each tile then uses as many of them as its own context fills, on the device). Each split
    keeps at least `min_keys` of the `capacity` keys (so the combine stays cheap), and there are at most 64.
    """
    want = math.ceil(waves * num_sms / max(programs, 1))
    most = min(64, capacity // max(min_keys, 1))
    return max(1, min(want, most))


def decode_settings(programs: int, capacity: int, element_size: int = 2, block_d: int = 128) -> dict[str, Any]:
    """The `DECODE_DEFAULTS` row of a decode launch of `programs` (sequence, kv head, row tile) programs over a
    cache of `capacity` keys: the first whose bounds hold (a copy). Its kernel tile applies to 16-bit inputs
    whose K/V stages fit the shared memory (what the sweep measures); other launches autotune the tile (float32
    takes the first configuration that fits)."""
    for most_programs, most_capacity, settings in DECODE_DEFAULTS:
        if programs <= most_programs and capacity <= most_capacity:
            found = dict(settings)
            if "BLOCK_N" in found and (element_size != 2 or found["num_stages"] * 2 * found["BLOCK_N"] * block_d
                                       * element_size > SMEM_BUDGET):
                found = {k: v for k, v in found.items() if k not in _TILE_KEYS}
            return found
    return {}


def _check_decode_config(config: dict[str, Any] | None) -> None:
    if config is None:
        return
    unknown = set(config) - DECODE_KEYS
    if unknown:
        raise ValueError(f"triton flash_attn_with_kvcache: config has unknown keys {sorted(unknown)}; "
                         f"known: {sorted(DECODE_KEYS)}")
    given = {"BLOCK_N", "num_warps", "num_stages"} & set(config)
    if given and len(given) < 3:
        raise ValueError("triton flash_attn_with_kvcache: config gives BLOCK_N, num_warps and num_stages together "
                         f"or none of them, got {sorted(given)}")


def flash_attn_with_kvcache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
    block_table: torch.Tensor | None, k: torch.Tensor | None, v: torch.Tensor | None, softmax_scale: float,
    causal: bool, window_size: tuple[int, int], softcap: float, out: torch.Tensor, *,
    cache_batch_idx: torch.Tensor | None = None, softmax_lse: torch.Tensor | None = None, splits: int | None = None,
    config: dict[str, Any] | None = None,
) -> torch.Tensor:
    """Decode attention over a KV cache (flash-attention ``flash_attn_with_kvcache``), the contract's
    calling convention.

    q ``[B, Sq, Hq, D]``; caches ``[B_cache, S_max, Hkv, D]`` (sequence b in row ``cache_batch_idx[b]``, b when
    None) or paged ``[num_pages, block_size, Hkv, D]`` with `block_table` int32 ``[B, max_blocks]``;
    `cache_seqlens` int32 ``[B]``; new `k`/`v` ``[B, Sq_new, Hkv, D]`` are first written at ``cache_seqlens[b] +
    t`` (in place, positions outside the cache skipped). Writes and returns `out` ``[B, Sq, Hq, D]``, and
    `softmax_lse` fp32 ``[B, Hq, Sq]`` when given. `splits` forces the split-K count (default: `num_splits`);
    `config` overrides the launch settings `decode_settings` picks (keys `DECODE_KEYS`, see `DECODE_DEFAULTS`).

    Raises:
        ValueError: head_dim > 256, `splits` < 1, or a `config` with an unknown key, or with only some of
        BLOCK_N / num_warps / num_stages.
    """
    block_d = _check_head_dim("flash_attn_with_kvcache", q.shape[-1])
    _check_decode_config(config)
    batch, q_len, num_heads_q, head_dim = q.shape
    num_heads_kv = k_cache.shape[2]
    paged = block_table is not None
    if paged:
        table, stride_btb, max_blocks, num_pages, page = block_table, block_table.stride(0), block_table.shape[1], \
            k_cache.shape[0], k_cache.shape[1]
        capacity = max_blocks * page
    else:
        table, stride_btb, max_blocks, num_pages, page = cache_seqlens, 0, 0, 0, 1
        capacity = k_cache.shape[1]
    new_len = 0 if k is None else k.shape[1]
    cache_rows = cache_seqlens if cache_batch_idx is None else cache_batch_idx  # a placeholder pointer when not given
    # the decode kernel appends itself (APPEND) to a paged cache when it has queries to run
    folded = (FOLD_APPEND and paged and cache_batch_idx is None and k is not None and v is not None
              and batch * new_len > 0 and batch * q_len > 0)
    if k is not None and v is not None and batch * new_len > 0 and not folded:
        _APPEND_KV((batch * new_len,),
            k, v, k_cache, v_cache, cache_seqlens, table, cache_rows, *k.stride()[:3], *v.stride()[:3],
            *k_cache.stride()[:3], *v_cache.stride()[:3], stride_btb, new_len, num_heads_kv, capacity, max_blocks,
            num_pages, k_cache.shape[0], HEAD_DIM=head_dim, BLOCK_H=next_power_of_2(num_heads_kv),
            BLOCK_D=block_d, PAGED=paged, PAGE_SIZE=page, HAS_BATCH_IDX=cache_batch_idx is not None,
        )
    if batch * q_len == 0:
        return out
    q, qk_scale, softcap_scale = _scales(q, softmax_scale, softcap)
    has_left, has_right, left, right = _window(causal, window_size)
    group = num_heads_q // num_heads_kv
    rows = group * q_len
    block_m = min(64, max(16, next_power_of_2(rows)))
    num_m_tiles = cdiv(rows, block_m)
    programs = batch * num_heads_kv * num_m_tiles
    interpreting = _interpreting()
    settings = decode_settings(programs, capacity, q.element_size(), block_d) | (config or {})
    kernel = {key: settings[key] for key in _TILE_KEYS if key in settings}
    if interpreting:  # one small key block, unless the call forces one (the table's tile is the GPU's)
        kernel = {"BLOCK_N": (config or {}).get("BLOCK_N", _INTERPRET_DECODE_BLOCK_N)}
    if splits is None:
        sms = 4 if interpreting or not q.is_cuda else sm_count(q.device)
        min_keys = settings.get("min_split_keys", 4 * (_INTERPRET_DECODE_BLOCK_N if interpreting else 64))
        splits = num_splits(programs, capacity, sms, min_keys, settings.get("split_waves", SPLIT_WAVES))
    if splits < 1:
        raise ValueError(f"triton flash_attn_with_kvcache: splits must be >= 1, got {splits}")
    fused = splits > 1 and bool(settings.get("fused", FUSED_COMBINE))
    if splits > 1:
        o_part = torch.empty((batch, q_len, num_heads_q, splits, head_dim), dtype=torch.float32, device=q.device)
        lse_part = torch.empty((batch, q_len, num_heads_q, splits), dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = out
    counter = split_counters(q.device, programs) if fused else cache_seqlens  # a placeholder pointer when unused
    lse = lse_part if softmax_lse is None else softmax_lse  # a placeholder pointer when not given
    lse_b, lse_h = (0, 0) if softmax_lse is None else softmax_lse.stride()[:2]
    k_new, v_new = (k, v) if folded else (q, q)  # placeholder pointers when not folded
    tune_size = next_power_of_2(programs) * 128 + splits  # tuned per launch size and split count
    args = (q, k_cache, v_cache, cache_seqlens, table, cache_rows, out, o_part, lse_part, lse, counter, k_new, v_new,
            *k_new.stride()[:3], *v_new.stride()[:3], *q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3],
            *out.stride()[:3], stride_btb, lse_b, lse_h, num_heads_kv, num_heads_q, q_len, group, new_len, capacity,
            max_blocks, num_pages, k_cache.shape[0], num_m_tiles, splits, qk_scale, softcap_scale, left, right,
            settings.get("min_split_blocks", MIN_SPLIT_BLOCKS), tune_size)
    meta = {"HEAD_DIM": head_dim, "BLOCK_D": block_d, "BLOCK_M": block_m, "SPLIT": splits > 1,
            "HAS_LEFT": has_left, "HAS_RIGHT": has_right, "SOFTCAP": softcap > 0, "PAGED": paged,
            "PAGE_SIZE": page, "PRECISION": FP32_PRECISION if q.dtype == torch.float32 else "tf32",
            "HAS_BATCH_IDX": cache_batch_idx is not None, "HAS_LSE": softmax_lse is not None, "FUSED": fused,
            "APPEND": folded, "NEW_FIRST": folded and bool(settings.get("new_first", False))}
    grid = (programs, splits)
    if kernel:  # a fixed configuration (and the interpreter's)
        _DECODE_FIXED(grid, *args, **meta, **(pdl() if q.is_cuda else {"PDL": False}), **kernel)
    else:
        key = (head_dim, block_m, paged, splits > 1, q.dtype, k_cache.dtype, cache_seqlens.dtype, table.dtype,
               cache_batch_idx is not None, softmax_lse is not None, fused, folded, meta["NEW_FIRST"], tune_size)
        _DECODE.launch(key, grid, *args, **meta | pdl())
    if splits > 1 and not fused:
        _COMBINE((batch * q_len * num_heads_q,),
            o_part, lse_part, out, lse, *out.stride()[:3], lse_b, lse_h, q_len, num_heads_q, splits, HEAD_DIM=head_dim,
            BLOCK_D=block_d, BLOCK_S=next_power_of_2(splits), HAS_LSE=softmax_lse is not None,
        )
    return out


# --- capabilities ----------------------------------------------------------------------------------

# Arguments the kernels do not implement yet, each with its reason; the torch provider serves them all.
_GATED: Final = {
    "alibi": "the kernels add no ALiBi bias yet",
    "fp8_kv": "the kernels read no float8_e4m3fn K/V yet (dequantization needs GPU tuning)",
    "cache_leftpad": "the decode kernels read every cache from row 0",
    "rotary": "the append and decode kernels apply no rotary embedding yet",
}
_VARLEN_GATED: Final = ("alibi", "fp8_kv")
_KVCACHE_GATED: Final = ("alibi", "fp8_kv", "cache_leftpad", "rotary")


def _capability(gated: tuple[str, ...]) -> Capability:
    return Capability(
        *base_constraints(),
        OneOf("dtype", ("float16", "bfloat16", "float32"), fix="cast to float16/bfloat16/float32, or use the torch "
              "provider"),
        OneOf("head_dim", HEAD_DIMS, fix="use the torch provider for this head dim"),
        OneOf("block_size", (0, *BLOCK_SIZES), fix="use a paged block size in {16, 32, 64, 128, 256}, or the torch "
              "provider"),
        *(OneOf(field, (False,), fix=f"{_GATED[field]}: use the torch provider") for field in gated),
    )


IMPLEMENTATIONS = [
    Implementation("flash_attn_varlen", "triton", "triton.flash_attn_varlen", _capability(_VARLEN_GATED), PRIORITY,
                   flash_attn_varlen),
    Implementation("flash_attn_with_kvcache", "triton", "triton.flash_attn_with_kvcache",
                   _capability(_KVCACHE_GATED), PRIORITY, flash_attn_with_kvcache),
]
