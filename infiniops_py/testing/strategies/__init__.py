"""Hypothesis strategies per operator; `STRATEGIES` maps each operator name to its case builder.

One module per family of ``infiniops_py.operators.FAMILIES``, named the same, each exporting its ``STRATEGIES``;
`strategy` also serves an operator that has none from its declaration's ``sample_inputs`` (`sampled_case`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Final

from hypothesis import strategies as st

from infiniops_py.operators import FAMILIES, OPERATORS
from infiniops_py.testing.case import Case, CaseContext

__all__ = ["STRATEGIES", "sampled_case", "strategy"]


def _collect() -> dict[str, Callable[[CaseContext], Case]]:
    """The ``STRATEGIES`` of the strategy module of each family that has one."""
    out: dict[str, Callable[[CaseContext], Case]] = {}
    for family in FAMILIES:
        name = f"{__name__}.{family}"
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:
                raise
            continue  # its operators' cases come from their declarations (`sampled_case`)
        out.update(module.STRATEGIES)
    return out


STRATEGIES: Final = _collect()


def sampled_case(ctx: CaseContext) -> Case:
    """A case from the declaration's ``sample_inputs``: each size of ``sizes`` drawn from its values, each bool
    field drawn (mostly among the values the implementation declares), the other fields at their defaults,
    random values from the case's generator; the arguments the declaration ``mutates`` are compared after the
    call."""
    spec: Any = ctx.spec
    values = {name: ctx.pick(name, (False, True)) if isinstance(default, bool) else default
              for name, default in spec.fields.items()}
    sizes = {name: ctx.record(name, ctx.draw(st.sampled_from(drawn))) for name, drawn in spec.sizes.items()}
    args, kwargs = spec.sample_inputs({**values, **sizes}, ctx.dtype, ctx.device, ctx.generator())
    mutated = tuple(name for name in spec.mutates if name in kwargs)
    return Case(tuple(args), dict(kwargs), mutated=mutated, note=", ".join(f"{k}={v}" for k, v in sizes.items()))


def strategy(op: str) -> Callable[[CaseContext], Case] | None:
    """The case builder of `op`: its family's strategy, else `sampled_case` when its declaration has
    ``sample_inputs``, else None."""
    found = STRATEGIES.get(op)
    if found is None and getattr(OPERATORS.get(op), "sample_inputs", None) is not None:
        return sampled_case
    return found
