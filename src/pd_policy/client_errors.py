"""What a client may not send or do, refused at the front door: a body past the size cap, a
client too slow to send its request, a field only the router may set, more media items
or content parts than the router plans for one request, and a connection past the
router's cap; and a
request that outlives its deadline.

Each is decided before any worker is called. None names more of the request than its
limit or its field: the body is never echoed.
"""

from __future__ import annotations

from .errors import PolicyError

__all__ = [
    "BodyTooLarge",
    "ClientTooSlow",
    "Overloaded",
    "RequestTimedOut",
    "RouterOwnedField",
    "TooManyMediaItems",
    "TooManyParts",
]


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


class RouterOwnedField(PolicyError):
    """The request sets a field only the router may set
    ([`ROUTER_FIELDS`][pd_policy.router_fields.ROUTER_FIELDS]); ``param`` names it."""

    code = "pd_router_owned_field"
    status = 400
    meaning = (
        "The request sets a field only the router may set: the KV handoff "
        "(kv_transfer_params), the encoder cache's handoff (ec_transfer_params), or those "
        "keys, or kv_cache_report_mode, inside vllm_xargs. A worker that took one from a "
        "client would connect where the client says and read the blocks it names. Refused "
        "on every route and decode form before any worker is called; never forwarded."
    )
    default_message = "the request sets a field only the router may set"


class TooManyMediaItems(PolicyError):
    """The request holds more media items than the router plans for one request."""

    code = "pd_too_many_media_items"
    status = 400
    meaning = (
        "The request holds more media items (images, videos, audio clips) than the router "
        "plans, names and places for one request (its --max-media-items): each costs the "
        "router work that one request must not be able to multiply without bound. Refused "
        "before any item is hashed or fetched, and before any worker is called."
    )
    default_message = "the request holds more media items than the router takes"


class TooManyParts(PolicyError):
    """The request holds more messages and content parts than the router takes."""

    code = "pd_too_many_parts"
    status = 400
    meaning = (
        "The request holds more messages and content parts together (or Responses input "
        "items and their parts) than the router takes for one request "
        "(--max-content-parts): the router walks them on every attempt, and one request "
        "must not be able to make that walk as long as it likes. Refused before any part "
        "is read, and before any worker is called."
    )
    default_message = "the request holds more messages and parts than the router takes"


class Overloaded(PolicyError):
    """The router holds as many client connections as it takes."""

    code = "pd_overloaded"
    status = 503
    meaning = (
        "The router already holds as many client connections as it takes "
        "(--max-client-connections): the new connection is answered with this and closed, "
        "before its request is read. The connections already held are not affected; another "
        "replica, or the same one a moment later, may take it."
    )
    default_message = "the router holds as many connections as it takes: try again later"
    may_retry = True


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
