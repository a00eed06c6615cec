"""Measured times per problem bucket, and where they persist: the machine's fingerprint, the cache file, shipped files.

A `Measurement` holds, for one problem with a size bucket (`infiniops_py.problem.Problem.bucket`), the median
time of every implementation timed on it, the sizes it was timed at, the device and the date. A `TuningTable`
holds the measurements the resolver ranks by, for the providers it was built with:

- the cache file of this machine, ``tuning-<fingerprint hash>.json`` in ``$INFINIOPS_CACHE``, else
  ``$XDG_CACHE_HOME/infiniops``, else ``~/.cache/infiniops``; read on the first lookup of a problem of a device
  type, rewritten (merged, atomically, under a lock: two processes adding at once keep both) whenever
  measurements are added;
- ``INFINIOPS_TUNING=FILE``: a file written by ``infiniops tune --write FILE`` (shipped with a deployment),
  read too, its entries winning over the cache file's; ``INFINIOPS_TUNING=off`` (or ``0``, ``false``, ``no``)
  turns measured ranking off: nothing is read or written and the priority alone ranks.

The fingerprint says which machine and software the times hold for: the device type, the device's name (the GPU
model, or the CPU model and torch's thread count), the CUDA driver and runtime, the torch and triton versions,
and each loaded provider's name and version. A file whose fingerprint differs (another GPU, driver or provider
version: *foreign*) or that cannot be parsed (*corrupt*: not JSON, nested too deep, larger than `MAX_BYTES`, or
not a regular file, such as a FIFO or a symlink to ``/dev/zero``, which is never opened for a blocking read) is
ignored with one warning per file and process. Within a usable file, an entry that is not a measurement (a missing
key, a wrong type, a time that is no finite number of seconds, such as an int of 401 digits) is skipped with one
warning per file and process; the other entries are used, and an add merges them into the rewritten cache file.

File format (JSON): ``{"format": "infiniops-tuning", "version": 1, "fingerprint": {...}, "entries": [{"op",
"device_type", "dtype", "fields", "bucket", "sizes", "times_us", "failed", "device", "measured"}, ...]}``.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import platform
import stat
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import torch

from infiniops_py._env import FALSE_WORDS
from infiniops_py.problem import Problem

__all__ = [
    "FORMAT",
    "Measurement",
    "TuningFileError",
    "TuningTable",
    "cache_dir",
    "fingerprint",
    "is_time",
    "read_file",
    "write_file",
]

log = logging.getLogger("infiniops")
FORMAT: Final = "infiniops-tuning"
VERSION: Final = 1
MAX_BYTES: Final = 64 << 20  # a larger file is not read (a model's buckets take kilobytes)
LOCK_WAIT_S: Final = 10.0  # how long an add waits for another process's merge into the same cache file
_WARNED: set[str] = set()  # files already warned about in this process
_MAX_SECONDS: Final = sys.float_info.max / 1e6  # a longer time's microseconds (the file's unit) overflow


class TuningFileError(ValueError):
    """A tuning file that cannot be used: corrupt (not the format) or foreign (another machine's fingerprint)."""


def is_time(value: Any) -> bool:
    """Whether `value` is a time in seconds: an int or float >= 0, not a bool, whose microseconds are a finite
    float (NaN, inf or an int beyond the float range, such as ``10**400``, would break the ranking and the
    file)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return 0.0 <= float(value) < _MAX_SECONDS
    except OverflowError:  # float() of an int of more than 309 digits
        return False


@dataclass(frozen=True)
class Measurement:
    """The times of the implementations timed on one problem bucket.

    Attributes:
        problem: the problem, with its size bucket.
        times: implementation name -> median seconds per call.
        sizes: the sizes the inputs had (the bucket's representative: ``{"m": 1, "n": 4096, "k": 1024}``).
        failed: implementation name -> why it could not be timed (it raised); never chosen by measurement.
        device: the device's name (``NVIDIA H200``).
        measured: the date of the measurement, ``YYYY-MM-DD``.
    """

    problem: Problem
    times: Mapping[str, float]
    sizes: Mapping[str, int] = field(default_factory=dict)
    failed: Mapping[str, str] = field(default_factory=dict)
    device: str = ""
    measured: str = ""

    def __post_init__(self) -> None:
        """Raises ValueError: a time that is not a number of seconds >= 0 (NaN or inf would break the ranking
        and the file)."""
        for name, t in self.times.items():
            if not is_time(t):
                raise ValueError(f"times[{name!r}] is {t!r}: expected a time in seconds >= 0")

    def as_json(self) -> dict[str, Any]:
        """The file entry of this measurement (times in microseconds)."""
        p = self.problem
        return {"op": p.op, "device_type": p.device_type, "dtype": p.dtype, "fields": dict(p.fields),
                "bucket": dict(p.bucket), "sizes": dict(self.sizes),
                "times_us": {k: round(v * 1e6, 3) for k, v in self.times.items()}, "failed": dict(self.failed),
                "device": self.device, "measured": self.measured}

    @classmethod
    def from_json(cls, entry: Any) -> Measurement:
        """Parse one file entry.

        Raises:
            TuningFileError: the entry is not an object of the format's keys and types.
        """
        try:
            problem = Problem(_text(entry["op"]), _text(entry["device_type"]), _text(entry["dtype"]),
                              _mapping(entry["fields"]), {k: _int(v) for k, v in _mapping(entry["bucket"]).items()})
            hash(problem)  # a field value that is a list would make the problem unusable as a key
            times = {_text(k): _number(v) / 1e6 for k, v in _mapping(entry["times_us"]).items()}
            return cls(problem, times, {k: _int(v) for k, v in _mapping(entry.get("sizes", {})).items()},
                       {_text(k): _text(v) for k, v in _mapping(entry.get("failed", {})).items()},
                       _text(entry.get("device", "")), _text(entry.get("measured", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # ValueError: __post_init__
            raise TuningFileError(f"an entry is not a measurement ({type(err).__name__}: {err})") from None


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise TypeError(f"expected an int >= 0, got {v!r}")
    return v


def _number(v: Any) -> float:
    if not is_time(v):
        shown = f"an int of {len(str(abs(v)))} digits" if type(v) is int and abs(v) >= 10**30 else repr(v)
        raise TypeError(f"expected a finite time >= 0, got {shown}")
    return float(v)


def _mapping(v: Any) -> Mapping[str, Any]:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise TypeError(f"expected an object, got {type(v).__name__}")
    return v


# -- where and for what ----------------------------------------------------------------------------------

def cache_dir() -> Path:
    """``$INFINIOPS_CACHE``, else ``$XDG_CACHE_HOME/infiniops``, else ``~/.cache/infiniops`` (not created here)."""
    explicit = os.environ.get("INFINIOPS_CACHE", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "infiniops"


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def _cuda_driver() -> str:
    """The CUDA driver version (``cuDriverGetVersion``, e.g. ``12080``), or empty where libcuda is missing."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
        out = ctypes.c_int(0)
        return str(out.value) if lib.cuDriverGetVersion(ctypes.byref(out)) == 0 else ""
    except (OSError, AttributeError):
        return ""


@functools.lru_cache(maxsize=1)
def _triton_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return "-"


def fingerprint(device_type: str, providers: Mapping[str, str]) -> dict[str, str] | None:
    """What the times of `device_type` hold for on this machine (see the module doc), or None where there is
    no such device here (``cuda`` without CUDA, ``meta``): nothing is measured or looked up for it then.

    `providers` maps each loaded provider's name to its version. On CUDA this reads the current device's name
    (CUDA initializes if it had not).
    """
    base = {"device_type": device_type, "torch": torch.__version__, "triton": _triton_version(),
            "providers": ",".join(f"{k}={v}" for k, v in sorted(providers.items()))}
    if device_type == "cpu":
        return {**base, "device": _cpu_name(), "threads": str(torch.get_num_threads())}
    if device_type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return {**base, "device": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}",
                "driver": _cuda_driver(), "cuda": str(torch.version.cuda)}
    return None


def _file_for(fp: Mapping[str, str]) -> Path:
    digest = hashlib.sha256(json.dumps(dict(fp), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"tuning-{fp['device_type']}-{digest}.json"


# -- files ----------------------------------------------------------------------------------------------

def read_file(path: Path, fp: Mapping[str, str] | None) -> list[Measurement]:
    """The measurements of tuning file `path`; with `fp`, the file must carry that fingerprint.

    An entry that is not a measurement is skipped, with one warning per file and process naming how many
    and why the first was refused (issue #30: one bad entry used to discard the whole file).

    Raises:
        OSError: the file cannot be read. TuningFileError: it is corrupt (not a regular file, larger than
            `MAX_BYTES`, not JSON that Python parses, not the format) or, with `fp`, foreign (naming the first
            fingerprint key that differs and both values).
    """
    try:
        data = json.loads(_read_bytes(Path(path)).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # too deep, or an int of 5000 digits
        raise TuningFileError(f"not a tuning file: {err}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TuningFileError(f"not a tuning file (no \"format\": {FORMAT!r})")
    if data.get("version") != VERSION:
        raise TuningFileError(f"tuning file version {data.get('version')!r}, this reader knows {VERSION}")
    theirs = data.get("fingerprint")
    if not isinstance(theirs, dict):
        raise TuningFileError("the tuning file has no fingerprint")
    if fp is not None and theirs != dict(fp):
        key = next((k for k in sorted({*fp, *theirs}) if fp.get(k) != theirs.get(k)), "?")
        raise TuningFileError(f"measured on another machine or software: {key}={theirs.get(key)!r} there, "
                              f"{fp.get(key)!r} here")
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise TuningFileError("the tuning file has no list of entries")
    found, bad = [], []
    for i, entry in enumerate(entries):
        try:
            found.append(Measurement.from_json(entry))
        except TuningFileError as err:
            bad.append(f"entry {i}: {err}")
    if bad:
        _warn_once(Path(path), f"skipped {len(bad)} of {len(entries)} entries (the first, {bad[0]})",
                   doing="using tuning file")
    return found


def _read_bytes(path: Path) -> bytes:
    """The bytes of regular file `path`, at most `MAX_BYTES`: opened without blocking (a FIFO would wait for a
    writer), checked to be a regular file before any read (``/dev/zero`` never ends).

    Raises:
        OSError: it cannot be opened. TuningFileError: not a regular file, or larger than `MAX_BYTES`.
    """
    with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise TuningFileError("not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise TuningFileError(f"larger than {MAX_BYTES} bytes")
    return data


def write_file(path: Path, fp: Mapping[str, str], measurements: Iterable[Measurement]) -> None:
    """Write `measurements` to `path` with fingerprint `fp`, atomically (a temporary file in its folder, then a
    rename), with the mode any new file gets (``0666`` less the umask). A symlink to a regular file is replaced.

    Raises:
        OSError: the folder cannot be created or written, or `path` exists and is not a regular file (a folder,
            a device, a symlink to one, such as ``/dev/stdout``): it is never replaced.
    """
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(path.stat().st_mode):
            raise OSError(errno.EEXIST, "exists and is not a regular file", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "version": VERSION, "fingerprint": dict(fp),
            "entries": [m.as_json() for m in measurements]}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside `path` exclusively (``flock``) for the block, so that two processes merging
    into `path` take turns. Waits at most `LOCK_WAIT_S` (a holder stopped in a debugger must not hang this one),
    then goes on unlocked; so it does too without ``fcntl`` (Windows) or where the lock file cannot be made."""
    fd = None
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0),
                     0o666)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
    except (ImportError, OSError):
        pass
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def _warn_once(path: Path, why: str, doing: str = "ignoring tuning file") -> None:
    key = f"{path}: {why}"
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning("infiniops: %s %s: %s", doing, path, why)


def _read_or_warn(path: Path, fp: Mapping[str, str]) -> list[Measurement]:
    """`read_file`, or nothing (and one warning) when the file is missing (quietly), corrupt or foreign."""
    try:
        return read_file(path, fp)
    except FileNotFoundError:
        return []
    except OSError as err:
        _warn_once(path, err.strerror or str(err))
    except TuningFileError as err:
        _warn_once(path, str(err))
    return []


class TuningTable:
    """The measurements one resolver ranks by (see the module doc for where they come from).

    Attributes:
        providers: loaded provider name -> version (part of the fingerprint).
        source: the value of ``INFINIOPS_TUNING``: empty (the cache file), a file, or off.
    """

    def __init__(self, providers: Mapping[str, str], source: str = "") -> None:
        self.providers = dict(providers)
        self.source = source.strip()
        self.enabled = self.source.lower() not in FALSE_WORDS
        self._by_device: dict[str, dict[Problem, Measurement]] = {}
        self._fingerprints: dict[str, dict[str, str] | None] = {}

    def fingerprint(self, device_type: str) -> dict[str, str] | None:
        """`fingerprint` of `device_type` for these providers (computed once)."""
        if device_type not in self._fingerprints:
            self._fingerprints[device_type] = fingerprint(device_type, self.providers)
        return self._fingerprints[device_type]

    def cache_file(self, device_type: str) -> Path | None:
        """This machine's cache file for `device_type`, or None where the device does not exist here."""
        fp = self.fingerprint(device_type)
        return None if fp is None else _file_for(fp)

    def _table(self, device_type: str) -> dict[Problem, Measurement]:
        table = self._by_device.get(device_type)
        if table is None:
            table = {}
            fp = self.fingerprint(device_type) if self.enabled else None
            if fp is not None:
                for m in _read_or_warn(_file_for(fp), fp):
                    table[m.problem] = m
                if self.source and self.source.lower() not in FALSE_WORDS:
                    shipped = Path(self.source).expanduser()
                    if not shipped.exists():
                        _warn_once(shipped, "INFINIOPS_TUNING names no file")
                    for m in _read_or_warn(shipped, fp):
                        if m.problem.device_type == device_type:
                            table[m.problem] = m
            self._by_device[device_type] = table
        return table

    def lookup(self, problem: Problem) -> Measurement | None:
        """The measurement of `problem` (with its bucket), or None: no bucket, none measured, or tuning off."""
        if not problem.bucket or not self.enabled:
            return None
        return self._table(problem.device_type).get(problem)

    def measurements(self, device_type: str) -> list[Measurement]:
        """Every measurement known for `device_type`."""
        return list(self._table(device_type).values())

    def add(self, measurements: Iterable[Measurement], *, save: bool = True) -> list[Path]:
        """Add `measurements` (a later one replaces an earlier one of the same problem) and, with `save`, merge
        them into this machine's cache file of each device type; returns the files written.

        Does nothing when tuning is off (``INFINIOPS_TUNING=off``). A cache file that cannot be written is
        warned about once (the measurements still rank in this process).
        """
        if not self.enabled:
            return []
        added: dict[str, list[Measurement]] = {}
        for m in measurements:
            self._table(m.problem.device_type)[m.problem] = m
            added.setdefault(m.problem.device_type, []).append(m)
        written = []
        for device_type, new in added.items() if save else ():
            fp = self.fingerprint(device_type)
            if fp is None:
                continue
            path = _file_for(fp)
            with _locked(path):  # read, merge and write as one step: another process's adds are kept
                merged = {m.problem: m for m in _read_or_warn(path, fp)}
                merged.update((m.problem, m) for m in new)
                try:
                    write_file(path, fp, merged.values())
                    written.append(path)
                except OSError as err:
                    _warn_once(path, f"cannot write it: {err.strerror or err}")
        return written

    def write(self, path: Path, device_type: str) -> int:
        """Write every measurement of `device_type` to `path` (to ship with ``INFINIOPS_TUNING=FILE``); returns
        how many.

        Raises:
            ValueError: `device_type` does not exist on this machine. OSError: the file cannot be written.
        """
        fp = self.fingerprint(device_type)
        if fp is None:
            raise ValueError(f"device_type={device_type!r}: no such device on this machine, nothing to write")
        found = self.measurements(device_type)
        write_file(path, fp, found)
        return len(found)
