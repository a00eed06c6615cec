"""Mamba-2 (Hugging Face ``Mamba2ForCausalLM``) through `infiniops_py`, with recurrent decode: its family.

The model is an embedding, one block per layer (``h = rms_norm(residual)``, the `Mamba2Mixer` of
`infinilm.layers.ssm`, the residual add), a final norm and the LM head. Every step but the embedding lookup
runs through `infiniops_py`: the first block's norm is `rms_norm`, each residual add is fused with the next
norm (`fused_add_rms_norm`; the last one with the final norm), so a decode step makes six operator calls per
layer and no PyTorch glue; where the gate plan fuses them (``plan.fused_add_norm``, one process) ``out_proj``, the
residual add and the next norm are one `gemm_add_rms_norm`, five calls per layer; where it folds each norm into the
next projection's prologue instead (``plan.prologue_norm``, one process) the block's norm runs in ``in_proj``'s
`rms_norm_gemm` and ``out_proj`` adds into the residual stream as the Gemm's ``c`` (five calls per layer too, no
add + norm kernel; the final norm in the LM head's `rms_norm_gemm`). The residual stream is in the
model dtype, as vLLM's Mamba-2 keeps it
(``residual_in_fp32`` is accepted and not followed: transformers keeps that stream in float32, which differs
only in a bf16/fp16 model, by the rounding of each add); SSM states are float32, conv states in the model
dtype. The request's states live in the engine's state pool, one row per
running request, whatever its length. Split across tensor-parallel ranks (``plan.parallel``), the embedding and
the head are vocab-parallel, each mixer holds its rank's heads (`infinilm.layers.ssm`), the norms are whole.
"""

from __future__ import annotations

import math
from typing import Any, Final

import torch

from infinilm.config import ConfigError, Mamba2Dims, ModelConfig, parse_dtype, token_ids
from infinilm.config_checks import ConfigLimits, field_problems, raise_problems, resolved_problems
from infinilm.distributed.parallel import Shard
from infinilm.layers.embedding import Embedding, LMHead, ParallelLMHead, VocabParallelEmbedding
from infinilm.layers.norm import RMSNorm
from infinilm.layers.ssm import Mamba2Mixer, SsmContext, StateRows
from infinilm.models.decoder_config import MAX_LAYERS
from infinilm.models.family import GatePlan, ModelFamily
from infiniops_py import gemm, rms_norm_gemm
from infiniops_py.operators.causal_conv1d import MAX_WIDTH, MIN_WIDTH

__all__ = ["MAMBA2", "NO_POSITION_LIMIT", "Mamba2Model", "mamba2_config"]

NO_POSITION_LIMIT: Final = 2**31 - 1  # a recurrent model has no position table; the engine caps the length
_LIMITS: Final = ConfigLimits(
    positive_ints=("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim", "state_size",
                   "n_groups", "conv_kernel", "chunk_size", "expand"),
    positive_floats=("layer_norm_epsilon",),
    # n_groups | num_heads: `mamba2_config` checks it, with the fix
    ranges=(("conv_kernel", MIN_WIDTH, MAX_WIDTH, "the widths of the causal_conv1d contract"),
            ("num_hidden_layers", 1, MAX_LAYERS, "released models have at most a few hundred layers")),
    choices=(("hidden_act", ("silu",)),),  # the gate's activation, written in the mixer
    bools=("tie_word_embeddings", "use_bias", "use_conv_bias", "residual_in_fp32"),
)


def mamba2_config(hf: Any) -> ModelConfig:
    """A `ModelConfig` (with `ssm` set) from transformers' ``Mamba2Config``; the attention fields are neutral.

    Raises:
        ConfigError: non-positive sizes or epsilon, a ``conv_kernel`` outside the widths of the causal conv
            (2 to 16), an activation other than SiLU, a flag that is not a boolean, an EOS id outside the
            vocabulary (all listed in one error), ``num_heads * head_dim != expand * hidden_size``, an
            ``n_groups`` that does not divide ``num_heads``, or a ``time_step_limit`` that is not a
            ``(low, high)`` pair of numbers with ``0 <= low <= high`` and low finite.
    """
    values = {k: getattr(hf, k, None) for k in (*_LIMITS.keys, "eos_token_id")}
    raise_problems("mamba2", field_problems(_LIMITS, values) + resolved_problems(_LIMITS, values))
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
    return ModelConfig(
        model_type="mamba2", vocab_size=int(hf.vocab_size), hidden_size=int(hf.hidden_size),
        intermediate_size=d_inner, num_layers=int(hf.num_hidden_layers), num_heads=heads, num_kv_heads=heads,
        head_dim=head_dim, rms_norm_eps=float(hf.layer_norm_epsilon), rope_type="none", rope_theta=0.0,
        max_position_embeddings=NO_POSITION_LIMIT, tie_word_embeddings=bool(hf.tie_word_embeddings),
        qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False,
        dtype=parse_dtype(dtype) if dtype is not None else torch.float32,
        eos_token_ids=token_ids(hf.eos_token_id),
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


class Mamba2Model:
    """A Mamba-2 causal LM: ``forward`` gives final hidden states ``[T, hidden]``, ``logits`` the LM head's."""

    def __init__(self, config: ModelConfig, plan: GatePlan, *, dtype: torch.dtype, device: torch.device,
                 max_len: int = NO_POSITION_LIMIT) -> None:
        """Empty weights for `config`; `max_len` is not used (a recurrent model keeps no position table).

        Raises:
            ConfigError: `config` is not a Mamba-2 config.
        """
        config.ssm_dims()  # raises for a config that is not Mamba-2's
        self.config, self.dtype = config, dtype
        new = {"dtype": dtype, "device": device}
        tp = plan.parallel
        self.embed: Embedding | VocabParallelEmbedding
        self.lm_head: LMHead | ParallelLMHead
        if tp is None:
            self.embed = Embedding(config.vocab_size, config.hidden_size, **new)
        else:
            self.embed = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp, **new)
        self.norms = [RMSNorm(config.hidden_size, config.rms_norm_eps, **new) for _ in range(config.num_layers)]
        self.mixers = [Mamba2Mixer(config, fuse_bias=plan.fused_bias, tp=tp, **new) for _ in range(config.num_layers)]
        self.norm_f = RMSNorm(config.hidden_size, config.rms_norm_eps, **new)
        self.fused_add_norm = plan.fused_add_norm and tp is None  # out_proj, the add and the next norm in one
        # each norm in in_proj's (the final one in the LM head's) rms_norm_gemm, out_proj adding the residual as c
        self.prologue_norm = plan.prologue_norm and tp is None
        if tp is None:
            head = self.embed.weight if config.tie_word_embeddings else torch.empty_like(self.embed.weight)
            self.lm_head = LMHead(head)
        else:  # zero padding rows, as the embedding's
            head = self.embed.weight if config.tie_word_embeddings else torch.zeros_like(self.embed.weight)
            self.lm_head = ParallelLMHead(head, config.vocab_size, tp)

    def targets(self) -> dict[str, torch.Tensor | Shard]:
        """Every checkpoint tensor name the model loads -> the view (or this rank's `Shard`) it loads into."""
        out: dict[str, torch.Tensor | Shard] = {"backbone.embeddings.weight": self.embed.target(),
                                                "backbone.norm_f.weight": self.norm_f.weight}
        for i, (norm, mixer) in enumerate(zip(self.norms, self.mixers)):
            out[f"backbone.layers.{i}.norm.weight"] = norm.weight
            out.update(mixer.targets(f"backbone.layers.{i}.mixer"))
        if not self.config.tie_word_embeddings:
            out["lm_head.weight"] = self.lm_head.target()
        return out

    @staticmethod
    def ignored(name: str, tied: bool) -> bool:
        """A tied head's copy may be present and is not loaded."""
        return tied and name == "lm_head.weight"

    def forward(self, input_ids: torch.Tensor, ctx: SsmContext, pool: StateRows) -> torch.Tensor:
        """input_ids int64 ``[T]`` -> final hidden states ``[T, hidden]`` in the model dtype.

        Reads and writes the pool rows named by `ctx` (decode rows advance one step; prefill rows are
        overwritten with the prompts' final states, never read).
        """
        residual = self.embed(input_ids)
        if self.prologue_norm:  # the residual stream out: `logits` runs the final norm in the head's prologue
            return self._forward_prologue(residual, ctx, pool)
        h = self.norms[0](residual)
        for i, mixer in enumerate(self.mixers):
            following = self.norms[i + 1] if i + 1 < len(self.norms) else self.norm_f
            if self.fused_add_norm:  # residual += out_proj(mixed); h = the next norm of it
                h, residual = following.project_add_norm(mixer.out_proj, mixer.mix(h, pool.conv[i], pool.ssm[i], ctx),
                                                         residual)
                continue
            out = mixer(h, pool.conv[i], pool.ssm[i], ctx)
            h, residual = following.add_norm(out, residual)  # residual += out; h = the next norm of it
        return h

    def _forward_prologue(self, stream: torch.Tensor, ctx: SsmContext, pool: StateRows) -> torch.Tensor:
        """`forward` with each block's norm in ``in_proj``'s `rms_norm_gemm` and ``out_proj`` adding into the
        residual stream as the Gemm's ``c``: returns the stream (not normed)."""
        for i, (norm, mixer) in enumerate(zip(self.norms, self.mixers)):
            in_proj, out_proj = mixer.in_proj, mixer.out_proj
            zx = rms_norm_gemm(stream, norm.weight, in_proj.weight, norm.eps, bias=in_proj.bias)
            mixed = mixer.mix_projected(zx, pool.conv[i], pool.ssm[i], ctx)
            stream = gemm(mixed, out_proj.weight, c=stream, bias=out_proj.bias, beta=1.0, trans_b=True)
        return stream

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[B, hidden]`` -> logits ``[B, V]`` in the model dtype (with `prologue_norm`, `hidden` is the
        residual stream and the final norm runs in the head's `rms_norm_gemm`)."""
        if self.prologue_norm:
            return rms_norm_gemm(hidden, self.norm_f.weight, self.lm_head.weight, self.norm_f.eps)
        return self.lm_head(hidden)


MAMBA2: Final = ModelFamily("mamba2", _LIMITS, mamba2_config, Mamba2Model, recurrent=True)
