"""The HTTP connection of ``infinilm serve``: aiohttp's, with the limits a server on a network needs.

- **Protocol errors** (a request aiohttp's parser refuses: an unknown method, a malformed line or header,
  ``Content-Encoding: br``, data after ``Connection: close``) are answered with the OpenAI error body, as every
  other error (`infinilm.serve.errors`); aiohttp's own answer is text/plain. The connection closes.
- **Half-close**: a client that sends its request and then shuts its side down (``shutdown(SHUT_WR)``, as
  HTTP/1.0 clients and ``nc -N`` do) gets its answer, and the requests it pipelined before, as nginx and Python's
  ``http.server`` give them; then the connection closes. aiohttp closes the connection at the end of input, so
  the request was cancelled. The cost: end of input no longer says that a client has gone, so a non-streamed
  request whose client closed its socket entirely runs to its end (the write of its answer fails); a stream
  sees the client gone at its next chunk, as before. A body cut short by the half-close is a 400 (``body``).
- **Read timeouts** (`read_timeout`, ``--read-timeout``, 60 s by default, nginx's ``client_header_timeout``
  and ``client_body_timeout``): a connection whose first request line and headers have not all arrived within
  it (slowloris) is answered 408 and closed, and so is a request whose body has not (`body_limits`); later
  requests on a keep-alive connection have aiohttp's keep-alive timeout.
- **Body limit**: a ``Content-Length`` above the application's ``client_max_size`` is a 413 at once, before
  any of the body is read (aiohttp refuses it only once that much has arrived, so a client that waits for an
  answer before sending waits for ever); the connection closes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from infinilm.serve.errors import APIError

__all__ = ["Runner", "body_limits"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OnError = Callable[[int], None]  # counts a refusal by status (the server's rejected-requests metric)


def _answer(err: APIError) -> web.Response:
    response = web.Response(text=json.dumps(err.body()), status=err.status, content_type="application/json")
    response.force_close()
    return response


class _Connection(RequestHandler):
    """One client connection (see the module's notes); aiohttp's private state it reads: ``_messages`` (requests
    parsed, not yet handled), ``_waiter`` (set while the connection waits for a request), ``_current_request``."""

    def __init__(self, manager: web.Server, read_timeout: float, on_error: OnError, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._read_timeout, self._on_error = read_timeout, on_error
        self._eof = False
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._header_timer = asyncio.get_running_loop().call_later(self._read_timeout, self._headers_timed_out)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_timer is not None and self._messages:  # the first request's line and headers arrived
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.transport is None or self._messages or self._current_request is not None:
            return
        self._on_error(408)
        err = APIError(408, f"the request's line and headers did not arrive within {self._read_timeout:g} s "
                       "(--read-timeout)")
        body = json.dumps(err.body()).encode()
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        self.force_close()  # the transport sends what it holds, then closes

    def eof_received(self) -> bool:
        if self._waiter is not None and not self._messages:  # waiting for a request that cannot come now
            return False  # close
        self._eof = True
        asyncio.get_running_loop().call_soon(self._cut_body)  # after the handler's task has started
        return True  # keep the transport open to write the answers

    def _cut_body(self) -> None:
        request = self._current_request
        if request is not None and not request.content.is_eof():  # its body cannot arrive now
            request.content.set_exception(web.RequestPayloadError(
                "the client shut its side of the connection down before the whole body arrived"))
            request.content.feed_eof()  # nothing more to read (aiohttp would read on after the answer)

    async def finish_response(self, request: web.BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        if isinstance(resp, web.HTTPException) and resp.status >= 400:  # raised before the middlewares ran (an
            self._on_error(resp.status)  # ``Expect`` aiohttp does not know: 417): the OpenAI body too
            resp = _answer(APIError(resp.status, f"{request.method} {request.path}: {resp.text or resp.reason}"))
        if self._eof and not self._messages:  # the last answer on a half-closed connection: then close
            resp.force_close()
        if request.content.exception() is not None:  # a body that cannot be read (bad gzip): aiohttp would read
            request.content.feed_eof()  # on after the answer, raise again and log a traceback per request
        return await super().finish_response(request, resp, start_time)

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            super().handle_error(request, status, exc, message)  # logs the traceback; raises if an answer began
            self._on_error(status)
            return _answer(APIError(status, f"internal error: {type(exc).__name__ if exc else 'unknown'}"))
        if request.writer.output_size > 0:
            raise ConnectionError("an answer has begun: no error answer can follow")
        detail = " ".join(str(message or exc or "").split())[:300]
        self.logger.debug("a request the HTTP parser refused: %s", detail)  # not a traceback per hostile client
        self._on_error(status)
        return _answer(APIError(status, f"the request is not valid HTTP/1.1: {detail}"))


class _Server(web.Server):
    """aiohttp's `web.Server` making `_Connection`s (aiohttp takes no argument for the protocol class)."""

    read_timeout: float = 60.0
    on_error: OnError = staticmethod(lambda status: None)

    def __call__(self) -> _Connection:
        return _Connection(self, self.read_timeout, self.on_error, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """`web.AppRunner` whose connections follow the module's notes.

    Args:
        read_timeout: seconds for a connection's first request line and headers (then 408 and close).
        on_error: called with the status of each protocol-level refusal (408, a parser's 400).
    """

    def __init__(self, app: web.Application, *, read_timeout: float, on_error: OnError, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._read_timeout, self._on_error = read_timeout, on_error

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same object, making our connections (_Server adds no state of its own)
        server.read_timeout, server.on_error = self._read_timeout, self._on_error  # type: ignore[attr-defined]
        return server


def body_limits(read_timeout: float) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """A middleware that reads a request's body before its handler: 413 at once for a ``Content-Length`` above
    ``client_max_size``, 408 when the body has not arrived within `read_timeout` seconds (both close the
    connection, param ``body``). Install it inside the error middleware, which answers its `APIError`s."""

    @web.middleware
    async def limits(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            size, limit = request.content_length, request.client_max_size
            if size is not None and limit and size > limit:
                raise APIError(413, f"body: Content-Length {size} is above the limit of {limit} bytes", "body",
                               headers={"Connection": "close"})
            try:
                await asyncio.wait_for(request.read(), read_timeout)
            except TimeoutError:
                raise APIError(408, f"body: did not arrive within {read_timeout:g} s (--read-timeout)", "body",
                               headers={"Connection": "close"}) from None
            except web.RequestPayloadError:
                pass  # the handler's own read raises it again and answers it
        return await handler(request)

    return limits
