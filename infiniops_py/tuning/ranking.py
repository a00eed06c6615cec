"""Measured ranking: the accepting implementations of one problem bucket, fastest first.

Two times closer than `NOISE_MARGIN` (relative to the faster one) are a tie: the higher priority wins it (then
the earlier in the priority order). An implementation with no time (not timed, or failed when timed) is not
ranked here: the resolver keeps it after the measured ones, in priority order. The last-resort ``reference``
provider is never ranked by time (it is the oracle, not a contender), nor is an implementation that is not
``graph_safe`` (a measured choice of it would break an engine's CUDA graphs).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Final

from infiniops_py.registry import Implementation
from infiniops_py.tuning.store import Measurement

__all__ = ["NOISE_MARGIN", "format_time", "measured_order", "why_chosen"]

NOISE_MARGIN: Final = 0.05
_REFERENCE: Final = "reference"


def measured_order(impls: Sequence[Implementation], accepted: Collection[str], measurement: Measurement,
                   margin: float = NOISE_MARGIN) -> list[Implementation]:
    """The implementations of `impls` (in priority order) named in `accepted` and timed in `measurement`,
    fastest first; ties inside `margin` go to the higher priority, then to the one earlier in `impls`."""
    times = measurement.times
    place = {impl.name: n for n, impl in enumerate(impls)}
    left = [i for i in impls if i.name in accepted and i.name in times and i.provider != _REFERENCE
            and i.graph_safe]  # a time of one that cannot be captured (an older file's) is not used either
    order: list[Implementation] = []
    while left:
        best = min(times[i.name] for i in left)
        tied = [i for i in left if times[i.name] <= best * (1 + margin)]
        pick = max(tied, key=lambda i: (i.priority, -place[i.name]))
        order.append(pick)
        left.remove(pick)
    return order


def format_time(seconds: float) -> str:
    """``31 us``, ``4.2 us``, ``1.25 ms``: a time per call as explain prints it."""
    us = seconds * 1e6
    if us >= 1000:
        return f"{us / 1000:.3g} ms"
    return f"{us:.0f} us" if us >= 10 else f"{us:.2g} us"


def why_chosen(chosen: Implementation, order: Sequence[Implementation], measurement: Measurement,
               margin: float = NOISE_MARGIN) -> str:
    """Why `chosen`, the first of the measured `order`, won: the fastest, or a tie inside the margin that its
    priority broke (naming the faster one and both times)."""
    times = measurement.times
    faster = min(order, key=lambda i: times[i.name])
    if faster is chosen or times[faster.name] == times[chosen.name]:
        runner_up = next((i for i in order if i is not chosen), None)
        if runner_up is None:
            return f"{chosen.name} is the only one measured that accepts the problem"
        return f"{chosen.name} is the fastest measured ({format_time(times[chosen.name])}, next {runner_up.name} " \
               f"{format_time(times[runner_up.name])})"
    rank = (f"has the higher priority ({chosen.priority} > {faster.priority})" if chosen.priority > faster.priority
            else f"comes first in the priority order (both {chosen.priority})")
    return (f"{chosen.name} ({format_time(times[chosen.name])}) is within {margin:.0%} of {faster.name} "
            f"({format_time(times[faster.name])}), a tie inside the noise margin, and {rank}")
