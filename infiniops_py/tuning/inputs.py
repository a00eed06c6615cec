"""Synthetic inputs of a problem bucket's representative size, for the tuner and ``infiniops tune``.

`build` returns one public-function call (`SyntheticCall`) whose problem has the given fields and whose sizes
fall in the given bucket: the tuner records the implementation call it makes and times each accepting
implementation on it. The values are standard-normal draws (seeded), laid out as the conformance suite's
strategies lay them out (``infiniops_py/testing/strategies``): those draw random sizes through hypothesis, so
they cannot be asked for one size; these builders take the sizes.

`SIZES` names, per operator, the sizes a builder takes and their defaults: the bucket's sizes (``OpSpec.buckets``)
and the extra ones that fix the shape (the attention's KV heads, the conv's channels, the rotary's heads). An
operator whose declaration has ``sample_inputs`` (``Operator.sizes``: the default is the largest drawn value)
is built by it; the others by the builders here.
Every problem field of every operator with a size bucket has a builder (an fp8 cache comes with its scales,
ALiBi with its slopes, a packed conv or scan with its sequence boundaries); ``all_reduce`` has no bucket (a
collective is timed on every rank together or not at all), so `build` refuses it with a `ValueError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch

from infiniops_py.operators import OPERATORS
from infiniops_py.operators.add import add
from infiniops_py.operators.causal_conv1d import causal_conv1d, causal_conv1d_update
from infiniops_py.operators.flash_attn import flash_attn_varlen, flash_attn_with_kvcache
from infiniops_py.operators.fused_qk_norm import fused_qk_norm
from infiniops_py.operators.fused_qk_norm_rope import fused_qk_norm_rope
from infiniops_py.operators.gemm import gemm
from infiniops_py.operators.paged_cache import reshape_and_cache_flash
from infiniops_py.operators.rms_norm_gated import rms_norm_gated
from infiniops_py.operators.rotary_embedding import rotary_embedding
from infiniops_py.operators.selective_scan import selective_scan, selective_state_update
from infiniops_py.problem import dtype_name

__all__ = ["SIZES", "SyntheticCall", "build"]

FP8: Final = torch.float8_e4m3fn

_BUILT_HERE: Final[dict[str, dict[str, int]]] = {
    "gemm": {"m": 1, "n": 4096, "k": 4096},
    "add": {"numel": 1 << 20},
    "fused_qk_norm": {"tokens": 128},
    "reshape_and_cache_flash": {"tokens": 128},
    "flash_attn_varlen": {"q_tokens": 1024, "k_len": 1024, "num_kv_heads": 8},
    "flash_attn_with_kvcache": {"q_tokens": 1, "k_len": 1024, "num_kv_heads": 8},
    "causal_conv1d": {"tokens": 2048, "dim": 1792},  # Mamba-2-130m's conv: d_inner 1536 + 2 x 128 of B/C
    "causal_conv1d_update": {"batch": 16, "dim": 1792},
    "selective_scan": {"tokens": 2048, "num_heads": 24},
    "selective_state_update": {"batch": 16, "num_heads": 24},
    "rms_norm_gated": {"tokens": 16},
    "rotary_embedding": {"tokens": 128, "num_q_heads": 16, "num_kv_heads": 8},
    "fused_qk_norm_rope": {"tokens": 128},
}
SIZES: Final[dict[str, dict[str, int]]] = {
    name: _BUILT_HERE.get(name) or {size: max(drawn) for size, drawn in spec.sizes.items()}
    for name, spec in OPERATORS.items() if name in _BUILT_HERE or getattr(spec, "sample_inputs", None) is not None}


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

    def scale(self, *shape: int) -> torch.Tensor:
        """Positive float32 values in [0.5, 1.5): fp8 scales and descales, ALiBi slopes."""
        return (0.5 + torch.rand(shape, generator=self.gen)).to(self.device)

    def index(self, n: int, high: int) -> torch.Tensor:
        """`n` distinct int64 indices in ``[0, high)`` (a permutation's head): state and conv-state slots."""
        return torch.randperm(high, generator=self.gen)[:n].to(self.device)


def build(op: str, *, device: str, dtype: str | torch.dtype, sizes: Mapping[str, int],
          fields: Mapping[str, Any]) -> SyntheticCall:
    """A call of operator `op` on `device` in `dtype` with problem `fields` (the rest take the operator's
    defaults) at `sizes` (missing ones take `SIZES`' defaults).

    Raises:
        KeyError: an unknown operator. ValueError: an operator without a size bucket (``all_reduce``), a size
            or a size field (one whose default is an int >= 1: ``hidden_size``) that is not an int >= 1, a
            name that is neither a size of `op` (`SIZES`) nor a field, an unknown dtype or device, or inputs
            that cannot be allocated (naming the sizes).
        ContractError: fields that cannot go together (the operator's own checks name them).
    """
    if op not in OPERATORS:
        raise KeyError(f"unknown operator {op!r}; known: {', '.join(OPERATORS)}")
    if op not in SIZES:
        raise ValueError(f"{op} has no size bucket: nothing to tune (a collective is timed on all its ranks "
                         "together, which the tuner does not do)")
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
    for name, value in fields.items():  # a size among the fields (hidden_size, head_dim): 0 builds empty inputs,
        default = spec.fields[name]     # which time nothing (issue #30, item 10)
        if _is_size(default) and (not _is_size(value) or value < 1):
            raise ValueError(f"{op}: field {name}={value!r} must be an int >= 1 (a size; its default is {default})")
    values = {**spec.fields, **fields}
    dt = getattr(torch, dtype_name(dtype), None) if isinstance(dtype, str) else dtype
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r} (float32, bfloat16, float16, ...)")
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r} (cpu, cuda, cuda:1, ...)") from None
    try:
        if op in _BUILDERS:
            function, args, kwargs = _BUILDERS[op](_Draw(device, dt), values, full)
        else:  # the declaration's own (a size it draws may be a field: one given by name wins)
            function = spec.function
            args, kwargs = spec.sample_inputs({**values, **SIZES[op], **fields, **sizes}, dt, torch.device(device),
                                              torch.Generator().manual_seed(0))
    except (RuntimeError, MemoryError) as err:  # an allocation the device refuses
        raise ValueError(f"{op}: cannot make the inputs of sizes {full} on {device}: {err}") from None
    return SyntheticCall(function, tuple(args), dict(kwargs), full)


def _is_size(value: Any) -> bool:
    """Whether a field's `value` is an int >= 1 (not a bool): the default of a size field, such as
    ``hidden_size`` or ``head_dim`` (a field whose default is 0, such as ``block_size`` 0, is a switch)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _gemm(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
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
    numel = s["numel"]
    if f["broadcast"]:  # the bias add of a linear layer: [rows, cols] + [cols]
        cols = min(numel, 1024)
        x, other = r(max(1, numel // cols), cols), r(cols)
    else:
        x, other = r(numel), r(numel)
    return add, (x, other), {"out": x} if f["inplace"] else {}


def _qk_norm(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    d, hq, hkv = f["head_dim"], f["num_q_heads"], f["num_kv_heads"]
    qkv = r(s["tokens"], (hq + 2 * hkv) * d)
    return fused_qk_norm, (qkv, 1 + r(d, scale=0.1), 1 + r(d, scale=0.1)), {
        "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d}


def _cache_write(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    t, bs, hkv, d = s["tokens"], f["block_size"], f["num_kv_heads"], f["head_dim"]
    blocks = math.ceil(t / bs) + 1
    slots = torch.arange(t, dtype=torch.int64, device=r.device)
    caches = [r(blocks, bs, hkv, d) for _ in range(2)]
    kwargs: dict[str, Any] = {}
    if f["fp8_kv"]:
        caches = [c.to(FP8) for c in caches]
        kwargs = {"kv_cache_dtype": "fp8", "k_scale": r.scale(1), "v_scale": r.scale(1)}
    return reshape_and_cache_flash, (r(t, hkv, d), r(t, hkv, d), *caches, slots), kwargs


def _attention_kwargs(r: _Draw, f: Mapping[str, Any], k_len: int, batch: int, hq: int, hkv: int
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


def _paged(r: _Draw, f: Mapping[str, Any], lengths: list[int], hkv: int, d: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """K/V caches ``[blocks, block_size, Hkv, D]`` and an int32 block table giving each sequence its own blocks."""
    bs = f["block_size"] or 16
    per = max(math.ceil(n / bs) for n in lengths)
    table = torch.arange(len(lengths) * per, dtype=torch.int32, device=r.device).view(len(lengths), per)
    return r(len(lengths) * per, bs, hkv, d), r(len(lengths) * per, bs, hkv, d), table


def _varlen(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    q_tokens, k_len, hkv, d = s["q_tokens"], s["k_len"], s["num_kv_heads"], f["head_dim"]
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
        k, v = k.to(FP8), v.to(FP8)
    return flash_attn_varlen, (r(n * sq, hq, d), k, v, cu_q, cu_k, sq, sk), kwargs


def _kvcache(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    batch, k_len, hkv, d = s["q_tokens"], s["k_len"], s["num_kv_heads"], f["head_dim"]
    hq = hkv * f["gqa_ratio"]
    kwargs = _attention_kwargs(r, f, k_len, batch, hq, hkv)
    if f["paged"]:
        k_cache, v_cache, table = _paged(r, f, [k_len] * batch, hkv, d)
        kwargs["block_table"] = table
    else:
        k_cache, v_cache = r(batch, k_len, hkv, d), r(batch, k_len, hkv, d)
    if f["fp8_kv"]:
        k_cache, v_cache = k_cache.to(FP8), v_cache.to(FP8)
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
    return flash_attn_with_kvcache, (r(batch, 1, hq, d), k_cache, v_cache), kwargs


def _conv(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    tokens, dim, width = s["tokens"], s["dim"], f["width"]
    weight = r(dim, width, scale=width ** -0.5)
    kwargs: dict[str, Any] = {"activation": "silu" if f["silu"] else None}
    if f["has_bias"]:
        kwargs["bias"] = r(dim)
    if f["varlen"]:  # vLLM's packed prefill: 4 sequences in one row, each with its own state slot
        n = min(4, tokens)
        x = r(dim, tokens)
        kwargs.update(conv_states=r(n, dim, width - 1), cache_indices=torch.arange(n, dtype=torch.int32,
                                                                                   device=r.device),
                      query_start_loc=torch.linspace(0, tokens, n + 1).round().to(torch.int32).to(r.device),
                      has_initial_state=torch.ones(n, dtype=torch.bool, device=r.device))
        return causal_conv1d, (x, weight), kwargs
    x = r(1, tokens, dim).transpose(1, 2) if f["channel_last"] else r(1, dim, tokens)
    if f["has_seq_idx"]:  # two sequences in the row
        kwargs["seq_idx"] = (torch.arange(tokens, device=r.device) >= tokens // 2).to(torch.int32).view(1, tokens)
    if f["has_initial_states"]:
        kwargs["initial_states"] = r(1, width - 1, dim).transpose(1, 2)
    kwargs["return_final_states"] = f["return_final_states"]
    return causal_conv1d, (x, weight), kwargs


def _conv_update(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    batch, dim, width = s["batch"], s["dim"], f["width"]
    slots = 2 * batch if f["has_indices"] else batch
    kwargs: dict[str, Any] = {"activation": "silu" if f["silu"] else None}
    if f["has_bias"]:
        kwargs["bias"] = r(dim)
    if f["has_indices"]:
        kwargs["conv_state_indices"] = r.index(batch, slots).to(torch.int32)
    if f["has_cache_seqlens"]:
        kwargs["cache_seqlens"] = torch.full((batch,), 7, dtype=torch.int32, device=r.device)
    return causal_conv1d_update, (r(batch, dim), r(slots, dim, f["state_len"]), r(dim, width, scale=width ** -0.5)), \
        kwargs


def _scan_inputs(r: _Draw, f: Mapping[str, Any], rows: int, length: int, heads: int) -> tuple[tuple, dict]:
    """x, dt, A, B, C (``[rows, length, ...]``, or ``[rows, ...]`` when `length` is 0: a decode step) and the
    optional D, z, dt_bias of the fields."""
    p, n, g = f["head_dim"], f["d_state"], f["n_groups"]
    lead = (rows, length) if length else (rows,)
    kwargs: dict[str, Any] = {"dt_softplus": f["dt_softplus"]}
    if f["has_D"]:
        kwargs["D"] = r(heads).float()
    if f["has_z"]:
        kwargs["z"] = r(*lead, heads, p)
    if f["has_dt_bias"]:
        kwargs["dt_bias"] = r(heads, scale=0.1).float()
    dt = (r(*lead, heads, scale=0.1).float().abs() + 0.01).to(r.dtype)  # dt >= 0 (the scan clamps, the step not)
    a = -(torch.rand(heads, generator=r.gen) + 0.5).to(r.device)
    return (r(*lead, heads, p), dt, a, r(*lead, g, n), r(*lead, g, n)), kwargs


def _scan(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    tokens, heads = s["tokens"], s["num_heads"]
    args, kwargs = _scan_inputs(r, f, 1, tokens, heads)
    kwargs["chunk_size"] = f["chunk_size"]
    n_seq = 2 if tokens >= 2 else 1
    if f["has_seq_idx"] or f["varlen"]:
        cut = tokens // n_seq
        if f["has_seq_idx"]:
            kwargs["seq_idx"] = (torch.arange(tokens, device=r.device) >= cut).to(torch.int32).view(1, tokens)
        if f["varlen"]:
            kwargs["cu_seqlens"] = torch.tensor([0, cut, tokens][-(n_seq + 1):], dtype=torch.int32, device=r.device)
    if f["has_initial_states"]:
        kwargs["initial_states"] = r(n_seq if f["varlen"] else 1, heads, f["head_dim"], f["d_state"]).float()
    kwargs.update(return_final_states=f["return_final_states"], return_varlen_states=f["return_varlen_states"])
    return selective_scan, args, kwargs


def _state_update(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    batch, heads, p, n = s["batch"], s["num_heads"], f["head_dim"], f["d_state"]
    (x, dt, a, b, c), kwargs = _scan_inputs(r, f, batch, 0, heads)
    if f["untied"]:  # mamba's own layouts, one value per channel: dt [B, H, P], A [H, P, N], dt_bias and D [H, P]
        # (views that only repeat a value per head would be taken as the tied form)
        dt = (r(batch, heads, p, scale=0.1).float().abs() + 0.01).to(r.dtype)
        a = -(torch.rand(heads, p, n, generator=r.gen) + 0.5).to(r.device)
        if "dt_bias" in kwargs:
            kwargs["dt_bias"] = r(heads, p, scale=0.1).float()
        if "D" in kwargs:
            kwargs["D"] = r(heads, p).float()
    slots = 2 * batch if f["has_indices"] else batch
    if f["has_indices"]:
        kwargs["state_batch_indices"] = r.index(batch, slots)
    state = r(slots, heads, p, n).to(getattr(torch, f["state_dtype"]))
    return selective_state_update, (state, x, dt, a, b, c), kwargs


def _rms_norm_gated(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    t, h = s["tokens"], f["hidden_size"]
    kwargs = {"z": r(t, h) if f["has_z"] else None, "group_size": f["group_size"],
              "norm_before_gate": f["norm_before_gate"]}
    return rms_norm_gated, (r(t, h), r(h), r(h) if f["has_bias"] else None), kwargs


def _cos_sin(r: _Draw, rotary_dim: int, positions: int) -> torch.Tensor:
    """vLLM's cache ``[positions, rotary_dim]``: the cos half, then the sin half (float32)."""
    inv = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(r.device)


def _rotary(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    t, hq, hkv, d = s["tokens"], s["num_q_heads"], s["num_kv_heads"], f["head_dim"]
    qkv = r(t, (hq + 2 * hkv) * d)  # query and key as column views of one packed projection, as in a model
    positions = torch.arange(t, dtype=torch.int64, device=r.device)
    return rotary_embedding, (positions, qkv[:, :hq * d], qkv[:, hq * d:(hq + hkv) * d], d,
                              _cos_sin(r, f["rotary_dim"], t), f["is_neox"]), {}


def _qk_norm_rope(r: _Draw, f: Mapping[str, Any], s: Mapping[str, int]) -> tuple[Callable[..., Any], tuple, dict]:
    t, hq, hkv, d = s["tokens"], f["num_q_heads"], f["num_kv_heads"], f["head_dim"]
    positions = torch.arange(t, dtype=torch.int64, device=r.device)
    return fused_qk_norm_rope, (r(t, (hq + 2 * hkv) * d), 1 + r(d, scale=0.1), 1 + r(d, scale=0.1),
                                _cos_sin(r, f["rotary_dim"], t), positions), {
        "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d, "is_neox": f["is_neox"]}


_BUILDERS: Final[dict[str, Callable[[_Draw, Mapping[str, Any], Mapping[str, int]],
                                    tuple[Callable[..., Any], tuple, dict]]]] = {
    "gemm": _gemm,
    "add": _add,
    "fused_qk_norm": _qk_norm,
    "reshape_and_cache_flash": _cache_write,
    "flash_attn_varlen": _varlen,
    "flash_attn_with_kvcache": _kvcache,
    "causal_conv1d": _conv,
    "causal_conv1d_update": _conv_update,
    "selective_scan": _scan,
    "selective_state_update": _state_update,
    "rms_norm_gated": _rms_norm_gated,
    "rotary_embedding": _rotary,
    "fused_qk_norm_rope": _qk_norm_rope,
}
