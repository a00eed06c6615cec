"""Where the time of one engine call goes: host wall time against device busy time, top kernels, host syncs.

`profile_summary` runs a callable once under ``torch.profiler`` (CPU and CUDA activities) and returns a
short markdown report for the GPU benchmarks:

- wall time on the host (from the call to a device synchronize), device busy time (the union of kernel,
  copy and memset intervals) and the device idle time within the wall; idle time is host overhead or a
  host sync, since the device waits for work;
- the kernel count, and the host calls that block on the device (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, blocking ``cudaMemcpy``, ``aten::_local_scalar_dense`` from ``.item()``);
- the top kernels by total device time, and the top host operations by self CPU time.

The profiler adds host overhead of its own (a few microseconds per recorded op): compare the wall time
with an unprofiled measurement.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

__all__ = ["profile_summary"]

_BLOCKING = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
             "cuStreamSynchronize", "cuCtxSynchronize", "aten::_local_scalar_dense", "aten::nonzero")


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (microseconds)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def profile_summary(fn: Callable[[], object], device: torch.device, *, top: int = 15, title: str = "") -> str:
    """Run `fn` once under the profiler; a markdown report of where its time went (see the module docstring).

    On a device other than CUDA only the host side is reported.
    """
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    sync()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        fn()
        sync()
        wall_us = (time.perf_counter() - start) * 1e6
    events = list(prof.events())
    device_events = [e for e in events if e.device_type == DeviceType.CUDA]
    kernels: dict[str, list[float]] = defaultdict(list)
    for e in device_events:
        kernels[e.name].append(e.time_range.end - e.time_range.start)
    busy = _busy_us([(e.time_range.start, e.time_range.end) for e in device_events])
    host = [e for e in events if e.device_type == DeviceType.CPU]
    blocking: dict[str, int] = defaultdict(int)
    for e in host:
        if e.name in _BLOCKING:
            blocking[e.name] += 1
    lines = [f"#### {title or 'profile'}", ""]
    if cuda:
        lines.append(f"host wall {wall_us / 1e3:.2f} ms; device busy {busy / 1e3:.2f} ms "
                     f"({busy / wall_us:.0%} of the wall), idle {max(0.0, wall_us - busy) / 1e3:.2f} ms; "
                     f"{len(device_events)} device events ({len(kernels)} distinct kernels)")
    else:
        lines.append(f"host wall {wall_us / 1e3:.2f} ms (on {device.type}: host only, no device timeline)")
    lines.append("blocking host calls: " + (", ".join(f"{k} x{v}" for k, v in sorted(blocking.items())) or "none"))
    if kernels:
        lines += ["", f"| top {top} kernels by device time | calls | total (ms) | share of busy |", "|---|---|---|---|"]
        ranked = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:top]
        for name, times in ranked:
            lines.append(f"| `{name[:90]}` | {len(times)} | {sum(times) / 1e3:.3f} | {sum(times) / busy:.1%} |")
    self_cpu: dict[str, list[float]] = defaultdict(list)
    for e in host:
        self_cpu[e.name].append(e.self_cpu_time_total)
    lines += ["", "| top 10 host ops by self CPU time | calls | self (ms) |", "|---|---|---|"]
    for name, times in sorted(self_cpu.items(), key=lambda kv: -sum(kv[1]))[:10]:
        lines.append(f"| `{name[:90]}` | {len(times)} | {sum(times) / 1e3:.3f} |")
    return "\n".join(lines)
