"""`kernelize`: check the model, gate every problem its swaps need, then swap (restoring earlier swaps first)."""

from __future__ import annotations

from typing import TypeVar

import torch

from infiniops_py import GateError, resolve_closure
from infiniops_py.integrations.transformers._attention import ATTENTION, register
from infiniops_py.integrations.transformers._families import FAMILIES
from infiniops_py.integrations.transformers._memo import forget
from infiniops_py.integrations.transformers._plan import SWITCHES, make_plan
from infiniops_py.integrations.transformers._report import Kernelized
from infiniops_py.integrations.transformers._swaps import swap_forward

__all__ = ["kernelize"]

M = TypeVar("M", bound=torch.nn.Module)


def kernelize(model: M, *, device: str | torch.device | None = None, mode: str = "inference",
              rms_norm: bool = True, fused_add_rms_norm: bool = True, attention: bool = True, rope: bool = True,
              swiglu: bool = True) -> M:
    """Swap `model`'s norms, fusable residual adds, attention, RoPE and SiLU-gated MLPs for InfiniOps-Py
    operators, in place, and return `model` (as HF ``kernels.kernelize`` does). A swapped MLP's
    ``gate_proj``/``up_proj`` weights (and biases) become the two halves of one packed tensor, allocated once
    (the parameters keep their identity and values; the packing stays after ``restore()``).

    Args:
        model: a transformers model (``PreTrainedModel``) of a family in `FAMILIES` (its ``config.model_type``).
        device: the device whose providers the gates check: a str (``"cuda"``, ``"cuda:1"``: its type counts)
            or a ``torch.device``; default: the device of the model's first parameter.
        mode: ``"inference"``, the only mode: no operator has a backward.
        rms_norm, fused_add_rms_norm, attention, rope, swiglu: which swaps to make (Liger-Kernel's
            ``apply_liger_kernel_to_<family>`` switches): the RMSNorms (Qwen3's q/k norms too) by `rms_norm`;
            each decoder layer's attention residual add and post-attention norm by `fused_add_rms_norm`; the
            attention implementation ``"infiniops"`` (flash attention); RoPE by `rotary_embedding`; the SiLU-gated
            MLP by one gate|up projection and `silu_and_mul`. Each is independent of the others.

    Returns:
        `model`. The `Kernelized` report is ``model.infiniops_kernelized`` (and the first lines of ``repr(model)``);
        its ``restore()`` undoes the swaps. Kernelizing a model again restores the previous swaps first (once the
        new gates pass).

    Raises:
        ValueError: `mode` other than ``"inference"``, or a ``model_type`` with no entry in `FAMILIES`
            (the message lists the supported ones).
        TypeError: `model` is not a ``torch.nn.Module`` with a ``config``, `device` is neither a str, a
            ``torch.device`` nor None, or a switch is not a bool.
        GateError: some operator problem the swaps need has no provider on `device`: one error lists them
            all, and nothing is swapped.
    """
    if mode != "inference":
        raise ValueError(f"kernelize(mode={mode!r}): only mode='inference' is supported (the InfiniOps-Py "
                         "operators have no backward, so training through them is impossible)")
    switches = {"rms_norm": rms_norm, "fused_add_rms_norm": fused_add_rms_norm, "attention": attention,
                "rope": rope, "swiglu": swiglu}
    for name, on in switches.items():
        if not isinstance(on, bool):
            raise TypeError(f"kernelize({name}={on!r}): expected True or False")
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
    kinds = frozenset(kind for name, on in switches.items() if on for kind in SWITCHES[name])
    plan = make_plan(model, family, device_type, kinds)
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
    report = Kernelized(model_type, device_type, left=[*plan.left, *family.left], chosen=chosen,
                        off=[name for name, on in switches.items() if not on])
    for prepare in plan.prepare:
        prepare()
    for kind, name, module, forward in plan.swaps:
        swap_forward(report, module, forward)
        report.swapped.setdefault(kind, []).append(name)
    if plan.attention:
        set_attention(report, model)
        report.swapped["attention"] = plan.attention
    report._undo.append(model.register_forward_pre_hook(forget).remove)
    _show(report, model)
    return model


def set_attention(report: Kernelized, model: torch.nn.Module) -> None:
    """Make `ATTENTION` `model`'s attention implementation (registered again, should another registration have
    replaced it), and add to `report` the undo that sets the previous one."""
    register()
    previous = model.config._attn_implementation  # type: ignore[union-attr]
    model.set_attn_implementation(ATTENTION)  # type: ignore[operator]
    report._undo.append(lambda: model.set_attn_implementation(previous))  # type: ignore[operator]


def _show(report: Kernelized, model: torch.nn.Module) -> None:
    """Put the report on ``model.infiniops_kernelized`` and at the top of ``repr(model)`` (the instance's
    ``extra_repr``), with the undo of both."""
    had = model.__dict__.get("extra_repr")
    own = model.extra_repr

    def extra_repr() -> str:
        return "\n".join(line for line in (own(), report.render()) if line)

    model.extra_repr = extra_repr  # type: ignore[method-assign]
    model.infiniops_kernelized = report

    def undo() -> None:
        model.__dict__.pop("infiniops_kernelized", None)
        if had is None:
            model.__dict__.pop("extra_repr", None)
        else:
            model.extra_repr = had  # type: ignore[method-assign]

    report._undo.insert(0, undo)


def _device_type(model: torch.nn.Module, device: str | torch.device | None) -> str:
    """The device type of `device` (``"cuda:1"`` -> ``"cuda"``), or of `model`'s first parameter when None
    (``"cpu"`` for a model without parameters).

    Raises:
        ValueError: a str with no device type. TypeError: `device` of another type.
    """
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
