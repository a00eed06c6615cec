"""Safetensors loading: single file or sharded index, memory-mapped, checked in full before anything is allocated.

`read_checkpoint` finds the files and reads every tensor header (name, shape, dtype), refusing what could
make the loader read the wrong bytes:

- the index ``model.safetensors.index.json`` is a JSON object whose ``weight_map`` maps each tensor name,
  listed once, to a relative path (a str) of a shard: no absolute path, no ``..``;
- the index and every shard, symlinks resolved, lie inside the checkpoint directory; the one exception is a
  Hugging Face hub cache snapshot (``<repo>/snapshots/<revision>/``), whose files are links into
  ``<repo>/blobs/``;
- the index and every shard are regular files (a directory, a FIFO, a device or a symlink loop is named, never
  opened);
- every shard exists and is a safetensors file (safetensors checks that the header's offsets cover the file
  exactly, so a header that lies about sizes is refused), holds the tensors the index maps to it and no
  other (a tensor of a shard that the index leaves out is refused, not loaded behind the index's back), and
  no tensor is in two files.

`Checkpoint.check` then compares the headers with the model's ``targets()`` (which may be meta tensors, so
that nothing is allocated yet): every missing, unexpected, mis-shaped and non-floating-point tensor goes
into one `LoadError` (the first 20 of each kind listed, the others counted). Only then are the tensors read
(``safe_open`` maps the file; no pickle) and copied, with a cast to the model dtype, into the views the model
allocated; a progress bar shows for large checkpoints.

A target may also be a `infinilm.distributed.parallel.Shard` (a tensor-parallel rank's part): the header must
declare the shard's full shape, and only the shard's index ranges are read, each through ``safe_open``'s
``get_slice`` (the bytes of that slice of the mapped file; no rank copies a whole tensor).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

import torch

from infinilm.distributed.parallel import Shard
from infinilm.files import file_kind

__all__ = ["FLOAT_DTYPES", "Checkpoint", "LoadError", "TensorHeader", "checkpoint_files", "load_weights",
           "read_checkpoint"]

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_PROGRESS_BYTES = 1 << 30
_LISTED: Final = 20  # the problems of each kind a `LoadError` of `Checkpoint.check` lists; the rest are counted
# The safetensors header dtypes a floating-point weight may have (each casts to the model dtype); integer,
# bool and complex tensors (I*, U*, BOOL, C64) and scale formats (F8_E8M0) are refused.
FLOAT_DTYPES: Final = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")


class LoadError(RuntimeError):
    """The checkpoint does not fit the model, or cannot be read safely: every problem, one per line."""


@dataclass(frozen=True)
class TensorHeader:
    """One tensor as its safetensors header declares it: the file holding it, its shape and dtype (``"BF16"``)."""

    file: Path
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Checkpoint:
    """The safetensors files of a checkpoint directory and the header of every tensor they hold.

    Attributes:
        path: the checkpoint directory.
        files: the safetensors files, each inside `path` (see the module docstring for the hub cache).
        headers: tensor name -> its header (each name in exactly one file).
    """

    path: Path
    files: tuple[Path, ...]
    headers: Mapping[str, TensorHeader]

    def check(self, targets: Mapping[str, torch.Tensor | Shard],
              ignored: Callable[[str], bool] = lambda n: False) -> None:
        """Compare the headers with the model's `targets` (name -> tensor or `Shard`, whose full shape is compared;
        meta tensors do, nothing is read).

        Raises:
            LoadError: the tensors that are missing, unexpected (unless `ignored`), of another shape than
                their target, or not floating point (dtypes outside `FLOAT_DTYPES`) where the target is, in one
                error naming the directory and the number of problems, and listing the first 20 of each
                kind (each tensor, its file, shape and dtype); the others of a kind are counted in one line.
        """
        found = self.headers
        shapes = {n: t.shape if isinstance(t, Shard) else tuple(t.shape) for n, t in targets.items()}
        views = {n: t.view if isinstance(t, Shard) else t for n, t in targets.items()}
        missing = [n for n in shapes if n not in found]
        unexpected = [n for n in found if n not in targets and not ignored(n)]
        misshaped = [n for n, s in shapes.items() if n in found and found[n].shape != s]
        not_float = [n for n, t in views.items()
                     if n in found and t.is_floating_point() and found[n].dtype not in FLOAT_DTYPES]
        count = len(missing) + len(unexpected) + len(misshaped) + len(not_float)
        if not count:
            return
        problems = [
            *_listed("missing", missing, lambda n: f"(expected shape {list(shapes[n])})"),
            *_listed("unexpected", unexpected, lambda n: f"(shape {list(found[n].shape)}, in {found[n].file.name})"),
            *_listed("mis-shaped", misshaped,
                     lambda n: f"checkpoint {list(found[n].shape)}, model expects {list(shapes[n])}", sep=": "),
            *_listed("not floating point", not_float,
                     lambda n: f"dtype {found[n].dtype} in {found[n].file.name} (the model loads {views[n].dtype} "
                               f"weights; allowed checkpoint dtypes: {', '.join(FLOAT_DTYPES)})", sep=": "),
        ]
        raise LoadError(f"{self.path}: the checkpoint does not fit the model ({count} problem(s)):\n  "
                        + "\n  ".join(problems))


def _listed(kind: str, names: list[str], detail: Callable[[str], str], sep: str = " ") -> list[str]:
    """One line ``"<kind>: <name><sep><detail>"`` for each of the first `_LISTED` `names`, then one counting the
    rest."""
    lines = [f"{kind}: {n}{sep}{detail(n)}" for n in names[:_LISTED]]
    return lines + ([f"... and {len(names) - _LISTED} more {kind}"] if len(names) > _LISTED else [])


class _Object(dict[str, Any]):
    """A JSON object that remembers the keys it held more than once (json keeps the last silently)."""

    repeated: list[str]


def _object(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    obj.repeated = []
    for key, value in pairs:
        if key in obj:
            obj.repeated.append(key)
        obj[key] = value
    return obj


def _read_index(index: Path) -> dict[str, str]:
    """The ``weight_map`` of the index: tensor name -> shard name, each checked to be a relative path.

    Raises:
        LoadError: unreadable or invalid JSON (or nested too deeply for Python's recursion limit), no
            ``weight_map`` object, a tensor listed twice, or a shard
            name that is not a str, is empty, absolute or holds ``..`` (all listed).
    """
    try:
        raw = json.loads(index.read_text(encoding="utf-8"), object_pairs_hook=_object)
    except OSError as err:
        raise LoadError(f"{index}: cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise LoadError(f"{index}: not UTF-8 text (expected a JSON object with a weight_map)") from None
    except json.JSONDecodeError as err:
        raise LoadError(f"{index}: not valid JSON: {err.msg} at line {err.lineno}, column {err.colno}") from None
    except RecursionError:  # json's decoder recurses once per nested array or object
        raise LoadError(f"{index}: nested too deeply to parse (expected a JSON object with a weight_map)") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, _Object):
        raise LoadError(f"{index}: expected a JSON object with a weight_map object (tensor name -> shard file), "
                        f"got {'no weight_map' if weight_map is None else type(weight_map).__name__}")
    problems = [f"weight_map lists {name!r} more than once (a tensor must come from one shard)"
                for name in dict.fromkeys(weight_map.repeated)]
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            problems.append(f"weight_map[{name!r}]={shard!r} must be a str (a shard file name)")
        elif not shard or "\x00" in shard or PurePosixPath(shard).is_absolute() or ".." in PurePosixPath(shard).parts:
            problems.append(f"weight_map[{name!r}]={shard!r} must be a file name relative to the checkpoint "
                            "directory (no absolute path, no '..')")
    if not weight_map:
        problems.append("weight_map is empty (it names no shard)")
    if problems:
        raise LoadError(f"{index}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    return dict(weight_map)


def _inside(path: Path, file: Path) -> bool:
    """Whether `file`, symlinks resolved, lies in `path` (or, for a hub cache snapshot, in its repo's blobs); a
    symlink loop, which resolves nowhere and reads nothing, counts as inside (`_kind` names it)."""
    try:
        root, target = path.resolve(), file.resolve()
    except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13, OSError after
        return True
    roots = [root]
    if root.parent.name == "snapshots":  # <repo>/snapshots/<revision>/<file> -> ../../blobs/<sha>
        roots.append(root.parent.parent / "blobs")
    return any(target.is_relative_to(r) for r in roots)


def _check_files(path: Path, files: list[Path], where: Path, what: str) -> None:
    """Refuse each of `files` (`what`: ``"shard(s)"``, ``"the index"``) that resolves outside `path`, is missing
    or is not a regular file.

    Raises:
        LoadError: the files outside `path`, else the missing ones, else those that are not regular files (each
            kind all listed, naming `where`).
    """
    outside = [f"{f} resolves to {f.resolve()}, outside {path.resolve()}" for f in files if not _inside(path, f)]
    if outside:
        raise LoadError(f"{where}: {what} outside the checkpoint directory (symlinks are followed):\n  "
                        + "\n  ".join(outside))
    kinds = {f: file_kind(f) for f in files}
    missing = [str(f) for f, kind in kinds.items() if kind == "missing"]
    if missing:
        raise LoadError(f"{where} names missing {what}: {', '.join(missing)}")
    odd = [f"{f} is {kind}" for f, kind in kinds.items() if kind is not None]
    if odd:
        verb = "are not regular files" if what.endswith("(s)") else "is not a regular file"
        raise LoadError(f"{where}: {what} {verb} (a safetensors file or its JSON index must be one):\n  "
                        + "\n  ".join(odd))


def _shard_files(path: Path, names: list[str], where: Path) -> list[Path]:
    """`path / name` for each name (once each, in name order), after checking each is a regular file inside
    `path`.

    Raises:
        LoadError: a shard that resolves outside `path`, is missing, or is not a regular file (see `_check_files`).
    """
    files = sorted({path / name for name in names})
    _check_files(path, files, where, "shard(s)")
    return files


def _locate(path: Path) -> tuple[list[Path], dict[str, str] | None]:
    """The checked shard files and, for a sharded checkpoint, the index's weight_map (an index that exists in any
    form is the checkpoint's, and must be a regular file inside `path`)."""
    index = path / _INDEX
    if file_kind(index) != "missing":
        _check_files(path, [index], path, "the index")
        weight_map = _read_index(index)
        return _shard_files(path, list(weight_map.values()), index), weight_map
    if file_kind(path / _SINGLE) != "missing":
        return _shard_files(path, [_SINGLE], path), None
    raise LoadError(f"{path}: no {_SINGLE} or {_INDEX}")


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (from the sharded index when present).

    Raises:
        LoadError: neither ``model.safetensors.index.json`` nor ``model.safetensors`` exists; an index or a shard
            that lies outside the directory or is not a regular file; an index that is not valid (see
            `_read_index`); a shard that is missing.
    """
    return _locate(Path(path))[0]


def read_checkpoint(path: str | Path) -> Checkpoint:
    """The files of a checkpoint directory and every tensor header; reads no tensor data, allocates nothing.

    Raises:
        LoadError: the files cannot be found or lie outside the directory (see `checkpoint_files`); a file
            that is not safetensors (including a header whose offsets do not cover the file); a tensor held
            by two files, one the index maps to a shard that does not hold it, or one a shard holds that the
            index does not list (all listed).
    """
    from safetensors import safe_open

    path = Path(path)
    files, weight_map = _locate(path)
    headers: dict[str, TensorHeader] = {}
    problems: list[str] = []
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    piece = st.get_slice(name)
                    if name in headers:
                        problems.append(f"{name} is in two shards: {headers[name].file.name} and {f.name}")
                        continue
                    headers[name] = TensorHeader(f, tuple(piece.get_shape()), piece.get_dtype())
        except Exception as err:  # safetensors raises its own SafetensorError (and OSError)
            raise LoadError(f"{f}: not a readable safetensors file ({type(err).__name__}: {err})") from err
    if weight_map is not None:  # the index and its shards must agree both ways
        problems += [f"the index maps {name} to {shard}, which does not hold it"
                     for name, shard in weight_map.items()
                     if name not in headers or headers[name].file != path / shard]
        problems += [f"{name} is in {h.file.name}, which the index does not map it to (the index must list every "
                     "tensor of its shards)" for name, h in headers.items() if name not in weight_map]
    if problems:
        raise LoadError(f"{path}: the checkpoint is inconsistent ({len(problems)} problem(s)):\n  "
                        + "\n  ".join(problems))
    return Checkpoint(path, tuple(files), headers)


def load_weights(
    path: str | Path | Checkpoint, targets: Mapping[str, torch.Tensor | Shard], *,
    ignored: Callable[[str], bool] = lambda n: False, progress: bool | None = None,
) -> int:
    """Copy every checkpoint tensor (or, for a `Shard`, its index ranges) into its target view, cast to the
    target's dtype and device.

    Args:
        path: checkpoint directory, or a `Checkpoint` already read (its headers are checked against
            `targets` again, which reads nothing).
        targets: tensor name -> the view to fill, or a `Shard` (the model's ``targets()``).
        ignored: names that may be present and are skipped (RoPE buffers, a tied LM head).
        progress: show a tqdm bar; None shows it for checkpoints over 1 GiB on a terminal.

    Returns:
        the number of bytes read (a shard's slices only).

    Raises:
        LoadError: everything `read_checkpoint` and `Checkpoint.check` refuse (all listed, nothing read yet).
    """
    from safetensors import safe_open
    from tqdm import tqdm

    checkpoint = path if isinstance(path, Checkpoint) else read_checkpoint(path)
    checkpoint.check(targets, ignored)
    files = checkpoint.files
    total = sum(f.stat().st_size for f in files)
    if progress is None:
        progress = total > _PROGRESS_BYTES and sys.stderr.isatty()
    by_file: dict[Path, list[str]] = {}
    for name in targets:
        by_file.setdefault(checkpoint.headers[name].file, []).append(name)
    read = 0
    with tqdm(total=len(targets), desc="loading weights", unit="tensor", disable=not progress) as bar:
        for f, names in by_file.items():
            with safe_open(str(f), framework="pt", device="cpu") as st, torch.no_grad():
                for name in names:
                    target = targets[name]
                    if isinstance(target, Shard):
                        read += _load_shard(st.get_slice(name), target)
                    else:
                        tensor = st.get_tensor(name)
                        target.copy_(tensor)
                        read += tensor.numel() * tensor.element_size()
                    bar.update(1)
    return read


def _load_shard(piece: Any, shard: Shard) -> int:
    """Read each index range of `shard` from `piece` (safetensors' slice of one mapped tensor) into its place of
    the shard's view; returns the bytes read."""
    read, offset = 0, 0
    lead = (slice(None),) * shard.dim
    for lo, hi in shard.ranges:
        part = piece[(*lead, slice(lo, hi))]
        shard.view.narrow(shard.dim, offset, hi - lo).copy_(part)
        offset += hi - lo
        read += part.numel() * part.element_size()
    return read
