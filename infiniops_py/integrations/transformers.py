"""Run a Hugging Face transformers model through InfiniOps-Py operators: ``kernelize(model)``.

As Hugging Face ``kernels.kernelize`` and Liger-Kernel's ``apply_liger_kernel_to_<family>`` do, one call swaps
a model's layers for the operators of this project, in place, on the model object it is given (other
instances of the same classes are untouched). Per family (`FAMILIES`, keyed by ``config.model_type``):

- every RMSNorm (Llama, Qwen2, Qwen3, Mamba-2 ``Mamba2RMSNorm``) -> `rms_norm`; Qwen3's per-head
  ``q_norm``/``k_norm`` too (over ``head_dim``, on the ``[B, S, H, D]`` projection views).
  `fused_qk_norm` is not used: it needs the packed ``[T, (Hq + 2 Hkv) D]`` projection, and transformers
  computes q, k and v with three separate linears.
- the pre-norm decoder layer's ``residual + attention`` followed by ``post_attention_layernorm`` ->
  `fused_add_rms_norm` (Llama, Qwen2, Qwen3, when the layer's forward is the residual pattern that
  `kernelize` knows; otherwise the two norms are swapped on their own and the report says so). The
  layer's input is copied once first (the caller may still hold it: ``output_hidden_states``, a user's
  ``inputs_embeds``); the MLP's residual add then runs in place on that copy.
- attention -> the ``"infiniops"`` entry of transformers' ``AttentionInterface`` (and of its
  ``AttentionMaskInterface``, which hands it the 2-D padding mask, as for flash-attention):
  `flash_attn_varlen` for prefill (sequences packed back to back, padding rows dropped) and for padded
  batches, `flash_attn_with_kvcache` for decode steps over transformers' cache (a view of it, no copy).
  The causal mask is bottom-right aligned, as transformers' masks are for queries that follow a cache;
  a sliding window of ``w`` keys is ``window_size=(w - 1, 0)``; the scale is the module's ``scaling``.

Left in transformers' code, and listed in `Kernelized.left`: the gated MLP (``act_fn(gate_proj(x)) *
up_proj(x)``: there is no ``silu_and_mul`` operator yet), rotary embeddings, and Mamba-2's gated
``MambaRMSNormGated`` (its ``silu(gate)`` product and per-group weight have no operator) and
``Mamba2Mixer`` (its conv and scans stay transformers' own).

Every operator problem the swaps need is resolved first (`infiniops_py.resolve_closure`): when any has no
provider, one `GateError` lists them all and nothing is swapped. The swapped calls then resolve per call
like any other call (``use(...)`` scopes and ``INFINIOPS_*`` settings apply). The operators have no
backward: run the model under ``torch.no_grad()`` or ``torch.inference_mode()`` (``generate`` does);
a call with grad mode on and parameters that require grad raises the operators' `ContractError`.
"""

from __future__ import annotations

import inspect
import itertools
import re
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import torch

from infiniops_py import (
    ContractError,
    GateError,
    Implementation,
    Problem,
    flash_attn_varlen,
    flash_attn_with_kvcache,
    fused_add_rms_norm,
    make_problem,
    resolve_closure,
    rms_norm,
)

__all__ = ["ATTENTION", "FAMILIES", "Family", "Kernelized", "kernelize"]

ATTENTION: Final = "infiniops"  # the name registered in transformers' AttentionInterface / AttentionMaskInterface
_MLP: Final = "the gated MLP act_fn(gate_proj(x)) * up_proj(x): no silu_and_mul operator exists yet"
_ROPE: Final = "rotary embeddings: transformers' own (no rotary operator exists yet)"


@dataclass(frozen=True)
class Family:
    """What `kernelize` swaps in one model family, by transformers class name.

    Attributes:
        norms: RMSNorm classes whose forward is ``weight * (x * rsqrt(mean(x**2) + eps)).to(x.dtype)``
            with the mean in float32 (``LlamaRMSNorm``), the semantics of `rms_norm`.
        layers: pre-norm decoder layers whose attention residual add and ``post_attention_layernorm`` fuse.
        attention: attention classes that call ``ALL_ATTENTION_FUNCTIONS.get_interface``.
        float32_inputs: module names (last component) of norms that see float32 inputs when the config's
            ``residual_in_fp32`` is set (Mamba-2's ``norm_f`` gets the float32 residual stream).
        left: what stays in transformers' code, and why.
    """

    norms: tuple[str, ...]
    layers: tuple[str, ...] = ()
    attention: tuple[str, ...] = ()
    float32_inputs: tuple[str, ...] = ()
    left: tuple[str, ...] = ()


FAMILIES: Final[dict[str, Family]] = {
    "llama": Family(("LlamaRMSNorm",), ("LlamaDecoderLayer",), ("LlamaAttention",), left=(_MLP, _ROPE)),
    "qwen2": Family(("Qwen2RMSNorm",), ("Qwen2DecoderLayer",), ("Qwen2Attention",), left=(_MLP, _ROPE)),
    "qwen3": Family(("Qwen3RMSNorm",), ("Qwen3DecoderLayer",), ("Qwen3Attention",), left=(_MLP, _ROPE)),
    "mamba2": Family(("Mamba2RMSNorm",), float32_inputs=("norm_f",), left=(
        "MambaRMSNormGated: its silu(gate) product and per-group weight have no operator",
        "Mamba2Mixer: its causal conv and scans stay transformers' own",
    )),
}


@dataclass
class Kernelized:
    """What `kernelize` did to one model.

    Attributes:
        model_type: the config's ``model_type``.
        device_type: the device type the gates were resolved for.
        swapped: kind (``rms_norm``, ``qk_norm``, ``fused_add_rms_norm``, ``attention``) -> the qualified
            names of the modules swapped.
        left: what still runs in transformers' code, and why.
        chosen: each operator problem gated -> the implementation that serves it.
    """

    model_type: str
    device_type: str
    swapped: dict[str, list[str]] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    chosen: dict[Problem, Implementation] = field(default_factory=dict)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def restore(self) -> None:
        """Put back every forward and the attention implementation that `kernelize` replaced."""
        while self._undo:
            self._undo.pop()()
        self.swapped.clear()

    def render(self) -> str:
        """One line per kind swapped (count and the operator's provider), then what was left and why."""
        providers: dict[str, list[str]] = {}
        for problem, impl in self.chosen.items():
            seen = providers.setdefault(problem.op, [])
            if impl.provider not in seen:
                seen.append(impl.provider)
        ops = {"rms_norm": ("rms_norm",), "qk_norm": ("rms_norm",), "fused_add_rms_norm": ("fused_add_rms_norm",),
               "attention": ("flash_attn_varlen", "flash_attn_with_kvcache")}
        lines = [f"kernelized {self.model_type} for {self.device_type}:"]
        for kind, names in self.swapped.items():
            by = ", ".join(f"{op} by {'+'.join(providers.get(op, ['?']))}" for op in ops[kind])
            lines.append(f"  {kind}: {len(names)} module(s) ({by})")
        lines.extend(f"  left: {why}" for why in self.left)
        return "\n".join(lines)


def kernelize(model: torch.nn.Module, *, device: str | torch.device | None = None,
              mode: str = "inference") -> Kernelized:
    """Swap `model`'s norms, fusable residual adds and attention for InfiniOps-Py operators, in place.

    Args:
        model: a transformers model (``PreTrainedModel``) of a family in `FAMILIES` (its
            ``config.model_type``).
        device: the device whose providers the gates check: a str (``"cuda"``, ``"cuda:1"``: its type counts)
            or a ``torch.device``; default: the device of the model's first parameter.
        mode: ``"inference"``, the only mode: no operator has a backward.

    Returns:
        The `Kernelized` report (also kept as ``model.infiniops_kernelized``); its ``restore()`` undoes the
        swaps. Kernelizing a model again restores the previous swaps first (once the new gates pass).

    Raises:
        ValueError: `mode` other than ``"inference"``, or a ``model_type`` with no entry in `FAMILIES`
            (the message lists the supported ones).
        TypeError: `model` is not a ``torch.nn.Module`` with a ``config``, or `device` is neither a str, a
            ``torch.device`` nor None.
        GateError: some operator problem the swaps need has no provider on `device`: one error lists them
            all, and nothing is swapped.
    """
    if mode != "inference":
        raise ValueError(f"kernelize(mode={mode!r}): only mode='inference' is supported (the InfiniOps-Py "
                         "operators have no backward, so training through them is impossible)")
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or config is None:
        raise TypeError(f"kernelize: expected a transformers model (a torch.nn.Module with a config), got "
                        f"{type(model).__name__}")
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ValueError(f"kernelize: model_type {model_type!r} ({type(model).__name__}) is not supported; "
                         f"supported: {', '.join(FAMILIES)}")
    device_type = _device_type(model, device)
    plan = _plan(model, family, device_type)
    try:
        chosen = resolve_closure(plan.problems)
    except GateError as err:  # its headline's first line counts the gaps: said here, with the model
        why = err.headline.split("\n")[1:]
        raise GateError(err.gaps, headline="\n".join([
            f"kernelize({type(model).__name__}, device={device_type!r}): {len(err.gaps)} operator problem(s) "
            "have no provider, so nothing was swapped", *why])) from None
    previous = getattr(model, "infiniops_kernelized", None)
    if isinstance(previous, Kernelized):
        previous.restore()
    report = Kernelized(model_type, device_type, left=[*plan.left, *family.left], chosen=chosen)
    for kind, name, module, forward in plan.swaps:
        _swap_forward(report, module, forward)
        report.swapped.setdefault(kind, []).append(name)
    if plan.attention:
        _swap_attention(report, model)
        report.swapped["attention"] = plan.attention
    model.infiniops_kernelized = report
    return report


# --- planning: what to swap and the problems it needs ---------------------------------------------------

class _Plan(NamedTuple):
    problems: list[Problem]
    swaps: list[tuple[str, str, torch.nn.Module, Callable[..., Any]]]  # kind, name, module, new forward
    attention: list[str]  # the attention modules that will dispatch to ATTENTION
    left: list[str]


def _device_type(model: torch.nn.Module, device: str | torch.device | None) -> str:
    if device is None:
        param = next(model.parameters(), None)
        return "cpu" if param is None else param.device.type
    if isinstance(device, torch.device):
        return device.type
    if isinstance(device, str):  # 'cuda:1' -> 'cuda'; a type no provider declares fails at the gates
        kind = device.partition(":")[0].strip()
        if not kind:
            raise ValueError(f"kernelize(device={device!r}): expected a device such as 'cpu', 'cuda' or 'cuda:1'")
        return kind
    raise TypeError(f"kernelize(device={device!r}): expected a str, a torch.device or None, got "
                    f"{type(device).__name__}")


def _plan(model: torch.nn.Module, family: Family, device_type: str) -> _Plan:
    problems: dict[Problem, None] = {}
    swaps: list[tuple[str, str, torch.nn.Module, Callable[..., Any]]] = []
    left: list[str] = []
    attention: list[str] = []
    config = model.config  # type: ignore[attr-defined]
    fp32_residual = bool(getattr(config, "residual_in_fp32", False))
    norms = {id(m) for m in model.modules() if type(m).__name__ in family.norms and _is_rms_norm(m)}

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
            swaps.append((kind, name, module, _rms_norm_forward))
        elif cls in family.norms:
            left.append(f"{name} ({cls}): not the RMSNorm kernelize knows (a 1-D weight and a float "
                        "variance_epsilon)")
        elif cls in family.layers:
            parts = [getattr(module, n, None) for n in ("input_layernorm", "post_attention_layernorm")]
            if not all(id(p) in norms for p in parts) or not _residual_pattern(type(module)):
                left.append(f"{name} ({cls}): its forward is not the pre-norm residual pattern kernelize "
                            "fuses, so its norms run unfused")
                continue
            weight = parts[1].weight  # type: ignore[union-attr]
            need("fused_add_rms_norm", weight.dtype, hidden_size=weight.numel())
            swaps.append(("fused_add_rms_norm", name, module, _fused_layer_forward))
        elif cls in family.attention:
            why = _attention_unsupported(model)
            if why:
                left.append(f"{name} ({cls}): {why}")
                continue
            for op, fields in _attention_problems(module, config):
                need(op, module.q_proj.weight.dtype, **fields)
            attention.append(name)
    return _Plan(list(problems), swaps, attention, left)


def _is_rms_norm(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 1 and isinstance(eps, float) and eps > 0


_PATTERN: Final = (
    "residual=hidden_states", "hidden_states=self.input_layernorm(hidden_states)", "hidden_states,_=self.self_attn(",
    "hidden_states=residual+hidden_states", "residual=hidden_states",
    "hidden_states=self.post_attention_layernorm(hidden_states)", "hidden_states=self.mlp(hidden_states)",
    "hidden_states=residual+hidden_states", "returnhidden_states",
)


def _residual_pattern(cls: type) -> bool:
    """Whether ``cls.forward`` is transformers' pre-norm decoder layer, statement for statement: norm, attention
    (returning ``(output, weights)``), residual add, norm, MLP, residual add, return the tensor."""
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    code = re.sub(r"\s+", "", "".join(line.split("#")[0] for line in source.splitlines()))
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


# --- the swaps -----------------------------------------------------------------------------------------

def _swap_forward(report: Kernelized, module: torch.nn.Module, forward: Callable[..., Any]) -> None:
    had = module.__dict__.get("forward")
    module.forward = types.MethodType(forward, module)

    def undo() -> None:
        if had is None:
            del module.forward
        else:
            module.forward = had

    report._undo.append(undo)


def _rms_norm_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
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


def _fused_layer_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
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


def _swap_attention(report: Kernelized, model: Any) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, flash_attention_mask)
    previous = model.config._attn_implementation
    model.set_attn_implementation(ATTENTION)
    report._undo.append(lambda: model.set_attn_implementation(previous))


# --- attention -----------------------------------------------------------------------------------------

class _Unpadded(NamedTuple):
    """Where the valid rows of a padded batch go: query and key (batch, position) pairs, in sequence order."""

    q_batch: torch.Tensor
    q_pos: torch.Tensor
    k_batch: torch.Tensor
    k_pos: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


_LAST_MASK: list[tuple[torch.Tensor, int, int, _Unpadded]] = []  # one entry: every layer of a step shares a mask


def _cu(lengths: list[int], device: torch.device) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def _unpad(mask: torch.Tensor, sq: int, sk: int) -> _Unpadded:
    """The valid rows of a ``[B, L]`` padding mask (nonzero = a real token; ``L <= Sk``, the queries being its
    last `sq` positions). Reads the mask on the host (one synchronization per step on CUDA).

    Raises:
        ValueError: a row whose real tokens are not one contiguous run (left or right padding only).
    """
    for held, q, k, found in _LAST_MASK:
        if held is mask and (q, k) == (sq, sk):
            return found
    valid = mask.detach().to("cpu", torch.bool)
    length = valid.shape[1]
    if length > sk:
        raise ValueError(f"infiniops attention: the padding mask covers {length} positions, more than the "
                         f"{sk} keys")
    qb, qp, kb, kp, lq, lk = [], [], [], [], [], []
    for b, row in enumerate(valid):
        where = row.nonzero().flatten()
        start, stop = (int(where[0]), int(where[-1]) + 1) if len(where) else (0, 0)
        if stop - start != len(where):
            raise ValueError(f"infiniops attention: row {b} of the padding mask has holes; only left or right "
                             "padding (one run of real tokens per row) maps to varlen sequences")
        first_q = max(start, length - sq)
        n_q = max(0, stop - first_q)
        qb += [b] * n_q
        qp += range(first_q - (length - sq), stop - (length - sq))
        kb += [b] * (stop - start)
        kp += range(start, stop)
        lq.append(n_q)
        lk.append(stop - start)
    device = mask.device
    found = _Unpadded(*(torch.tensor(x, dtype=torch.long, device=device) for x in (qb, qp, kb, kp)),
                      _cu(lq, device), _cu(lk, device), max(lq, default=0), max(lk, default=0))
    _LAST_MASK[:] = [(mask, sq, sk, found)]
    return found


def _packed(position_ids: Any, b: int, sq: int) -> list[int] | None:
    """The lengths of the sequences packed in one row, as transformers reads them from `position_ids`
    (a sequence starts where the position is the row's minimum), or None when the row is one sequence."""
    if b != 1 or sq < 2 or not isinstance(position_ids, torch.Tensor) or position_ids.numel() != sq:
        return None
    pos = position_ids.reshape(-1)
    if bool((pos[1:] - pos[:-1] == 1).all()):
        return None
    starts = [*(pos == pos.min()).nonzero().flatten().tolist(), sq]
    return [e - s for s, e in itertools.pairwise(starts)]


def _longest(cu: torch.Tensor, given: Any) -> int:
    """`given` (the caller's max length), else the longest sequence of `cu` (read on the host)."""
    return int(given) if given is not None else int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0


def _attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
               sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over `flash_attn_varlen` / `flash_attn_with_kvcache`.

    `query` ``[B, Hq, Sq, D]``, `key`/`value` ``[B, Hkv, Sk, D]`` (the cache included), `attention_mask` None
    or the ``[B, L]`` padding mask (``AttentionMaskInterface``'s flash-attention mask). Returns
    ``([B, Sq, Hq, D], None)``; a padding query row is 0.

    Raises:
        ValueError: `dropout` > 0 (call ``model.eval()``), a mask that is not 2-D, more queries than keys.
    """
    if dropout:
        raise ValueError(f"infiniops attention: dropout={dropout}, but the operators have no dropout: call "
                         "model.eval() before running a kernelized model")
    b, hq, sq, d = query.shape
    hkv, sk = key.shape[1], key.shape[2]
    if sq > sk:
        raise ValueError(f"infiniops attention: {sq} queries but only {sk} keys")
    causal = bool(module.is_causal if is_causal is None else is_causal)
    window = (-1, -1) if not sliding_window else (int(sliding_window) - 1, 0 if causal else int(sliding_window) - 1)
    options = {"softmax_scale": scaling, "causal": causal, "window_size": window, "softcap": float(softcap or 0.0)}
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, S, H, D] views
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"infiniops attention: expected a 2-D padding mask, got shape {list(attention_mask.shape)}")
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is not None and cu_k is not None:  # packed sequences described by the caller (padding-free batches)
        max_q, max_k = (kwargs.get(n) for n in ("max_length_q", "max_length_k"))
        out = flash_attn_varlen(q.reshape(b * sq, hq, d), k.reshape(b * sk, hkv, d), v.reshape(b * sk, hkv, d),
                                cu_q.to(torch.int32), cu_k.to(torch.int32), _longest(cu_q, max_q),
                                _longest(cu_k, max_k), **options)
        return out.view(b, sq, hq, d), None
    if attention_mask is None and sq < sk:  # decode over transformers' cache: a view, no copy
        seqlens = torch.full((b,), sk, dtype=torch.int32, device=query.device)
        return flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, **options), None
    if attention_mask is None:  # prefill: each row one sequence, or the sequences packed in one row
        rows = _packed(kwargs.get("position_ids"), b, sq) or [sq] * b
        cu = _cu(rows, query.device)
        out = flash_attn_varlen(q.reshape(b * sq, hq, d), k.reshape(b * sk, hkv, d), v.reshape(b * sk, hkv, d),
                                cu, cu, max(rows), max(rows), **options)
        return out.view(b, sq, hq, d), None
    u = _unpad(attention_mask, sq, sk)
    found = flash_attn_varlen(q[u.q_batch, u.q_pos], k[u.k_batch, u.k_pos], v[u.k_batch, u.k_pos], u.cu_q, u.cu_k,
                              u.max_q, u.max_k, **options)
    out = query.new_zeros(b, sq, hq, d)
    out[u.q_batch, u.q_pos] = found
    return out, None
