"""The Mamba-2 mixer layer and the context that tells it where a step's tokens keep their recurrent state.

Each layer (transformers' ``Mamba2Block``, mamba_ssm's ``Mamba2``) mixes over the tokens of a step: ``in_proj``
gives ``[gate | xBC | dt]``; ``xBC`` goes through `causal_conv1d` with SiLU and splits into ``x`` ``[H, P]``,
``B`` and ``C`` ``[G, N]``; `selective_scan` (prefill) or `selective_state_update` (decode) gives ``y`` with
``dt_bias``, softplus, ``dt_limit = time_step_limit`` and ``D``; the gated RmsNorm ``norm(y * silu(gate))``
per group of ``d_inner / n_groups`` channels; ``out_proj``. Prefill leaves each request's conv and SSM states
in its row of the state pool; decode advances them in place with `causal_conv1d_update` and
`selective_state_update`.

Decisions:
  - The gated norm is per group (mamba_ssm's ``RMSNormGated(group_size=d_inner // n_groups,
    norm_before_gate=False)``, the checkpoint's semantics); older transformers slow paths normalize over
    the whole inner dim, which differs when ``n_groups > 1``. It runs as `rms_norm` over a ``[T, G, d_inner/G]``
    view, so the gates check ``hidden_size = d_inner / n_groups``. It runs in float32 and is cast to the model
    dtype before ``out_proj``.
  - ``time_step_limit`` also clamps dt in decode. transformers' and mamba_ssm's decode steps skip the clamp;
    applying it keeps a token's output independent of whether it was prefilled or decoded. The two agree
    for the default ``(0, inf)`` (every published Mamba-2 checkpoint).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Protocol

import torch
import torch.nn.functional as F

from infinilm.config import ModelConfig
from infinilm.layers.derived import Derived
from infinilm.layers.linear import Linear
from infiniops_py import causal_conv1d, causal_conv1d_update, rms_norm, selective_scan, selective_state_update
from infiniops_py.operators.selective_scan import process_dt

__all__ = ["NO_TIME_STEP_LIMIT", "Mamba2Mixer", "SsmContext", "StateRows", "prefill_layout"]

NO_TIME_STEP_LIMIT: Final = (0.0, math.inf)  # the dt clamp that clamps nothing: selective_state_update's own


class StateRows(Protocol):
    """Per-layer recurrent states (`infinilm.engine.state_pool.StatePool`): conv ``[layers, rows, conv_dim, W-1]``
    and SSM ``[layers, rows, H, P, N]``."""

    conv: torch.Tensor
    ssm: torch.Tensor


@dataclass
class SsmContext:
    """Where a step's tokens read and write recurrent state (built by the recurrent runner, passed down).

    The step holds ``num_decode`` decode tokens first (one per request, advancing rows ``decode_rows``), then
    the prompts. Prompts go one per row of a ``[P, L]`` grid, right-aligned (L: the longest prompt), with
    ``seq_idx`` -1 on the left padding and 0 on the prompt: the conv outputs 0 on padding and the scan
    restarts where the prompt begins, so each grid row's final states are its prompt's own (the operators
    return final states per row, for its last sequence; that is why prompts are not packed several to a row).
    A single prompt skips the grid: ``gather``, ``seq_idx`` and ``token_index`` are None.

    Attributes:
        decode_rows: int64 ``[num_decode]`` pool rows (-1: a padding row, skipped by the operators).
        prefill_rows: int64 ``[P]`` pool rows receiving each prompt's final states, or None without prompts.
        gather: int64 ``[P, L]``: 1 + the index of the prompt token at each grid cell, 0 for padding.
        seq_idx: int32 ``[P, L]``.
        token_index: int64 ``[Tp]``: the flat grid cell of each prompt token, in step order.
    """

    num_decode: int = 0
    decode_rows: torch.Tensor | None = None
    prefill_rows: torch.Tensor | None = None
    gather: torch.Tensor | None = None
    seq_idx: torch.Tensor | None = None
    token_index: torch.Tensor | None = None


def prefill_layout(lengths: list[int]) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """``gather``, ``seq_idx`` and ``token_index`` of `SsmContext` for prompts of `lengths`, packed in order."""
    width = max(lengths)
    gather: list[list[int]] = []
    seq_idx: list[list[int]] = []
    token_index: list[int] = []
    offset = 0
    for row, n in enumerate(lengths):
        pad = width - n
        gather.append([0] * pad + list(range(offset + 1, offset + n + 1)))
        seq_idx.append([-1] * pad + [0] * n)
        token_index.extend(range(row * width + pad, (row + 1) * width))
        offset += n
    return gather, seq_idx, token_index


class Mamba2Mixer:
    """The Mamba-2 mixer of one layer over a step's tokens: decode tokens first, then prefill prompts."""

    __slots__ = ("A_log", "D", "a", "conv_bias", "conv_weight", "dims", "dt_bias", "dtype", "eps", "in_proj", "norm",
                 "norm_weight", "ones", "out_proj")

    def __init__(self, c: ModelConfig, *, fuse_bias: bool, dtype: torch.dtype, device: torch.device) -> None:
        """Empty weights for `c` (a Mamba-2 config); `fuse_bias`: biases fused into the Gemm (the gates' choice).

        Raises:
            ConfigError: `c` has no recurrent numbers.
        """
        s = self.dims = c.ssm_dims()
        new = {"dtype": dtype, "device": device}
        self.in_proj = Linear(c.hidden_size, s.proj_size, bias=s.use_bias, fuse_bias=fuse_bias, **new)
        self.conv_weight = torch.empty(s.conv_dim, s.conv_kernel, **new)
        self.conv_bias = torch.empty(s.conv_dim, **new) if s.use_conv_bias else None
        self.dt_bias = torch.empty(s.num_heads, **new)
        self.A_log = torch.empty(s.num_heads, **new)
        self.D = torch.empty(s.num_heads, **new)
        self.norm_weight = torch.empty(s.intermediate_size, **new)
        self.out_proj = Linear(s.intermediate_size, c.hidden_size, bias=s.use_bias, fuse_bias=fuse_bias, **new)
        self.dtype, self.eps = dtype, c.rms_norm_eps
        self.a = Derived(self.A_log, lambda w: -torch.exp(w.float()))
        self.norm = Derived(self.norm_weight, lambda w: w.float())
        self.ones = torch.ones(s.group_size, dtype=torch.float32, device=device)  # the per-group norm's weight

    def targets(self, prefix: str) -> dict[str, torch.Tensor]:
        """Checkpoint name -> the view each of the mixer's tensors loads into."""
        out = {f"{prefix}.conv1d.weight": self.conv_weight.unsqueeze(1), f"{prefix}.dt_bias": self.dt_bias,
               f"{prefix}.A_log": self.A_log, f"{prefix}.D": self.D, f"{prefix}.norm.weight": self.norm_weight}
        if self.conv_bias is not None:
            out[f"{prefix}.conv1d.bias"] = self.conv_bias
        out.update(self.in_proj.targets(f"{prefix}.in_proj"))
        out.update(self.out_proj.targets(f"{prefix}.out_proj"))
        return out

    def __call__(self, h: torch.Tensor, conv_states: torch.Tensor, ssm_states: torch.Tensor,
                 ctx: SsmContext) -> torch.Tensor:
        """h ``[T, hidden]`` -> ``[T, hidden]``; conv ``[rows, conv_dim, W-1]`` and SSM ``[rows, H, P, N]`` states."""
        zx = self.in_proj(h)
        nd = ctx.num_decode
        parts = []
        if nd:
            parts.append(self._decode(zx[:nd], conv_states, ssm_states, ctx))
        if ctx.prefill_rows is not None:
            parts.append(self._prefill(zx[nd:], conv_states, ssm_states, ctx))
        y = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.out_proj(self._gated_norm(y, zx[:, : self.dims.intermediate_size]))

    def _split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[..., conv_dim]`` -> views x ``[..., H, P]``, B and C ``[..., G, N]``."""
        s = self.dims
        gn = s.n_groups * s.state_size
        x, b, c = xbc.split((s.intermediate_size, gn, gn), dim=-1)
        return (x.unflatten(-1, (s.num_heads, s.head_dim)), b.unflatten(-1, (s.n_groups, s.state_size)),
                c.unflatten(-1, (s.n_groups, s.state_size)))

    def _decode(self, zx: torch.Tensor, conv_states: torch.Tensor, ssm_states: torch.Tensor,
                ctx: SsmContext) -> torch.Tensor:
        """One step of each decode request, advancing its rows' conv and SSM states in place."""
        s = self.dims
        lo = s.intermediate_size
        xbc = causal_conv1d_update(zx[:, lo:lo + s.conv_dim], conv_states, self.conv_weight, self.conv_bias,
                                   activation="silu", conv_state_indices=ctx.decode_rows)
        x, b, c = self._split(xbc)
        dt = zx[:, lo + s.conv_dim:]
        if s.time_step_limit == NO_TIME_STEP_LIMIT:
            y = selective_state_update(ssm_states, x, dt, self.a.get(), b, c, D=self.D, dt_bias=self.dt_bias,
                                       dt_softplus=True, state_batch_indices=ctx.decode_rows)
        else:  # the operator clamps to (0, inf) only: pass dt already processed with the limit
            dt = process_dt(dt, self.dt_bias, True, s.time_step_limit, torch.float32)
            y = selective_state_update(ssm_states, x, dt, self.a.get(), b, c, D=self.D,
                                       state_batch_indices=ctx.decode_rows)
        return y.flatten(1)

    def _prefill(self, zx: torch.Tensor, conv_states: torch.Tensor, ssm_states: torch.Tensor,
                 ctx: SsmContext) -> torch.Tensor:
        """Every prompt in its own right-aligned row (see `SsmContext`); each row's final states go to its slot."""
        s = self.dims
        tail = zx[:, s.intermediate_size:]  # [Tp, conv_dim + H]: xBC and dt
        rows = tail.unsqueeze(0) if ctx.gather is None else F.pad(tail, (0, 0, 1, 0))[ctx.gather]
        conv, conv_final = causal_conv1d(rows[..., : s.conv_dim].transpose(1, 2), self.conv_weight, self.conv_bias,
                                         activation="silu", seq_idx=ctx.seq_idx, return_final_states=True)
        x, b, c = self._split(conv.transpose(1, 2))
        y, ssm_final = selective_scan(
            x, rows[..., s.conv_dim:], self.a.get(), b, c, D=self.D, dt_bias=self.dt_bias, dt_softplus=True,
            dt_limit=s.time_step_limit, seq_idx=ctx.seq_idx, return_final_states=True, chunk_size=s.chunk_size,
        )
        conv_states.index_copy_(0, ctx.prefill_rows, conv_final)
        ssm_states.index_copy_(0, ctx.prefill_rows, ssm_final)
        y = y.view(-1, s.intermediate_size)
        return y if ctx.token_index is None else y[ctx.token_index]

    def _gated_norm(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``rms_norm(y * silu(gate))`` per group of ``d_inner / G`` channels, in float32, cast to the model dtype."""
        s = self.dims
        g = F.silu(gate.float()).mul_(y)  # y promoted to float32 in the product: y.float() * silu, one kernel less
        if s.n_groups == 1:
            return rms_norm(g, self.norm.get(), self.eps).to(self.dtype)
        t = g.shape[0]
        normed = rms_norm(g.view(t, s.n_groups, s.group_size), self.ones, self.eps)
        return (normed.view(t, -1) * self.norm.get()).to(self.dtype)
