"""The HTTP routes: OpenAI's completions, chat completions and models, ``/health`` and ``/metrics``, on aiohttp.

Responses follow the OpenAI API: ``text_completion`` / ``chat.completion`` objects with ``usage`` and
``finish_reason`` (``stop``: EOS, a stop token or a stop string; ``length``: ``max_tokens`` or
``max_model_len``; ``abort``: the server shut down, vLLM's word). With ``stream: true`` the answer is
server-sent events, one ``data:`` chunk per generated token (its text may be "" while a multi-byte
character or a possible stop string is held back), the last token's chunk carrying ``finish_reason``, then
a ``usage`` chunk when ``stream_options.include_usage`` asks for it, then ``data: [DONE]``; a chat stream
first sends the ``role`` delta, as OpenAI's does. An error after the stream started is sent as one
``data: {"error": ...}`` event before ``[DONE]``.

A client that disconnects cancels its request: the write of the next chunk fails, or (the server runs with
aiohttp's ``handler_cancellation``) the handler is cancelled while it waits, and the request leaves the
engine before the next step. Every error a request can cause is answered by the middleware as an OpenAI
error body; none reaches the engine thread or another request.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from infinilm.serve.engine_loop import EngineLoop, Request
from infinilm.serve.errors import APIError
from infinilm.serve.metrics import CONTENT_TYPE, ServerMetrics
from infinilm.serve.schemas import GenerationRequest, ModelInfo, parse_body, parse_chat, parse_completion
from infinilm.serve.text import TextOutput

__all__ = ["Routes"]

Piece = tuple[str, int | None, str | None]  # new text, the token (None: ended without one), finish reason
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _json(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=_dumps(obj), status=status, content_type="application/json", headers=headers)


class Routes:
    """The handlers of one server over one `EngineLoop`.

    Attributes:
        draining: set at shutdown: new generation requests get 503, ``/health`` says so.
    """

    def __init__(self, loop: EngineLoop, info: ModelInfo, metrics: ServerMetrics) -> None:
        self.loop, self.info, self.metrics = loop, info, metrics
        self.draining = False
        self.created = int(time.time())

    def install(self, app: web.Application) -> None:
        """Add the routes and the error middleware to `app`."""
        app.middlewares.append(self._errors)
        app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/health", self.health),
            web.get("/metrics", self.metrics_text),
        ])

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except APIError as err:
            return self._error(err)
        except web.HTTPException as err:
            if err.status < 400:
                raise
            param = "body" if err.status == 413 else None
            headers = {k: v for k, v in err.headers.items() if k in ("Allow",)}
            return self._error(APIError(err.status, f"{request.method} {request.path}: {err.reason}", param,
                                        headers=headers))
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as err:  # a bug: answer 500, keep serving
            traceback.print_exc(file=sys.stderr)
            return self._error(APIError(500, f"internal error: {type(err).__name__}: {err}"))

    def _error(self, err: APIError) -> web.Response:
        self.metrics.rejected.labels(str(err.status)).inc()
        # ASCII escapes: an error may quote any text the client sent, and the answer must still encode
        response = web.Response(text=json.dumps(err.body()), status=err.status, content_type="application/json",
                                headers=err.headers)
        if err.headers.get("Connection") == "close":
            response.force_close()
        return response

    # -- the OpenAI API ------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions``."""
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions``."""
        return await self._generate(request, chat=True)

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: the one served model, with vLLM's ``max_model_len`` and its ``vocab_size``."""
        card = {"id": self.info.name, "object": "model", "created": self.created, "owned_by": "infinilm",
                "root": self.info.name, "max_model_len": self.info.max_model_len,
                "vocab_size": self.info.vocab_size}
        return _json({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: 200 while the engine thread runs and the server is not shutting down, else 503."""
        if self.draining or not self.loop.alive:
            return _json({"status": "shutting down" if self.draining else "engine stopped"}, 503)
        return _json({"status": "ok"})

    async def metrics_text(self, request: web.Request) -> web.Response:
        """``GET /metrics``: the Prometheus text format (`infinilm.serve.metrics`)."""
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.RequestPayloadError as err:  # a body its Content-Encoding cannot decode, a broken chunking
            detail = " ".join(str(err).split()).removeprefix("400, message: ")
            # aiohttp cannot find the next request on this connection any more: say so, so that a client opens
            # a new one instead of sending its next request into a closed socket (a reset on keep-alive)
            raise APIError(400, f"body: cannot be read ({detail})", "body", headers={"Connection": "close"}) from None
        body = parse_body(raw)
        parse = parse_chat if chat else parse_completion  # in a thread: encoding a long prompt (the tokenizer lets
        greq = await asyncio.to_thread(parse, body, self.info)  # the GIL go) must not hold up the other streams
        if self.draining:
            raise APIError(503, "the server is shutting down")
        handle = self.loop.submit(greq.prompt, greq.params)
        try:
            first = await handle.events.get()
            if first.error is not None:
                raise first.error
            if first.final:  # aborted before it started
                raise APIError(503, "the server is shutting down")
            if greq.stream:
                return await self._stream(request, greq, handle, chat)
            return await self._complete(greq, handle, chat)
        finally:
            self.loop.cancel(handle)  # nothing when it already ended

    async def _pieces(self, greq: GenerationRequest, handle: Request) -> AsyncIterator[Piece]:
        text = TextOutput(self.info.tokenizer, greq.stop)
        while True:
            event = await handle.events.get()
            if event.error is not None:
                raise event.error
            if event.token is None:  # ended by the server (shutdown)
                new = text.flush()
                yield new, None, "stop" if text.stopped else "abort"
                return
            new = text.push(event.token)
            if text.stopped:
                self.loop.cancel(handle, "stop")
                yield new, event.token, "stop"
                return
            if event.final:
                new += text.flush()
                yield new, event.token, "stop" if text.stopped else event.finish_reason
                return
            yield new, event.token, None

    def _usage(self, greq: GenerationRequest, completion_tokens: int) -> dict[str, int]:
        n = len(greq.prompt)
        return {"prompt_tokens": n, "completion_tokens": completion_tokens, "total_tokens": n + completion_tokens}

    async def _complete(self, greq: GenerationRequest, handle: Request, chat: bool) -> web.Response:
        parts, ids, reason = [], [], None
        async for new, token, reason in self._pieces(greq, handle):  # noqa: B007 - the last one is wanted
            parts.append(new)
            if token is not None:
                ids.append(token)
        text = "".join(parts)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        if greq.return_token_ids:
            choice["token_ids"] = ids
        out = {"id": _request_id(chat), "object": "chat.completion" if chat else "text_completion",
               "created": int(time.time()), "model": self.info.name, "choices": [choice],
               "usage": self._usage(greq, len(ids))}
        if greq.return_token_ids:
            out["prompt_token_ids"] = greq.prompt
        return _json(out)

    async def _stream(self, request: web.Request, greq: GenerationRequest, handle: Request,
                      chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        head = {"id": _request_id(chat), "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": self.info.name}

        async def send(obj: object) -> None:
            await resp.write(f"data: {_dumps(obj)}\n\n".encode())

        try:
            try:
                if chat:
                    await send({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                     "logprobs": None, "finish_reason": None}]})
                count = 0
                async for new, token, reason in self._pieces(greq, handle):
                    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
                    if chat:
                        choice["delta"] = {"content": new}
                    else:
                        choice["text"] = new
                    if greq.return_token_ids:
                        choice["token_ids"] = [] if token is None else [token]
                    count += token is not None
                    await send({**head, "choices": [choice]})
                if greq.include_usage:
                    await send({**head, "choices": [], "usage": self._usage(greq, count)})
            except APIError as err:  # the engine failed after the stream started
                self.metrics.rejected.labels(str(err.status)).inc()
                await send(err.body())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:  # the client is gone; `_generate` cancels the request
            pass
        return resp


def _request_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
