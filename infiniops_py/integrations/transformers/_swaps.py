"""The module swaps of `kernelize`: a module's forward replaced (and put back), the RMSNorm forwards over
`rms_norm` (Llama's, Qwen3's q/k norms, Gemma's ``1 + weight``), the decoder layer forwards over
`fused_add_rms_norm` (the pre-norm layer, GLM-4's), and the gated MLPs over one gate|up projection and
`silu_and_mul` (`pack_gate_up`, `gated_mlp_forward`; GLM-4's own packed one)."""

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

__all__ = ["fused_layer_forward", "gated_mlp_forward", "gemma_rms_norm_forward", "pack_gate_up", "pack_rows",
           "packed_mlp_forward", "packed_rows", "rms_norm_forward", "sandwich_layer_forward", "swap_forward"]


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


def gemma_rms_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm (``Gemma2RMSNorm.forward``: normalized and multiplied by ``1 + weight`` in float32, then
    cast once) through `rms_norm` in float32 with the float32 weight ``1 + weight`` (made once per weight
    value)."""
    weight = _plus_one(self)
    if hidden_states.dtype == torch.float32:
        return rms_norm(hidden_states, weight, self.eps)
    return rms_norm(hidden_states.float(), weight, self.eps).to(hidden_states.dtype)


def _plus_one(norm: torch.nn.Module) -> torch.Tensor:
    """``1 + norm.weight`` in float32, held on the module while the weight is the same tensor at the same
    version (made again after an in-place update or a replaced parameter; a weight that is an inference tensor
    has no version: an in-place update of it inside inference mode is not seen)."""
    weight = norm.weight
    if torch.compiler.is_compiling():
        return 1.0 + weight.float()
    held = norm.__dict__.get("_infiniops_plus_one")
    version = -1 if weight.is_inference() else weight._version  # inference tensors count no versions
    if held is None or held[0] is not weight or held[1] != version:
        with torch.no_grad():
            held = (weight, version, 1.0 + weight.float())
        norm.__dict__["_infiniops_plus_one"] = held
    return held[2]  # type: ignore[no-any-return]


_DEFAULTS: dict[type, tuple[inspect.Signature, dict[str, Any]]] = {}


def _layer_arguments(self: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
                     ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The decoder layer's ``hidden_states`` and the keywords transformers' forward hands its attention: every
    named parameter (defaults included), then the extra keywords. transformers passes everything after
    ``hidden_states`` by keyword: then this is one dict merge; positional arguments are bound to the
    signature."""
    cls = type(self)
    found = _DEFAULTS.get(cls)
    if found is None:
        signature = inspect.signature(cls.forward)
        named = [p for p in signature.parameters.values()
                 if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)][1:]
        found = _DEFAULTS[cls] = (signature, {p.name: p.default for p in named if p.name != "hidden_states"
                                              and p.default is not inspect.Parameter.empty})
    signature, defaults = found
    if len(args) == 1 and "hidden_states" not in kwargs:
        return args[0], {**defaults, **kwargs}
    bound = signature.bind(self, *args, **kwargs)
    arguments = dict(bound.arguments)
    extra: dict[str, Any] = {}
    for p in signature.parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            extra = arguments.pop(p.name, {})
        elif p.kind is inspect.Parameter.VAR_POSITIONAL:
            arguments.pop(p.name, None)
    arguments.pop(next(iter(signature.parameters)))  # self
    hidden_states = arguments.pop("hidden_states")
    return hidden_states, {**defaults, **arguments, **extra}


def fused_layer_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The pre-norm decoder layer with ``residual + attention`` and ``post_attention_layernorm`` in one
    `fused_add_rms_norm`; the attention gets exactly the arguments transformers' forward passes it. The input
    is copied once (the caller may still hold it); the MLP's residual add runs in place on that copy."""
    hidden_states, named = _layer_arguments(self, args, kwargs)
    residual = hidden_states.clone(memory_format=torch.contiguous_format)
    x, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **named)
    norm = self.post_attention_layernorm
    fused_add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)  # residual += x; x = norm(residual)
    return residual.add_(self.mlp(x))


def sandwich_layer_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
    """GLM-4's decoder layer (``post_self_attn_layernorm`` after the attention, ``post_mlp_layernorm`` after the
    MLP) with the attention's residual add and ``post_attention_layernorm`` in one `fused_add_rms_norm`."""
    hidden_states, named = _layer_arguments(self, args, kwargs)
    residual = hidden_states.clone(memory_format=torch.contiguous_format)
    x, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **named)
    x = self.post_self_attn_layernorm(x)
    norm = self.post_attention_layernorm
    fused_add_rms_norm(x, residual, norm.weight, norm.variance_epsilon)
    return residual.add_(self.post_mlp_layernorm(self.mlp(x)))


def _rows(parts: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
    """The tensor whose rows are those of `parts` in order (the same storage, each contiguous, each right after
    the one before), or None when they are not laid out so."""
    first = parts[0]
    at = first.storage_offset()
    for t in parts:
        if (t.shape[1:] != first.shape[1:] or t.dtype != first.dtype or t.device != first.device or t.numel() == 0
                or not t.is_contiguous() or t.storage_offset() != at
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()):
            return None
        at += t.numel()
    shape = (sum(t.shape[0] for t in parts), *first.shape[1:])
    # through .data: a parameter made in inference mode (a model copied there) takes no view of its own
    return first.data.as_strided(shape, tuple(math.prod(shape[i + 1:]) for i in range(len(shape))))


def pack_rows(module: torch.nn.Module, names: tuple[str, ...]) -> None:
    """Lay the weights of `module`'s linears `names` (``[n_i, H]`` each) out as the consecutive row blocks of
    one ``[sum n_i, H]`` tensor, and their biases likewise where they have biases (vLLM's ``gate_up_proj`` and
    ``qkv_proj``). The parameters stay the same objects with the same values (their ``.data`` becomes a view
    of the packed tensor, allocated once: the old storages are freed when nothing else holds them); weights
    already packed so are left as they are. The packed views are held on `module` for `packed_rows`. The
    packing outlives `Kernelized.restore` (it changes no value)."""
    linears = [getattr(module, n) for n in names]
    with torch.inference_mode(False), torch.no_grad():  # ordinary tensors, even if called in inference mode
        for attr in ("weight", "bias"):
            parts = tuple(getattr(m, attr) for m in linears)
            if parts[0] is None or _rows(parts) is not None:
                continue
            packed = torch.empty((sum(p.shape[0] for p in parts), *parts[0].shape[1:]), dtype=parts[0].dtype,
                                 device=parts[0].device)
            at = 0
            for p in parts:
                packed[at:at + p.shape[0]].copy_(p)
                at += p.shape[0]
            at = 0
            for p in parts:
                p.data, at = packed[at:at + p.shape[0]], at + p.shape[0]
    with torch.no_grad():  # in the caller's mode: the parameters may be inference tensors
        weights = tuple(m.weight for m in linears)
        biases = tuple(m.bias for m in linears)
        weight = _rows(weights)
        bias = None if biases[0] is None else _rows(biases)
        module.__dict__[_key(names)] = (weights + biases, weight, bias, _pointers(*weights, *biases))


def pack_gate_up(mlp: torch.nn.Module) -> None:
    """`pack_rows` of ``gate_proj`` and ``up_proj``: one ``[2I, H]`` gate|up weight (and bias)."""
    pack_rows(mlp, _GATE_UP)


_GATE_UP = ("gate_proj", "up_proj")


def _key(names: tuple[str, ...]) -> str:
    return "_infiniops_packed_" + "_".join(names)


def _pointers(*tensors: torch.Tensor | None) -> tuple[int, ...]:
    return tuple(0 if t is None else t.data_ptr() for t in tensors)


def packed_rows(module: torch.nn.Module, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The packed weight and bias `pack_rows` holds on `module` for `names`, or None when the linears'
    parameters are no longer those tensors (a parameter replaced, or its ``.data`` moved by ``model.to(...)``:
    eagerly their addresses are compared too; while tracing, their identity, dtype and device)."""
    held = module.__dict__.get(_key(names))
    if held is None:
        return None
    params, weight, bias, pointers = held
    modules = module._modules
    n = len(names)
    for i, name in enumerate(names):
        linear = modules.get(name)
        if linear is None or linear.weight is not params[i] or linear.bias is not params[n + i]:
            return None
    if weight is None or (bias is None) != (params[-1] is None):
        return None
    if torch.compiler.is_compiling():
        first = params[0]
        return (weight, bias) if (weight.dtype, weight.device) == (first.dtype, first.device) else None
    for p, at in zip(params, pointers, strict=True):
        if p is not None and p.data_ptr() != at:
            return None
    return weight, bias


def _packed(mlp: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    return packed_rows(mlp, _GATE_UP)


def gated_mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``LlamaMLP.forward``, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with SiLU, as vLLM computes it:
    one ``[..., 2I]`` gate|up projection over the weights `pack_gate_up` packed, `silu_and_mul`, then
    ``down_proj``. Weights no longer packed (a ``model.to(...)`` or a parameter replaced since) still give the
    same result, through the two projections concatenated."""
    packed = _packed(self)
    h = torch.cat((self.gate_proj(x), self.up_proj(x)), dim=-1) if packed is None else F.linear(x, *packed)
    return self.down_proj(silu_and_mul(h))


def packed_mlp_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """GLM-4's MLP, ``down_proj(up * silu(gate))`` over its own packed ``gate_up_proj``, with `silu_and_mul`."""
    return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
