"""Sampling: one batched draw per step from filtered logits (FlashInfer's ``top_k_top_p_sampling_from_logits``
with vLLM's sampler options: temperature, min-p, penalties over the output so far, per-row seeds).

Public: top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None, *, temperature=None, min_p=None,
  seed=None, offset=None, repetition_penalty=None, frequency_penalty=None, presence_penalty=None,
  output_token_counts=None, prompt_token_mask=None) -> int32 [N].
Implementation calling convention: fn(logits, rows, top_k, top_p, temperature, min_p, seed, offset, penalties,
  out) -> out; logits [R, V] (last stride 1), rows int64 [N] in [0, R) (the logits row of each output), top_k
  int32 [N], top_p / temperature / min_p float32 (float64 for the reference) [N], seed / offset int64 [N],
  penalties None or (repetition, frequency, presence) float [R] with counts int32 [R, V] and seen bool [R, V]
  (prompt or output), out int32 [N] contiguous.
Problem fields: penalized (bool): whether penalties are applied.
Size bucket: batch, the `size_class` of N.

The semantics, per output row b of logits row r = rows[b] (vLLM's order):
  1. penalties on row r (vLLM ``apply_penalties``): a token seen in the prompt or the output has its logit
     divided by ``repetition`` when positive, multiplied when not; then ``- frequency * count - presence *
     (count > 0)`` over the output counts;
  2. a row with a NaN or +inf logit, or no logit above -inf, samples -1 (the caller's error: FlashInfer's
     ``check_nan`` raises on the host instead, which needs a synchronization);
  3. temperature <= 0: the argmax (first index on ties), exactly;
  4. else z = (x - max x) / temperature; min-p keeps z >= log(min_p); top-k (0 < k < V) keeps the tokens with
     fewer than k tokens strictly more likely; top-p keeps, among those, the tokens whose strictly more likely
     tokens hold less than top_p of the renormalized mass (so the most likely always stays; ties are kept
     together);
  5. the draw is Gumbel-max: argmax of z + g over the kept tokens, g = -log(-log(u)), u the token's uniform
     from Philox-4x32-10 keyed by the row's seed, counter (token, offset), as Triton's ``tl.philox``
     computes it (`philox_uniform`): row b's draw depends only on its seed, offset and logits row.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

import torch

from infiniops_py.dispatch import dispatch
from infiniops_py.operators._base import (
    FLOAT_DTYPES,
    INDEX_DTYPES,
    ContractError,
    check_device,
    check_dtype,
    check_index_range,
    check_no_grad,
    check_real,
    check_shape,
    check_tensor,
    device_type,
)
from infiniops_py.operators._declare import Operator, Overload, Param, sample_tensor

__all__ = ["SPECS", "filter_mask", "philox_uniform", "reference", "sample_rows", "top_k_top_p_sampling_from_logits"]

_OP = "top_k_top_p_sampling_from_logits"
_M32: Final = 0xFFFFFFFF
_PHILOX_W: Final = (0x9E3779B9, 0xBB67AE85)
_PHILOX_M: Final = (0xD2511F53, 0xCD9E8D57)
Penalties = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


_REAL: Final = (torch.float32, torch.float64)
# per-output option -> (its default for None, the tensor dtypes it may have, its dtype as a scalar, its bounds)
_PER_ROW: Final[dict[str, tuple[Any, tuple[torch.dtype, ...], torch.dtype, tuple[float, float] | None]]] = {
    "top_k": (None, INDEX_DTYPES, torch.int32, None),
    "top_p": (None, _REAL, torch.float32, (0.0, 1.0)),
    "temperature": (1.0, _REAL, torch.float32, (0.0, math.inf)),
    "min_p": (0.0, _REAL, torch.float32, (0.0, 1.0)),
    "seed": (None, (torch.int64,), torch.int64, None),
    "offset": (0, (torch.int64,), torch.int64, None),
}


def _row_tensor(name: str, value: object, n: int, device: torch.device) -> torch.Tensor:
    """The per-output option `name` as a tensor ``[n]`` on `device` (None: its default; a None seed: fresh)."""
    default, dtypes, dtype, bounds = _PER_ROW[name]
    if value is None:
        value = _fresh_seeds(n, device) if name == "seed" else default
    return _per_row(name, value, n, device, dtypes, dtype, bounds)


def _schema_row(name: str) -> Param:
    """The schema form of a per-output option: the int32/int64/float32 ``[N]`` tensor the body makes of it."""
    def to_schema(value: object, call: Mapping[str, Any]) -> torch.Tensor:
        logits, indices = call["logits"], call["indices"]
        return _row_tensor(name, value, logits.shape[0] if indices is None else indices.shape[0], logits.device)

    return Param("Tensor", to_schema=to_schema)


def reference(logits: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
              temperature: torch.Tensor, min_p: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor,
              penalties: Penalties | None, out: torch.Tensor) -> torch.Tensor:
    """The pipeline of the module docstring in float64 (`sample_rows`)."""
    return sample_rows(logits, rows, top_k, top_p, temperature, min_p, seed, offset, penalties, out, torch.float64)


def sample_inputs(values: Mapping[str, Any], dtype: torch.dtype, device: torch.device,
                  generator: torch.Generator) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``batch`` rows of ``vocab`` logits, top-k 50, top-p 0.9, temperature 0.8, fixed seeds; with
    ``penalized``, vLLM's three penalties over random output counts (the tuner's call)."""
    b, v = values["batch"], values["vocab"]
    logits = sample_tensor(generator, b, v, dtype=dtype, device=device, scale=3.0)
    kwargs: dict[str, Any] = {"temperature": 0.8, "seed": torch.arange(b, device=device), "offset": 0}
    if values["penalized"]:
        counts = torch.randint(0, 3, (b, v), generator=generator).to(device=device, dtype=torch.int32)
        kwargs.update(repetition_penalty=torch.full((b,), 1.1, device=device),
                      frequency_penalty=torch.full((b,), 0.2, device=device),
                      presence_penalty=torch.full((b,), 0.1, device=device), output_token_counts=counts)
    return (logits, 50, 0.9), kwargs


SPEC = Operator(
    name=_OP,
    fields={"penalized": False},
    buckets=("batch",),
    reference=reference,
    doc="one token per row from temperature/min-p/top-k/top-p-filtered, penalized logits, per-row seeds",
    overloads=(Overload(fake=lambda logits, top_k, **_: logits.new_empty(top_k.shape, dtype=torch.int32)),),
    params={name: _schema_row(name) for name in _PER_ROW},
    sizes={"batch": (1, 7, 64), "vocab": (17, 1000, 32000)},
    sample_inputs=sample_inputs,
)


@SPEC.define
def top_k_top_p_sampling_from_logits(
    logits: torch.Tensor,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
    indices: torch.Tensor | None = None,
    *,
    temperature: torch.Tensor | float | None = None,
    min_p: torch.Tensor | float | None = None,
    seed: torch.Tensor | int | None = None,
    offset: torch.Tensor | int | None = None,
    repetition_penalty: torch.Tensor | None = None,
    frequency_penalty: torch.Tensor | None = None,
    presence_penalty: torch.Tensor | None = None,
    output_token_counts: torch.Tensor | None = None,
    prompt_token_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token id per output row, drawn from the filtered softmax of its logits row (see the module docstring).

    FlashInfer's ``top_k_top_p_sampling_from_logits(logits, top_k, top_p, indices=None, ..., seed, offset)``
    (top-k first, then top-p renormalized) with vLLM's sampler options. One batched call, no host
    synchronization: per-row values are tensors, and bad per-row values are clamped, not checked (a negative
    temperature is greedy, top_p <= 0 and min_p >= 1 keep only the most likely, top_p >= 1 and k <= 0 or k >= V
    filter nothing).

    Args:
        logits: ``[R, V]`` float16/bfloat16/float32/float64, last stride 1, V >= 1.
        top_k: an int or an int tensor ``[N]`` (per output row).
        top_p: a float or a float tensor ``[N]``.
        indices: None (N = R, output b from logits row b) or int32/int64 ``[N]`` in ``[0, R)``: output b samples
            logits row ``indices[b]`` (FlashInfer's ``indices``); per-output options are indexed by b.
        temperature: None (1.0), a number >= 0 or a float tensor ``[N]``; 0 is the argmax.
        min_p: None (0), a number in [0, 1] or a float tensor ``[N]``: drop tokens below min_p times the top
            probability (after temperature).
        seed, offset: None (seed: fresh from torch's generator of logits' device; offset: 0), an int, or int64
            ``[N]``: the Philox key and step of each output row (a seed in [2**63, 2**64) given as an int is taken
            as its int64 bits).
        repetition_penalty, frequency_penalty, presence_penalty: None or float ``[R]`` (per logits row);
            any of them needs `output_token_counts`. Missing ones are neutral (1, 0, 0).
        output_token_counts: int32/int64 ``[R, V]``: how often each token occurs in the output so far.
        prompt_token_mask: bool ``[R, V]``: the tokens of the prompt (repetition counts them too).

    Returns:
        int32 ``[N]``: the sampled ids; -1 where the (penalized) logits row holds NaN or +inf or nothing above
        -inf.

    Raises:
        ContractError: a non-tensor, a bad shape, dtype, device or layout, an out-of-range scalar, a penalty
            without `output_token_counts`, an index out of ``[0, R)`` (checked mode), or a tensor requiring grad.
    """
    check_tensor(_OP, "logits", logits)
    if logits.dim() != 2:
        raise ContractError(_OP, "logits", f"expected 2 dims [R, V], got shape {list(logits.shape)}")
    check_dtype(_OP, "logits", logits, FLOAT_DTYPES)
    if logits.shape[1] < 1:
        raise ContractError(_OP, "logits", f"expected a vocabulary V >= 1, got shape {list(logits.shape)}")
    if logits.stride(1) != 1:
        raise ContractError(_OP, "logits", f"expected last stride 1, got strides {list(logits.stride())}")
    r = logits.shape[0]
    dev = logits.device
    if indices is not None:
        check_tensor(_OP, "indices", indices)
        check_dtype(_OP, "indices", indices, INDEX_DTYPES)
        check_shape(_OP, "indices", indices, (None,), " (one logits row per output)")
        check_device(_OP, "indices", indices, dev)
    n = r if indices is None else indices.shape[0]
    call = {"top_k": top_k, "top_p": top_p, "temperature": temperature, "min_p": min_p, "seed": seed,
            "offset": offset}
    per_row = {name: _row_tensor(name, value, n, dev) for name, value in call.items()}
    penalties = _penalties(logits, repetition_penalty, frequency_penalty, presence_penalty, output_token_counts,
                           prompt_token_mask)
    check_no_grad(_OP, {"logits": logits, **per_row})
    out = torch.empty(n, dtype=torch.int32, device=dev)
    if n == 0:
        return out
    if r == 0:
        raise ContractError(_OP, "logits", f"has no rows, but indices asks for {n} outputs")
    if indices is None:
        rows = torch.arange(n, device=dev)
    else:
        check_index_range(_OP, "indices", indices, r, allow_negative=False)
        rows = indices.long().clamp(0, r - 1)  # unchecked: an out-of-range index reads a valid row
    key = SPEC.key(device_type(logits), logits.dtype, penalized=penalties is not None, batch=n)
    dispatch(SPEC, key, logits, rows, per_row["top_k"], per_row["top_p"], per_row["temperature"], per_row["min_p"],
             per_row["seed"], per_row["offset"], penalties, out)
    return out


def _fresh_seeds(n: int, device: torch.device) -> torch.Tensor:
    """`n` int64 seeds from torch's default generator of `device` (drawn there: no host synchronization)."""
    return torch.randint(-(2**63), 2**63 - 1, (n,), dtype=torch.int64, device=device)


def _per_row(name: str, value: object, n: int, device: torch.device, dtypes: tuple[torch.dtype, ...],
             dtype: torch.dtype, bounds: tuple[float, float] | None) -> torch.Tensor:
    """A per-output option as a tensor ``[n]`` on `device`: a scalar is checked and broadcast (in `dtype`), a
    tensor is checked for kind, shape, device and dtype (its values are not read) and made contiguous."""
    if isinstance(value, torch.Tensor):
        check_dtype(_OP, name, value, dtypes)
        check_shape(_OP, name, value, (n,), " (one value per output row)")
        if value.device != device:
            raise ContractError(_OP, name, f"expected a tensor on {device} (logits'), got {value.device}")
        return value.contiguous()  # providers index it by row
    if dtype.is_floating_point:
        low, high = bounds or (-math.inf, math.inf)
        x = check_real(_OP, name, value, low=low)
        if x > high:
            raise ContractError(_OP, name, f"expected a number <= {high:g}, got {value!r}")
        return torch.full((n,), x, dtype=dtype, device=device)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ContractError(_OP, name, f"expected an int or an int tensor [N], got {type(value).__name__} {value!r}")
    if dtype == torch.int64 and not -(2**63) <= value < 2**64:
        raise ContractError(_OP, name, f"expected an int in [-2**63, 2**64), got {value}")
    if dtype == torch.int32:
        value = max(min(value, 2**31 - 1), -(2**31))
    elif value >= 2**63:
        value -= 2**64  # the same 64 bits, as int64
    return torch.full((n,), value, dtype=dtype, device=device)


def _penalties(logits: torch.Tensor, repetition: torch.Tensor | None, frequency: torch.Tensor | None,
               presence: torch.Tensor | None, counts: torch.Tensor | None, prompt: torch.Tensor | None
               ) -> Penalties | None:
    """The penalty inputs as ``(repetition, frequency, presence, counts, seen)``, or None when none is given."""
    given = {"repetition_penalty": repetition, "frequency_penalty": frequency, "presence_penalty": presence}
    for name, t in (*given.items(), ("output_token_counts", counts), ("prompt_token_mask", prompt)):
        check_tensor(_OP, name, t, optional=True)
    if all(t is None for t in given.values()):
        return None
    r, v = logits.shape
    if counts is None:
        raise ContractError(_OP, "output_token_counts", "is required with a penalty: int [R, V] output counts")
    check_dtype(_OP, "output_token_counts", counts, INDEX_DTYPES)
    check_shape(_OP, "output_token_counts", counts, (r, v), " (logits' shape)")
    check_device(_OP, "output_token_counts", counts, logits.device)
    factors = []
    for (name, t), neutral in zip(given.items(), (1.0, 0.0, 0.0)):
        if t is None:
            t = torch.full((r,), neutral, dtype=torch.float32, device=logits.device)
        check_dtype(_OP, name, t, (torch.float32, torch.float64))
        check_shape(_OP, name, t, (r,), " (one value per logits row)")
        check_device(_OP, name, t, logits.device)
        factors.append(t)
    seen = counts > 0
    if prompt is not None:
        check_dtype(_OP, "prompt_token_mask", prompt, (torch.bool,))
        check_shape(_OP, "prompt_token_mask", prompt, (r, v), " (logits' shape)")
        check_device(_OP, "prompt_token_mask", prompt, logits.device)
        seen = seen | prompt
    return factors[0], factors[1], factors[2], counts, seen


# --- what every provider computes the same way ------------------------------------------------------------


def philox_uniform(seed: torch.Tensor, offset: torch.Tensor, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """``[N, vocab]`` uniforms in (0, 1): Philox-4x32-10 (Triton's ``tl.philox`` rounds and constants) keyed by
    ``seed[b]`` (low, high 32 bits), counter ``(token, offset low, offset high, 0)``; the first output word's
    top 24 bits plus one half, times 2**-24 (exact in float32, never 0 or 1)."""
    n = seed.shape[0]
    dev = seed.device
    c0 = torch.arange(vocab, dtype=torch.int64, device=dev).expand(n, vocab)
    c1 = (offset & _M32)[:, None].expand(n, vocab)
    c2 = ((offset >> 32) & _M32)[:, None].expand(n, vocab)
    c3 = torch.zeros_like(c0)
    k0, k1 = (seed & _M32)[:, None], ((seed >> 32) & _M32)[:, None]
    for _ in range(10):
        p0, p2 = _PHILOX_M[1] * c2, _PHILOX_M[0] * c0  # exact low 64 bits of 32 x 32-bit products
        c0, c2 = ((p0 >> 32) & _M32) ^ c1 ^ k0, ((p2 >> 32) & _M32) ^ c3 ^ k1
        c1, c3 = p0 & _M32, p2 & _M32
        k0, k1 = (k0 + _PHILOX_W[0]) & _M32, (k1 + _PHILOX_W[1]) & _M32
    return ((c0 >> 8).to(dtype) + 0.5) * 2.0**-24


def sample_rows(logits: torch.Tensor, rows: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                temperature: torch.Tensor, min_p: torch.Tensor, seed: torch.Tensor, offset: torch.Tensor,
                penalties: Penalties | None, out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The whole pipeline in batched torch ops computing in `dtype` (float64: the reference; float32: the torch
    provider): penalties, the non-finite flag, argmax rows, min-p / top-k / top-p thresholds from one sort, and
    the Gumbel-max draw over `philox_uniform` (on the CPU only for the rows with a temperature > 0). Writes `out`
    and returns it."""
    x = penalize(logits.to(dtype), penalties).index_select(0, rows)
    bad = x.amax(1).isfinite().logical_not_()  # the max is NaN with a NaN, +inf with a +inf, -inf with no logit
    ids = x.argmax(1)
    temp = temperature.to(dtype)
    hot = temp > 0
    if x.is_cpu:  # the values are on the host already: draw only the rows that sample (greedy batches: no sort)
        if bool(hot.any()):
            hot = hot.nonzero()[:, 0]
            ids[hot] = _draw(x[hot], top_k[hot], top_p[hot], temp[hot], min_p[hot], seed[hot], offset[hot], dtype)
    else:  # no synchronization: every row is drawn, the greedy ones keep their argmax
        ids = torch.where(hot, _draw(x, top_k, top_p, temp, min_p, seed, offset, dtype), ids)
    return out.copy_(ids.masked_fill_(bad, -1))


def _draw(x: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, temp: torch.Tensor, min_p: torch.Tensor,
          seed: torch.Tensor, offset: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The Gumbel-max draw of each row of `x` ``[n, V]`` (temperatures > 0) over its filtered tokens."""
    z = (x - x.max(1, keepdim=True).values) / temp.clamp_min(torch.finfo(dtype).tiny)[:, None]
    keep = filter_mask(z, top_k, top_p.to(dtype), min_p.to(dtype))
    u = philox_uniform(seed, offset, x.shape[1], dtype)
    return torch.where(keep, z - torch.log(-torch.log(u)), -math.inf).argmax(1)


def penalize(x: torch.Tensor, penalties: Penalties | None) -> torch.Tensor:
    """vLLM's ``apply_penalties`` on ``x`` ``[R, V]`` (in its dtype): repetition over the seen tokens, then
    frequency and presence over the output counts."""
    if penalties is None:
        return x
    repetition, frequency, presence, counts, seen = penalties
    rep = repetition.to(x.dtype)[:, None]
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    c = counts.to(x.dtype)
    return x - frequency.to(x.dtype)[:, None] * c - presence.to(x.dtype)[:, None] * (c > 0).to(x.dtype)


def filter_mask(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """The kept tokens of ``z`` ``[N, V]`` (temperature-scaled, max 0 in each row): min-p, then top-k, then
    top-p over the renormalized survivors, each a threshold from one descending sort (ties kept together)."""
    v = z.shape[1]
    ordered = z.sort(1, descending=True).values
    floor = torch.where(min_p > 0, torch.log(min_p), -math.inf).clamp_max(0)  # min_p > 1 keeps the maxima
    k = top_k.long()
    kth = ordered.gather(1, (k.clamp(1, v) - 1)[:, None])[:, 0]
    floor = torch.maximum(floor, torch.where((k > 0) & (k < v), kth, -math.inf))
    kept = torch.where(ordered >= floor[:, None], ordered, -math.inf)
    probs = torch.softmax(kept, 1)
    before = probs.cumsum(1) - probs  # mass of the tokens sorted before each: < top_p keeps it
    survivors = kept > -math.inf
    count = torch.where(top_p >= 1, survivors.sum(1), ((before < top_p[:, None]) & survivors).sum(1)).clamp_min(1)
    floor = torch.maximum(floor, ordered.gather(1, (count - 1)[:, None])[:, 0])
    return z >= floor[:, None]


SPECS = (SPEC,)
