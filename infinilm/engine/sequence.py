"""One request's state as it moves through the engine: waiting, running, finished."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

__all__ = ["FinishReason", "SamplingParams", "SeqStatus", "Sequence"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    Attributes:
        max_new_tokens: stop after this many generated tokens.
        temperature: 0 is greedy (argmax); > 0 samples from ``softmax(logits / temperature)``.
        top_k: keep the k most likely tokens (0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches `top_p` (1.0: all).
        seed: seeds this request's own generator, so its samples do not depend on the batch it shares; an int
            in ``[0, 2**64)``, the seeds of a `torch.Generator` (torch would remap a negative seed onto that
            range, so that -1 and ``2**64 - 1`` gave the same stream: refused instead).
        ignore_eos: keep generating past the model's EOS ids (``eos_token_id`` of its config); the
            ``stop_token_ids`` and ``max_new_tokens`` still end the request (vLLM's semantics).
        stop_token_ids: extra tokens that end the request (besides the model's EOS ids), with or without
            ``ignore_eos``; an EOS id listed here stops the request even when ``ignore_eos`` is set.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        """Check every field.

        Raises:
            ValueError: a field out of its range; an integer field that is not an int (a float or a bool); a
                number field that is not an int or a float; ``ignore_eos`` that is not a bool;
                ``stop_token_ids`` that is not a tuple or a list (a str is refused) of ints >= 0.
        """
        for name in ("max_new_tokens", "top_k", "seed"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{name}={value!r} must be an int")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name}={value!r} must be a number (an int or a float)")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos={self.ignore_eos!r} must be True or False")
        stop = self.stop_token_ids
        if not isinstance(stop, tuple | list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                         for t in stop):
            raise ValueError(f"stop_token_ids={stop!r} must be a tuple (or a list) of token ids, ints >= 0")
        object.__setattr__(self, "stop_token_ids", tuple(stop))
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature={self.temperature} must be a finite number >= 0 (0: greedy)")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables it)")
        if not 0.0 < self.top_p <= 1.0:  # also refuses nan
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed={self.seed} must be in [0, 2**64) (or None: a random seed)")


class SeqStatus(enum.Enum):
    """Where a request is: queued, holding cache blocks (or a state row), or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    """Why a request finished: an EOS or stop token, its length limit, or a cancellation."""

    EOS = "eos"
    LENGTH = "length"
    CANCELLED = "cancelled"


class Sequence:
    """A request: its tokens, its KV-cache blocks and its sampling state.

    Attributes:
        id: the request's number, unique within its engine (`infinilm.engine.Engine.add_request` numbers them).
        tokens: prompt followed by generated tokens.
        num_prompt: how many of `tokens` are the prompt.
        num_cached: how many leading tokens have their K/V in the cache (0 after a preemption).
        block_table: the cache block ids this sequence owns.
        row: its row of the engine's persistent step inputs while it runs (`infinilm.engine.input_batch`), else
            None.
    """

    __slots__ = ("block_table", "finish_reason", "generator", "id", "num_cached", "num_prompt", "params",
                 "row", "status", "tokens")

    def __init__(self, prompt: list[int], params: SamplingParams, request_id: int = 0) -> None:
        """A waiting request of `prompt` (token ids).

        Raises:
            ValueError: `prompt` is empty.
        """
        if not prompt:
            raise ValueError("prompt: needs at least one token")
        self.id = request_id
        self.tokens = list(prompt)
        self.num_prompt = len(prompt)
        self.num_cached = 0
        self.block_table: list[int] = []
        self.row: int | None = None
        self.params = params
        self.status = SeqStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.generator: torch.Generator | None = None

    @property
    def output(self) -> list[int]:
        """The generated tokens."""
        return self.tokens[self.num_prompt:]

    @property
    def num_output(self) -> int:
        """How many tokens have been generated."""
        return len(self.tokens) - self.num_prompt

    @property
    def finished(self) -> bool:
        """Whether the request has finished (for any reason)."""
        return self.status is SeqStatus.FINISHED

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"<Sequence {self.id} {self.status.value} {self.num_prompt}+{self.num_output} tokens>"
