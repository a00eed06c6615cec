"""Hypothesis strategies per operator family; `STRATEGIES` maps each operator name to its case builder.

One module per family of ``infiniops_py.operators.FAMILIES``, named the same, each exporting its ``STRATEGIES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Final

from infiniops_py.operators import FAMILIES
from infiniops_py.testing.case import Case, CaseContext

__all__ = ["STRATEGIES"]


def _collect() -> dict[str, Callable[[CaseContext], Case]]:
    out: dict[str, Callable[[CaseContext], Case]] = {}
    for family in FAMILIES:
        out.update(importlib.import_module(f"infiniops_py.testing.strategies.{family}").STRATEGIES)
    return out


STRATEGIES: Final = _collect()
