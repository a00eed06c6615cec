"""The response bodies as pydantic models: the OpenAI API's objects, with vLLM's additions.

Every field the OpenAI API declares nullable is written, ``null`` included (``logprobs``, ``finish_reason``,
vLLM's ``stop_reason``); the extensions a request asks for (``token_ids``, ``prompt_token_ids``; ``usage`` of a
stream chunk) are left out when absent. Logprobs follow vLLM: a completion's ``top_logprobs`` maps token text
to logprob for the sampled token and the ``logprobs`` most likely (up to ``logprobs + 1`` entries, OpenAI's
rule); a chat token's ``top_logprobs`` lists the ``top_logprobs`` most likely, most likely first; a logprob
below -9999 is written as -9999.0 (vLLM's floor; JSON has no -Infinity).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

__all__ = ["ChatChoice", "ChatChunk", "ChatChunkChoice", "ChatDelta", "ChatLogprob", "ChatLogprobs", "ChatMessageOut",
           "ChatResponse", "CompletionChoice", "CompletionLogprobs", "CompletionResponse", "DetokenizeResponse",
           "ModelCard", "ModelList", "TokenizeResponse", "TopLogprob", "Usage", "VersionResponse", "floor"]

LOGPROB_FLOOR: Final = -9999.0


def floor(logprob: float) -> float:
    """`logprob` as written: at least -9999.0 (NaN too)."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")
    _omit_none: ClassVar[frozenset[str]] = frozenset({"token_ids", "prompt_token_ids", "usage"})

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k not in self._omit_none}

class Usage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Out):
    """A completion choice's (or chunk's) logprobs, one entry per token; offsets count characters of the
    choice's text (vLLM's running sum of the tokens' texts)."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(_Out):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(_Out):
    """``text_completion``: the whole answer, or (streaming) one chunk of it."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None


class TopLogprob(_Out):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Out):
    content: list[ChatLogprob] | None


class ChatMessageOut(_Out):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Out):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None
    token_ids: list[int] | None = None


class ChatResponse(_Out):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None


class ChatDelta(_Out):
    _omit_none: ClassVar[frozenset[str]] = frozenset({"role"})
    role: Literal["assistant"] | None = None
    content: str


class ChatChunkChoice(_Out):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatChunk(_Out):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(_Out):
    """An OpenAI model object, with vLLM's ``root`` and ``max_model_len`` and the ``vocab_size``."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "infinilm"
    root: str
    max_model_len: int
    vocab_size: int


class ModelList(_Out):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(_Out):
    """vLLM's ``/tokenize`` answer."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(_Out):
    """vLLM's ``/detokenize`` answer."""

    prompt: str


class VersionResponse(_Out):
    """vLLM's ``/version`` answer."""

    version: str
