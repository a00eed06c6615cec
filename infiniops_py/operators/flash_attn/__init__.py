"""FlashAttention: varlen prefill and decode with a (paged) KV cache (flash-attention semantics).

Semantics follow flash-attention's ``flash_attn_varlen_func`` / ``flash_attn_with_kvcache`` (the flash_attn 2
package's signatures and defaults; ``seqused_k``, ``return_softmax_lse`` and ``k_descale``/``v_descale`` of
varlen are vLLM's ``vllm_flash_attn`` and flash-attention 3's): scale ``D**-0.5`` by default; query head h
reads kv head ``h // (Hq // Hkv)``; the causal mask is aligned bottom-right (key j visible to query i when
``j <= i + Sk - Sq``); ``window_size=(left, right)`` keeps keys in ``[i + Sk - Sq - left, i + Sk - Sq +
right]``, -1 meaning unbounded, after flash-attention's normalization (``flash_api.cpp``: a side >=
``max_seqlen_k`` becomes -1; then, when exactly one side is bounded, the other becomes ``max_seqlen_k``, so
the first query rows stay clipped when ``Sq > max_seqlen_k + 1``); ``softcap > 0`` means ``s = softcap *
tanh(s / softcap)``; ALiBi adds ``-slope * |i + Sk - Sq - j|`` to the (scaled, softcapped) score; a query row
that sees no key outputs 0, never NaN, and its log-sum-exp is +inf (flash-attention 2 writes +inf there).

Implementation calling conventions (the public functions normalize arguments first). The positional
arguments always come; the keyword arguments only when set (an implementation that does not declare the
feature's problem field never receives them):
  flash_attn_varlen: fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
    causal, window_size, softcap, block_table, out, *, seqused_k, alibi_slopes, k_descale, v_descale,
    softmax_lse) -> out; softmax_scale a float (default D**-0.5 filled in), window_size (left, right) as
    normalized below, softcap 0.0 = off, block_table None or int32 [B, max_blocks] with k/v then paged
    caches [num_blocks, block_size, Hkv, D]; out [total_q, Hq, D]; seqused_k int32 [B]: sequence b attends
    to its first seqused_k[b] keys (clamped to [0, its cu_seqlens_k length], or to [0, capacity] when
    paged); alibi_slopes float [B, Hq] (a [Hq] argument expanded); k_descale/v_descale float [B, Hkv] with
    float8_e4m3fn k/v (keys read as ``k * k_descale[b, h]``); softmax_lse float32 (float64 for float64 q)
    [Hq, total_q] to fill.
  flash_attn_with_kvcache: fn(q, k_cache, v_cache, cache_seqlens, block_table, k, v, softmax_scale, causal,
    window_size, softcap, out, *, cache_batch_idx, cache_leftpad, rotary_cos, rotary_sin, rotary_interleaved,
    alibi_slopes, k_descale, v_descale, softmax_lse) -> out; q [B, Sq, Hq, D]; caches [B_cache, S_max, Hkv, D]
    or paged; cache_seqlens int32 [B] (an int or None already made a tensor); k/v None or [B, Sq_new, Hkv, D],
    rotated (rotary_cos/sin [seqlen_ro, rotary_dim / 2], rotary_dim <= D) and then written into the cache at
    cache_seqlens[b] + t first (in place); attention then sees, of cache row cache_batch_idx[b] (b when not
    given), rows cache_leftpad[b] (0 when not given) to cache_seqlens[b] + Sq_new; softmax_lse [B, Hq, Sq];
    out [B, Sq, Hq, D].
  Normalized window: -1 or in [0, max_seqlen_k] (for the kvcache entry max_seqlen_k is the cache capacity
  per sequence: S_max, or max_blocks * block_size when paged); under causal the right window is -1 (the
  causal mask is the right window 0); otherwise both sides are -1 or both >= 0. Paged sequence b uses the
  first ceil(Sk_b / block_size) entries of block_table[b]; later entries are ignored (any value, e.g. 0 or
  -1 padding). Keys past a sequence's length are never attended (cache memory there may be uninitialized,
  even NaN). In unchecked mode an out-of-range index is skipped: a key in a block whose id is out of range
  is not attended, a new k/v row whose position falls outside the cache is not written, a sequence whose
  cache_batch_idx is out of range sees no key and writes nothing, a rotary position past the cos/sin table
  is not rotated.
Problem fields (both): head_dim, gqa_ratio (Hq // Hkv), causal, local (window given), softcap (bool),
  paged (bool), block_size (0 when not paged), alibi, return_softmax_lse, fp8_kv (float8_e4m3fn k/v); varlen
  adds seqused_k; kvcache adds append (k/v given), cache_batch_idx, cache_leftpad, rotary (bools).
Size bucket (both): q_tokens, k_len: the `size_class` (power of two at or above) of the query rows (varlen:
  total_q; kvcache: B * Sq) and of the context length (varlen: max_seqlen_k; kvcache: the cache's capacity per
  sequence, S_max or max_blocks * block_size: known on the host, never read from cache_seqlens).

The package: `_varlen` and `_kvcache` hold the two public functions and their specs, `_checks` the argument
checks on metadata and the window normalization, `_values` the checked-mode checks that read index values on
the host, `_call` what both entry points hand an implementation, `_reference` the literal references.
"""

from __future__ import annotations

from infiniops_py.operators.flash_attn._checks import FP8
from infiniops_py.operators.flash_attn._kvcache import KVCACHE_SPEC, flash_attn_with_kvcache
from infiniops_py.operators.flash_attn._reference import in_input_dtype, reference_kvcache, reference_varlen
from infiniops_py.operators.flash_attn._varlen import VARLEN_SPEC, flash_attn_varlen

__all__ = ["FP8", "KVCACHE_SPEC", "SPECS", "VARLEN_SPEC", "flash_attn_varlen", "flash_attn_with_kvcache",
           "in_input_dtype", "reference_kvcache", "reference_varlen"]

SPECS = (VARLEN_SPEC, KVCACHE_SPEC)
