"""One choice of a request: its engine request's events as text pieces, with logprobs and vLLM's ``stop_reason``.

A request of ``n`` choices over a batch of prompts is one engine request per choice (`GenerationRequest.choices`);
each is a `Choice`, and `merged` interleaves their pieces as they come (each choice's in order).

``finish_reason`` is OpenAI's (``stop``, ``length``; ``abort`` when the server shut down, vLLM's word);
``stop_reason`` is vLLM's: the stop string or the stop token id that ended the choice, None for an EOS (with
``ignore_eos`` unset an EOS ends a choice before ``stop_token_ids`` are looked at, vLLM's order) or a length.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from infinilm.engine.sequence import SamplingParams
from infinilm.serve.engine_client import EngineClient, Request
from infinilm.serve.responses import ChatLogprob, ChatLogprobs, CompletionLogprobs, TopLogprob, floor
from infinilm.serve.schemas import ModelInfo
from infinilm.serve.text import TextOutput

__all__ = ["Choice", "Piece", "TokenTexts", "merged"]


@dataclass(frozen=True)
class Piece:
    """New text of a choice and the token that brought it (None: it ended without one, at shutdown), with the
    token's logprob and its ``(token, logprob)`` top list when asked for, and, on the last piece, why it ended."""

    text: str
    token: int | None
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class TokenTexts:
    """Each token id's own text, as logprobs name tokens: its decoding alone, special tokens kept (vLLM's);
    ``token_id:<id>`` without a tokenizer (vLLM's ``return_tokens_as_token_ids`` form)."""

    def __init__(self, tokenizer: Any | None) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = (f"token_id:{token}" if self.tokenizer is None
                    else self.tokenizer.decode([token], skip_special_tokens=False))
            self._texts[token] = text
        return text

    def completion(self, pieces: Sequence[Piece], offset: int) -> CompletionLogprobs:
        """The completions ``logprobs`` of `pieces`' tokens, the first at text offset `offset`."""
        out = CompletionLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
        for p in pieces:
            if p.token is None or p.logprob is None:
                continue
            text = self(p.token)
            out.tokens.append(text)
            out.token_logprobs.append(floor(p.logprob))
            out.top_logprobs.append({text: floor(p.logprob)} | {self(t): floor(lp) for t, lp in p.top_logprobs})
            out.text_offset.append(offset)
            offset += len(text)
        return out

    def chat(self, pieces: Sequence[Piece]) -> ChatLogprobs:
        """The chat ``logprobs`` (``content``) of `pieces`' tokens."""
        return ChatLogprobs(content=[
            ChatLogprob(**self._entry(p.token, p.logprob), top_logprobs=[
                TopLogprob(**self._entry(t, lp)) for t, lp in p.top_logprobs])
            for p in pieces if p.token is not None and p.logprob is not None])

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        text = self(token)
        return {"token": text, "logprob": floor(logprob), "bytes": list(text.encode("utf-8", errors="replace"))}


@dataclass
class Choice:
    """One choice: its index in the answer, its prompt, and its engine request (`handle`).

    Attributes:
        pieces: every piece so far (the non-streamed answer joins them).
        offset: characters of the logprobs' token texts so far (the next ``text_offset``).
    """

    index: int
    prompt: list[int]
    params: SamplingParams
    handle: Request
    pieces: list[Piece] = field(default_factory=list)
    offset: int = 0

    @property
    def token_ids(self) -> list[int]:
        return [p.token for p in self.pieces if p.token is not None]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)

    @property
    def last(self) -> Piece:
        return self.pieces[-1]

    async def run(self, loop: EngineClient, info: ModelInfo, stop: tuple[str, ...]) -> AsyncIterator[Piece]:
        """The choice's pieces, to its last (which carries `Piece.finish_reason`); each is kept in `pieces`.

        Raises:
            APIError: the engine failed this request.
        """
        text = TextOutput(info.tokenizer, stop)
        while True:
            event = await self.handle.events.get()
            if event.error is not None:
                raise event.error
            if event.token is None:  # ended by the server (shutdown)
                new = text.flush()
                reason = "stop" if text.stopped else "abort"
                yield self._keep(Piece(new, None, finish_reason=reason, stop_reason=text.stop_string))
                return
            new = text.push(event.token)
            lp = {"logprob": event.logprob, "top_logprobs": event.top_logprobs}
            if text.stopped:
                loop.cancel(self.handle, "stop")
                yield self._keep(Piece(new, event.token, **lp, finish_reason="stop", stop_reason=text.stop_string))
                return
            if event.final:
                new += text.flush()
                why: int | str | None = text.stop_string  # a stop string in the text held back
                if not text.stopped and event.finish_reason == "stop":
                    why = self._stop_token(event.token, info)
                reason = "stop" if text.stopped else event.finish_reason
                yield self._keep(Piece(new, event.token, **lp, finish_reason=reason, stop_reason=why))
                return
            yield self._keep(Piece(new, event.token, **lp))

    def _keep(self, piece: Piece) -> Piece:
        self.pieces.append(piece)
        return piece

    def _stop_token(self, token: int, info: ModelInfo) -> int | None:
        p = self.params
        if not p.ignore_eos and token in info.eos_token_ids:
            return None
        return token if token in p.stop_token_ids else None


async def merged(choices: Sequence[Choice], loop: EngineClient, info: ModelInfo,
                 stop: tuple[str, ...]) -> AsyncIterator[tuple[Choice, Piece]]:
    """The pieces of every choice as they come (each choice's in order), until all have ended.

    Raises:
        APIError: the engine failed one of them (the others are left to the caller to cancel).
    """
    if len(choices) == 1:  # no task: a single choice streams as it did before batches
        async for piece in choices[0].run(loop, info, stop):
            yield choices[0], piece
        return
    queue: asyncio.Queue[tuple[Choice, Piece | None, BaseException | None]] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for piece in choice.run(loop, info, stop):
                queue.put_nowait((choice, piece, None))
        except Exception as err:
            queue.put_nowait((choice, None, err))
            return
        queue.put_nowait((choice, None, None))

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        left = len(tasks)
        while left:
            choice, piece, err = await queue.get()
            if err is not None:
                raise err
            if piece is None:
                left -= 1
            else:
                yield choice, piece
    finally:
        for t in tasks:
            t.cancel()
