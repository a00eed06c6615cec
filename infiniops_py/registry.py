"""Implementations and providers as the registry holds them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from infiniops_py.capability import Capability

__all__ = ["Implementation", "Provider", "provider_from_modules"]


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
        graph_safe: whether its calls can be captured in a CUDA graph (no host synchronization, and no library
            call or allocation that stream capture forbids). The tuner times only graph-safe implementations,
            so a measured ranking never puts one that cannot be captured ahead of one that can (an engine's
            CUDA graphs would then fail to capture); the others serve in priority order.
    """

    op: str
    provider: str
    name: str
    capability: Capability
    priority: int
    fn: Callable[..., Any]
    graph_safe: bool = True

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


def provider_from_modules(name: str, package: str, modules: Sequence[str], *, api_version: int,
                          distribution: str | None = None) -> Provider:
    """The `Provider` named `name` holding the ``IMPLEMENTATIONS`` of each module `package`.`m` of `modules`.

    The modules are imported in the order given (the provider's own list: a family it has no module for is
    just not served) and their implementations kept in that order. The version is the installed version of the
    distribution `distribution` (``infiniops-provider-<name>`` when None), ``0+unknown`` when it is not
    installed (a source checkout on ``sys.path``). `api_version` is the provider API the plugin was built for
    (``Provider.api_version``); it is never defaulted to the framework's current one, so that an old plugin
    cannot claim a newer API. Whatever a module's import raises propagates (`ModuleNotFoundError` for a module
    that does not exist, `AttributeError` for one without ``IMPLEMENTATIONS``): plugin discovery then records
    the provider as a failed one.
    """
    impls = [impl for m in modules for impl in importlib.import_module(f"{package}.{m}").IMPLEMENTATIONS]
    try:
        ver = version(distribution or f"infiniops-provider-{name}")
    except PackageNotFoundError:
        ver = "0+unknown"
    return Provider(name=name, version=ver, implementations=impls, api_version=api_version)
