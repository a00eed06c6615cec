"""Strategies for the Mamba-2 selective scan and its decode step.

After vLLM's ``test_mamba_ssm_ssd_single_example.py`` and mamba's ``test_selective_state_update.py``,
scaled down: H {2, 4}, P {4, 8, 16}, N {8, 16}, G {1, 2}, L up to 160 with chunk sizes {16, 32, 64}
(L often not a multiple, sequences shorter than a chunk), D [H] or [H, P], z, dt_bias, softplus,
dt_limit, initial/final states, ``seq_idx`` with several runs; the update with slots gathered through
indices with -1 padding and, as the peer's "tied" case, dt and D broadcast (stride 0) along a dim.
dt is drawn like Mamba's: softplus of a small raw value plus an inverse-softplus bias in [1e-3, 0.1].

On `CaseContext.large` (GPU) runs, the Mamba-2 layer sizes: H up to 32 (24, Mamba-2-130m's, among them),
P up to 128 (64 favored), N up to 128 (64 and 128 favored), G {1, 2, 4}, chunk sizes up to 256; one scan
in five runs 1024 to 4096 steps, the others up to 512, with at most 2**24 elements in x; the update runs
batches up to 64 over up to 128 slots, with at most 2**24 state elements.
"""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from infiniops_py.testing.case import Case, CaseContext, randn
from infiniops_py.testing.strategies.causal_conv1d import padded_indices, segments

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

    def params(self, dt_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, dict[str, object]]:
        """dt in the input dtype, A fp32, and the D / dt_bias / dt_softplus keyword arguments."""
        h = self.heads
        if self.softplus:
            dt = self.rand(*dt_shape, scale=0.5)
        else:  # already a step size: small and positive (dt_bias may push a few below 0: clamped)
            dt = self.uniform(*dt_shape, low=1e-3, high=0.1).to(self.ctx.dtype)
        A = -torch.exp(self.rand(h, scale=0.5, dtype=torch.float32))
        kwargs: dict[str, object] = {"dt_softplus": self.softplus}
        if self.has_dt_bias:
            step = self.uniform(h, low=1e-3, high=0.1)
            kwargs["dt_bias"] = torch.log(torch.expm1(step)) if self.softplus else 0.01 * self.rand(h)
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


def selective_state_update_case(ctx: CaseContext) -> Case:
    d = _Draws(ctx)
    has_indices = ctx.pick("has_indices", _FLAGS)
    h, p, n, g = d.heads, d.head_dim, d.d_state, d.groups
    if ctx.large:
        most = max(1, _LARGE_ELEMENTS // (h * p * n))  # slots
        batch = ctx.draw(st.integers(1, max(1, min(64, most // 2))))
        slots = batch + (ctx.draw(st.integers(0, min(64, most - batch))) if has_indices else 0)
    else:
        batch = ctx.draw(st.integers(1, 4))
        slots = batch + (ctx.draw(st.integers(0, 4)) if has_indices else 0)
    tied = ctx.draw(st.booleans())
    dt, A, kwargs = d.params((batch, 1) if tied else (batch, h))
    if tied:  # the peer's stride-0 case: one step size per row, broadcast over the heads
        dt = dt.expand(batch, h)
    state = d.rand(slots, h, p, n, dtype=torch.float32)
    x = d.rand(batch, h, p)
    B, C = d.rand(batch, g, n), d.rand(batch, g, n)
    if d.has_z:
        kwargs["z"] = d.rand(batch, h, p)
    note = f"B={batch} slots={slots} {d.note()}{' tied dt' if tied else ''}"
    if has_indices:
        index = padded_indices(d.gen, batch, slots, ctx.draw(st.sampled_from((0.0, 0.25, 0.5))))
        dtype = ctx.draw(st.sampled_from((torch.int32, torch.int64)))
        kwargs["state_batch_indices"] = index.to(dtype).to(ctx.device)
        note += f" padding={int((index < 0).sum())}"
    return Case((state, x, dt, A, B, C), kwargs, mutated=(0,), note=note)


STRATEGIES = {"selective_scan": selective_scan_case, "selective_state_update": selective_state_update_case}
