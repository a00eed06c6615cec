"""Synthetic inputs of a problem bucket's representative size, for the tuner and ``infiniops tune``.

`build` returns one public-function call (`SyntheticCall`) whose problem has the given fields and whose sizes
fall in the given bucket: the tuner records the implementation call it makes and times each accepting
implementation on it. The values are standard-normal draws (seeded), laid out as the conformance suite's
strategies lay them out (``infiniops_py/testing/strategies``): those draw random sizes through hypothesis, so
they cannot be asked for one size; these builders take the sizes.

`SIZES` names, per operator, the sizes a builder takes and their defaults: the bucket's sizes (``OpSpec.buckets``)
and the extra ones that fix the shape (the attention's KV heads). Fields that change what is computed but that
no builder makes (an fp8 cache, ALiBi slopes, ``seqused_k``, ...) raise `NotImplementedError`; so do the
operators without a builder (the convolutions and scans): their problems are tuned from a model's recorded
calls (``infiniops tune --model DIR``, or the engine at build).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch

__all__ = ["SIZES", "SyntheticCall", "build"]

SIZES: Final[dict[str, dict[str, int]]] = {
    "gemm": {"m": 1, "n": 4096, "k": 4096},
    "add": {"numel": 1 << 20},
    "rms_norm": {"tokens": 128},
    "fused_add_rms_norm": {"tokens": 128},
    "fused_qk_norm": {"tokens": 128},
    "reshape_and_cache_flash": {"tokens": 128},
    "flash_attn_varlen": {"q_tokens": 1024, "k_len": 1024, "num_kv_heads": 8},
    "flash_attn_with_kvcache": {"q_tokens": 1, "k_len": 1024, "num_kv_heads": 8},
}


@dataclass
class SyntheticCall:
    """``function(*args, **kwargs)``: a public operator call; `sizes` are the sizes it was built at."""

    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)

    def run(self) -> Any:
        """Make the call (under ``torch.inference_mode``)."""
        with torch.inference_mode():
            return self.function(*self.args, **self.kwargs)


class _Draw:
    def __init__(self, device: str, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype
        self.gen = torch.Generator().manual_seed(0)

    def __call__(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        t = torch.randn(shape, generator=self.gen, dtype=torch.float32) * scale
        return t.to(device=self.device, dtype=self.dtype)


def build(op: str, *, device: str, dtype: str | torch.dtype, sizes: Mapping[str, int],
          fields: Mapping[str, Any]) -> SyntheticCall:
    """A call of operator `op` on `device` in `dtype` with problem `fields` (the rest take the operator's
    defaults) at `sizes` (missing ones take `SIZES`' defaults).

    Raises:
        KeyError: an unknown operator. ValueError: a size that is not an int >= 1, or a name that is neither a
            size of `op` (`SIZES`) nor a field. NotImplementedError: no builder for `op`, or for one of
            `fields` (see the module doc).
    """
    from infiniops_py import OPERATORS
    from infiniops_py.problem import dtype_name

    if op not in OPERATORS:
        raise KeyError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
    if op not in SIZES:
        raise NotImplementedError(f"{op}: no synthetic inputs (operators with them: {', '.join(SIZES)}); tune "
                                  "it from a model's calls: infiniops tune --model DIR")
    unknown = set(sizes) - set(SIZES[op])
    if unknown:
        raise ValueError(f"{op}: unknown size(s) {sorted(unknown)}; its sizes: {', '.join(SIZES[op])}")
    spec = OPERATORS[op]
    unknown = set(fields) - set(spec.fields)
    if unknown:
        raise ValueError(f"{op}: unknown problem field(s) {sorted(unknown)}; known: {sorted(spec.fields)}")
    full = {**SIZES[op], **sizes}
    for name, n in full.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{op}: size {name}={n!r} must be an int >= 1")
    values = {**spec.fields, **fields}
    dt = getattr(torch, dtype_name(dtype)) if isinstance(dtype, str) else dtype
    function, args, kwargs = _BUILDERS[op](_Draw(device, dt), values, full)
    return SyntheticCall(function, args, kwargs, full)


def _refuse(op: str, values: Mapping[str, Any], *names: str) -> None:
    for name in names:
        if values.get(name):
            raise NotImplementedError(f"{op}: no synthetic inputs with {name}={values[name]!r}; tune it from a "
                                      "model's calls: infiniops tune --model DIR")


def _gemm(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    from infiniops_py import gemm

    m, n, k = s["m"], s["n"], s["k"]
    lead = (2,) if f["batched"] else ()
    a = r(*lead, *((k, m) if f["trans_a"] else (m, k)))
    b = r(*lead, *((n, k) if f["trans_b"] else (k, n)), scale=k ** -0.5)
    kwargs: dict[str, Any] = {"trans_a": f["trans_a"], "trans_b": f["trans_b"]}
    if f["has_bias"]:
        kwargs["bias"] = r(n)
    if f["has_c"]:
        kwargs.update(c=r(*lead, m, n), beta=1.0)
    return gemm, (a, b), kwargs


def _add(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    from infiniops_py import add

    numel = s["numel"]
    if f["broadcast"]:  # the bias add of a linear layer: [rows, cols] + [cols]
        cols = min(numel, 1024)
        x, other = r(max(1, numel // cols), cols), r(cols)
    else:
        x, other = r(numel), r(numel)
    return add, (x, other), {"out": x} if f["inplace"] else {}


def _rms_norm(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    from infiniops_py import rms_norm

    h = f["hidden_size"]
    return rms_norm, (r(s["tokens"], h), 1 + r(h, scale=0.1), 1e-6), {}


def _fused_add(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    from infiniops_py import fused_add_rms_norm

    h = f["hidden_size"]
    return fused_add_rms_norm, (r(s["tokens"], h), r(s["tokens"], h), 1 + r(h, scale=0.1), 1e-6), {}


def _qk_norm(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    from infiniops_py import fused_qk_norm

    d, hq, hkv = f["head_dim"], f["num_q_heads"], f["num_kv_heads"]
    qkv = r(s["tokens"], (hq + 2 * hkv) * d)
    return fused_qk_norm, (qkv, 1 + r(d, scale=0.1), 1 + r(d, scale=0.1)), {
        "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d}


def _cache_write(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    from infiniops_py import reshape_and_cache_flash

    _refuse("reshape_and_cache_flash", f, "fp8_kv")
    t, bs, hkv, d = s["tokens"], f["block_size"], f["num_kv_heads"], f["head_dim"]
    blocks = math.ceil(t / bs) + 1
    slots = torch.arange(t, dtype=torch.int64, device=r.device)
    return reshape_and_cache_flash, (r(t, hkv, d), r(t, hkv, d), r(blocks, bs, hkv, d), r(blocks, bs, hkv, d),
                                     slots), {}


def _attention_kwargs(f: Mapping[str, Any], k_len: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"causal": f["causal"]}
    if f["local"]:
        kwargs["window_size"] = (max(1, k_len // 4), 0)
    if f["softcap"]:
        kwargs["softcap"] = 50.0
    if f["return_softmax_lse"]:
        kwargs["return_softmax_lse"] = True
    return kwargs


def _paged(r: _Draw, f: Mapping[str, Any], lengths: list[int], hkv: int, d: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V caches ``[blocks, block_size, Hkv, D]`` and an int32 block table giving each sequence its own blocks."""
    bs = f["block_size"] or 16
    per = max(math.ceil(n / bs) for n in lengths)
    table = torch.arange(len(lengths) * per, dtype=torch.int32, device=r.device).view(len(lengths), per)
    return r(len(lengths) * per, bs, hkv, d), r(len(lengths) * per, bs, hkv, d), table


def _varlen(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    from infiniops_py import flash_attn_varlen

    _refuse("flash_attn_varlen", f, "alibi", "fp8_kv", "seqused_k")
    q_tokens, k_len, hkv, d = s["q_tokens"], s["k_len"], s["num_kv_heads"], f["head_dim"]
    hq = hkv * f["gqa_ratio"]
    # q_tokens <= k_len: one sequence whose last q_tokens query rows see k_len keys (a chunked prefill);
    # else q_tokens // k_len sequences of k_len tokens each (a batched prefill)
    n = max(1, q_tokens // k_len)
    sq, sk = min(q_tokens, k_len), k_len
    cu_q = torch.arange(0, (n + 1) * sq, sq, dtype=torch.int32, device=r.device)
    cu_k = torch.arange(0, (n + 1) * sk, sk, dtype=torch.int32, device=r.device)
    kwargs = _attention_kwargs(f, sk)
    if f["paged"]:
        k, v, table = _paged(r, f, [sk] * n, hkv, d)
        kwargs["block_table"] = table
    else:
        k, v = r(n * sk, hkv, d), r(n * sk, hkv, d)
    return flash_attn_varlen, (r(n * sq, hq, d), k, v, cu_q, cu_k, sq, sk), kwargs


def _kvcache(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    from infiniops_py import flash_attn_with_kvcache

    _refuse("flash_attn_with_kvcache", f, "alibi", "fp8_kv", "cache_batch_idx", "cache_leftpad", "rotary")
    batch, k_len, hkv, d = s["q_tokens"], s["k_len"], s["num_kv_heads"], f["head_dim"]
    hq = hkv * f["gqa_ratio"]
    kwargs = _attention_kwargs(f, k_len)
    if f["paged"]:
        k_cache, v_cache, table = _paged(r, f, [k_len] * batch, hkv, d)
        kwargs["block_table"] = table
    else:
        k_cache, v_cache = r(batch, k_len, hkv, d), r(batch, k_len, hkv, d)
    lens = k_len - 1 if f["append"] else k_len  # every sequence at (nearly) full context: the decode's worst case
    kwargs["cache_seqlens"] = torch.full((batch,), lens, dtype=torch.int32, device=r.device)
    if f["append"]:
        kwargs.update(k=r(batch, 1, hkv, d), v=r(batch, 1, hkv, d))
    return flash_attn_with_kvcache, (r(batch, 1, hq, d), k_cache, v_cache), kwargs


_BUILDERS: Final[dict[str, Callable[[_Draw, Mapping[str, Any], Mapping[str, int]],
                                    tuple[Callable[..., Any], tuple, dict]]]] = {
    "gemm": _gemm,
    "add": _add,
    "rms_norm": _rms_norm,
    "fused_add_rms_norm": _fused_add,
    "fused_qk_norm": _qk_norm,
    "reshape_and_cache_flash": _cache_write,
    "flash_attn_varlen": _varlen,
    "flash_attn_with_kvcache": _kvcache,
}
