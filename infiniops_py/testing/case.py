"""What a strategy draws: one call of a public operator, ready to run and to check.

A strategy module per operator family (``infiniops_py/testing/strategies/<family>.py``) exports
``STRATEGIES: dict[str, Callable[[CaseContext], Case]]`` keyed by operator name. Each function
draws fresh random inputs (never zeros) on ``ctx.device`` in ``ctx.dtype`` and returns a `Case`.

It draws shape fields (head dims, block sizes, widths, flags) with ``ctx.pick(field, universe)``: the
values the implementation under test declares, and now and then one from the rest of the contract's
universe, so that the suite also checks that the resolver gates what the implementation does not declare.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

from infiniops_py.problem import OpSpec
from infiniops_py.registry import Implementation

__all__ = ["Case", "CaseContext", "Draw", "randn"]

Draw = Callable[[st.SearchStrategy[Any]], Any]


@dataclass
class Case:
    """One call: ``function(*args, **kwargs)`` on the device, plus what to compare afterwards.

    Attributes:
        args, kwargs: the public function's arguments (tensors on the device under test).
        mutated: positions (int) or names (str) of arguments updated in place; compared after the call.
            With ``out=`` they are the call's outputs, the only memory it may write: every other argument,
            and every byte around and between the arguments' elements, must come back bit for bit.
        exact: positions in the compared outputs (see `outputs`) that must match bit for bit.
        untouched: parts of outputs that must not change at all, bit for bit: an entry ``(position or name,
            index)`` checks ``argument[index]`` (e.g. the V columns of a packed qkv); a bare position or
            name checks the whole argument.
        note: a short description for failure messages (shapes, flags).
        k: the reduction length K of tolerances with ``atol_per_k`` (Gemm: ``atol + atol_per_k * K``);
            None when the operator has no such tolerance.
        outputs: how to pick the compared tensors from ``(result, args, kwargs)``; None (the default)
            compares the result (a tensor or tuple of tensors, None entries skipped) followed by the
            mutated arguments. `exact` indexes this sequence.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    mutated: tuple[int | str, ...] = ()
    exact: tuple[int, ...] = ()
    untouched: tuple[int | str | tuple[int | str, Any], ...] = ()
    note: str = ""
    k: int | None = None
    outputs: Callable[[Any, tuple[Any, ...], dict[str, Any]], Sequence[torch.Tensor]] | None = None


@dataclass
class CaseContext:
    """What a strategy knows about the run: device, dtype, the implementation's declared limits, the scale.

    `large` asks for GPU-scale cases (the conformance suite sets it on cuda): the GPU acceptance grid
    (head dims 64/128/256, GQA ratios 1/4/8, block sizes 16/256, sequences up to 8192 tokens, hidden sizes
    up to 8192, scans of 4096 steps), with each case's tensors still bounded (about 2**25 elements per input).
    Without it the draws stay CPU-sized (CI time).
    """

    device: torch.device
    dtype: torch.dtype
    spec: OpSpec
    impl: Implementation
    draw: Draw
    explore: float = 0.1  # chance of drawing a field value outside the declared capability
    large: bool = False
    seen: dict[str, Any] = field(default_factory=dict)  # what `pick` and `record` saw, for the report

    def pick(self, name: str, universe: Sequence[Any], favored: Sequence[Any] = ()) -> Any:
        """A value of problem field `name`: mostly one the implementation declares, else any in `universe`.

        On `large` runs, half the declared draws come from the declared values among `favored` (the GPU
        acceptance grid), so that each of them shows up within a few hundred examples.
        """
        declared = [v for v in universe if self.declares(name, v)]
        explore = self.draw(st.floats(0, 1)) < self.explore
        if declared and not explore:
            preferred = [v for v in favored if v in declared] if self.large else []
            if preferred and self.draw(st.booleans()):
                return self.record(name, self.draw(st.sampled_from(preferred)))
            return self.record(name, self.draw(st.sampled_from(declared)))
        return self.record(name, self.draw(st.sampled_from(list(universe))))

    def record(self, name: str, value: Any) -> Any:
        """Note `value` of `name` (a field, or a size such as ``longest_seq``) for the coverage report."""
        self.seen[name] = value
        return value

    def generator(self) -> torch.Generator:
        """A CPU generator seeded by hypothesis, for the case's random tensors."""
        return torch.Generator().manual_seed(self.draw(st.integers(0, 2**31 - 1)))

    def declares(self, name: str, value: Any) -> bool:
        """Whether no static constraint of the implementation on field `name` rejects `value`."""
        if name not in self.spec.fields:
            return True
        problem = self.spec.problem(self.device.type, self.dtype, **{name: value})
        return not any(
            c.reject(problem) for c in self.impl.capability.constraints
            if c.field == name and not c.environmental
        )


def randn(*shape: int, dtype: torch.dtype, device: torch.device, scale: float = 1.0,
          generator: torch.Generator | None = None) -> torch.Tensor:
    """Fresh standard-normal data (drawn in float32 on the CPU, so every device sees the same values)."""
    t = torch.randn(shape, generator=generator, dtype=torch.float32) * scale  # a tuple: 0-D works too
    return t.to(device=device, dtype=dtype)
