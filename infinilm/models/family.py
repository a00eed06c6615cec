"""What a model family declares, and what the gates hand back to the model it builds.

A `ModelFamily` is data: its ``model_type``, the `ConfigLimits` of its ``config.json`` fields, the translation of
a transformers config into a `ModelConfig`, its model class, and whether it keeps recurrent state (a state pool
and the recurrent runner) instead of a paged KV cache. Its operator problems are not listed: the gates trace the
model's forward on meta tensors (`infinilm.engine.trace`). `infinilm.models.registry` lists the families; the
engine, the gates and the CLI ask it and hold no per-family code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Protocol

import torch

from infinilm.config import ModelConfig
from infinilm.config_checks import ConfigLimits
from infinilm.distributed.parallel import TensorParallel
from infiniops_py import Implementation, Problem

__all__ = ["GEMM_FIELDS", "CausalLM", "GatePlan", "ModelClass", "ModelFamily"]

# the problem fields every linear layer's Gemm shares: x [T, K] @ weight [N, K].T
GEMM_FIELDS: Final[Mapping[str, bool]] = MappingProxyType(
    {"batched": False, "trans_a": False, "trans_b": True, "has_c": False})


@dataclass(frozen=True)
class GatePlan:
    """What the gates decided: the path choices and the implementation of every problem.

    Attributes:
        fused_qk_norm: Qwen3 q/k norms through `fused_qk_norm` (else per-head `rms_norm`), when not
            `fused_qk_norm_rope`.
        fused_qk_norm_rope: Qwen3 q/k norms and RoPE in one `fused_qk_norm_rope` (else the norms, then
            `rotary_embedding`).
        fused_bias: linear biases fused into `gemm` (else `gemm` + `add`).
        fused_swiglu: a SwiGLU MLP's gate/up projection and activation in one `gemm_swiglu` (else `gemm`, then
            `silu_and_mul`).
        fused_add_norm: each projection into the residual stream (the o and down projections of a pre-norm
            decoder layer, Mamba-2's ``out_proj``) with the residual add and the norm that follows it in one
            `gemm_add_rms_norm` (else `gemm`, then `fused_add_rms_norm`); one process only (a row-parallel
            projection all-reduces between the two) and layers without a norm after each sub-block.
        prologue_norm: each RMSNorm of a pre-norm decoder layer (and the final norm) folded into the prologue of
            the projection that reads it, one `rms_norm_gemm` (the qkv projection; the gate/up projection with
            SwiGLU; the LM head), and the o and down projections adding into the residual stream as the Gemm's
            ``c`` (``beta=1``), instead of `gemm` then `fused_add_rms_norm`; one process only, layers without a
            norm after each sub-block; not with `fused_add_norm`.
        chosen: each problem the model needs -> the implementation that serves it.
        parallel: the tensor-parallel rank the model is built for (its shard of every weight), None for one
            process holding the whole model; set by the engine.
    """

    fused_qk_norm: bool = False
    fused_qk_norm_rope: bool = False
    fused_bias: bool = True
    fused_swiglu: bool = False
    fused_add_norm: bool = False
    prologue_norm: bool = False
    chosen: dict[Problem, Implementation] = field(default_factory=dict)
    parallel: TensorParallel | None = None

    def providers_by_op(self) -> dict[str, str]:
        """Operator -> the provider(s) serving its problems (``torch``, or ``torch+triton`` when split)."""
        names: dict[str, list[str]] = {}
        for problem, impl in self.chosen.items():
            seen = names.setdefault(problem.op, [])
            if impl.provider not in seen:
                seen.append(impl.provider)
        return {op: "+".join(p) for op, p in names.items()}

    def render(self) -> str:
        """The closure as a table: operator, problem fields, implementation."""
        lines = [f"{'operator':<26} {'implementation':<34} problem"]
        for problem, impl in self.chosen.items():
            fields = ", ".join(f"{k}={v}" for k, v in problem.fields.items())
            lines.append(f"{problem.op:<26} {impl.name:<34} {problem.dtype}, {problem.device_type}: {fields}")
        qk = ("fused_qk_norm_rope (with RoPE)" if self.fused_qk_norm_rope else
              "fused_qk_norm" if self.fused_qk_norm else "per-head rms_norm")
        lines.append(f"qk norm: {qk}; "
                     f"linear bias: {'fused into gemm' if self.fused_bias else 'gemm + add'}; "
                     f"SwiGLU MLP: {'gemm_swiglu' if self.fused_swiglu else 'gemm + silu_and_mul'}; "
                     f"residual add + norm: {self._add_norm_path()}")
        return "\n".join(lines)

    def _add_norm_path(self) -> str:
        if self.fused_add_norm:
            return "gemm_add_rms_norm"
        if self.prologue_norm:
            return "rms_norm_gemm (each norm in the next projection), gemm with c"
        return "gemm + fused_add_rms_norm"


class CausalLM(Protocol):
    """What the engine calls on a model of any family (the runners add the forward of their kind)."""

    def targets(self) -> dict[str, torch.Tensor]:
        """Every checkpoint tensor name the model loads -> the view it loads into."""
        ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[B, hidden]`` -> logits ``[B, V]``."""
        ...


class ModelClass(Protocol):
    """A family's model class: built with empty weights, and told which checkpoint tensors it skips."""

    def __call__(self, config: ModelConfig, plan: GatePlan, *, dtype: torch.dtype, device: torch.device,
                 max_len: int) -> CausalLM: ...

    def ignored(self, name: str, tied: bool) -> bool:
        """Whether checkpoint tensor `name` may be present and is not loaded (`tied`: the head is the embedding)."""
        ...


@dataclass(frozen=True)
class ModelFamily:
    """One model family: everything the engine, the gates and the CLI need to know about it.

    Attributes:
        model_type: the ``model_type`` of ``config.json`` it serves.
        limits: the limits of the ``config.json`` fields it reads, checked before transformers reads the file.
        translate: transformers config -> `ModelConfig` (checking the resolved values; raises `ConfigError`).
        model: the model class.
        recurrent: the model keeps per-request recurrent state (a state pool, the recurrent runner) instead
            of a paged KV cache.
    """

    model_type: str
    limits: ConfigLimits
    translate: Callable[[Any], ModelConfig]
    model: ModelClass
    recurrent: bool = False
