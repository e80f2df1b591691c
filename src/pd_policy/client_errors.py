"""The refusals of a client's own connection at the front door: a body past the size cap,
and a client too slow to send its request.

Both are decided before the request is read as JSON, so no worker is ever called, and
neither names more of the request than its size limit: the body is never echoed.
"""

from __future__ import annotations

from .errors import PolicyError

__all__ = ["BodyTooLarge", "ClientTooSlow"]


class BodyTooLarge(PolicyError):
    """The client's body is larger than the router takes."""

    code = "pd_body_too_large"
    status = 413
    meaning = (
        "The request body is larger than the router's cap (its Content-Length says so, or "
        "its chunks passed it while being read). Refused before the body is read whole, "
        "and before any worker is called."
    )
    default_message = "the request body is larger than the router accepts"


class ClientTooSlow(PolicyError):
    """The client did not send its whole body within the router's time limit."""

    code = "pd_client_timeout"
    status = 408
    meaning = (
        "The client did not send its whole request body within the router's time limit "
        "(a slow or stalled client holds a connection and its memory). The router answers "
        "and closes the connection; no worker is called."
    )
    default_message = "the request body did not arrive in time"
