"""A worker's URL, parsed once for every leg to it: where to connect, and the first lines
of each request's head (its path, its ``Host``, and Basic auth from credentials in the URL,
as ``aiohttp`` sends them)."""

from __future__ import annotations

import base64
from urllib.parse import unquote, urlsplit

from pd_policy import InvalidConfiguration
from pd_policy.authority import split_host_port, url_host

from .errors import UpstreamUnreachable

__all__ = ["Target"]


class Target:
    """A URL, parsed once: where to connect, and the head's first lines for it."""

    __slots__ = ("authorization", "host", "origin", "port", "prefix", "tls")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            # Unreachable, as aiohttp's InvalidURL is a client error: the leg is tried on
            # another worker, and the message does not quote the URL (it may hold a key).
            raise UpstreamUnreachable("a worker URL is http:// or https:// with a host")
        self.tls = parts.scheme == "https"
        try:
            # The socket's host: an IPv6 address bare, its zone as "%eth0", not "%25eth0".
            self.host, port = split_host_port(parts.netloc.rpartition("@")[2])
        except InvalidConfiguration:
            raise UpstreamUnreachable("a worker URL's host and port are unreadable") from None
        self.port = port or (443 if self.tls else 80)
        self.origin = (parts.scheme, self.host, self.port)
        name = url_host(self.host)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.prefix = f"POST {path} HTTP/1.1\r\nHost: {name}:{self.port}\r\n".encode()
        self.authorization: str | None = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.authorization = "Basic " + base64.b64encode(pair.encode()).decode()
