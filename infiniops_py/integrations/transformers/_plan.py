"""Planning `kernelize`: which modules of a model to swap, and the operator problems the swaps need gated."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import torch

from infiniops_py import Problem, make_problem
from infiniops_py.integrations.transformers._families import SwapTargets
from infiniops_py.integrations.transformers._rope import rope_attention, rope_unsupported
from infiniops_py.integrations.transformers._source import code_of
from infiniops_py.integrations.transformers._swaps import (
    fused_layer_forward,
    gated_mlp_forward,
    pack_gate_up,
    rms_norm_forward,
)

__all__ = ["Plan", "make_plan"]


class Plan(NamedTuple):
    """What `kernelize` will do to a model, once every problem in `problems` has a provider."""

    problems: list[Problem]
    swaps: list[tuple[str, str, torch.nn.Module, Callable[..., Any]]]  # kind, name, module, new forward
    attention: list[str]  # the attention modules that will dispatch to ATTENTION
    left: list[str]
    prepare: list[Callable[[], None]]  # run once the gates pass, before the swaps (the gate|up packing)


def make_plan(model: torch.nn.Module, family: SwapTargets, device_type: str) -> Plan:
    """The swaps of `family` that `model` admits on `device_type`, the problems they need, and what is left
    (with the reason): a norm class whose module is not the RMSNorm `rms_norm` computes, a decoder layer whose
    forward is not the residual pattern (`_residual_pattern`), attention the model cannot redirect, RoPE that is
    not transformers' rotate-half in ``LlamaAttention.forward`` (`rope_unsupported`), a gated MLP that is not
    SiLU's or not laid out as ``LlamaMLP`` (`_mlp_unsupported`)."""
    problems: dict[Problem, None] = {}
    swaps: list[tuple[str, str, torch.nn.Module, Callable[..., Any]]] = []
    left: list[str] = []
    attention: list[str] = []
    prepare: list[Callable[[], None]] = []
    config = model.config  # type: ignore[attr-defined]
    fp32_residual = bool(getattr(config, "residual_in_fp32", False))
    norms = {id(m) for m in model.modules() if type(m).__name__ in family.norms and _is_rms_norm(m)}
    rotary = frozenset(type(m) for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))

    def need(op: str, dtype: torch.dtype, **fields: Any) -> None:
        problems[make_problem(op, device_type=device_type, dtype=dtype, **fields)] = None

    for name, module in model.named_modules():
        cls = type(module).__name__
        if id(module) in norms:
            short = name.rpartition(".")[2]
            weight = module.weight
            need("rms_norm", weight.dtype, hidden_size=weight.numel())
            if fp32_residual and short in family.float32_inputs and weight.dtype != torch.float32:
                need("rms_norm", torch.float32, hidden_size=weight.numel())
            kind = "qk_norm" if short in ("q_norm", "k_norm") else "rms_norm"
            swaps.append((kind, name, module, rms_norm_forward))
        elif cls in family.norms:
            left.append(f"{name} ({cls}): not the RMSNorm kernelize knows (a 1-D weight, a float "
                        "variance_epsilon and LlamaRMSNorm's forward)")
        elif cls in family.layers:
            parts = [getattr(module, n, None) for n in ("input_layernorm", "post_attention_layernorm")]
            if not all(id(p) in norms for p in parts):
                left.append(f"{name} ({cls}): its input or post-attention norm is not the RMSNorm kernelize "
                            "knows, so its residual add and norm run unfused")
                continue
            if not _residual_pattern(type(module)):
                left.append(f"{name} ({cls}): its forward is not the pre-norm residual pattern kernelize "
                            "fuses, so its norms run unfused")
                continue
            weight = parts[1].weight  # type: ignore[union-attr]
            need("fused_add_rms_norm", weight.dtype, hidden_size=weight.numel())
            swaps.append(("fused_add_rms_norm", name, module, fused_layer_forward))
        elif cls in family.attention:
            why = _attention_unsupported(model)
            if why:
                left.append(f"{name} ({cls}): {why}")
                continue
            dtype = module.q_proj.weight.dtype
            for op, fields in _attention_problems(module, config):
                need(op, dtype, **fields)
            attention.append(name)
            why = rope_unsupported(type(module), rotary)
            if why:
                left.append(f"{name} ({cls}): rotary embeddings stay transformers' own: {why}")
                continue
            need("rotary_embedding", dtype, head_dim=module.head_dim, rotary_dim=module.head_dim, is_neox=True)
            swaps.append(("rope", name, module, rope_attention(type(module))))
        elif cls in family.mlps:
            why = _mlp_unsupported(module, config)
            if why:
                left.append(f"{name} ({cls}): {why}")
                continue
            need("silu_and_mul", module.gate_proj.weight.dtype, d=module.gate_proj.weight.shape[0])
            prepare.append(functools.partial(pack_gate_up, module))
            swaps.append(("gated_mlp", name, module, gated_mlp_forward))
    return Plan(list(problems), swaps, attention, left, prepare)


# LlamaRMSNorm.forward (Qwen2's, Qwen3's, Mamba2RMSNorm's), whitespace and comments removed, any names
_RMS_FORWARD: Final = re.compile(r"defforward\(self,(\w+)(?::[\w.]+)?\)(?:->[\w.]+)?:(\w+)=\1\.dtype"
                                 r"\1=\1\.to\(torch\.float32\)(\w+)=\1\.pow\(2\)\.mean\(-1,keepdim=True\)"
                                 r"\1=\1\*torch\.rsqrt\(\3\+self\.variance_epsilon\)returnself\.weight\*\1\.to\(\2\)")


def _is_rms_norm(module: torch.nn.Module) -> bool:
    """Whether `module` has the 1-D ``weight`` and the positive float ``variance_epsilon`` of ``LlamaRMSNorm``, and
    its class's forward is ``LlamaRMSNorm.forward`` statement for statement (a class of the same name may compute
    another norm)."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    return (isinstance(weight, torch.Tensor) and weight.dim() == 1 and isinstance(eps, float) and eps > 0
            and _RMS_FORWARD.fullmatch(code_of(type(module).forward)) is not None)


_PATTERN: Final = (
    "residual=hidden_states", "hidden_states=self.input_layernorm(hidden_states)", "hidden_states,_=self.self_attn(",
    "hidden_states=residual+hidden_states", "residual=hidden_states",
    "hidden_states=self.post_attention_layernorm(hidden_states)", "hidden_states=self.mlp(hidden_states)",
    "hidden_states=residual+hidden_states", "returnhidden_states",
)


def _residual_pattern(cls: type) -> bool:
    """Whether ``cls.forward`` is transformers' pre-norm decoder layer, statement for statement: norm, attention
    (returning ``(output, weights)``), residual add, norm, MLP, residual add, return the tensor."""
    code = code_of(cls.forward)
    at = 0
    for statement in _PATTERN:
        at = code.find(statement, at)
        if at < 0:
            return False
        at += len(statement)
    return code.endswith(_PATTERN[-1]) and code.count("self.self_attn(") == 1


def _attention_unsupported(model: torch.nn.Module) -> str:
    """Why `model`'s attention cannot dispatch to `ATTENTION` ('' when it can)."""
    try:
        from transformers import AttentionInterface  # noqa: F401
        from transformers.masking_utils import AttentionMaskInterface  # noqa: F401
    except ImportError as err:
        return f"this transformers has no attention-interface registry ({err})"
    can_set = getattr(type(model), "_can_set_attn_implementation", None)
    if not hasattr(model, "set_attn_implementation") or (callable(can_set) and not can_set()):
        return "the model cannot set its attention implementation"
    return ""


def _attention_problems(module: torch.nn.Module, config: Any) -> list[tuple[str, dict[str, Any]]]:
    """The attention problems of one attention module: prefill (varlen) and decode (kvcache), causal, with
    and without the window where the layer has one (a window wider than the keys counts as none)."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(module, "head_dim", None) or config.hidden_size // heads
    windows = (False, True) if getattr(module, "sliding_window", None) else (False,)
    common = {"head_dim": head_dim, "gqa_ratio": heads // kv_heads, "causal": True, "softcap": False}
    return [(op, {**common, "local": local}) for op in ("flash_attn_varlen", "flash_attn_with_kvcache")
            for local in windows]


# LlamaMLP.forward, whitespace and comments removed: an optional annotation, then `name = <product>; return name`
# or `return <product>`
_MLP_FORWARD: Final = re.compile(r"defforward\(self,(\w+)(?::[\w.|\[\]]+)?\)(?:->[\w.|\[\]]+)?:(?:(\w+)=|return)"
                                 r"self\.down_proj\(self\.act_fn\(self\.gate_proj\(\1\)\)\*self\.up_proj\(\1\)\)"
                                 r"(?:return(\w+))?")
_SILU: Final = ("silu", "swish")  # transformers' ACT2FN names of SiLU


def _mlp_unsupported(module: torch.nn.Module, config: Any) -> str:
    """Why the gated MLP `module` cannot run as one gate|up projection and `silu_and_mul` ('' when it can): an
    activation other than SiLU (``config.hidden_act`` and the module's ``act_fn``), projections that are not
    plain ``nn.Linear`` of one shape, dtype and device (biases on both or neither), or a forward that is not
    ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""
    act = getattr(config, "hidden_act", None)
    act_fn = getattr(module, "act_fn", None)
    if act not in _SILU or type(act_fn) not in (torch.nn.SiLU, _silu_class()):
        return (f"its activation is hidden_act={act!r} ({type(act_fn).__name__}), not SiLU: silu_and_mul "
                "computes silu(gate) * up, so the MLP stays transformers' own")
    gate, up, down = (getattr(module, n, None) for n in ("gate_proj", "up_proj", "down_proj"))
    if not all(type(m) is torch.nn.Linear for m in (gate, up, down)):
        kinds = ", ".join(type(m).__name__ for m in (gate, up, down))
        return f"its gate/up/down projections are {kinds}, not torch.nn.Linear, so the MLP stays transformers' own"
    w, v = gate.weight, up.weight
    if (w.shape, w.dtype, w.device) != (v.shape, v.dtype, v.device) or (gate.bias is None) != (up.bias is None):
        return (f"gate_proj ({list(w.shape)} {w.dtype} {w.device}, bias {gate.bias is not None}) and up_proj "
                f"({list(v.shape)} {v.dtype} {v.device}, bias {up.bias is not None}) differ, so they do not pack "
                "into one projection")
    if w.device.type == "meta":
        return "its weights are on the meta device (not loaded, or offloaded), so they cannot be packed"
    found = _MLP_FORWARD.fullmatch(code_of(type(module).forward))
    if found is None or found[2] != found[3]:
        return "its forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x)), so the MLP stays transformers' own"
    return ""


@functools.cache
def _silu_class() -> type:
    """transformers' ``SiLUActivation`` (ACT2FN's ``"silu"``), or ``torch.nn.SiLU`` where it has none."""
    try:
        from transformers.activations import SiLUActivation
    except ImportError:
        return torch.nn.SiLU
    return SiLUActivation
