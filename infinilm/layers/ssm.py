"""The Mamba-2 mixer layer and the context that tells it where a step's tokens keep their recurrent state.

Each layer (transformers' ``Mamba2Block``, mamba_ssm's ``Mamba2``) mixes over the tokens of a step: ``in_proj``
gives ``[gate | xBC | dt]``; ``xBC`` goes through `causal_conv1d` with SiLU and splits into ``x`` ``[H, P]``,
``B`` and ``C`` ``[G, N]``; `selective_scan` (prefill) or `selective_state_update` (decode) gives ``y`` with
``dt_bias``, softplus, ``dt_limit = time_step_limit`` and ``D``; the gated RmsNorm ``norm(y * silu(gate))``
per group of ``d_inner / n_groups`` channels; ``out_proj``. Prefill leaves each request's conv and SSM states
in its row of the state pool; decode advances them in place with `causal_conv1d_update` and
`selective_state_update`. The prompts of one step are packed in one row cut by ``cu_seqlens``: vLLM's packed
`causal_conv1d` writes each prompt's conv state into its row, mamba's packed `selective_scan` returns each
prompt's final SSM state (``return_varlen_states``).

Decisions:
  - The gated norm is per group (mamba_ssm's ``RMSNormGated(group_size=d_inner // n_groups,
    norm_before_gate=False)``, the checkpoint's semantics); older transformers slow paths normalize over
    the whole inner dim, which differs when ``n_groups > 1``. It is one `rms_norm_gated` call on the state
    update's (or scan's) output and the gate's columns of ``in_proj``'s output, computed in float32 and
    rounded once to the model dtype before ``out_proj``.
  - Split across tensor-parallel ranks (`infinilm.distributed.parallel`), a mixer holds its rank's heads: their
    rows of ``in_proj`` (gate, x, dt), conv channels, ``dt_bias``, ``A_log``, ``D``, norm weight and states, and
    the B/C rows of its group(s); ``out_proj`` is row parallel (one all-reduce). A norm group held whole by the
    rank is normed as above; a group spread over several ranks (``n_groups`` below the rank count) is normed
    from its squared sum over the whole group, one all-reduce of a ``[T, n_groups]`` float32 buffer in which
    each rank adds its part at its group's column, then ``y * rsqrt(sum / group_size + eps) * weight``: the
    formula of `rms_norm`, in float32, with the channels summed in another order.
  - ``time_step_limit`` also clamps dt in decode. transformers' and mamba_ssm's decode steps skip the clamp
    (so does `selective_state_update`, like mamba's); applying it keeps a token's output independent of
    whether it was prefilled or decoded. The two agree for the default ``(0, inf)`` (every published Mamba-2
    checkpoint: softplus steps are never negative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Protocol

import torch
import torch.nn.functional as F

from infinilm.config import Mamba2Dims, ModelConfig
from infinilm.distributed.parallel import Shard, TensorParallel
from infinilm.layers.derived import Derived
from infinilm.layers.linear import Linear, RowParallelLinear
from infiniops_py import (
    all_reduce,
    causal_conv1d,
    causal_conv1d_update,
    rms_norm_gated,
    selective_scan,
    selective_state_update,
)
from infiniops_py.operators.selective_scan import process_dt

__all__ = ["NO_TIME_STEP_LIMIT", "Mamba2Mixer", "SsmContext", "StateRows", "prefill_starts"]

NO_TIME_STEP_LIMIT: Final = (0.0, math.inf)  # the dt clamp that clamps no softplus step (the default limit)


class StateRows(Protocol):
    """Per-layer recurrent states (`infinilm.engine.state_pool.StatePool`): conv ``[layers, rows, conv_dim, W-1]``
    and SSM ``[layers, rows, H, P, N]``."""

    conv: torch.Tensor
    ssm: torch.Tensor


@dataclass
class SsmContext:
    """Where a step's tokens read and write recurrent state (built by the recurrent runner, passed down).

    The step holds ``num_decode`` decode tokens first (one per request, advancing rows ``decode_rows``), then
    the prompts, packed one after another. Several prompts run as one packed row cut by ``cu_seqlens``
    (the packed conv and scan: each prompt starts from zero states and leaves its own final states); a
    single prompt runs as a plain row, ``seq_idx`` marking the left padding of a prefill graph's bucket
    (-1: the conv outputs 0 there and the scan restarts where the prompt begins).

    Attributes:
        decode_rows: int64 ``[num_decode]`` pool rows (-1: a padding row, skipped by the operators).
        prefill_rows: int64 ``[P]`` pool rows receiving each prompt's final states, or None without prompts.
        cu_seqlens: int32 ``[P + 1]``: the prompts' token offsets (`prefill_starts`) when P > 1, else None.
        seq_idx: int32 ``[1, L]`` for a padded single prompt (a prefill graph), else None.
    """

    num_decode: int = 0
    decode_rows: torch.Tensor | None = None
    prefill_rows: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    seq_idx: torch.Tensor | None = None


def prefill_starts(lengths: list[int]) -> list[int]:
    """``cu_seqlens`` of `SsmContext` for prompts of `lengths` packed in order: 0, then each prompt's end."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return starts


class Mamba2Mixer:
    """The Mamba-2 mixer of one layer over a step's tokens: decode tokens first, then prefill prompts."""

    __slots__ = ("A_log", "D", "a", "conv_bias", "conv_weight", "dims", "dt_bias", "dtype", "eps", "full", "in_proj",
                 "norm", "norm_weight", "out_proj", "tp")

    def __init__(self, c: ModelConfig, *, fuse_bias: bool, dtype: torch.dtype, device: torch.device,
                 tp: TensorParallel | None = None) -> None:
        """Empty weights for `c` (a Mamba-2 config); `fuse_bias`: biases fused into the Gemm (the gates' choice);
        `tp`: the tensor-parallel rank whose heads the mixer holds (None: all of them).

        Attributes:
            dims: the numbers of the heads held (this rank's, `TensorParallel.ssm_dims`); full: the model's.

        Raises:
            ConfigError: `c` has no recurrent numbers.
        """
        self.full = c.ssm_dims()
        self.tp = tp
        s = self.dims = self.full if tp is None else tp.ssm_dims(self.full)
        new = {"dtype": dtype, "device": device}
        self.in_proj = Linear(c.hidden_size, s.proj_size, bias=s.use_bias, fuse_bias=fuse_bias, **new)
        self.conv_weight = torch.empty(s.conv_dim, s.conv_kernel, **new)
        self.conv_bias = torch.empty(s.conv_dim, **new) if s.use_conv_bias else None
        self.dt_bias = torch.empty(s.num_heads, **new)
        self.A_log = torch.empty(s.num_heads, **new)
        self.D = torch.empty(s.num_heads, **new)
        self.norm_weight = torch.empty(s.intermediate_size, **new)
        self.out_proj: Linear | RowParallelLinear
        if tp is None:
            self.out_proj = Linear(s.intermediate_size, c.hidden_size, bias=s.use_bias, fuse_bias=fuse_bias, **new)
        else:
            d_inner = self.full.intermediate_size
            self.out_proj = RowParallelLinear((*tp.split(d_inner), d_inner), c.hidden_size, bias=s.use_bias, **new)
        self.dtype, self.eps = dtype, c.rms_norm_eps
        self.a = Derived(self.A_log, lambda w: -torch.exp(w.float()))
        self.norm = Derived(self.norm_weight, lambda w: w.float())  # the weight of a norm spread over ranks

    def targets(self, prefix: str) -> dict[str, torch.Tensor | Shard]:
        """Checkpoint name -> the view (split across ranks: the `Shard`) each of the mixer's tensors loads into."""
        if self.tp is not None:
            return self._shards(prefix, self.tp)
        out: dict[str, torch.Tensor | Shard] = {
            f"{prefix}.conv1d.weight": self.conv_weight.unsqueeze(1), f"{prefix}.dt_bias": self.dt_bias,
            f"{prefix}.A_log": self.A_log, f"{prefix}.D": self.D, f"{prefix}.norm.weight": self.norm_weight}
        if self.conv_bias is not None:
            out[f"{prefix}.conv1d.bias"] = self.conv_bias
        out.update(self.in_proj.targets(f"{prefix}.in_proj"))
        out.update(self.out_proj.targets(f"{prefix}.out_proj"))
        return out

    def _shards(self, prefix: str, tp: TensorParallel) -> dict[str, torch.Tensor | Shard]:
        """The `Shard`s of rank `tp`: its heads' channels of every per-channel tensor, its group(s)' B/C rows.

        The checkpoint packs ``in_proj`` rows as ``[gate (d_inner) | x (d_inner) | B (G*N) | C (G*N) | dt (H)]``
        and the conv channels as ``[x | B | C]``; the rank's rows of each part, in that order, are its own
        layout (`Mamba2Dims` of its heads)."""
        f = self.full
        di, gn = f.intermediate_size, f.n_groups * f.state_size
        h0, h1 = tp.split(f.num_heads)
        c0, c1 = h0 * f.head_dim, h1 * f.head_dim
        g0, g1 = (g * f.state_size for g in tp.shared(f.n_groups))
        conv = ((c0, c1), (di + g0, di + g1), (di + gn + g0, di + gn + g1))
        proj = ((c0, c1), *((di + lo, di + hi) for lo, hi in conv), (2 * di + 2 * gn + h0, 2 * di + 2 * gn + h1))
        heads, channels = ((h0, h1),), ((c0, c1),)
        hidden, width = self.in_proj.weight.shape[1], f.conv_kernel
        out: dict[str, torch.Tensor | Shard] = {
            f"{prefix}.conv1d.weight": Shard(self.conv_weight.unsqueeze(1), (f.conv_dim, 1, width), 0, conv),
            f"{prefix}.dt_bias": Shard(self.dt_bias, (f.num_heads,), 0, heads),
            f"{prefix}.A_log": Shard(self.A_log, (f.num_heads,), 0, heads),
            f"{prefix}.D": Shard(self.D, (f.num_heads,), 0, heads),
            f"{prefix}.norm.weight": Shard(self.norm_weight, (di,), 0, channels),
            f"{prefix}.in_proj.weight": Shard(self.in_proj.weight, (f.proj_size, hidden), 0, proj),
        }
        if self.conv_bias is not None:
            out[f"{prefix}.conv1d.bias"] = Shard(self.conv_bias, (f.conv_dim,), 0, conv)
        if self.in_proj.bias is not None:
            out[f"{prefix}.in_proj.bias"] = Shard(self.in_proj.bias, (f.proj_size,), 0, proj)
        out.update(self.out_proj.targets(f"{prefix}.out_proj"))
        return out

    def __call__(self, h: torch.Tensor, conv_states: torch.Tensor, ssm_states: torch.Tensor,
                 ctx: SsmContext) -> torch.Tensor:
        """h ``[T, hidden]`` -> ``[T, hidden]``; conv ``[rows, conv_dim, W-1]`` and SSM ``[rows, H, P, N]`` states."""
        return self.out_proj(self.mix(h, conv_states, ssm_states, ctx))

    def mix(self, h: torch.Tensor, conv_states: torch.Tensor, ssm_states: torch.Tensor,
            ctx: SsmContext) -> torch.Tensor:
        """The mixer without ``out_proj``: the gated norm's output ``[T, intermediate]`` (the states as `__call__`)."""
        return self.mix_projected(self.in_proj(h), conv_states, ssm_states, ctx)

    def mix_projected(self, zx: torch.Tensor, conv_states: torch.Tensor, ssm_states: torch.Tensor,
                      ctx: SsmContext) -> torch.Tensor:
        """`mix` from ``in_proj``'s output `zx` ``[T, proj_size]`` (computed by the caller: `rms_norm_gemm` of the
        residual stream, with the block's norm in its prologue)."""
        nd = ctx.num_decode
        parts = []
        if nd:
            parts.append(self._decode(zx[:nd], conv_states, ssm_states, ctx))
        if ctx.prefill_rows is not None:
            parts.append(self._prefill(zx[nd:], conv_states, ssm_states, ctx))
        y = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self._gated_norm(y, zx[:, : self.dims.intermediate_size])

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
        else:  # the operator takes no limit (mamba's): pass dt already processed with it
            dt = process_dt(dt, self.dt_bias, True, s.time_step_limit, torch.float32)
            y = selective_state_update(ssm_states, x, dt, self.a.get(), b, c, D=self.D,
                                       state_batch_indices=ctx.decode_rows)
        return y.flatten(1)

    def _prefill(self, zx: torch.Tensor, conv_states: torch.Tensor, ssm_states: torch.Tensor,
                 ctx: SsmContext) -> torch.Tensor:
        """The step's prompts as one row (packed by ``ctx.cu_seqlens`` when several, see `SsmContext`); each
        prompt's final states go to its pool row."""
        s = self.dims
        tail = zx[:, s.intermediate_size:].unsqueeze(0)  # [1, Tp, conv_dim + H]: xBC and dt
        scan = {"D": self.D, "dt_bias": self.dt_bias, "dt_softplus": True, "dt_limit": s.time_step_limit}
        if ctx.cu_seqlens is None:
            conv, conv_final = causal_conv1d(tail[..., : s.conv_dim].transpose(1, 2), self.conv_weight,
                                             self.conv_bias, activation="silu", seq_idx=ctx.seq_idx,
                                             return_final_states=True)
            x, b, c = self._split(conv.transpose(1, 2))
            y, ssm_final = selective_scan(x, tail[..., s.conv_dim:], self.a.get(), b, c, s.chunk_size, **scan,
                                          seq_idx=ctx.seq_idx, return_final_states=True)
            conv_states.index_copy_(0, ctx.prefill_rows, conv_final)
        else:  # the conv writes each prompt's state into its row; the scan returns each prompt's final state
            conv = causal_conv1d(tail[0, :, : s.conv_dim].t(), self.conv_weight, self.conv_bias, activation="silu",
                                 conv_states=conv_states, query_start_loc=ctx.cu_seqlens,
                                 cache_indices=ctx.prefill_rows)
            x, b, c = self._split(conv.t().unsqueeze(0))
            y, ssm_final = selective_scan(x, tail[..., s.conv_dim:], self.a.get(), b, c, s.chunk_size, **scan,
                                          cu_seqlens=ctx.cu_seqlens, return_varlen_states=True)
        ssm_states.index_copy_(0, ctx.prefill_rows, ssm_final)
        return y.view(-1, s.intermediate_size)

    def _gated_norm(self, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """``rms_norm(y * silu(gate))`` per group of ``d_inner / G`` channels, in float32, in the model dtype."""
        if self.tp is not None and self.full.n_groups < self.tp.size:  # the group spans ranks
            return self._spread_norm(F.silu(gate.float()).mul_(y), self.tp, self.full)
        return rms_norm_gated(y, self.norm_weight, None, z=gate, eps=self.eps, group_size=self.dims.group_size,
                              norm_before_gate=False)

    def _spread_norm(self, g: torch.Tensor, tp: TensorParallel, full: Mamba2Dims) -> torch.Tensor:
        """The gated norm of this rank's channels `g` ``[T, d_inner / size]`` (float32) of a group spread over
        ``size / G`` ranks: its squared sum over the whole group from one all-reduce (see the module docstring)."""
        group = tp.shared(full.n_groups)[0]
        sums = g.new_zeros(g.shape[0], full.n_groups)
        sums[:, group] = g.square().sum(-1)
        rstd = torch.rsqrt(all_reduce(sums)[:, group:group + 1] / full.group_size + self.eps)
        return (g.mul_(rstd) * self.norm.get()).to(self.dtype)
