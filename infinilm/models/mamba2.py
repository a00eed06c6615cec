"""Mamba-2 (Hugging Face ``Mamba2ForCausalLM``) through `infiniops_py`, with recurrent decode.

Each layer (transformers' ``Mamba2Block``, mamba_ssm's ``Mamba2``): ``h = rms_norm(residual)``; ``in_proj``
gives ``[gate | xBC | dt]``; ``xBC`` goes through `causal_conv1d` with SiLU and splits into ``x`` ``[H, P]``,
``B`` and ``C`` ``[G, N]``; `selective_scan` (prefill) or `selective_state_update` (decode) gives ``y`` with
``dt_bias``, softplus, ``dt_limit = time_step_limit`` and ``D``; the gated RmsNorm ``norm(y * silu(gate))``
per group of ``d_inner / n_groups`` channels; ``out_proj``; the residual add. Prefill leaves each request's
conv and SSM states in its `StatePool` row; decode advances them in place with `causal_conv1d_update` and
`selective_state_update`. Gemm, RmsNorm, Add, the convolutions and the scans run through `infiniops_py`;
the embedding lookup, SiLU-and-multiply of the gate and dtype casts are plain PyTorch.

Numerics follow transformers: with ``residual_in_fp32`` the residual stream is float32 (each block norm
reads it cast to the model dtype, the final norm reads it in float32); the gated norm runs in float32 and
is cast to the model dtype before ``out_proj``; SSM states are float32, conv states in the model dtype.

Decisions:
  - The gated norm is per group (mamba_ssm's ``RMSNormGated(group_size=d_inner // n_groups,
    norm_before_gate=False)``, the checkpoint's semantics); older transformers slow paths normalize over
    the whole inner dim, which differs when ``n_groups > 1``. It runs as `rms_norm` over a ``[T, G, d_inner/G]``
    view, so the gates check ``hidden_size = d_inner / n_groups``.
  - ``time_step_limit`` also clamps dt in decode. transformers' and mamba_ssm's decode steps skip the clamp;
    applying it keeps a token's output independent of whether it was prefilled or decoded. The two agree
    for the default ``(0, inf)`` (every published Mamba-2 checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from typing import TYPE_CHECKING, Any, Final

import torch
import torch.nn.functional as F

from infinilm.config import ConfigError, ModelConfig, parse_dtype
from infinilm.config_checks import (
    BOOLS,
    CHOICES,
    POSITIVE_FLOATS,
    POSITIVE_INTS,
    RANGES,
    field_problems,
    raise_problems,
    resolved_problems,
)
from infinilm.layers.embedding import Embedding, LMHead
from infinilm.layers.linear import Linear
from infinilm.layers.norm import RMSNorm
from infiniops_py import add, causal_conv1d, causal_conv1d_update, rms_norm, selective_scan, selective_state_update
from infiniops_py.operators.selective_scan import process_dt

if TYPE_CHECKING:
    from infinilm.engine.gates import GatePlan
    from infinilm.engine.state_pool import SsmContext, StatePool

__all__ = ["NO_POSITION_LIMIT", "Mamba2Dims", "Mamba2Mixer", "Mamba2Model", "gate_problems", "mamba2_config"]

NO_POSITION_LIMIT: Final = 2**31 - 1  # a recurrent model has no position table; the engine caps the length
_NO_LIMIT: Final = (0.0, math.inf)


@dataclass(frozen=True)
class Mamba2Dims:
    """The Mamba-2 numbers of a config (`ModelConfig.ssm`).

    Attributes:
        num_heads / head_dim / state_size / n_groups: H, P, N and G of the scans (H % G == 0).
        conv_kernel: W, the causal conv width; the conv state keeps W - 1 columns.
        intermediate_size: d_inner = H * P = expand * hidden_size.
        time_step_limit: ``(low, high)`` clamp of the processed dt.
    """

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    intermediate_size: int
    use_bias: bool
    use_conv_bias: bool
    residual_in_fp32: bool
    time_step_limit: tuple[float, float]

    @property
    def conv_dim(self) -> int:
        """Channels of the causal conv: x, B and C, ``d_inner + 2 * G * N``."""
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def group_size(self) -> int:
        """Channels per group of the gated norm, ``d_inner / G``."""
        return self.intermediate_size // self.n_groups

    @property
    def proj_size(self) -> int:
        """Output width of ``in_proj``: gate, xBC and dt."""
        return self.intermediate_size + self.conv_dim + self.num_heads


def mamba2_config(hf: Any) -> ModelConfig:
    """A `ModelConfig` (with `ssm` set) from transformers' ``Mamba2Config``; the attention fields are neutral.

    Raises:
        ConfigError: non-positive sizes or epsilon, a ``conv_kernel`` outside the widths of the causal conv
            (2 to 16), an activation other than SiLU, a flag that is not a boolean, an EOS id outside the
            vocabulary (all listed in one error), ``num_heads * head_dim != expand * hidden_size``, an
            ``n_groups`` that does not divide ``num_heads``, or a ``time_step_limit`` that is not a
            ``(low, high)`` pair of numbers with ``0 <= low <= high`` and low finite.
    """
    keys = (*POSITIVE_INTS["mamba2"], *POSITIVE_FLOATS["mamba2"], *RANGES["mamba2"], *CHOICES["mamba2"],
            *BOOLS["mamba2"], "eos_token_id")
    values = {k: getattr(hf, k, None) for k in keys}
    raise_problems("mamba2", field_problems("mamba2", values) + resolved_problems("mamba2", values))
    heads, head_dim, groups = int(hf.num_heads), int(hf.head_dim), int(hf.n_groups)
    d_inner = int(hf.expand * hf.hidden_size)
    if heads * head_dim != d_inner:
        raise ConfigError(f"mamba2: num_heads * head_dim = {heads * head_dim} must equal expand * hidden_size = "
                          f"{d_inner}")
    if groups < 1 or heads % groups:
        raise ConfigError(f"mamba2: n_groups={groups} must divide num_heads={heads}")
    limit = _time_step_limit(hf.time_step_limit)
    dims = Mamba2Dims(
        num_heads=heads, head_dim=head_dim, state_size=int(hf.state_size), n_groups=groups,
        conv_kernel=int(hf.conv_kernel), chunk_size=int(hf.chunk_size), intermediate_size=d_inner,
        use_bias=bool(hf.use_bias), use_conv_bias=bool(hf.use_conv_bias),
        residual_in_fp32=bool(hf.residual_in_fp32), time_step_limit=(limit[0], limit[1]),
    )
    dtype = getattr(hf, "dtype", None) or getattr(hf, "torch_dtype", None)
    eos = hf.eos_token_id
    return ModelConfig(
        model_type="mamba2", vocab_size=int(hf.vocab_size), hidden_size=int(hf.hidden_size),
        intermediate_size=d_inner, num_layers=int(hf.num_hidden_layers), num_heads=heads, num_kv_heads=heads,
        head_dim=head_dim, rms_norm_eps=float(hf.layer_norm_epsilon), rope_type="none", rope_theta=0.0,
        max_position_embeddings=NO_POSITION_LIMIT, tie_word_embeddings=bool(hf.tie_word_embeddings),
        qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False,
        dtype=parse_dtype(dtype) if dtype is not None else torch.float32,
        eos_token_ids=() if eos is None else ((int(eos),) if isinstance(eos, int) else tuple(int(e) for e in eos)),
        hf_config=hf, ssm=dims,
    )


def _time_step_limit(value: object) -> tuple[float, float]:
    """``time_step_limit`` as ``(low, high)`` floats: two real numbers, ``0 <= low <= high``, low finite.

    Raises:
        ConfigError: anything else, naming the field and the value.
    """
    pair = list(value) if isinstance(value, list | tuple) else None
    if (pair is None or len(pair) != 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in pair)
            or not (math.isfinite(pair[0]) and 0 <= pair[0] <= pair[1])):
        raise ConfigError(f"mamba2: time_step_limit={value!r} must be a (low, high) pair of numbers with "
                          "0 <= low <= high and low finite (high may be inf; the default is (0.0, inf))")
    return float(pair[0]), float(pair[1])


def gate_problems(c: ModelConfig, base: dict[str, Any], fused_bias: bool) -> list[tuple[str, dict[str, Any]]]:
    """Every ``(operator, problem fields)`` a Mamba-2 model calls, for `infinilm.engine.gates.plan`.

    `base` holds ``device_type`` and the model ``dtype`` name. Prefill calls the conv and the scan with and
    without ``seq_idx`` (several prompts or one) and the conv channel-last or not (a one-token prompt).
    """
    s = _dims(c)
    rdt = "float32" if s.residual_in_fp32 else base["dtype"]
    gemm = {**base, "batched": False, "trans_a": False, "trans_b": True, "has_c": False}
    out: list[tuple[str, dict[str, Any]]] = [("gemm", {**gemm, "has_bias": False})]
    if s.use_bias:
        out.append(("gemm", {**gemm, "has_bias": True}) if fused_bias
                   else ("add", {**base, "broadcast": True, "inplace": True}))
    out += [
        ("rms_norm", {**base, "hidden_size": c.hidden_size}),
        ("rms_norm", {**base, "dtype": rdt, "hidden_size": c.hidden_size}),
        ("rms_norm", {**base, "dtype": "float32", "hidden_size": s.group_size}),
        ("add", {**base, "dtype": rdt, "broadcast": False, "inplace": True}),
    ]
    conv = {**base, "width": s.conv_kernel, "has_bias": s.use_conv_bias, "silu": True}
    for channel_last, packed in product((True, False), repeat=2):
        out.append(("causal_conv1d", {**conv, "channel_last": channel_last, "has_seq_idx": packed,
                                      "has_initial_states": False, "return_final_states": True}))
    out.append(("causal_conv1d_update", {**conv, "state_len": s.conv_kernel - 1, "has_indices": True}))
    scan = {**base, "head_dim": s.head_dim, "d_state": s.state_size, "n_groups": s.n_groups, "has_D": True,
            "has_z": False}
    for packed in (True, False):
        out.append(("selective_scan", {**scan, "chunk_size": s.chunk_size, "has_dt_bias": True, "dt_softplus": True,
                                       "has_seq_idx": packed, "has_initial_states": False,
                                       "return_final_states": True}))
    raw_dt = s.time_step_limit == _NO_LIMIT  # else decode passes dt already processed (Mamba2Mixer._decode)
    out.append(("selective_state_update", {**scan, "has_dt_bias": raw_dt, "dt_softplus": raw_dt,
                                           "has_indices": True}))
    return out


def _dims(c: ModelConfig) -> Mamba2Dims:
    if c.ssm is None:
        raise ConfigError(f"{c.model_type}: not a Mamba-2 config (ModelConfig.ssm is None)")
    return c.ssm


class _Derived:
    """A value computed from a loaded weight, recomputed only when the weight changes in place (a reload)."""

    __slots__ = ("fn", "source", "value", "version")

    def __init__(self, source: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.source, self.fn, self.value, self.version = source, fn, source, -1

    def get(self) -> torch.Tensor:
        if self.source._version != self.version:
            self.value, self.version = self.fn(self.source), self.source._version
        return self.value


class Mamba2Mixer:
    """The Mamba-2 mixer of one layer over a step's tokens: decode tokens first, then prefill prompts."""

    __slots__ = ("A_log", "D", "a", "conv_bias", "conv_weight", "dims", "dt_bias", "dtype", "eps", "in_proj", "norm",
                 "norm_weight", "ones", "out_proj")

    def __init__(self, c: ModelConfig, plan: GatePlan, dtype: torch.dtype, device: torch.device) -> None:
        s = self.dims = _dims(c)
        new = {"dtype": dtype, "device": device}
        self.in_proj = Linear(c.hidden_size, s.proj_size, bias=s.use_bias, fuse_bias=plan.fused_bias, **new)
        self.conv_weight = torch.empty(s.conv_dim, s.conv_kernel, **new)
        self.conv_bias = torch.empty(s.conv_dim, **new) if s.use_conv_bias else None
        self.dt_bias = torch.empty(s.num_heads, **new)
        self.A_log = torch.empty(s.num_heads, **new)
        self.D = torch.empty(s.num_heads, **new)
        self.norm_weight = torch.empty(s.intermediate_size, **new)
        self.out_proj = Linear(s.intermediate_size, c.hidden_size, bias=s.use_bias, fuse_bias=plan.fused_bias, **new)
        self.dtype, self.eps = dtype, c.rms_norm_eps
        self.a = _Derived(self.A_log, lambda w: -torch.exp(w.float()))
        self.norm = _Derived(self.norm_weight, lambda w: w.float())
        self.ones = torch.ones(s.group_size, dtype=torch.float32, device=device)  # the per-group norm's weight

    def targets(self, prefix: str) -> dict[str, torch.Tensor]:
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
        if s.time_step_limit == _NO_LIMIT:
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


class Mamba2Model:
    """A Mamba-2 causal LM: ``forward`` gives final hidden states ``[T, hidden]``, ``logits`` the LM head's."""

    def __init__(self, config: ModelConfig, plan: GatePlan, *, dtype: torch.dtype, device: torch.device) -> None:
        s = _dims(config)
        self.config, self.dtype = config, dtype
        self.residual_dtype = torch.float32 if s.residual_in_fp32 else dtype
        new = {"dtype": dtype, "device": device}
        self.embed = Embedding(config.vocab_size, config.hidden_size, **new)
        self.norms = [RMSNorm(config.hidden_size, config.rms_norm_eps, **new) for _ in range(config.num_layers)]
        self.mixers = [Mamba2Mixer(config, plan, dtype, device) for _ in range(config.num_layers)]
        self.norm_f = RMSNorm(config.hidden_size, config.rms_norm_eps, **new)
        self.final_weight = _Derived(self.norm_f.weight, lambda w: w.to(self.residual_dtype))
        head = self.embed.weight if config.tie_word_embeddings else torch.empty_like(self.embed.weight)
        self.lm_head = LMHead(head)

    def targets(self) -> dict[str, torch.Tensor]:
        """Every checkpoint tensor name the model loads -> the view it loads into."""
        out = {"backbone.embeddings.weight": self.embed.weight, "backbone.norm_f.weight": self.norm_f.weight}
        for i, (norm, mixer) in enumerate(zip(self.norms, self.mixers)):
            out[f"backbone.layers.{i}.norm.weight"] = norm.weight
            out.update(mixer.targets(f"backbone.layers.{i}.mixer"))
        if not self.config.tie_word_embeddings:
            out["lm_head.weight"] = self.lm_head.weight
        return out

    @staticmethod
    def ignored(name: str, tied: bool) -> bool:
        """A tied head's copy may be present and is not loaded."""
        return tied and name == "lm_head.weight"

    def forward(self, input_ids: torch.Tensor, ctx: SsmContext, pool: StatePool) -> torch.Tensor:
        """input_ids int64 ``[T]`` -> final hidden states ``[T, hidden]`` in the residual dtype.

        Reads and writes the pool rows named by `ctx` (decode rows advance one step; prefill rows are
        overwritten with the prompts' final states, never read).
        """
        rdt = self.residual_dtype
        residual = self.embed(input_ids).to(rdt)
        for i, (norm, mixer) in enumerate(zip(self.norms, self.mixers)):
            out = mixer(norm(residual.to(self.dtype)), pool.conv[i], pool.ssm[i], ctx)
            add(residual, out.to(rdt), out=residual)
        return rms_norm(residual, self.final_weight.get(), self.config.rms_norm_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[B, hidden]`` -> logits ``[B, V]`` in the model dtype."""
        return self.lm_head(hidden.to(self.dtype))
