"""Planning `kernelize`: which modules of a model to swap, and the operator problems the swaps need gated."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import torch

from infiniops_py import GateError, Problem, make_problem, resolve_closure
from infiniops_py.integrations.transformers._families import ROLES, SwapTargets
from infiniops_py.integrations.transformers._layer import QKV, layer_forward
from infiniops_py.integrations.transformers._match import keeps_forward, role_of
from infiniops_py.integrations.transformers._rope import rope_forward
from infiniops_py.integrations.transformers._swaps import (
    fused_layer_forward,
    gated_mlp_forward,
    gemma_rms_norm_forward,
    pack_gate_up,
    pack_rows,
    packed_mlp_forward,
    rms_norm_forward,
    sandwich_layer_forward,
)

__all__ = ["SWITCHES", "Plan", "make_plan"]

# kernelize's keyword switches (Liger-Kernel's ``apply_liger_kernel_to_<family>(rope=, rms_norm=, swiglu=)``
# style) -> the kinds of swaps each turns on
SWITCHES: Final = {"rms_norm": ("rms_norm", "qk_norm"), "fused_add_rms_norm": ("fused_add_rms_norm",),
                   "attention": ("attention",), "rope": ("rope",), "swiglu": ("gated_mlp",)}

_NORMS: Final = {"rms_norm": rms_norm_forward, "gemma_rms_norm": gemma_rms_norm_forward}
_LAYERS: Final = {"layer": (fused_layer_forward, ()),
                  "sandwich_layer": (sandwich_layer_forward, ("post_self_attn_layernorm", "post_mlp_layernorm"))}


class Plan(NamedTuple):
    """What `kernelize` will do to a model, once every problem in `problems` has a provider."""

    problems: list[Problem]
    swaps: list[tuple[str, str, torch.nn.Module, Callable[..., Any]]]  # kind, name, module, new forward
    attention: list[str]  # the attention modules that will dispatch to ATTENTION
    left: list[str]
    prepare: list[Callable[[], None]]  # run once the gates pass, before the swaps (the gate|up packing)


def make_plan(model: torch.nn.Module, family: SwapTargets, device_type: str, kinds: frozenset[str]) -> Plan:
    """The swaps of `family` of the `kinds` asked for that `model` admits on `device_type`, the problems they
    need, and what is left (with the reason): a module whose class overrides the forward of its role's class, a
    norm without the attributes its role reads, a decoder layer whose post-attention norm is not Llama's RMSNorm,
    RoPE over a rotary module of another class, a gated MLP that is not SiLU's or not plain linears."""
    problems: dict[Problem, None] = {}
    swaps: list[tuple[str, str, torch.nn.Module, Callable[..., Any]]] = []
    left: list[str] = []
    attention: list[str] = []
    prepare: list[Callable[[], None]] = []
    config = model.config  # type: ignore[attr-defined]
    fp32_residual = bool(getattr(config, "residual_in_fp32", False))
    roles = {id(m): found for m in model.modules() if (found := role_of(m, family)) is not None}
    rms = {i for i, (role, _) in roles.items() if role == "rms_norm"}
    rotary_classes = {type(m) for m in model.modules() if id(m) in roles and roles[id(m)][0] == "rotary"}

    def need(op: str, dtype: torch.dtype, **fields: Any) -> None:
        problems[make_problem(op, device_type=device_type, dtype=dtype, **fields)] = None

    for name, module in model.named_modules():
        if id(module) not in roles:
            continue
        role, declared = roles[id(module)]
        cls = type(module).__name__
        if role != "rotary" and not keeps_forward(module, declared):
            rms.discard(id(module))
            if role == "attention":  # its attention function still dispatches through the interface
                attention.append(name)
                why = "rotary embeddings stay transformers' own: "
            else:
                why = ""
            left.append(f"{name} ({cls}): {why}its class overrides the forward of {declared.__name__} "
                        f"({ROLES[role]}), so kernelize does not know what it computes")
            continue
        if role in _NORMS:
            weight = getattr(module, "weight", None)
            eps = getattr(module, "variance_epsilon" if role == "rms_norm" else "eps", None)
            if not (isinstance(weight, torch.Tensor) and weight.dim() == 1 and isinstance(eps, float) and eps > 0):
                rms.discard(id(module))
                left.append(f"{name} ({cls}): not the RMSNorm kernelize knows (a 1-D weight and a positive float "
                            "epsilon)")
                continue
            short = name.rpartition(".")[2]
            kind = "qk_norm" if short in ("q_norm", "k_norm") else "rms_norm"
            if kind not in kinds:
                continue
            dtype = torch.float32 if role == "gemma_rms_norm" else weight.dtype
            need("rms_norm", dtype, hidden_size=weight.numel())
            if fp32_residual and short in family.float32_inputs and weight.dtype != torch.float32:
                need("rms_norm", torch.float32, hidden_size=weight.numel())
            swaps.append((kind, name, module, _NORMS[role]))
        elif role in _LAYERS and "fused_add_rms_norm" in kinds:
            forward, more = _LAYERS[role]
            post = getattr(module, "post_attention_layernorm", None)
            if id(post) not in rms or not all(isinstance(getattr(module, n, None), torch.nn.Module) for n in more):
                left.append(f"{name} ({cls}): its post-attention norm is not the RMSNorm kernelize knows, so its "
                            "residual add and norm run unfused")
                continue
            need("fused_add_rms_norm", post.weight.dtype, hidden_size=post.weight.numel())  # type: ignore[union-attr]
            swaps.append(("fused_add_rms_norm", name, module, forward))
        elif role == "attention":
            _plan_attention(model, name, module, declared, family, kinds, rotary_classes, need, swaps, attention, left)
        elif role in ("mlp", "packed_mlp") and "gated_mlp" in kinds:
            why = _mlp_unsupported(module, config, packed=role == "packed_mlp")
            if why:
                left.append(f"{name} ({cls}): {why}")
                continue
            proj = module.gate_up_proj if role == "packed_mlp" else module.gate_proj
            width = proj.weight.shape[0] // (2 if role == "packed_mlp" else 1)
            need("silu_and_mul", proj.weight.dtype, d=width)
            if role == "mlp":
                prepare.append(functools.partial(pack_gate_up, module))
            swaps.append(("gated_mlp", name, module, gated_mlp_forward if role == "mlp" else packed_mlp_forward))
    dims = _rotary_dims(model, rotary_classes)
    if len(dims) == 1:
        _plan_layers(swaps, problems, prepare, device_type, dims.pop())
    return Plan(list(problems), swaps, attention, left, prepare)


def _plan_layers(swaps: list[tuple[str, str, torch.nn.Module, Callable[..., Any]]], problems: dict[Problem, None],
                 prepare: list[Callable[[], None]], device_type: str, rotary_dim: int) -> None:
    """Add a ``"layer"`` swap (`layer_forward`, the whole layer in one forward, made after the layer's
    ``fused_add_rms_norm`` swap, so that the undos put both back in turn) to every pre-norm decoder layer whose
    parts all have their swaps (input norm, RoPE, gated MLP, Qwen3's q/k norms), whose q/k/v projections are
    plain linears that pack into one, whose submodules' forwards are their classes' (no ``forward`` of an
    instance's own, as accelerate's hooks set), and, with q/k norms, whose `fused_qk_norm_rope` problem has a
    provider (else the layer keeps the swaps of its parts)."""
    by_name = {(kind, name): forward for kind, name, _, forward in swaps}
    for kind, name, layer, forward in list(swaps):
        if kind != "fused_add_rms_norm" or forward is not fused_layer_forward:
            continue
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        rope = by_name.get(("rope", f"{name}.self_attn"))
        if (attn is None or mlp is None or ("rms_norm", f"{name}.input_layernorm") not in by_name
                or by_name.get(("gated_mlp", f"{name}.mlp")) is not gated_mlp_forward
                or not isinstance(rope, functools.partial) or not _plain_qkv(attn)
                or any(_foreign_forward(m) for m in layer.modules())):
            continue
        qk_norm = bool(rope.keywords["qk_norm"])
        if qk_norm:
            found = _qk_norm_rope_problem(attn, name, by_name, rope.keywords["is_neox"], device_type, rotary_dim)
            if found is None:
                continue
            problems[found] = None
        prepare.append(functools.partial(pack_rows, attn, QKV))
        swaps.append(("layer", name, layer, functools.partial(layer_forward, **rope.keywords)))


def _foreign_forward(module: torch.nn.Module) -> bool:
    """Whether `module` has a ``forward`` of its instance's own that is not a kernelize swap (a hook's wrapper,
    as accelerate sets; a previous kernelize's swaps are undone before this one's are made)."""
    forward = module.__dict__.get("forward")
    if forward is None:
        return False
    func = getattr(forward, "__func__", None)
    func = getattr(func, "func", func)  # a functools.partial bound as a method
    return not getattr(func, "__module__", "").startswith(__name__.rpartition(".")[0])


def _plain_qkv(attn: torch.nn.Module) -> bool:
    """Whether `attn`'s q/k/v projections are ``nn.Linear`` of one dtype and device, not on the meta device,
    biases on all or none, whole heads of ``attn.head_dim``."""
    projs = [getattr(attn, n, None) for n in QKV]
    d = getattr(attn, "head_dim", None)
    if not isinstance(d, int) or not all(type(m) is torch.nn.Linear for m in projs):
        return False
    weights = [m.weight for m in projs]  # type: ignore[union-attr]
    return (len({(w.dtype, w.device, w.shape[1]) for w in weights}) == 1 and weights[0].device.type != "meta"
            and len({m.bias is None for m in projs}) == 1  # type: ignore[union-attr]
            and all(w.shape[0] % d == 0 for w in weights))


def _qk_norm_rope_problem(attn: torch.nn.Module, name: str, by_name: dict[Any, Any], is_neox: bool,
                          device_type: str, rotary_dim: int) -> Problem | None:
    """The `fused_qk_norm_rope` problem of `attn`'s packed projection, or None when its q/k norms are not both
    swapped, differ in epsilon, or the problem has no provider on `device_type`."""
    if not all(("qk_norm", f"{name}.self_attn.{n}") in by_name for n in ("q_norm", "k_norm")):
        return None
    q_norm, k_norm = attn.q_norm, attn.k_norm
    d = attn.head_dim
    if q_norm.variance_epsilon != k_norm.variance_epsilon or q_norm.weight.numel() != d:
        return None
    problem = make_problem("fused_qk_norm_rope", device_type=device_type, dtype=attn.q_proj.weight.dtype,
                           head_dim=d, num_q_heads=attn.q_proj.weight.shape[0] // d,
                           num_kv_heads=attn.k_proj.weight.shape[0] // d, rotary_dim=rotary_dim, is_neox=is_neox)
    try:
        resolve_closure([problem])
    except GateError:
        return None
    return problem


def _plan_attention(model: torch.nn.Module, name: str, module: torch.nn.Module, declared: type, family: SwapTargets,
                    kinds: frozenset[str], rotary_classes: set[type], need: Callable[..., None],
                    swaps: list[Any], attention: list[str], left: list[str]) -> None:
    """The attention dispatch (`attention` kind) and the RoPE swap (`rope` kind) of one attention module."""
    cls = type(module).__name__
    dtype = module.q_proj.weight.dtype
    config = model.config  # type: ignore[attr-defined]
    if "attention" in kinds:
        why = _attention_unsupported(model)
        if why:
            left.append(f"{name} ({cls}): {why}")
        else:
            for op, fields in _attention_problems(module, config):
                need(op, dtype, **fields)
            attention.append(name)
    if "rope" not in kinds:
        return
    dims = _rotary_dims(model, rotary_classes)
    if len(dims) != 1:
        left.append(f"{name} ({cls}): rotary embeddings stay transformers' own: the model has no rotary module of "
                    f"{family.module.rpartition('.')[2]}'s class (or several of different widths)")
        return
    rotary_dim = dims.pop()
    extra = {kw: functools.reduce(getattr, path.split("."), module) if _has(module, path) else None
             for kw, path in family.attention_extra}
    need("rotary_embedding", dtype, head_dim=module.head_dim, rotary_dim=rotary_dim, is_neox=family.rope == "neox")
    swaps.append(("rope", name, module, rope_forward(module, declared, is_neox=family.rope == "neox",
                                                     extra={k: v for k, v in extra.items() if v is not None})))


def _rotary_dims(model: torch.nn.Module, rotary_classes: set[type]) -> set[int]:
    """The rotary widths (twice ``inv_freq``'s length) of `model`'s rotary modules of `rotary_classes`."""
    return {int(m.inv_freq.numel()) * 2 for m in model.modules()
            if type(m) in rotary_classes and isinstance(getattr(m, "inv_freq", None), torch.Tensor)}


def _has(obj: object, path: str) -> bool:
    try:
        functools.reduce(getattr, path.split("."), obj)
    except AttributeError:
        return False
    return True


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
    """The attention problems of one attention module: prefill (varlen) and decode (kvcache, also with the left
    padding of a padded batch), causal, with and without the window where the layer has one (a window wider than
    the keys counts as none), with softcap where the layer has one."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(module, "head_dim", None) or config.hidden_size // heads
    window = getattr(module, "sliding_window", None) or getattr(config, "sliding_window", None)
    windows = (False, True) if window else (False,)
    softcap = bool(getattr(module, "attn_logit_softcapping", None))
    common = {"head_dim": head_dim, "gqa_ratio": heads // kv_heads, "causal": True, "softcap": softcap}
    found = [("flash_attn_varlen", {**common, "local": local}) for local in windows]
    found += [("flash_attn_with_kvcache", {**common, "local": local, "cache_leftpad": leftpad})
              for local in windows for leftpad in (False, True)]
    return found


_SILU: Final = ("silu", "swish")  # transformers' ACT2FN names of SiLU


def _mlp_unsupported(module: torch.nn.Module, config: Any, *, packed: bool) -> str:
    """Why the gated MLP `module` cannot run as one gate|up projection and `silu_and_mul` ('' when it can): an
    activation other than SiLU (``config.hidden_act`` and the module's ``act_fn``/``activation_fn``), projections
    that are not plain ``nn.Linear`` (gate and up of one shape, dtype and device, biases on both or neither), or
    weights on the meta device."""
    act = getattr(config, "hidden_act", None)
    act_fn = getattr(module, "activation_fn" if packed else "act_fn", None)
    if act not in _SILU or type(act_fn) not in (torch.nn.SiLU, _silu_class()):
        return (f"its activation is hidden_act={act!r} ({type(act_fn).__name__}), not SiLU: silu_and_mul "
                "computes silu(gate) * up, so the MLP stays transformers' own")
    names = ("gate_up_proj", "down_proj") if packed else ("gate_proj", "up_proj", "down_proj")
    projs = [getattr(module, n, None) for n in names]
    if not all(type(m) is torch.nn.Linear for m in projs):
        kinds = ", ".join(type(m).__name__ for m in projs)
        return f"its {'/'.join(names)} projections are {kinds}, not torch.nn.Linear, so the MLP stays transformers' own"
    w = projs[0].weight  # type: ignore[union-attr]
    if packed:
        if w.shape[0] % 2:
            return f"gate_up_proj has an odd number of outputs ({w.shape[0]}), so it does not split into gate and up"
    else:
        gate, up = projs[0], projs[1]
        v = up.weight  # type: ignore[union-attr]
        if (w.shape, w.dtype, w.device) != (v.shape, v.dtype, v.device) or \
                (gate.bias is None) != (up.bias is None):  # type: ignore[union-attr]
            return (f"gate_proj ({list(w.shape)} {w.dtype} {w.device}, bias {gate.bias is not None}) and up_proj "
                    f"({list(v.shape)} {v.dtype} {v.device}, bias {up.bias is not None}) differ, so they do not "
                    "pack into one projection")  # type: ignore[union-attr]
    if w.device.type == "meta":
        return "its weights are on the meta device (not loaded, or offloaded), so they cannot be packed"
    return ""


@functools.cache
def _silu_class() -> type:
    """transformers' ``SiLUActivation`` (ACT2FN's ``"silu"``), or ``torch.nn.SiLU`` where it has none."""
    try:
        from transformers.activations import SiLUActivation
    except ImportError:
        return torch.nn.SiLU
    return SiLUActivation

