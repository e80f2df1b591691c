"""The proxy's client for its workers' legs: HTTP/1.1 POSTs on kept-alive connections
([`client`][pd_policy_vllm.http.upstream.client]), one protocol per connection
([`connection`][pd_policy_vllm.http.upstream.connection])."""

from .client import Observer, Response, Upstream
from .errors import UpstreamDisconnected, UpstreamProtocolError, UpstreamUnreachable

__all__ = [
    "Observer", "Response", "Upstream", "UpstreamDisconnected", "UpstreamProtocolError",
    "UpstreamUnreachable",
]  # fmt: skip
