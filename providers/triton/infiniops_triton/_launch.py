"""Autotuned kernels launched at the cost of a plain kernel once their configuration is chosen.

`triton.autotune`'s wrapper rebuilds a dict of every argument and a key with a ``hasattr`` per argument on
each call, several times the cost of the plain launch (benchmarks/RESULTS.md). `Tuned` asks the autotuner once
per key the launcher computes (the autotuner's own key: its key arguments and the operands' dtypes), keeps the
configuration it chose, and from then on launches the kernel under the autotuner (its heuristics included)
with that configuration through `infiniops_triton._fastlaunch.Launcher` (Triton's own binding skipped too).

Only for autotuned kernels whose configurations have no ``pre_hook`` (the hook would be skipped) and whose
``restore_value`` only matters while timing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from triton.runtime.autotuner import Autotuner

from infiniops_triton._fastlaunch import Launcher

__all__ = ["Tuned"]


class Tuned:
    """An autotuned kernel, tuned once per launcher key, then launched with the chosen configuration."""

    __slots__ = ("_chosen", "_inner", "_tuned")

    def __init__(self, tuned: Autotuner) -> None:
        if any(c.pre_hook is not None for c in tuned.configs):
            raise ValueError(f"{tuned.base_fn.__name__}: Tuned cannot skip a configuration's pre_hook")
        self._tuned = tuned
        self._inner = Launcher(tuned.fn)  # the heuristics or the jitted kernel under the autotuner
        self._chosen: dict[Hashable, dict[str, Any]] = {}

    def launch(self, key: Hashable, grid: Callable[[dict[str, Any]], tuple[int, ...]] | tuple[int, ...],
               *args: Any, **kwargs: Any) -> None:
        """Launch on `grid`; `key` must determine the autotuner's key (its key arguments and dtypes).

        A callable `grid` may read only the configuration's keywords (its block sizes): once the configuration is
        chosen it is called with those alone, not with the dict of every bound argument Triton builds."""
        config = self._chosen.get(key)
        if config is None:
            self._tuned[grid](*args, **kwargs)
            self._chosen[key] = self._tuned.best_config.all_kwargs()
            return
        self._inner(grid(config) if callable(grid) else grid, *args, **kwargs, **config)
