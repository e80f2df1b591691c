"""The limits on a client's request: a body past the size cap and a client too slow to send
its request, refused at the front door, and a request that outlives its deadline.

The first two are decided before the request is read as JSON, so no worker is ever called.
None names more of the request than its limit: the body is never echoed.
"""

from __future__ import annotations

from .errors import PolicyError

__all__ = ["BodyTooLarge", "ClientTooSlow", "RequestTimedOut"]


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


class RequestTimedOut(PolicyError):
    """The request was not answered within the router's deadline for it."""

    code = "pd_request_timeout"
    status = 504
    meaning = (
        "The request was not answered within the router's deadline for a whole request "
        "(its legs and every retry). The legs in flight are abandoned; no worker is blamed. "
        "The same request would take as long again, so a gateway does not retry it."
    )
    default_message = "the request was not answered within the router's deadline"
