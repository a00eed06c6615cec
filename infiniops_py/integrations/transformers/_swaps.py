"""The module swaps of `kernelize`: a module's forward replaced (and put back), the RMSNorm forward over
`rms_norm` (the models' norms and Qwen3's q/k norms), and the decoder layer forward over `fused_add_rms_norm`."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import torch

from infiniops_py import ContractError, fused_add_rms_norm, rms_norm
from infiniops_py.integrations.transformers._report import Kernelized

__all__ = ["fused_layer_forward", "rms_norm_forward", "swap_forward"]


def swap_forward(report: Kernelized, module: torch.nn.Module, forward: Callable[..., Any]) -> None:
    """Make `forward` the forward of this `module` instance (not of its class), and add to `report` the undo
    that puts back what the instance had."""
    had = module.__dict__.get("forward")
    module.forward = types.MethodType(forward, module)

    def undo() -> None:
        if had is None:
            del module.forward
        else:
            module.forward = had

    report._undo.append(undo)


def rms_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``LlamaRMSNorm.forward`` through `rms_norm`. An input wider than the weight (Mamba-2's float32
    residual stream into a bfloat16 ``norm_f``) gets the weight widened, which is exactly transformers'
    promoting product."""
    weight = self.weight
    if hidden_states.dtype != weight.dtype:
        if torch.promote_types(hidden_states.dtype, weight.dtype) != hidden_states.dtype:
            raise ContractError("rms_norm", "weight",
                                f"{weight.dtype} is wider than the input's {hidden_states.dtype}: kernelize's "
                                "RMSNorm takes inputs at least as wide as the weight")
        weight = weight.to(hidden_states.dtype)
    return rms_norm(hidden_states, weight, self.variance_epsilon)


_SIGNATURES: dict[type, inspect.Signature] = {}


def fused_layer_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The pre-norm decoder layer with ``residual + attention`` and ``post_attention_layernorm`` in one
    `fused_add_rms_norm`; the attention gets exactly the arguments transformers' forward passes it (every
    named parameter, defaults included, then the extra keywords)."""
    cls = type(self)
    signature = _SIGNATURES.get(cls)
    if signature is None:
        signature = _SIGNATURES[cls] = inspect.signature(cls.forward)
    bound = signature.bind(self, *args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    extra: dict[str, Any] = {}
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            extra = named.pop(p.name, {})
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            named.pop(p.name, None)
    named.pop(next(iter(signature.parameters)))  # self
    hidden_states = named.pop("hidden_states")
    residual = hidden_states.clone(memory_format=torch.contiguous_format)  # the caller may still hold the input
    x = self.input_layernorm(hidden_states)
    x, _ = self.self_attn(hidden_states=x, **named, **extra)
    norm = self.post_attention_layernorm
    fused_add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)  # residual += x; x = norm(residual)
    return residual.add_(self.mlp(x))
