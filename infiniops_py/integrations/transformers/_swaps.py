"""The module swaps of `kernelize`: a module's forward replaced (and put back), the RMSNorm forward over
`rms_norm` (the models' norms and Qwen3's q/k norms), the decoder layer forward over `fused_add_rms_norm`, and
the gated MLP over one packed gate|up projection and `silu_and_mul` (`pack_gate_up`, `gated_mlp_forward`)."""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from infiniops_py import ContractError, fused_add_rms_norm, rms_norm, silu_and_mul
from infiniops_py.integrations.transformers._report import Kernelized

__all__ = ["fused_layer_forward", "gated_mlp_forward", "pack_gate_up", "rms_norm_forward", "swap_forward"]


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


def _gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """The ``[2n, ...]`` tensor whose first half is `gate` ``[n, ...]`` and second half `up` (the same storage,
    both contiguous, `up` right after `gate`), or None when they are not laid out so."""
    if (gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device or gate.numel() == 0
            or not gate.is_contiguous() or not up.is_contiguous()
            or up.storage_offset() != gate.storage_offset() + gate.numel()
            or gate.untyped_storage().data_ptr() != up.untyped_storage().data_ptr()):
        return None
    shape = (2 * gate.shape[0], *gate.shape[1:])
    return gate.as_strided(shape, tuple(math.prod(shape[i + 1:]) for i in range(len(shape))))


def pack_gate_up(mlp: torch.nn.Module) -> None:
    """Lay ``mlp.gate_proj.weight`` ``[I, H]`` and ``mlp.up_proj.weight`` out as the two halves of one
    ``[2I, H]`` tensor (vLLM's ``gate_up_proj``), and their biases as the halves of one ``[2I]`` where they
    have biases. The parameters stay the same objects with the same values (their ``.data`` becomes a view
    of the packed tensor, allocated once: the old storages are freed when nothing else holds them); a pair
    already packed so is left as it is. The packing outlives `Kernelized.restore` (it changes no value)."""
    with torch.inference_mode(False), torch.no_grad():  # ordinary tensors, even if called in inference mode
        for attr in ("weight", "bias"):
            gate, up = getattr(mlp.gate_proj, attr), getattr(mlp.up_proj, attr)
            if gate is None or _gate_up(gate, up) is not None:
                continue
            n = gate.shape[0]
            packed = torch.empty((2 * n, *gate.shape[1:]), dtype=gate.dtype, device=gate.device)
            packed[:n].copy_(gate)
            packed[n:].copy_(up)
            gate.data, up.data = packed[:n], packed[n:]


def gated_mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``LlamaMLP.forward``, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU, as vLLM computes it:
    one ``[..., 2I]`` gate|up projection over the weights `pack_gate_up` packed, `silu_and_mul`, then
    ``down_proj``. Weights no longer packed (a ``model.to(...)`` or a parameter replaced since) still give the
    same result, through the two projections concatenated."""
    gate, up = self.gate_proj, self.up_proj
    weight = _gate_up(gate.weight, up.weight)
    bias = None if gate.bias is None else _gate_up(gate.bias, up.bias)
    if weight is None or (bias is None) != (gate.bias is None):
        h = torch.cat((gate(x), up(x)), dim=-1)
    else:
        h = F.linear(x, weight, bias)
    return self.down_proj(silu_and_mul(h))
