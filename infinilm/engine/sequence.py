"""One request's state as it moves through the engine: waiting, running, finished."""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass

__all__ = ["MAX_LOGPROBS", "FinishReason", "SamplingParams", "SeqStatus", "Sequence"]

MAX_LOGPROBS = 20  # OpenAI's top_logprobs bound (vLLM's default max_logprobs is 20 too)


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples and when it stops.

    Attributes:
        max_new_tokens: stop after this many generated tokens.
        temperature: 0 is greedy (argmax); > 0 samples from ``softmax(logits / temperature)``.
        top_k: keep the k most likely tokens (0: all).
        top_p: keep the smallest set of most likely tokens whose probability reaches `top_p` (1.0: all).
        seed: the Philox key of this request's draws (the sampler's per-row seed; the offset is the draw's
            number), so its samples do not depend on the batch it shares; an int in ``[0, 2**64)`` (a negative
            seed would alias one of that range, so that -1 and ``2**64 - 1`` gave the same stream: refused).
        ignore_eos: keep generating past the model's EOS ids (``eos_token_id`` of its config); the
            ``stop_token_ids`` and ``max_new_tokens`` still end the request (vLLM's semantics).
        stop_token_ids: extra tokens that end the request (besides the model's EOS ids), with or without
            ``ignore_eos``; an EOS id listed here stops the request even when ``ignore_eos`` is set.
        min_p: drop the tokens whose probability (after temperature) is below ``min_p`` times the most likely
            token's (0.0: off; vLLM's ``min_p``), in ``[0, 1]``.
        presence_penalty / frequency_penalty: subtracted from the logit of every token already generated, once /
            once per occurrence (OpenAI's and vLLM's semantics), in ``[-2, 2]``; 0.0 is off.
        repetition_penalty: divides the positive logits and multiplies the negative ones of every token of the
            prompt and the output so far (vLLM's, after the CTRL paper), > 0; 1.0 is off.
        logprobs: return the log-probability of each generated token and of this many most likely tokens
            (None: none; 0: the generated token's only), from the model's raw logits (vLLM's default
            ``raw_logprobs``: before penalties, temperature and filters); at most `MAX_LOGPROBS`.
    """

    max_new_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None

    def __post_init__(self) -> None:
        """Check every field.

        Raises:
            ValueError: a field out of its range; an integer field that is not an int (a float or a bool); a
                number field that is not an int or a float; ``ignore_eos`` that is not a bool;
                ``stop_token_ids`` that is not a tuple or a list (a str is refused) of ints >= 0.
        """
        for name in ("max_new_tokens", "top_k", "seed", "logprobs"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{name}={value!r} must be an int")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
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
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p={self.min_p} must be in [0, 1] (0: off)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name}={getattr(self, name)} must be in [-2, 2] (0: off)")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(f"repetition_penalty={self.repetition_penalty} must be a finite number > 0 (1: off)")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs={self.logprobs} must be in [0, {MAX_LOGPROBS}] (or None: no logprobs)")

    @functools.cached_property
    def penalized(self) -> bool:
        """Whether a presence, frequency or repetition penalty is on (computed once per params)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @functools.cached_property
    def needs_host(self) -> bool:
        """Whether a step of this request needs its sampled token on the host before the next one launches
        (penalties over the output, or logprobs: `infinilm.engine.overlap`); computed once per params."""
        return self.penalized or self.logprobs is not None

    @functools.cached_property
    def plain_greedy(self) -> bool:
        """Greedy and unpenalized: the token is the argmax of the raw logits (computed once per params)."""
        return self.temperature <= 0 and not self.penalized


class SeqStatus(enum.Enum):
    """Where a request is: queued, holding cache blocks (or a state row), or done."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(enum.Enum):
    """Why a request finished: an EOS or stop token, its length limit, a cancellation, or an error (the reason in
    `Sequence.error`: e.g. non-finite logits)."""

    EOS = "eos"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


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
        stop_len / stop_ids: the length at which it finishes (``max_new_tokens`` output tokens, and at most the
            scheduler's ``max_model_len``) and the tokens that finish it (``stop_token_ids``, and the model's EOS
            ids unless ``ignore_eos``): from `params` here, completed by the scheduler when it queues the request.
    """

    __slots__ = ("block_table", "draws", "error", "finish_reason", "id", "num_cached", "num_prompt", "params",
                 "row", "seed", "status", "stop_ids", "stop_len", "tokens")

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
        self.seed: int | None = None  # the sampler's Philox seed (int64 bits), set at the first sampled draw
        self.draws = 0  # how many tokens were drawn: the sampler's Philox offset of the next one
        self.error: str | None = None  # why the request finished with FinishReason.ERROR
        self.stop_len = self.num_prompt + params.max_new_tokens
        self.stop_ids = frozenset(params.stop_token_ids)

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
