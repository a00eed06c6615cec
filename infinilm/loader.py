"""Safetensors loading: single file or sharded index, memory-mapped, checked in full before any data is read.

The checkpoint's tensor headers (names, shapes) are compared with the model's `targets()` first; every
missing, unexpected and mis-shaped tensor goes into one `LoadError`. Only then are the tensors read
(``safe_open`` maps the file; no pickle) and copied, with a cast to the model dtype, into the views the
model allocated; a progress bar shows for large checkpoints.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["LoadError", "checkpoint_files", "load_weights"]

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_PROGRESS_BYTES = 1 << 30


class LoadError(RuntimeError):
    """The checkpoint does not fit the model: every problem, one per line."""


def checkpoint_files(path: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory (from the sharded index when present).

    Raises:
        LoadError: neither ``model.safetensors.index.json`` nor ``model.safetensors`` exists, or the index
            names a missing shard.
    """
    path = Path(path)
    if (path / _INDEX).is_file():
        weight_map = json.loads((path / _INDEX).read_text())["weight_map"]
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise LoadError(f"{path / _INDEX} names missing shard(s): {', '.join(missing)}")
        return files
    if (path / _SINGLE).is_file():
        return [path / _SINGLE]
    raise LoadError(f"{path}: no {_SINGLE} or {_INDEX}")


def _headers(files: list[Path]) -> dict[str, tuple[Path, list[int]]]:
    from safetensors import safe_open

    found: dict[str, tuple[Path, list[int]]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt", device="cpu") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    found[name] = (f, list(st.get_slice(name).get_shape()))
        except Exception as err:  # safetensors raises its own SafetensorError (and OSError)
            raise LoadError(f"{f}: not a readable safetensors file ({type(err).__name__}: {err})") from err
    return found


def _check(found: dict[str, tuple[Path, list[int]]], targets: dict[str, torch.Tensor],
           ignored: Callable[[str], bool], where: Path) -> None:
    problems = [f"missing: {n} (expected shape {list(t.shape)})" for n, t in targets.items() if n not in found]
    problems += [f"unexpected: {n} (shape {s}, in {f.name})" for n, (f, s) in found.items()
                 if n not in targets and not ignored(n)]
    problems += [f"mis-shaped: {n}: checkpoint {found[n][1]}, model expects {list(t.shape)}"
                 for n, t in targets.items() if n in found and found[n][1] != list(t.shape)]
    if problems:
        raise LoadError(f"{where}: the checkpoint does not fit the model ({len(problems)} problem(s)):\n  "
                        + "\n  ".join(problems))


def load_weights(
    path: str | Path, targets: dict[str, torch.Tensor], *, ignored: Callable[[str], bool] = lambda n: False,
    progress: bool | None = None,
) -> int:
    """Copy every checkpoint tensor into its target view (cast to the target's dtype and device).

    Args:
        path: checkpoint directory.
        targets: tensor name -> the view to fill (the model's ``targets()``).
        ignored: names that may be present and are skipped (RoPE buffers, a tied LM head).
        progress: show a tqdm bar; None shows it for checkpoints over 1 GiB on a terminal.

    Returns:
        the number of bytes read.

    Raises:
        LoadError: missing, unexpected or mis-shaped tensors (all listed, nothing read yet), no safetensors
            files, or a file that is not safetensors.
    """
    from safetensors import safe_open
    from tqdm import tqdm

    path = Path(path)
    files = checkpoint_files(path)
    found = _headers(files)
    _check(found, targets, ignored, path)
    total = sum(f.stat().st_size for f in files)
    if progress is None:
        progress = total > _PROGRESS_BYTES and sys.stderr.isatty()
    by_file: dict[Path, list[str]] = {}
    for name in targets:
        by_file.setdefault(found[name][0], []).append(name)
    read = 0
    with tqdm(total=len(targets), desc="loading weights", unit="tensor", disable=not progress) as bar:
        for f, names in by_file.items():
            with safe_open(str(f), framework="pt", device="cpu") as st, torch.no_grad():
                for name in names:
                    tensor = st.get_tensor(name)
                    targets[name].copy_(tensor)
                    read += tensor.numel() * tensor.element_size()
                    bar.update(1)
    return read
