"""Operator contracts: one module per operator family.

Each module declares its operators (`Operator`: the problem fields, the forms of the call, the reference, the
sample inputs) and defines their public functions with it (argument checks raising `ContractError`, then
dispatch). `OPERATORS` maps each public entry point's name to its declaration: the families' operators in
family order, then any operator declared outside this package (a provider's own, registered when its module is
imported), by name. `FAMILIES` names the family modules in order (``gemm``, ``add``, ...).

Adding a family is its module plus its name in `FAMILIES` (README, "Add an operator").
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import Final

from infiniops_py.errors import ContractError
from infiniops_py.operators._declare import GIVEN, Operator, Overload, Param, SampleInputs
from infiniops_py.problem import SPECS, OpSpec, Problem

__all__ = ["FAMILIES", "GIVEN", "OPERATORS", "ContractError", "OpSpec", "Operator", "Overload", "Param", "Problem",
           "SampleInputs"]

FAMILIES: Final[tuple[str, ...]] = (  # the registry: one name per family module, in order
    "gemm", "add", "rms_norm", "fused_qk_norm", "paged_cache", "flash_attn", "causal_conv1d", "selective_scan",
    "silu_and_mul", "rotary_embedding", "fused_qk_norm_rope", "gemm_swiglu", "gemm_add_rms_norm", "rms_norm_gemm",
    "all_reduce", "rms_norm_gated", "sampling",
)

_MODULES: Final[tuple[ModuleType, ...]] = tuple(importlib.import_module(f"{__name__}.{f}") for f in FAMILIES)

_FAMILY_ORDER: Final[tuple[str, ...]] = tuple(spec.name for m in _MODULES for spec in m.SPECS)


class _Operators(Mapping[str, OpSpec]):
    """`OPERATORS`: a read-only view of `infiniops_py.problem.SPECS` in family order, then the rest by name."""

    def __getitem__(self, name: str) -> OpSpec:
        return SPECS[name]

    def __iter__(self) -> Iterator[str]:
        yield from _FAMILY_ORDER
        yield from (name for name in SPECS if name not in _FAMILY_ORDER)

    def __len__(self) -> int:
        return len(SPECS)

    def __repr__(self) -> str:
        return f"OPERATORS({list(self)})"


OPERATORS: Final[Mapping[str, OpSpec]] = _Operators()
