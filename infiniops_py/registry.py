"""Implementations and providers as the registry holds them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from infiniops_py.capability import Capability

__all__ = ["Implementation", "Provider"]


@dataclass(frozen=True, eq=False)
class Implementation:
    """One provider's implementation of one operator.

    Attributes:
        op: the operator's public name (``rms_norm``).
        provider: the provider's name (``triton``).
        name: a name unique within the provider (``triton.rms_norm``), shown in traces and the matrix.
        capability: what it serves.
        priority: higher wins among the implementations that accept a problem.
        fn: the callable, with the operator's implementation calling convention (see its module).
    """

    op: str
    provider: str
    name: str
    capability: Capability
    priority: int
    fn: Callable[..., Any]

    def __repr__(self) -> str:
        return f"<Implementation {self.name} for {self.op}, priority {self.priority}>"


@dataclass
class Provider:
    """A provider plugin: its name, version, where it came from, and what it implements or why it failed.

    `api_version` is the provider API (``infiniops_py.hookspecs.PROVIDER_API``) the plugin was built for;
    discovery refuses a plugin that declares another one. None (not declared) is accepted.
    """

    name: str
    version: str = ""
    source: str = ""
    implementations: Sequence[Implementation] = field(default_factory=list)
    error: str = ""
    api_version: int | None = None

    @property
    def loaded(self) -> bool:
        return not self.error
