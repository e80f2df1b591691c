"""A host (and port) as a URL's authority, and back: an IPv6 address kept whole.

Worker addresses come as operators write them: ``10.0.0.5:8000``, ``fe80::1``,
``[fe80::1]:8000``, ``fe80::1%eth0`` (a link-local address with its zone). Splitting
such text at the first or last colon cuts an IPv6 address apart, and pasting one into
``http://{host}:{port}`` makes a URL no client parses. Every place that builds a URL,
a ``host:port`` or a bootstrap address goes through here:

* [`url_host`][pd_policy.authority.url_host]: the host as a URL writes it, an IPv6
  address in brackets, its zone's ``%`` as ``%25`` (RFC 6874);
* [`authority`][pd_policy.authority.authority]: that and ``:port``;
* [`split_host_port`][pd_policy.authority.split_host_port]: ``host[:port]`` text back
  to the bare host (zone unescaped, as a socket takes it) and the port;
* [`worker_url`][pd_policy.authority.worker_url]: a worker address, with or without its
  scheme, as the ``scheme://authority[/path]`` URL the proxy calls.

Pure; raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for an
address it cannot read one way only. Messages never quote the address (a URL may hold
credentials).
"""

from __future__ import annotations

import ipaddress
from typing import Final

from .errors import InvalidConfiguration

__all__ = ["authority", "host_of_url", "split_host_port", "url_host", "worker_url"]

_SCHEMES: Final = ("http://", "https://")
_FORBIDDEN: Final = frozenset("/?#@[] \t\r\n\\")


def _ipv6(text: str) -> str | None:
    """``text`` as a bare IPv6 address (zone unescaped), or ``None`` when it is none."""
    address, percent, zone = text.replace("%25", "%", 1).partition("%")
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return None
    if percent and (not zone.isprintable() or set(zone) & _FORBIDDEN or "%" in zone or not zone):
        raise InvalidConfiguration("an IPv6 zone id must be a plain interface name", "host")
    return f"{address}%{zone}" if zone else address


def url_host(host: str) -> str:
    """``host`` as a URL's authority writes it: an IPv6 address (bare, or already in
    brackets; with a zone id written ``%`` or ``%25``) in brackets with its zone as
    ``%25``; any other host unchanged.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for an empty
    host, brackets around something that is no IPv6 address, a bad zone, or a host that
    holds a character that would end or change the authority (``/ ? # @``, a blank, a
    colon outside an IPv6 address).
    """
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    v6 = _ipv6(inner)
    if v6 is not None:
        return f"[{v6.replace('%', '%25', 1)}]"
    if inner is not host:
        raise InvalidConfiguration("brackets in a host hold an IPv6 address", param="host")
    if not host or set(host) & (_FORBIDDEN | {":"}):
        raise InvalidConfiguration("a host is a name or an IP address", param="host")
    return host


def authority(host: str, port: int | None = None) -> str:
    """``host`` (see [`url_host`][pd_policy.authority.url_host]) and ``:port`` when given.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] as ``url_host``
    does, and for a port outside 1..65535."""
    if port is None:
        return url_host(host)
    if type(port) is not int or not 1 <= port <= 65535:
        raise InvalidConfiguration("a port is an integer in 1..65535", param="port")
    return f"{url_host(host)}:{port}"


def split_host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 address (taken whole:
    ``fe80::1`` has no port) as the bare host and the port (``None`` when absent). An IPv6
    host comes back without brackets and with its zone as a socket takes it
    (``fe80::1%eth0``).

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for text no
    authority reads: an unclosed bracket, a port that is no integer in 1..65535, a host
    [`url_host`][pd_policy.authority.url_host] refuses."""
    if text.startswith("["):
        close = text.find("]")
        rest = text[close + 1 :] if close > 0 else "?"
        if rest and not rest.startswith(":"):
            raise InvalidConfiguration("an IPv6 address in brackets, then :port", "host")
        host, port_text = text[1:close], rest[1:] if rest else None
    elif _ipv6(text) is not None:
        host, port_text = text, None
    else:
        host, sep, port_text_or_host = text.rpartition(":")
        host, port_text = (host, port_text_or_host) if sep else (text, None)
    if port_text is not None and not (port_text.isascii() and port_text.isdigit()):
        raise InvalidConfiguration("a port is an integer in 1..65535", param="port")
    port = int(port_text) if port_text is not None else None
    authority(host, port)  # checks both
    v6 = _ipv6(host)
    return (v6 if v6 is not None else host), port


def worker_url(address: str, *, scheme: str = "http") -> str:
    """A worker address as the URL the proxy calls: ``scheme://authority`` plus the
    address's own path, with no trailing ``/``. ``address`` is a URL (``http://`` or
    ``https://``, its host in brackets when IPv6) or, without a scheme, what
    [`split_host_port`][pd_policy.authority.split_host_port] reads (``fe80::1``,
    ``[fe80::1]:8000``, ``host:8000``), which gets ``scheme``.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for an
    address it cannot read one way only, such as an IPv6 address outside brackets in a
    URL (``http://fe80::1:8000``: is ``8000`` the port or the last group?).
    """
    lowered = address[:8].lower()
    given = next((s for s in _SCHEMES if lowered.startswith(s)), None)
    if given is None:
        if "://" in address:
            raise InvalidConfiguration("a worker URL is http:// or https://", param="url")
        host, port = split_host_port(address.rstrip("/"))
        return f"{scheme}://{authority(host, port)}"
    rest = address[len(given) :]
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hostport = netloc.rpartition("@")
    if not hostport.startswith("[") and hostport.count(":") > 1:
        raise InvalidConfiguration("an IPv6 address in a URL goes in brackets", param="url")
    host, port = split_host_port(hostport)
    return f"{given}{userinfo}{at}{authority(host, port)}{tail}".rstrip("/")


def host_of_url(url: str) -> str:
    """The bare host of a URL ``worker_url`` made (or any ``scheme://authority`` URL): an
    IPv6 address without brackets and with its zone as a socket takes it, as a bootstrap
    host or a connection needs it. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] as
    [`split_host_port`][pd_policy.authority.split_host_port] does."""
    rest = url.partition("://")[2]
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    return split_host_port(rest[:cut].rpartition("@")[2])[0]
