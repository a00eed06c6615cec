"""Measured resolution: time every implementation that accepts a problem bucket, persist the times, rank by them.

- `infiniops_py.tuning.store`: `Measurement`, the `TuningTable` the resolver ranks by, the machine's fingerprint,
  the cache file and shipped files (``INFINIOPS_TUNING``).
- `infiniops_py.tuning.ranking`: the measured order (fastest first, a tie inside the noise margin to priority).
- `infiniops_py.tuning.timer`: one call's median time (CUDA events, or ``perf_counter`` on the CPU).
- `infiniops_py.tuning.capture`: recording the implementation calls that code makes.
- `infiniops_py.tuning.inputs`: synthetic inputs of a bucket's representative size.
- `infiniops_py.tuning.tuner`: `tune_calls` (recorded calls) and `tune_problem` (synthetic inputs).

Nothing here imports the runtime at import time (the resolver imports this package).
"""

from __future__ import annotations

from infiniops_py.tuning.capture import CapturedCall, recording
from infiniops_py.tuning.ranking import NOISE_MARGIN, measured_order
from infiniops_py.tuning.store import Measurement, TuningFileError, TuningTable, cache_dir, fingerprint
from infiniops_py.tuning.timer import CaptureError, measure
from infiniops_py.tuning.tuner import TuneReport, TuneResult, candidates, tune_calls, tune_problem

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
