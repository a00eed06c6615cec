"""A stream's token chunks as server-sent-event frames, built without pydantic.

A streamed token is one ``data:`` frame, so at 64 streams of one token per engine step the frames' cost is the
server's cost per token. `TokenFrames` writes a token chunk without logprobs (what every chat client streams) as
bytes from a prefix encoded once per stream and the token's own fields, each through `json.dumps`: the same
bytes as the pydantic models' ``model_dump_json`` (`infinilm.serve.responses`: ``CompletionResponse`` with
one ``CompletionChoice``, ``ChatChunk`` with one ``ChatChunkChoice``; compact separators, UTF-8, fields in
their declared order, ``token_ids`` only when asked for). Chunks with logprobs, a role delta or usage go
through the models.
"""

from __future__ import annotations

import json
from functools import partial
from json.encoder import encode_basestring  # what json.dumps(str, ensure_ascii=False) calls: C, no encoder object

__all__ = ["TokenFrames", "frame"]

_dumps = partial(json.dumps, ensure_ascii=False, separators=(",", ":"))


def _value(v: str | int | None) -> str:
    return "null" if v is None else encode_basestring(v) if isinstance(v, str) else _dumps(v)


def frame(text: str) -> bytes:
    """The ``data: <text>`` event, UTF-8."""
    return f"data: {text}\n\n".encode()


class TokenFrames:
    """The token chunks of one stream.

    Args:
        id / created / model: the stream's ``id``, ``created`` (Unix seconds) and ``model``.
        chat: ``chat.completion.chunk`` frames (a ``delta``) instead of ``text_completion`` ones (a ``text``).
    """

    def __init__(self, id: str, created: int, model: str, *, chat: bool) -> None:
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._head = (f'data: {{"id":{_dumps(id)},"object":"{obj}","created":{int(created)},"model":{_dumps(model)},'
                      '"choices":[{"index":')
        self._text = ',"delta":{"content":' if chat else ',"text":'
        self._close = "}" if chat else ""

    def token(self, index: int, text: str, finish_reason: str | None = None, stop_reason: int | str | None = None,
              token_ids: list[int] | None = None) -> bytes:
        """The frame of one choice's chunk: its new `text`, no logprobs, and `token_ids` when not None."""
        ids = "" if token_ids is None else f',"token_ids":{_dumps(token_ids)}'
        return (f'{self._head}{int(index)}{self._text}{encode_basestring(text)}{self._close},"logprobs":null,'
                f'"finish_reason":{_value(finish_reason)},"stop_reason":{_value(stop_reason)}{ids}}}]}}\n\n').encode()
