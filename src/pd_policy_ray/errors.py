"""A policy refusal as Ray Serve LLM returns an error: vLLM's ``ErrorResponse``.

Ray's ingress turns an ``ErrorResponse`` yielded by the decode server into an HTTP
error with its ``code`` as the status and its ``message`` and ``type``; it drops any
other field. So the policy's error code (``pd_...``) leads the message, where a client
and a log can read it, and the status and OpenAI type are the error's own. Raised
inside the server instead, a refusal would reach the client as a 500 with a traceback.
"""

from __future__ import annotations

from typing import Any

from pd_policy import PolicyError

__all__ = ["error_fields", "error_response"]


def error_fields(error: PolicyError) -> dict[str, Any]:
    """The fields of the ``ErrorInfo`` that stands for ``error``: ``message`` (its code,
    then its message), ``type``, ``param`` and ``code`` (the HTTP status)."""
    return {
        "message": f"{error.code}: {error.message}",
        "type": error.error_type,
        "param": error.param,
        "code": error.status,
    }


def error_response(error: PolicyError) -> Any:
    """Ray's (vLLM's) ``ErrorResponse`` for ``error``. Needs Ray Serve LLM."""
    from .seam import ErrorInfo, ErrorResponse

    return ErrorResponse(error=ErrorInfo(**error_fields(error)))
