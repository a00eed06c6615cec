"""The server's middlewares besides the error answers: the access log and the API key.

Access log: one line per request on the ``infinilm.serve.access`` logger (the `logging` module; `infinilm serve`
writes it to stderr at INFO, ``--disable-access-log`` turns it off): the client's address, the request line,
the status and the time from the request to the end of its answer (a stream's last event included), as
``127.0.0.1 "POST /v1/completions HTTP/1.1" 200 12.3ms``; 499 (nginx's "client closed request") when the
client left before the answer ended.

API key (``--api-key`` or ``INFINILM_API_KEY``, vLLM's ``--api-key`` / ``VLLM_API_KEY``): every ``/v1`` route
needs the header ``Authorization: Bearer <key>``, else it is answered 401 with OpenAI's error body (code
``invalid_api_key``) and ``WWW-Authenticate: Bearer``; as in vLLM, ``/health``, ``/metrics``, ``/version``,
``/tokenize`` and ``/detokenize`` stay open. Keys are compared in constant time (`hmac.compare_digest`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from aiohttp import web

from infinilm.serve.errors import APIError

__all__ = ["ACCESS_LOG", "Handler", "Middleware", "access_log", "require_api_key"]

ACCESS_LOG: Final = logging.getLogger("infinilm.serve.access")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Middleware = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]
_CLIENT_GONE: Final = 499


@web.middleware
async def access_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Log one line for `request` once its answer has ended (outermost: it sees the status that was sent)."""
    start, status = time.perf_counter(), 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as err:
        status = err.status
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        status = _CLIENT_GONE
        raise
    finally:
        if ACCESS_LOG.isEnabledFor(logging.INFO):
            ACCESS_LOG.info('%s "%s %s HTTP/%d.%d" %d %.1fms', request.remote, request.method, request.path,
                            request.version.major, request.version.minor, status,
                            1e3 * (time.perf_counter() - start))


def require_api_key(keys: Sequence[str]) -> Middleware:
    """A middleware that answers 401 to a ``/v1`` request without ``Authorization: Bearer <one of keys>``.

    Raises:
        ValueError: `keys` is empty or holds an empty key.
    """
    if not keys or not all(keys):
        raise ValueError(f"keys={list(keys)!r}: give at least one non-empty API key")
    expected = [k.encode() for k in keys]

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and request.path.startswith("/v1"):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise _unauthorized("no API key: send the header 'Authorization: Bearer <key>'")
            given = token.strip().encode()
            if not any([hmac.compare_digest(given, k) for k in expected]):  # a list: every key is compared
                raise _unauthorized("incorrect API key")
        return await handler(request)

    return check


def _unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
