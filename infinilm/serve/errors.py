"""The errors the server answers with, in the OpenAI API's error body.

OpenAI's clients read ``{"error": {"message", "type", "param", "code"}}`` and raise by status (the `openai`
package: 400 `BadRequestError`, 404 `NotFoundError`, 429 `RateLimitError`, 5xx `InternalServerError`);
``param`` names the request field at fault, so a client can tell which of its arguments to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

__all__ = ["APIError", "bad_request"]

_TYPES: Final[Mapping[int, str]] = MappingProxyType({400: "invalid_request_error", 404: "invalid_request_error",
                                                    405: "invalid_request_error", 413: "invalid_request_error",
                                                    429: "rate_limit_error", 503: "server_unavailable"})


class APIError(Exception):
    """An HTTP error answer: `status`, a message that names the value found and what is needed, and the field.

    Attributes:
        status: the HTTP status (4xx for what the client sent, 5xx for the server's own state).
        message: one sentence a user can act on.
        param: the request field at fault (``messages[1].role``), or None when no one field is.
        code: OpenAI's machine-readable code (``model_not_found``, ``rate_limit_exceeded``), or None.
        headers: extra response headers (``Retry-After`` of a 429).
    """

    def __init__(self, status: int, message: str, param: str | None = None, *, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
        kind = _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def bad_request(param: str, message: str) -> APIError:
    """A 400 naming `param`; `message` is prefixed with it (``max_tokens: 0 is below 1``)."""
    return APIError(400, f"{param}: {message}", param)
