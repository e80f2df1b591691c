"""What a failed call to a worker raises: ``aiohttp``'s own classes, so that a caller
tells an unreachable worker from one that failed mid-answer as it does for ``aiohttp``'s
client, and its handlers catch both.

None of their messages names the worker's address: a URL may carry credentials.
"""

from __future__ import annotations

from pd_policy_vllm.http.aio import aiohttp

__all__ = [
    "UpstreamDisconnected",
    "UpstreamProtocolError",
    "UpstreamTimeout",
    "UpstreamUnreachable",
]


class UpstreamUnreachable(aiohttp.ClientConnectionError):
    """No connection could be made: nothing was sent, so another worker may be tried."""


class UpstreamDisconnected(aiohttp.ServerDisconnectedError):
    """The worker closed the connection before its answer was whole."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


class UpstreamProtocolError(aiohttp.ClientPayloadError):
    """The worker's answer is not the HTTP/1.1 this client speaks."""


class UpstreamTimeout(aiohttp.ServerTimeoutError):
    """The worker was silent past the read timeout: its leg fails with a 504, and the
    connection is closed (its answer may still come, and must not be read as the next
    request's)."""
