"""The sample calls of the two entry points (`Operator.sample_inputs`): for the tuner, the benchmarks and the
conformance suite."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from infiniops_py.operators._declare import Sampler

__all__ = ["sample_kvcache", "sample_varlen"]


def _attention_kwargs(r: Sampler, f: Mapping[str, Any], k_len: int, batch: int, hq: int, hkv: int
                      ) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"causal": f["causal"]}
    if f["alibi"]:
        kwargs["alibi_slopes"] = r.scale(batch, hq)
    if f["fp8_kv"]:
        kwargs.update(k_descale=r.scale(batch, hkv), v_descale=r.scale(batch, hkv))
    if f["local"]:
        kwargs["window_size"] = (max(1, k_len // 4), 0)
    if f["softcap"]:
        kwargs["softcap"] = 50.0
    if f["return_softmax_lse"]:
        kwargs["return_softmax_lse"] = True
    return kwargs


def _paged(r: Sampler, f: Mapping[str, Any], lengths: list[int], hkv: int, d: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V caches ``[blocks, block_size, Hkv, D]`` and an int32 block table giving each sequence its own blocks."""
    bs = f["block_size"] or 16
    per = max(math.ceil(n / bs) for n in lengths)
    table = torch.arange(len(lengths) * per, dtype=torch.int32, device=r.device).view(len(lengths), per)
    return r(len(lengths) * per, bs, hkv, d), r(len(lengths) * per, bs, hkv, d), table


def sample_varlen(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``q_tokens`` query rows over sequences of ``k_len`` keys (``num_kv_heads`` KV heads): one sequence whose last
    query rows see ``k_len`` keys when ``q_tokens <= k_len``, else ``q_tokens // k_len`` sequences; paged, fp8,
    ALiBi, a window, a softcap, seqused_k and the log-sum-exp as the fields ask."""
    r, f = Sampler(generator, dtype, device), values
    q_tokens, k_len, hkv, d = f["q_tokens"], f["k_len"], f["num_kv_heads"], f["head_dim"]
    hq = hkv * f["gqa_ratio"]
    # q_tokens <= k_len: one sequence whose last q_tokens query rows see k_len keys (a chunked prefill);
    # else q_tokens // k_len sequences of k_len tokens each (a batched prefill)
    n = max(1, q_tokens // k_len)
    sq, sk = min(q_tokens, k_len), k_len
    cu_q = torch.arange(0, (n + 1) * sq, sq, dtype=torch.int32, device=r.device)
    cu_k = torch.arange(0, (n + 1) * sk, sk, dtype=torch.int32, device=r.device)
    kwargs = _attention_kwargs(r, f, sk, n, hq, hkv)
    if f["paged"]:
        k, v, table = _paged(r, f, [sk] * n, hkv, d)
        kwargs["block_table"] = table
    else:
        k, v = r(n * sk, hkv, d), r(n * sk, hkv, d)
    if f["seqused_k"]:  # every sequence uses all of its keys: the same work, the argument's code path
        kwargs["seqused_k"] = torch.full((n,), sk, dtype=torch.int32, device=r.device)
    if f["fp8_kv"]:
        k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
    return (r(n * sq, hq, d), k, v, cu_q, cu_k, sq, sk), kwargs


def sample_kvcache(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                   generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """a decode step of ``q_tokens`` sequences at ``k_len`` cached keys (``num_kv_heads`` KV heads), appending one
    new key when asked; paged, fp8, ALiBi, a window, a softcap, cache_batch_idx, cache_leftpad and RoPE tables as
    the fields ask."""
    r, f = Sampler(generator, dtype, device), values
    batch, k_len, hkv, d = f["q_tokens"], f["k_len"], f["num_kv_heads"], f["head_dim"]
    hq = hkv * f["gqa_ratio"]
    kwargs = _attention_kwargs(r, f, k_len, batch, hq, hkv)
    if f["paged"]:
        k_cache, v_cache, table = _paged(r, f, [k_len] * batch, hkv, d)
        kwargs["block_table"] = table
    else:
        k_cache, v_cache = r(batch, k_len, hkv, d), r(batch, k_len, hkv, d)
    if f["fp8_kv"]:
        k_cache, v_cache = k_cache.to(torch.float8_e4m3fn), v_cache.to(torch.float8_e4m3fn)
    lens = k_len - 1 if f["append"] else k_len  # every sequence at (nearly) full context: the decode's worst case
    kwargs["cache_seqlens"] = torch.full((batch,), lens, dtype=torch.int32, device=r.device)
    if f["append"]:
        kwargs.update(k=r(batch, 1, hkv, d), v=r(batch, 1, hkv, d))
    if f["cache_batch_idx"]:  # the sequences' cache rows in reverse order: a gather, not the identity
        kwargs["cache_batch_idx"] = torch.arange(batch - 1, -1, -1, dtype=torch.int32, device=r.device)
    if f["cache_leftpad"]:
        kwargs["cache_leftpad"] = torch.zeros(batch, dtype=torch.int32, device=r.device)
    if f["rotary"]:
        angles = torch.outer(torch.arange(k_len, dtype=torch.float32), torch.ones(d // 2))
        kwargs.update(rotary_cos=angles.cos().to(r.device, r.dtype), rotary_sin=angles.sin().to(r.device, r.dtype))
    return (r(batch, 1, hq, d), k_cache, v_cache), kwargs
