"""The CPU engine's intra-op thread count: calibrated on the engine's own decode step, unless the user chose one.

A decode step's matmuls are small (one row per sequence): on a machine whose cores are busy, torch's default
of one OpenMP thread per core made the demo model decode at 7.4 tok/s against 226 tok/s with one thread
(issue #24), since every operator waits for all its threads. So a CPU engine times its decode step (padding
rows at batch 1 and at the largest decode batch it runs, as the warm-up and the decode graphs run them) with
one thread and with torch's default count, and keeps torch's count only where it is at least `MARGIN` faster
(threads also lose more to a loaded machine than a few timed steps show). A calibration, not a rule from the
model's sizes: whether threads pay depends on the machine's cores and load, which no size rule sees. It
takes a few steps of each kind; a step slower than `SLOW_S` ends a timing: at one thread, torch's count is kept
(a model that large gains from threads); at torch's count, one thread wins.

The engine applies its count inside its own calls only (`using_threads`, which restores the caller's count:
switching costs well under a microsecond), so the process's own count stays the user's. An explicit choice is
respected and never measured: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment, or a count other
than torch's default (one thread per physical core), which only ``torch.set_num_threads`` gives.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import torch

__all__ = ["MARGIN", "SLOW_S", "calibrate_threads", "default_threads", "explicit_threads", "using_threads"]

MARGIN: Final = 1.25  # torch's count must be this much faster than one thread to be kept
SLOW_S: Final = 0.25  # a decode step slower than this ends the calibration (keep torch's count)
_REPEATS: Final = 5


def default_threads() -> int:
    """torch's default intra-op thread count: one per physical core (``/proc/cpuinfo``'s distinct physical and
    core ids), else ``os.cpu_count()``."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    cores: set[tuple[str, str]] = set()
    physical = "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            physical = value.strip()
        elif key.strip() == "core id":
            cores.add((physical, value.strip()))
    return len(cores) or os.cpu_count() or 1


def explicit_threads() -> str | None:
    """What makes the current thread count the user's (see the module doc), or None when it is torch's default."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(name, "").strip():
            return f"{name}={os.environ[name].strip()}"
    current, default = torch.get_num_threads(), default_threads()
    if current != default:
        return f"torch.set_num_threads({current}), not torch's default of {default}"
    return None


@contextlib.contextmanager
def using_threads(threads: int | None) -> Iterator[None]:
    """Run the block at `threads` intra-op threads (None: the current count), then restore the caller's."""
    previous = torch.get_num_threads()
    if threads is None or threads == previous:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _median_step_s(step: Callable[[], object], threads: int) -> float | None:
    """The median time of `step` at `threads` threads; None when one step exceeds `SLOW_S`."""
    with using_threads(threads):
        step()  # warm: allocations, first-call set-up
        times = []
        for _ in range(_REPEATS):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
            if times[-1] > SLOW_S:
                return None
    return statistics.median(times)


def calibrate_threads(step: Callable[[], object]) -> tuple[int | None, str]:
    """The thread count for a CPU engine whose decode step is `step` (None: keep the caller's), and the status
    line that says what was chosen and why."""
    current = torch.get_num_threads()
    reason = explicit_threads()
    if reason is not None:
        return None, f"cpu threads: {current} (the user's: {reason})"
    if current <= 1:
        return None, "cpu threads: 1 (one core)"
    one = _median_step_s(step, 1)
    if one is None:
        return None, f"cpu threads: {current} (torch's default: a decode step takes over {SLOW_S * 1e3:.0f} ms)"
    many = _median_step_s(step, current)
    chosen = current if many is not None and many * MARGIN <= one else 1
    at_many = f"over {SLOW_S * 1e3:.0f}" if many is None else f"{many * 1e3:.2f}"
    return chosen, (f"cpu threads: {chosen} (calibrated: decode step {one * 1e3:.2f} ms at 1 thread, {at_many} ms "
                    f"at {current})")
