"""Device memory: what a cache may take, and refusing one that cannot fit before it is allocated.

`memory_budget` is the bytes the KV cache (or the recurrent state pool) may take when the options leave its
size open; `cache_units` sizes it in blocks (rows) from that budget; `check_fits` refuses an allocation
larger than the device's memory, with the bytes it would need (`check_cache_fits` for a cache).
"""

from __future__ import annotations

from pathlib import Path

import torch

from infinilm.config import ConfigError, EngineOptions

__all__ = ["cache_units", "check_cache_fits", "check_fits", "device_memory", "memory_budget"]


def _cpu_memory() -> int | None:
    """Bytes of host memory a process can ever hold on Linux: the cgroup v2 ``memory.max`` when one is set,
    else ``MemTotal + SwapTotal`` of ``/proc/meminfo``; None where neither is readable."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        limit = "max"
    if limit.isdigit():
        return int(limit)
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        return (int(fields["MemTotal"].split()[0]) + int(fields.get("SwapTotal", "0 kB").split()[0])) * 1024
    except (ValueError, OSError, KeyError, IndexError):
        return None


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """``(available, total)`` bytes of memory on `device`, or None when unknown.

    CUDA: ``torch.cuda.mem_get_info`` (free, total), None when CUDA is not available or the device index does
    not exist. CPU (Linux): the memory a process can ever hold (`_cpu_memory`) for both: ``MemAvailable``
    under-reports where the kernel reclaims caches on demand and on VMs whose memory grows as it is used, so
    on CPU only a size that can never fit is refused. None elsewhere.
    """
    if device.type == "cuda":
        index = device.index if device.index is not None else 0
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            return None
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    if device.type == "cpu":
        total = _cpu_memory()
        return None if total is None else (total, total)
    return None


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def check_fits(what: str, needed: int, device: torch.device, *, now: bool, fix: str) -> None:
    """Refuse, before allocating it, `what` (e.g. ``"num_blocks=8: the KV cache"``) of `needed` bytes on `device`.

    `now` False compares with the device's total memory (a size that can never fit, checked before any weight
    is read); True with the memory available at this moment (CUDA: free; CPU: the total, see `device_memory`),
    just before the allocation. Nothing is checked where `device_memory` does not know the memory.

    Raises:
        ConfigError: `needed` exceeds that memory; the message gives both sizes in bytes and `fix`.
    """
    memory = device_memory(device)
    if memory is None:
        return
    limit = memory[0] if now else memory[1]
    if needed > limit:
        kind = "available" if now else "total"
        raise ConfigError(f"{what} needs {needed} bytes ({_size(needed)}), more than the {limit} bytes "
                          f"({_size(limit)}) of {kind} memory on {device}; {fix}")


def memory_budget(options: EngineOptions, device: torch.device) -> int:
    """Bytes a cache sized from memory may take: ``kv_cache_memory``, or on CUDA the free memory above
    ``1 - gpu_memory_utilization`` of the total (read after the weights load)."""
    if device.type != "cuda":
        return options.kv_cache_memory
    free, total = torch.cuda.mem_get_info(device)
    return int(free - total * (1.0 - options.gpu_memory_utilization))


def cache_units(options: EngineOptions, device: torch.device, unit_bytes: int, cap: int) -> int:
    """``options.num_blocks`` when given, else the blocks (rows) of `unit_bytes` each the `memory_budget` holds,
    between 1 and `cap` (more than every sequence at full length needs is never allocated)."""
    if options.num_blocks is not None:
        return options.num_blocks
    return max(1, min(cap, memory_budget(options, device) // unit_bytes))


def check_cache_fits(what: str, units: int, unit_bytes: int, options: EngineOptions, device: torch.device, *,
                     now: bool) -> None:
    """Refuse `what` (``"KV cache"``, ``"state pool"``) of `units` blocks (rows) of `unit_bytes` on `device`,
    through `check_fits`; the message says whether the size was given (``num_blocks``) or sized from memory.

    Raises:
        ConfigError: it does not fit.
    """
    given = options.num_blocks is not None
    check_fits(f"{f'num_blocks={units}' if given else f'{units} blocks sized from the memory budget'}: the {what} "
               f"({units} x {unit_bytes} bytes)", units * unit_bytes, device, now=now,
               fix="lower num_blocks" if given else "lower kv_cache_memory or gpu_memory_utilization")
