"""The proxy's client for its workers' legs: HTTP/1.1 POSTs on kept-alive connections
([`client`][pd_policy_vllm.http.upstream.client]), one protocol per connection
([`connection`][pd_policy_vllm.http.upstream.connection]), within bounds
([`limits`][pd_policy_vllm.http.upstream.limits])."""

from .client import Observer, Upstream
from .errors import (
    UpstreamDisconnected,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from .limits import DEFAULT_LIMITS, Limits
from .response import Response

__all__ = [
    "DEFAULT_LIMITS",
    "Limits",
    "Observer",
    "Response",
    "Upstream",
    "UpstreamDisconnected",
    "UpstreamProtocolError",
    "UpstreamTimeout",
    "UpstreamUnreachable",
]
