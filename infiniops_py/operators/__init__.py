"""Operator contracts: one module per operator family.

Each module holds the public function(s) (argument checks raising `ContractError`, then dispatch), the
`OpSpec` naming the problem fields, and the literal PyTorch reference. `OPERATORS` maps each public
entry point's name to its spec.
"""

from __future__ import annotations

from types import ModuleType
from typing import Final

from infiniops_py.operators import add as _add
from infiniops_py.operators._base import ContractError, OpSpec, Problem

__all__ = ["OPERATORS", "ContractError", "OpSpec", "Problem"]

_MODULES: Final[tuple[ModuleType, ...]] = (_add,)

OPERATORS: Final[dict[str, OpSpec]] = {spec.name: spec for m in _MODULES for spec in m.SPECS}
