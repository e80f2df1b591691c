"""The front door's limits on a client: how large its body may be, and how long it may take
to send its request.

A client that trickles its request holds a connection, and the memory of what it sent,
for as long as the proxy waits for it (slowloris). So each part of a request has a
deadline:

- its head (request line and headers): ``header_timeout`` seconds from the moment the
  connection opens, or from the end of the last response on it. ``aiohttp``'s server has
  no timer of its own for the head; its keep-alive timer is armed at exactly those two
  moments and closes the connection if no whole head has arrived when it fires, so it is
  that timer, set to ``header_timeout`` (which is thus also how long an idle keep-alive
  connection is kept: set it above a balancer's idle timeout in front of the proxy);
- its body: ``body_timeout`` seconds for the whole of it, from the end of the head, so
  that a client sending a byte now and then cannot hold it either; past it the client
  gets a 408 and the connection is closed;
- its size: ``max_body`` bytes, a 413 above (before it is read, when it declares its
  length).

Refusals are the OpenAI error body of [`BodyTooLarge`][pd_policy.client_errors.BodyTooLarge]
and [`ClientTooSlow`][pd_policy.client_errors.ClientTooSlow].
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from pd_policy import BodyTooLarge, ClientTooSlow, PolicyError

from .aio import web
from .body import MAX_BODY
from .relay import error_response

__all__ = ["BODY_TIMEOUT", "HEADER_TIMEOUT", "FrontDoor", "refusal"]

#: Seconds for a request's head, by default: generous for any client, and above the idle
#: timeouts balancers close their own connections at (60 s for most).
HEADER_TIMEOUT: Final = 75.0
#: Seconds for a whole body, by default: 256 MiB at about 1 MB/s.
BODY_TIMEOUT: Final = 300.0


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, not {value!r}")


@attrs.frozen(slots=True)
class FrontDoor:
    """The limits on clients (see the module docs). Raises ``ValueError`` for a limit that
    is not positive."""

    max_body: int = attrs.field(default=MAX_BODY, validator=_positive)
    header_timeout: float = attrs.field(default=HEADER_TIMEOUT, validator=_positive)
    body_timeout: float = attrs.field(default=BODY_TIMEOUT, validator=_positive)

    def server_args(self) -> dict[str, Any]:
        """The keywords of ``web.run_app`` and ``web.AppRunner`` that apply these limits
        to the server (the application's own is its ``client_max_size``)."""
        return {"keepalive_timeout": self.header_timeout}


async def refusal(request: web.Request, error: PolicyError) -> web.StreamResponse:
    """The client's answer for ``error``. A body too large ends its connection (the rest of
    it is not wanted); a client too slow gets its answer at once and the connection is
    closed after it, so that the slow body is not read any further."""
    response = error_response(error)
    if isinstance(error, BodyTooLarge):
        response.force_close()
    if not isinstance(error, ClientTooSlow):
        return response
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    # aiohttp would go on reading the rest of the body for its lingering time; the
    # transport sends what was written, then closes.
    if request.transport is not None:
        request.transport.close()
    return response
