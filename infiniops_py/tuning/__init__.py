"""Measured resolution: time every implementation that accepts a problem bucket, persist the times, rank by them.

- `infiniops_py.tuning.store`: `Measurement`, the `TuningTable` the resolver ranks by, the machine's fingerprint,
  the cache file and shipped files (``INFINIOPS_TUNING``).
- `infiniops_py.tuning.ranking`: the measured order (fastest first, a tie inside the noise margin to priority).
- `infiniops_py.tuning.timer`: one call's median time (CUDA events, or ``perf_counter`` on the CPU).
- `infiniops_py.tuning.capture`: recording the implementation calls that code makes.
- `infiniops_py.tuning.inputs`: synthetic inputs of a bucket's representative size.
- `infiniops_py.tuning.tuner`: `tune_calls` (recorded calls) and `tune_problem` (synthetic inputs).

Two layers in one package. `store`, `ranking` and `timer` sit below the resolver (which imports them) and are
imported with the package; `capture`, `inputs` and `tuner` call the operators and the runtime, so they sit above
the operators: the package's names from them (`recording`, `tune_calls`, ...) load on first use (`__getattr__`),
never while the resolver is being imported.
"""

from __future__ import annotations

import importlib
from typing import Any, Final

from infiniops_py.tuning.ranking import NOISE_MARGIN, measured_order
from infiniops_py.tuning.store import Measurement, TuningFileError, TuningTable, cache_dir, fingerprint
from infiniops_py.tuning.timer import CaptureError, measure

__all__ = [
    "NOISE_MARGIN",
    "CaptureError",
    "CapturedCall",
    "Measurement",
    "TuneReport",
    "TuneResult",
    "TuningFileError",
    "TuningTable",
    "cache_dir",
    "candidates",
    "fingerprint",
    "measure",
    "measured_order",
    "recording",
    "tune_calls",
    "tune_problem",
]

_ABOVE_THE_OPERATORS: Final[dict[str, str]] = {
    "CapturedCall": "capture", "recording": "capture", "TuneReport": "tuner", "TuneResult": "tuner",
    "candidates": "tuner", "tune_calls": "tuner", "tune_problem": "tuner",
}


def __getattr__(name: str) -> Any:
    """The names of `capture` and `tuner`, imported on first use (PEP 562)."""
    module = _ABOVE_THE_OPERATORS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
