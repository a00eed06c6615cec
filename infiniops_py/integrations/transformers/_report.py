"""The report of one `kernelize` call (`Kernelized`): what was swapped, what was left, how to undo it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from infiniops_py import Implementation, Problem

__all__ = ["Kernelized"]


@dataclass
class Kernelized:
    """What `kernelize` did to one model.

    Attributes:
        model_type: the config's ``model_type``.
        device_type: the device type the gates were resolved for.
        swapped: kind (``rms_norm``, ``qk_norm``, ``fused_add_rms_norm``, ``attention``, ``rope``,
            ``gated_mlp``, ``layer``: a decoder layer run as one forward over its swapped parts) -> the qualified
            names of the modules swapped.
        left: what still runs in transformers' code, and why.
        chosen: each operator problem gated -> the implementation that serves it.
        off: the switches of `kernelize` turned off.
    """

    model_type: str
    device_type: str
    swapped: dict[str, list[str]] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)
    chosen: dict[Problem, Implementation] = field(default_factory=dict, repr=False)
    off: list[str] = field(default_factory=list)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def restore(self) -> None:
        """Put back every forward and the attention implementation that `kernelize` replaced. The parameters
        are the model's own throughout (the same objects, values and ``state_dict``); a gated MLP's
        ``gate_proj``/``up_proj`` weights stay views of their packed tensor."""
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
               "attention": ("flash_attn_varlen", "flash_attn_with_kvcache"), "rope": ("rotary_embedding",),
               "gated_mlp": ("silu_and_mul",), "layer": ("fused_qk_norm_rope",)}
        lines = [f"kernelized {self.model_type} for {self.device_type}:"]
        for kind, names in self.swapped.items():
            by = ", ".join(f"{op} by {'+'.join(providers.get(op, ['?']))}" for op in ops[kind]
                           if kind != "layer" or op in providers)  # a layer without q/k norms uses none of its own
            lines.append(f"  {kind}: {len(names)} module(s)" + (f" ({by})" if by else " (one forward of the parts)"))
        if self.off:
            lines.append(f"  off: {', '.join(self.off)}")
        lines.extend(f"  left: {why}" for why in self.left)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()
