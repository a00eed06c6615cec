"""The step broadcast: rank 0's scheduled batch, packed in int64 tensors, for the other ranks to run too.

Rank 0 owns the scheduler; every step it broadcasts what the runners read of the batch (vLLM's driver
broadcasting its step inputs), and each follower rebuilds the same `Batch` of `StepSeq` stand-ins and runs
the same runner on it, so the ranks' collectives line up. Each follower keeps a copy of rank 0's persistent
rows (`infinilm.engine.input_batch.SeqRows`): a prefill travels as its tokens, its row and its whole block
table (or state row), which the follower loads into that row; a decode sequence as its last token, its length,
its row, its table's length and its table's last block only: a decode step adds at most one block to a table,
always its last entry, so the broadcast of a step does not grow with the context. Two broadcasts per step over
the control group (gloo, on the CPU): a header ``[kind, decodes, prefills, payload length]``, then the payload
``[token, length, row, table length, last block]`` per decode and ``[length, *tokens, row, table length,
*table]`` per prefill (row -1: none, as `infinilm.engine.Engine.prefill_logits`'s sequences hold none).
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from infinilm.batch import Batch

__all__ = ["StepKind", "StepSeq", "receive_step", "send_step"]

_HEADER = 4


class StepKind(enum.IntEnum):
    """What the ranks do with a broadcast batch."""

    STOP = 0  # no batch: the followers leave their loop
    RUN = 1  # `Runner.run`: the last tokens' logits
    PREFILL_LOGITS = 2  # `Runner.prefill_logits`: every token's logits


class StepSeq:
    """What a runner reads of a sequence, on a follower: its tokens (a decode sequence's last one only), its
    length, its block table (a recurrent model's: its state row; a decode sequence's: its last block only, of
    `num_blocks`) and its row on rank 0 (None: none)."""

    __slots__ = ("block_table", "length", "num_blocks", "row", "tokens")

    def __init__(self, tokens: list[int], length: int, block_table: list[int], row: int | None = None,
                 num_blocks: int | None = None) -> None:
        self.tokens, self.length, self.block_table, self.row = tokens, length, block_table, row
        self.num_blocks = len(block_table) if num_blocks is None else num_blocks

    def __len__(self) -> int:
        return self.length


def _pack(kind: StepKind, batch: Batch | None) -> tuple[list[int], list[int]]:
    payload: list[int] = []
    decodes = batch.decodes if batch is not None else []
    prefills = batch.prefills if batch is not None else []
    for s in decodes:
        payload += (s.tokens[-1], len(s), s.row, len(s.block_table), s.block_table[-1])
    for s in prefills:
        payload += (len(s), *s.tokens, -1 if s.row is None else s.row, len(s.block_table), *s.block_table)
    return [int(kind), len(decodes), len(prefills), len(payload)], payload


def _unpack(header: list[int], payload: list[int]) -> Batch:
    batch, at = Batch(), 0
    for _ in range(header[1]):
        token, length, row, width, last = payload[at:at + 5]
        batch.decodes.append(StepSeq([token], length, [last], row, width))
        at += 5
    for _ in range(header[2]):
        length = payload[at]
        tokens = payload[at + 1:at + 1 + length]
        row, width = payload[at + 1 + length:at + 3 + length]
        table = payload[at + 3 + length:at + 3 + length + width]
        batch.prefills.append(StepSeq(tokens, length, table, None if row < 0 else row))
        at += 3 + length + width
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
