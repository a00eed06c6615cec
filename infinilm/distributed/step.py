"""The step broadcast: rank 0's scheduled batch, packed in int64 tensors, for the other ranks to run too.

Rank 0 owns the scheduler; every step it broadcasts what the runners read of the batch (vLLM's driver
broadcasting its step inputs), and each follower rebuilds the same `Batch` of `StepSeq` stand-ins and runs
the same runner on it, so the ranks' collectives line up. A decode sequence travels as its last token, its
length, its row of the persistent step inputs (`infinilm.engine.input_batch`, which the follower loads the
rest into) and its block table (or state row); a prefill as its tokens and its block table. Two broadcasts
per step over the control group (gloo, on the CPU): a header ``[kind, decodes, prefills, payload length]``,
then the payload ``[token, length, row, table length, *table]`` per decode and ``[length, *tokens, table
length, *table]`` per prefill.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from infinilm.engine.scheduler import Batch

__all__ = ["StepKind", "StepSeq", "receive_step", "send_step"]

_HEADER = 4


class StepKind(enum.IntEnum):
    """What the ranks do with a broadcast batch."""

    STOP = 0  # no batch: the followers leave their loop
    RUN = 1  # `Runner.run`: the last tokens' logits
    PREFILL_LOGITS = 2  # `Runner.prefill_logits`: every token's logits


class StepSeq:
    """What a runner reads of a sequence, on a follower: its tokens (a decode sequence's last one only), its
    length, its block table (a recurrent model's: its state row) and its row on rank 0 (a decode's; else None)."""

    __slots__ = ("block_table", "length", "row", "tokens")

    def __init__(self, tokens: list[int], length: int, block_table: list[int], row: int | None = None) -> None:
        self.tokens, self.length, self.block_table, self.row = tokens, length, block_table, row

    def __len__(self) -> int:
        return self.length


def _pack(kind: StepKind, batch: Batch | None) -> tuple[list[int], list[int]]:
    payload: list[int] = []
    decodes = batch.decodes if batch is not None else []
    prefills = batch.prefills if batch is not None else []
    for s in decodes:
        payload += (s.tokens[-1], len(s), s.row, len(s.block_table), *s.block_table)
    for s in prefills:
        payload += (len(s), *s.tokens, len(s.block_table), *s.block_table)
    return [int(kind), len(decodes), len(prefills), len(payload)], payload


def _unpack(header: list[int], payload: list[int]) -> Batch:
    batch, at = Batch(), 0
    for _ in range(header[1]):
        token, length, row, width = payload[at:at + 4]
        batch.decodes.append(StepSeq([token], length, payload[at + 4:at + 4 + width], row))  # type: ignore[arg-type]
        at += 4 + width
    for _ in range(header[2]):
        length = payload[at]
        tokens = payload[at + 1:at + 1 + length]
        width = payload[at + 1 + length]
        table = payload[at + 2 + length:at + 2 + length + width]
        batch.prefills.append(StepSeq(tokens, length, table))  # type: ignore[arg-type]
        at += 2 + length + width
    return batch


def send_step(kind: StepKind, batch: Batch | None, group: Any) -> None:
    """Rank 0: broadcast `kind` and `batch` (None with `StepKind.STOP`) to the other ranks of `group` (a CPU
    group, or None for the default one)."""
    import torch.distributed as dist

    header, payload = _pack(kind, batch)
    dist.broadcast(torch.tensor(header, dtype=torch.int64), 0, group=group)
    if payload:
        dist.broadcast(torch.tensor(payload, dtype=torch.int64), 0, group=group)


def receive_step(group: Any) -> tuple[StepKind, Batch | None]:
    """A follower: the next step rank 0 broadcasts over `group`: its kind and the batch (None for STOP)."""
    import torch.distributed as dist

    header = torch.empty(_HEADER, dtype=torch.int64)
    dist.broadcast(header, 0, group=group)
    values = header.tolist()
    kind = StepKind(values[0])
    if kind is StepKind.STOP:
        return kind, None
    payload = torch.empty(values[3], dtype=torch.int64)
    if values[3]:
        dist.broadcast(payload, 0, group=group)
    return kind, _unpack(values, payload.tolist())
