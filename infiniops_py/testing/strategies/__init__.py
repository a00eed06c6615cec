"""Hypothesis strategies per operator family; `STRATEGIES` maps each operator name to its case builder."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Final

from infiniops_py.testing.case import Case, CaseContext

__all__ = ["STRATEGIES"]

_FAMILIES: Final = ("gemm", "add", "rms_norm", "fused_qk_norm", "paged_cache", "flash_attn", "causal_conv1d",
                    "selective_scan")


def _collect() -> dict[str, Callable[[CaseContext], Case]]:
    out: dict[str, Callable[[CaseContext], Case]] = {}
    for family in _FAMILIES:
        out.update(importlib.import_module(f"infiniops_py.testing.strategies.{family}").STRATEGIES)
    return out


STRATEGIES: Final = _collect()
