"""FlashAttention: varlen prefill and decode with a (paged) KV cache (DESIGN.md operator 6).

Implementation calling conventions (the public functions normalize arguments first):
  flash_attn_varlen: fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
    causal, window_size, softcap, block_table, out) -> out; softmax_scale a float (default D**-0.5
    filled in), window_size (left, right) with -1 unbounded, softcap 0.0 = off, block_table None or
    int32 [B, max_blocks] with k/v then paged caches [num_blocks, block_size, Hkv, D]; out [total_q, Hq, D].
  flash_attn_with_kvcache: fn(q, k_cache, v_cache, cache_seqlens, block_table, k, v, softmax_scale, causal,
    window_size, softcap, out) -> out; q [B, Sq, Hq, D]; caches [B, S_max, Hkv, D] or paged; cache_seqlens
    int32 [B]; k/v None or [B, Sq_new, Hkv, D], written into the cache at cache_seqlens[b] first (in place),
    attention then sees cache_seqlens[b] + Sq_new keys; out [B, Sq, Hq, D].
Problem fields (both): head_dim, gqa_ratio (Hq // Hkv), causal, local (window given), softcap (bool),
  paged (bool), block_size (0 when not paged); kvcache adds append (bool, k/v given).
"""

from __future__ import annotations

SPECS = ()  # placeholder: the contract module is being written
