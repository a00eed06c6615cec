"""One step's work, `Batch`: below the engine, which schedules it, and the ranks of a split model, which receive it.

A batch holds sequences as a runner reads them (`StepSequence`): the engine's own
(`infinilm.engine.sequence.Sequence`) on the rank that schedules, their stand-ins
(`infinilm.distributed.step.StepSeq`) on the ranks that follow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Batch", "StepSequence"]


class StepSequence(Protocol):
    """What a runner reads of a sequence: its tokens, its length, its block table (a recurrent model's: its state
    row) and its `infinilm.engine.input_batch.SeqRows` row (None: none)."""

    tokens: list[int]
    block_table: list[int]
    row: int | None

    def __len__(self) -> int: ...


S = TypeVar("S", bound=StepSequence)


@dataclass
class Batch(Generic[S]):
    """One step's work: decode sequences (one token each) first, then prefill sequences (all their tokens).

    Attributes:
        rows: the `SeqRows` rows of `seqs` (int64), when the engine has filled them in; else None.
    """

    decodes: list[S] = field(default_factory=list)
    prefills: list[S] = field(default_factory=list)
    rows: Any = field(default=None, repr=False)

    @property
    def seqs(self) -> list[S]:
        """The decode sequences, then the prefill ones: the order of the step's logits rows."""
        return self.decodes + self.prefills

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills)
