"""Provider plugins built in the test process, registered by hand and removed afterwards."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import infiniops_py as io
from infiniops_py import Capability, Implementation, OneOf, Provider, hookimpl


def correct_add(input: torch.Tensor, other: torch.Tensor, alpha: float, out: torch.Tensor) -> torch.Tensor:
    """A correct `add` implementation (the operator's calling convention)."""
    return torch.add(input, other, alpha=alpha, out=out)


def cpu_capability(*more: Any, dtypes: tuple[str, ...] = ("float32",)) -> Capability:
    return Capability(OneOf("device_type", ("cpu",)), OneOf("dtype", dtypes), *more)


class _Plugin:
    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    @hookimpl
    def infiniops_provider(self) -> Provider:
        return self.provider


@contextmanager
def registered(*providers: tuple[str, list[tuple[str, Capability, int, Callable[..., Any]]]]) -> Iterator[None]:
    """Register providers given as ``(name, [(op, capability, priority, fn), ...])`` for the block."""
    names = []
    try:
        for name, impls in providers:
            made = [Implementation(op, name, f"{name}.{op}.{n}", cap, prio, fn)
                    for n, (op, cap, prio, fn) in enumerate(impls)]
            io.register_provider(_Plugin(Provider(name=name, version="0", implementations=made)), name=name)
            names.append(name)
        yield
    finally:
        for name in names:
            io.unregister_provider(name)


def fresh_env(**extra: str) -> dict[str, str]:
    """The environment for a subprocess: no ``INFINIOPS_*`` or Triton interpreter settings, plus `extra`."""
    import os

    env = {k: v for k, v in os.environ.items()
           if not k.startswith("INFINIOPS_") and k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS")}
    env.update(extra)
    return env


def timed_gemm(delay: float = 0.0, calls: list[str] | None = None, name: str = "") -> Callable[..., Any]:
    """A correct `gemm` implementation (a @ b into `out`, the last argument) that sleeps `delay` seconds and
    appends `name` to `calls` on each call: a provider whose time a tuning test controls."""

    def fn(a: torch.Tensor, b: torch.Tensor, *rest: Any, **kwargs: Any) -> torch.Tensor:
        if calls is not None:
            calls.append(name)
        if delay:
            time.sleep(delay)
        return torch.matmul(a, b, out=rest[-1] if rest else kwargs["out"])

    return fn


def isolate_tuning(monkeypatch: Any, cache: Path, *unset: str) -> None:
    """Give a test its own tuning cache folder `cache` and none of the INFINIOPS_* settings that steer tuning
    (nor the variables in `unset`), and forget which tuning files were already warned about."""
    from infiniops_py.tuning import store

    for name in ("INFINIOPS_TUNING", "INFINIOPS_PRIORITY", "INFINIOPS_STRICT", "INFINIOPS_TRACE_CALLS", *unset):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INFINIOPS_CACHE", str(cache))
    store._WARNED.clear()


def plant_not_a_file(path: Path, kind: str) -> None:
    """Make `path` something that is not a regular file: ``"fifo"`` (a named pipe), ``"directory"``, or else a
    symlink to ``/dev/zero``."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to("/dev/zero")
