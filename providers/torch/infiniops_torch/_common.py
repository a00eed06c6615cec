"""What the torch provider's implementations share: its devices, dtypes and priority, and `put_rows`,
the write of index-addressed rows that skips invalid ones without a host synchronization."""

from __future__ import annotations

from typing import Final

import torch

from infiniops_py import OneOf

__all__ = ["DEVICES", "FLOAT_DTYPES", "PRIORITY", "put_rows"]

PRIORITY: Final = 10
DEVICES: Final = OneOf("device_type", ("cpu", "cuda"))
FLOAT_DTYPES: Final = OneOf("dtype", ("float16", "bfloat16", "float32"))


def put_rows(dst: torch.Tensor, index: tuple[torch.Tensor, ...], rows: torch.Tensor, valid: torch.Tensor) -> None:
    """``dst[index[0][i], index[1][i], ...] = rows[i]`` for each i where `valid[i]`; the other rows are
    skipped, and their index values (possibly out of range) are never used. No host synchronization, so
    it runs on CUDA at full speed and under CUDA-graph capture.

    `index` holds k integer tensors ``[N]``, `rows` is ``[N, *dst.shape[k:]]`` (cast to ``dst.dtype``),
    `valid` bool ``[N]``. One ``index_put_`` writes all N rows: a skipped row is redirected to the first
    valid row's place with that row's value (or, when none is valid, to ``dst[0, ..., 0]`` with its own
    content), so the places written twice receive identical bits and the result is deterministic. Two
    valid rows naming one place are the caller's to avoid: which of them lands is undefined.
    """
    if valid.shape[0] == 0 or dst.numel() == 0:
        return
    first = valid.int().argmax()[None]  # 0 when none is valid
    safe = tuple(torch.where(valid, i.long(), 0) for i in index)  # in range wherever valid
    place = tuple(s.index_select(0, first) for s in safe)  # [1] each: the first valid row's place, or 0
    tail = (1,) * (rows.dim() - 1)
    rows = rows.to(dst.dtype)
    filler = torch.where(valid.index_select(0, first).view(1, *tail), rows.index_select(0, first), dst[place])
    target = tuple(torch.where(valid, s, p) for s, p in zip(safe, place))
    dst.index_put_(target, torch.where(valid.view(-1, *tail), rows, filler))
