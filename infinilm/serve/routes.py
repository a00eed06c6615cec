"""The HTTP routes, on aiohttp: OpenAI's completions, chat completions and models; vLLM's ``/tokenize``,
``/detokenize`` and ``/version``; ``/health`` and ``/metrics``.

Responses follow the OpenAI API (`infinilm.serve.responses`): ``text_completion`` / ``chat.completion`` objects
with ``usage``, ``finish_reason`` (``stop``: EOS, a stop token or a stop string; ``length``: ``max_tokens`` or
``max_model_len``; ``abort``: the server shut down, vLLM's word) and vLLM's ``stop_reason``
(`infinilm.serve.choices`). A request of several prompts or ``n`` > 1 runs one engine request per choice, all
at once; ``usage`` counts each prompt once and every choice's tokens. With ``stream: true`` the answer is
server-sent events, one ``data:`` chunk per generated token of a choice (its text may be "" while a
multi-byte character or a possible stop string is held back; the choices' chunks interleave as they come),
each choice's last chunk carrying its ``finish_reason``, then a ``usage`` chunk when
``stream_options.include_usage`` asks for it, then ``data: [DONE]``; a chat stream first sends each choice's
``role`` delta, as OpenAI's does. An error after the stream started is sent as one ``data: {"error": ...}``
event before ``[DONE]``.

A client that disconnects cancels its request: the write of the next chunk fails, or (the server runs with
aiohttp's ``handler_cancellation``) the handler is cancelled while it waits, and its engine requests leave
the engine before the next step. Every error a request can cause is answered by the middleware as an OpenAI
error body; none reaches the engine or another request.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import traceback
import uuid
from collections.abc import Sequence

from aiohttp import web
from pydantic import BaseModel

from infinilm.serve.choices import Choice, TokenTexts, merged
from infinilm.serve.engine_client import EngineClient
from infinilm.serve.errors import APIError, bad_request
from infinilm.serve.metrics import CONTENT_TYPE, ServerMetrics
from infinilm.serve.middleware import Handler, access_log, require_api_key
from infinilm.serve.responses import (
    ChatChoice,
    ChatChunk,
    ChatChunkChoice,
    ChatDelta,
    ChatMessageOut,
    ChatResponse,
    CompletionChoice,
    CompletionResponse,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
    Usage,
    VersionResponse,
)
from infinilm.serve.schemas import (
    DetokenizeRequest,
    GenerationRequest,
    ModelInfo,
    TokenizeRequest,
    check_model,
    parse_body,
    parse_chat,
    parse_completion,
    render_text,
    validate,
)
from infinilm.serve.sse import TokenFrames, frame
from infiniops_py import __version__

__all__ = ["Routes"]


def _json(obj: BaseModel | dict[str, object], status: int = 200) -> web.Response:
    text = obj.model_dump_json() if isinstance(obj, BaseModel) else json.dumps(obj)
    return web.Response(text=text, status=status, content_type="application/json")


class Routes:
    """The handlers of one server over one `EngineClient`.

    Attributes:
        draining: set at shutdown: new generation requests get 503, ``/health`` says so.
        api_keys: the keys a ``/v1`` request must bear (`infinilm.serve.middleware`); empty: none needed.
    """

    def __init__(self, loop: EngineClient, info: ModelInfo, metrics: ServerMetrics, *,
                 api_keys: Sequence[str] = ()) -> None:
        self.loop, self.info, self.metrics = loop, info, metrics
        self.api_keys = tuple(api_keys)
        self.draining = False
        self.created = int(time.time())

    def install(self, app: web.Application) -> None:
        """Add the routes and the middlewares (access log, error answers, API key) to `app`."""
        app.middlewares.append(access_log)  # outermost: it logs the status the error middleware answered
        app.middlewares.append(self._errors)
        if self.api_keys:
            app.middlewares.append(require_api_key(self.api_keys))
        app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model:.+}", self.model),
            web.post("/tokenize", self.tokenize),
            web.post("/detokenize", self.detokenize),
            web.get("/version", self.version),
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

    def _card(self) -> ModelCard:
        return ModelCard(id=self.info.name, created=self.created, root=self.info.name,
                         max_model_len=self.info.max_model_len, vocab_size=self.info.vocab_size)

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``: the one served model, with vLLM's ``max_model_len`` and its ``vocab_size``."""
        return _json(ModelList(data=[self._card()]))

    async def model(self, request: web.Request) -> web.Response:
        """``GET /v1/models/{id}``: the served model's card; 404 (``model_not_found``) for another id."""
        check_model(request.match_info["model"], self.info)
        return _json(self._card())

    # -- vLLM's extra routes ---------------------------------------------------------------------------
    async def tokenize(self, request: web.Request) -> web.Response:
        """``POST /tokenize`` (vLLM's): the token ids of a ``prompt`` (special tokens added unless
        ``add_special_tokens: false``) or of chat ``messages`` rendered by the chat template (none added
        unless ``add_special_tokens: true``), with ``count`` and ``max_model_len``; ``token_strs`` (the
        tokenizer's token strings) with ``return_token_strs``."""
        body = parse_body(await self._read(request))
        check_model(body.get("model"), self.info)
        req = validate(TokenizeRequest, body)
        tokenizer = self.info.tokenizer
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("prompt", "give either prompt (a text) or messages (a chat)")
        if req.messages is not None:
            if req.add_generation_prompt is False:
                raise bad_request("add_generation_prompt", "only true is supported")
            text, special = render_text(req.messages, self.info), bool(req.add_special_tokens)
        else:
            text, special = req.prompt or "", req.add_special_tokens is not False
        if tokenizer is None:
            raise bad_request("prompt", f"model {self.info.name!r} has no tokenizer.json")
        ids = (await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=special)).ids  # off the loop
        strs = [tokenizer.id_to_token(t) for t in ids] if req.return_token_strs else None
        return _json(TokenizeResponse(count=len(ids), max_model_len=self.info.max_model_len, tokens=ids,
                                      token_strs=strs))

    async def detokenize(self, request: web.Request) -> web.Response:
        """``POST /detokenize`` (vLLM's): the text of ``tokens`` (special tokens kept, as vLLM decodes them)."""
        body = parse_body(await self._read(request))
        check_model(body.get("model"), self.info)
        req = validate(DetokenizeRequest, body)
        if self.info.tokenizer is None:
            raise bad_request("tokens", f"model {self.info.name!r} has no tokenizer.json")
        bad = next((i for i, t in enumerate(req.tokens) if not 0 <= t < self.info.vocab_size), None)
        if bad is not None:
            raise bad_request("tokens", f"token id {req.tokens[bad]} (item {bad}) is outside the vocabulary "
                              f"[0, {self.info.vocab_size})")
        return _json(DetokenizeResponse(prompt=self.info.tokenizer.decode(req.tokens, skip_special_tokens=False)))

    async def version(self, request: web.Request) -> web.Response:
        """``GET /version`` (vLLM's): the installed infiniops-py version."""
        return _json(VersionResponse(version=__version__))

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health``: 200 while the engine (its process or thread) runs and the server is not shutting down,
        else 503."""
        if self.draining or not self.loop.alive:
            return _json({"status": "shutting down" if self.draining else "engine stopped"}, 503)
        return _json({"status": "ok"})

    async def metrics_text(self, request: web.Request) -> web.Response:
        """``GET /metrics``: the Prometheus text format (`infinilm.serve.metrics`)."""
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # -- generation ------------------------------------------------------------------------------------
    async def _read(self, request: web.Request) -> bytes:
        try:
            return await request.read()
        except web.RequestPayloadError as err:  # a body its Content-Encoding cannot decode, a broken chunking
            detail = " ".join(str(err).split()).removeprefix("400, message: ")
            # aiohttp cannot find the next request on this connection any more: say so, so that a client opens
            # a new one instead of sending its next request into a closed socket (a reset on keep-alive)
            raise APIError(400, f"body: cannot be read ({detail})", "body", headers={"Connection": "close"}) from None

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = parse_body(await self._read(request))
        parse = parse_chat if chat else parse_completion  # in a thread: encoding a long prompt (the tokenizer lets
        greq = await asyncio.to_thread(parse, body, self.info)  # the GIL go) must not hold up the other streams
        if self.draining:
            raise APIError(503, "the server is shutting down")
        specs = greq.choices()
        if len(specs) > self.loop.max_waiting:  # more than could ever wait at once
            raise bad_request("n" if greq.n > 1 else "prompt", f"{len(greq.prompts)} prompt(s) x n={greq.n} is "
                              f"{len(specs)} choices; this server takes at most {self.loop.max_waiting} at once "
                              "(--max-waiting)")
        choices: list[Choice] = []
        try:
            for index, p, params in specs:
                choices.append(Choice(index, greq.prompts[p], params, self.loop.submit(greq.prompts[p], params)))
            for c in choices:
                first = await c.handle.events.get()
                if first.error is not None:
                    raise first.error
                if first.final:  # aborted before it started
                    raise APIError(503, "the server is shutting down")
            if greq.stream:
                return await self._stream(request, greq, choices, chat)
            return await self._complete(greq, choices, chat)
        finally:
            for c in choices:
                self.loop.cancel(c.handle)  # nothing when it already ended

    def _usage(self, greq: GenerationRequest, completion_tokens: int) -> Usage:
        n = sum(len(p) for p in greq.prompts)
        return Usage(prompt_tokens=n, completion_tokens=completion_tokens, total_tokens=n + completion_tokens)

    async def _complete(self, greq: GenerationRequest, choices: list[Choice], chat: bool) -> web.Response:
        async for _ in merged(choices, self.loop, self.info, greq.stop):
            pass
        texts, want = TokenTexts(self.info.tokenizer), greq.logprobs is not None
        usage = self._usage(greq, sum(len(c.token_ids) for c in choices))
        ids = greq.return_token_ids
        head = {"id": _request_id(chat), "created": int(time.time()), "model": self.info.name}
        if chat:
            return _json(ChatResponse(**head, usage=usage, prompt_token_ids=greq.prompts[0] if ids else None, choices=[
                ChatChoice(index=c.index, message=ChatMessageOut(content=c.text),
                           logprobs=texts.chat(c.pieces) if want else None, finish_reason=c.last.finish_reason,
                           stop_reason=c.last.stop_reason, token_ids=c.token_ids if ids else None)
                for c in choices]))
        single = ids and len(greq.prompts) == 1
        return _json(CompletionResponse(**head, usage=usage, prompt_token_ids=greq.prompts[0] if single else None,
                                        choices=[
            CompletionChoice(index=c.index, text=c.text, logprobs=texts.completion(c.pieces, 0) if want else None,
                             finish_reason=c.last.finish_reason, stop_reason=c.last.stop_reason,
                             token_ids=c.token_ids if ids else None, prompt_token_ids=c.prompt if ids else None)
            for c in choices]))

    async def _stream(self, request: web.Request, greq: GenerationRequest, choices: list[Choice],
                      chat: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        head = {"id": _request_id(chat), "created": int(time.time()), "model": self.info.name}
        texts, want, ids = TokenTexts(self.info.tokenizer), greq.logprobs is not None, greq.return_token_ids

        frames = TokenFrames(**head, chat=chat)
        pending: list[bytes] = []  # frames not yet written: one write for the tokens that came together
        single = choices[0].handle.events if len(choices) == 1 else None

        def add(obj: BaseModel | dict[str, object]) -> None:
            pending.append(frame(obj.model_dump_json() if isinstance(obj, BaseModel) else json.dumps(obj)))

        async def flush() -> None:
            if pending:
                data = b"".join(pending)
                pending.clear()
                await resp.write(data)

        try:
            try:
                if chat:
                    for c in choices:
                        add(ChatChunk(**head, choices=[ChatChunkChoice(
                            index=c.index, delta=ChatDelta(role="assistant", content=""), logprobs=None,
                            finish_reason=None)]))
                    await flush()
                count = 0
                async for c, piece in merged(choices, self.loop, self.info, greq.stop):
                    token_ids = ([] if piece.token is None else [piece.token]) if ids else None
                    if not (want and piece.token is not None):  # no logprobs: the frame without pydantic
                        pending.append(frames.token(c.index, piece.text, piece.finish_reason, piece.stop_reason,
                                                    token_ids))
                    elif chat:
                        add(ChatChunk(**head, choices=[ChatChunkChoice(
                            index=c.index, delta=ChatDelta(content=piece.text), logprobs=texts.chat([piece]),
                            finish_reason=piece.finish_reason, stop_reason=piece.stop_reason,
                            token_ids=token_ids)]))
                    else:
                        logprobs = texts.completion([piece], c.offset)
                        c.offset += sum(map(len, logprobs.tokens))
                        add(CompletionResponse(**head, choices=[CompletionChoice(
                            index=c.index, text=piece.text, logprobs=logprobs, finish_reason=piece.finish_reason,
                            stop_reason=piece.stop_reason, token_ids=token_ids)]))
                    count += piece.token is not None
                    if single is None or single.empty():  # else the next token is here already: write both
                        await flush()
                if greq.include_usage:
                    usage = self._usage(greq, count)
                    add(ChatChunk(**head, choices=[], usage=usage) if chat
                        else CompletionResponse(**head, choices=[], usage=usage))
            except APIError as err:  # the engine failed after the stream started
                self.metrics.rejected.labels(str(err.status)).inc()
                add(err.body())
            pending.append(b"data: [DONE]\n\n")
            await flush()
            await resp.write_eof()
        except ConnectionResetError:  # the client is gone; `_generate` cancels the request
            pass
        return resp


def _request_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
