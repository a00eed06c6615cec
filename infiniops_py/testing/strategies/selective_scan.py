"""Strategies for the Mamba-2 selective scan and its decode step.

After vLLM's ``test_mamba_ssm_ssd_single_example.py`` and mamba's ``test_selective_state_update.py``,
scaled down: H {2, 4}, P {4, 8, 16}, N {8, 16}, G {1, 2}, L up to 160 with chunk sizes {16, 32, 64}
(L often not a multiple, sequences shorter than a chunk), D [H] or [H, P], z, dt_bias, softplus,
dt_limit, initial/final states, ``seq_idx`` with several runs; mamba's packed row (``cu_seqlens``: up to
5 sequences, empty ones included, with per-sequence or mamba's one-row initial states, varlen states,
sometimes with a ``seq_idx`` that restarts inside a sequence too); the update with slots gathered through
indices with -1 padding, as the peer's "tied" case dt and D broadcast (stride 0) along a dim, mamba's
untied layouts (dt [B, H, P], A [H, P, N], dt_bias [H, P], each drawn separately, now and then as the
stride-0 view of a per-head value), and states in the inputs' 16-bit dtype (mamba's test keeps the state
in the input dtype). dt is drawn like Mamba's: softplus of a small raw value plus an inverse-softplus bias
in [1e-3, 0.1]; without softplus, the update's steps may be negative (it never clamps).

On `CaseContext.large` (GPU) runs, the Mamba-2 layer sizes: H up to 32 (24, Mamba-2-130m's, among them),
P up to 128 (64 favored), N up to 128 (64 and 128 favored), G {1, 2, 4}, chunk sizes up to 256; one scan
in five runs 1024 to 4096 steps, the others up to 512, with at most 2**24 elements in x; the update runs
batches up to 64 over up to 128 slots, with at most 2**24 state elements.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from infiniops_py.problem import dtype_name
from infiniops_py.testing.case import Case, CaseContext, randn
from infiniops_py.testing.strategies.causal_conv1d import cut, padded_indices, segments

__all__ = ["STRATEGIES"]

_HEAD_DIMS = (4, 8, 16)
_D_STATES = (8, 16)
_GROUPS = (1, 2)
_CHUNKS = (16, 32, 64)
_LENGTHS = (1, 15, 16, 17, 33, 64, 100, 129, 160)
_LIMITS = ((0.0, math.inf), (0.0, math.inf), (1e-3, 0.05))
_FLAGS = (False, True)
# large (GPU) runs
_LARGE_HEAD_DIMS = (*_HEAD_DIMS, 32, 64, 128)
_LARGE_D_STATES = (*_D_STATES, 32, 64, 128)
_LARGE_GROUPS = (1, 2, 4)
_LARGE_HEADS = (2, 4, 8, 16, 24, 32)
_LARGE_CHUNKS = (*_CHUNKS, 128, 256)
_LARGE_LENGTHS = (*_LENGTHS, 256, 257, 512)
_LONG_LENGTHS = (1024, 2048, 2049, 4096)
_LARGE_ELEMENTS = 2**24


class _Draws:
    """The flags and sizes both entry points share, drawn through `ctx.pick` where they are problem fields."""

    def __init__(self, ctx: CaseContext) -> None:
        self.ctx = ctx
        self.gen = ctx.generator()
        if ctx.large:
            self.head_dim = ctx.pick("head_dim", _LARGE_HEAD_DIMS, (64,))
            self.d_state = ctx.pick("d_state", _LARGE_D_STATES, (64, 128))
            self.groups = ctx.pick("n_groups", _LARGE_GROUPS)
            self.heads = ctx.draw(st.sampled_from([h for h in _LARGE_HEADS if h % self.groups == 0]))
        else:
            self.head_dim = ctx.pick("head_dim", _HEAD_DIMS)
            self.d_state = ctx.pick("d_state", _D_STATES)
            self.groups = ctx.pick("n_groups", _GROUPS)
            self.heads = ctx.draw(st.sampled_from((2, 4)))
        self.has_D, self.has_z = ctx.pick("has_D", _FLAGS), ctx.pick("has_z", _FLAGS)
        self.has_dt_bias, self.softplus = ctx.pick("has_dt_bias", _FLAGS), ctx.pick("dt_softplus", _FLAGS)

    def rand(self, *shape: int, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
        return randn(*shape, dtype=dtype or self.ctx.dtype, device=self.ctx.device, scale=scale, generator=self.gen)

    def uniform(self, *shape: int, low: float, high: float) -> torch.Tensor:
        return (low + (high - low) * torch.rand(*shape, generator=self.gen)).to(self.ctx.device)

    def params(self, dt_shape: tuple[int, ...], low: float = 1e-3, bias_shape: tuple[int, ...] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
        """dt in the input dtype, A fp32, and the D / dt_bias / dt_softplus keyword arguments; `low`: the
        smallest step without softplus, `bias_shape`: dt_bias's ([H] by default)."""
        h = self.heads
        if self.softplus:
            dt = self.rand(*dt_shape, scale=0.5)
        else:  # already a step size: small (dt_bias may push a few below 0: the scan clamps them)
            dt = self.uniform(*dt_shape, low=low, high=0.1).to(self.ctx.dtype)
        A = -torch.exp(self.rand(h, scale=0.5, dtype=torch.float32))
        kwargs: dict[str, object] = {"dt_softplus": self.softplus}
        if self.has_dt_bias:
            shape = bias_shape or (h,)
            step = self.uniform(*shape, low=1e-3, high=0.1)
            kwargs["dt_bias"] = torch.log(torch.expm1(step)) if self.softplus else 0.01 * self.rand(*shape)
        if self.has_D:
            shape = (h, self.head_dim) if self.ctx.draw(st.booleans()) else (h,)
            kwargs["D"] = self.rand(*shape, dtype=torch.float32)
        return dt, A, kwargs

    def note(self) -> str:
        flags = [n for n, on in (("D", self.has_D), ("z", self.has_z), ("dt_bias", self.has_dt_bias),
                                 ("softplus", self.softplus)) if on]
        return f"H={self.heads} P={self.head_dim} N={self.d_state} G={self.groups} {'+'.join(flags) or 'plain'}"


def _batch_length(ctx: CaseContext, row: int) -> tuple[int, int]:
    """Scan rows and steps; on large runs at most `_LARGE_ELEMENTS` in x (`row`: elements per step)."""
    if not ctx.large:
        return ctx.draw(st.integers(1, 2)), ctx.draw(st.one_of(st.sampled_from(_LENGTHS), st.integers(1, 160)))
    if ctx.draw(st.integers(0, 4)) == 0:
        length = ctx.draw(st.one_of(st.sampled_from(_LONG_LENGTHS), st.integers(1024, 4096)))
    else:
        length = ctx.draw(st.one_of(st.sampled_from(_LARGE_LENGTHS), st.integers(1, 512)))
    return ctx.draw(st.integers(1, max(1, min(4, _LARGE_ELEMENTS // (length * row))))), length


def selective_scan_case(ctx: CaseContext) -> Case:
    d = _Draws(ctx)
    chunk = ctx.pick("chunk_size", _LARGE_CHUNKS if ctx.large else _CHUNKS)
    has_seq_idx, has_init = ctx.pick("has_seq_idx", _FLAGS), ctx.pick("has_initial_states", _FLAGS)
    final = ctx.pick("return_final_states", _FLAGS)
    if ctx.pick("varlen", _FLAGS):
        return _packed_scan_case(ctx, d, chunk, has_seq_idx, has_init, final)
    batch, length = _batch_length(ctx, d.heads * d.head_dim)
    ctx.record("max_length", length)
    h, p, n, g = d.heads, d.head_dim, d.d_state, d.groups
    x = d.rand(batch, length, h, p)
    dt, A, kwargs = d.params((batch, length, h))
    B, C = d.rand(batch, length, g, n), d.rand(batch, length, g, n)
    kwargs["chunk_size"] = chunk
    kwargs["dt_limit"] = ctx.draw(st.sampled_from(_LIMITS))
    note = f"Bt={batch} L={length} chunk={chunk} {d.note()} dt_limit={kwargs['dt_limit']}"
    if d.has_z:
        kwargs["z"] = d.rand(batch, length, h, p)
    if has_init:
        kwargs["initial_states"] = d.rand(batch, h, p, n, dtype=torch.float32)
        note += " initial_states"
    if has_seq_idx:
        count = ctx.draw(st.integers(1, 4))
        kwargs["seq_idx"] = segments(d.gen, batch, length, count, ctx.draw(st.booleans())).to(ctx.device)
        note += f" seq_idx({count} runs)"
    if final:
        kwargs["return_final_states"] = True
        note += " final_states"
    return Case((x, dt, A, B, C), kwargs, note=note)


def _packed_scan_case(ctx: CaseContext, d: _Draws, chunk: int, has_seq_idx: bool, has_init: bool,
                      final: bool) -> Case:
    """mamba's packed row: S sequences in one row cut by cu_seqlens, each with its own initial state."""
    h, p, n, g = d.heads, d.head_dim, d.d_state, d.groups
    _, length = _batch_length(ctx, h * p)
    sequences = ctx.draw(st.integers(1, 5))
    lengths = cut(d.gen, length, sequences)
    ctx.record("max_length", max(lengths))
    cu = torch.tensor([0, *lengths]).cumsum(0).to(ctx.draw(st.sampled_from((torch.int32, torch.int64))))
    x = d.rand(1, length, h, p)
    dt, A, kwargs = d.params((1, length, h))
    B, C = d.rand(1, length, g, n), d.rand(1, length, g, n)
    kwargs |= {"chunk_size": chunk, "dt_limit": ctx.draw(st.sampled_from(_LIMITS)), "cu_seqlens": cu.to(ctx.device)}
    note = f"packed lengths={lengths} chunk={chunk} {d.note()} dt_limit={kwargs['dt_limit']}"
    if d.has_z:
        kwargs["z"] = d.rand(1, length, h, p)
    if has_init:
        rows = 1 if ctx.draw(st.booleans()) else sequences  # mamba's one-row form: the first sequence's
        kwargs["initial_states"] = d.rand(rows, h, p, n, dtype=torch.float32)
        note += f" initial_states[{rows}]"
    if has_seq_idx:  # a restart inside a sequence too (the sequences' own starts are restarts anyway)
        kwargs["seq_idx"] = segments(d.gen, 1, length, ctx.draw(st.integers(1, 3)), False).to(ctx.device)
        note += " seq_idx"
    if final:
        kwargs["return_final_states"] = True
        note += " final_states"
    if ctx.pick("return_varlen_states", _FLAGS):
        kwargs["return_varlen_states"] = True
        note += " varlen_states"
    return Case((x, dt, A, B, C), kwargs, note=note)


def _untied(d: _Draws, batch: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, object], str]:
    """mamba's untied layouts, each argument drawn in its own form: per channel, the stride-0 view of a
    per-head value (mamba's "tied" call, taken as per-head) or per head."""
    h, p, n = d.heads, d.head_dim, d.d_state
    forms = [d.ctx.draw(st.sampled_from(("untied", "expanded", "head"))) for _ in range(3)]
    if "untied" not in forms:  # at least one really per channel (else the problem is the per-head one)
        forms[d.ctx.draw(st.integers(0, 2))] = "untied"
    if forms[2] == "untied" and not d.has_dt_bias:
        forms[2] = "head"
        forms[0] = "untied" if "untied" not in forms else forms[0]
    low = -0.05 if not d.softplus else 1e-3  # the update never clamps: negative steps stay
    dt, _, kwargs = d.params((batch, h, p) if forms[0] == "untied" else (batch, h), low=low,
                             bias_shape=(h, p) if forms[2] == "untied" else (h,))
    if forms[0] == "expanded":
        dt = dt[:, :, None].expand(batch, h, p)
    A = -torch.exp(d.rand(h, p, n, scale=0.5, dtype=torch.float32)) if forms[1] == "untied" else \
        -torch.exp(d.rand(h, scale=0.5, dtype=torch.float32))
    if forms[1] == "expanded":
        A = A[:, None, None].expand(h, p, n)
    if forms[2] == "expanded" and "dt_bias" in kwargs:
        kwargs["dt_bias"] = kwargs["dt_bias"][:, None].expand(h, p)
    return dt, A, kwargs, f" dt/A/dt_bias {'/'.join(forms)}"


def selective_state_update_case(ctx: CaseContext) -> Case:
    d = _Draws(ctx)
    has_indices = ctx.pick("has_indices", _FLAGS)
    untied = ctx.pick("untied", _FLAGS)
    state_dtype = ctx.pick("state_dtype", tuple(dict.fromkeys(("float32", dtype_name(ctx.dtype)))))
    h, p, n, g = d.heads, d.head_dim, d.d_state, d.groups
    if ctx.large:
        most = max(1, _LARGE_ELEMENTS // (h * p * n))  # slots
        batch = ctx.draw(st.integers(1, max(1, min(64, most // 2))))
        slots = batch + (ctx.draw(st.integers(0, min(64, most - batch))) if has_indices else 0)
    else:
        batch = ctx.draw(st.integers(1, 4))
        slots = batch + (ctx.draw(st.integers(0, 4)) if has_indices else 0)
    tied = ctx.draw(st.booleans())
    if untied:
        dt, A, kwargs, forms = _untied(d, batch)
    else:
        dt, A, kwargs = d.params((batch, 1) if tied else (batch, h), low=-0.05 if not d.softplus else 1e-3)
        forms = ""
        if tied:  # the peer's stride-0 case: one step size per row, broadcast over the heads
            dt = dt.expand(batch, h)
    state = d.rand(slots, h, p, n, dtype=getattr(torch, state_dtype))
    x = d.rand(batch, h, p)
    B, C = d.rand(batch, g, n), d.rand(batch, g, n)
    if d.has_z:
        kwargs["z"] = d.rand(batch, h, p)
    note = f"B={batch} slots={slots} {d.note()}{' tied dt' if tied and not untied else ''}{forms} state {state_dtype}"
    if has_indices:
        index = padded_indices(d.gen, batch, slots, ctx.draw(st.sampled_from((0.0, 0.25, 0.5))))
        dtype = ctx.draw(st.sampled_from((torch.int32, torch.int64)))
        kwargs["state_batch_indices"] = index.to(dtype).to(ctx.device)
        note += f" padding={int((index < 0).sum())}"
    return Case((state, x, dt, A, B, C), kwargs, mutated=(0,), note=note)


STRATEGIES = {"selective_scan": selective_scan_case, "selective_state_update": selective_state_update_case}
