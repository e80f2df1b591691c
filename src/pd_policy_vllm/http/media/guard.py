"""The client session the proxy fetches remote media with: it connects to public addresses
only (unless a lab allows private ones), within the proxy's own caps.

A check of a URL's host name before the fetch is not enough: the name's DNS answer
can change between that check and the connection (DNS rebinding), and a redirect names
a new host. So the address is checked where the connection is made, on every hop:

- the session's resolver ([`GuardedResolver`][pd_policy_vllm.http.media.guard.GuardedResolver])
  drops every refused address from each answer (refusing the name when none is left),
  and the connector connects to exactly what it returned;
- its socket factory refuses a refused address once more, as the socket is made: it
  sees every address connected to, an IP literal too (``aiohttp`` asks no resolver for
  one), whatever resolved it.

The session is the media fetches' alone, so the probes and describes of workers, on
private addresses as a rule, are not affected; it sends no header of the proxy's
(never the workers' key), asks for no compression (a small compressed answer is not a
large one decompressed in memory), and reads no proxy from the environment.

It serves every tenant, so each fetch stands alone: nothing one fetch left behind may
go out on the next, which may be another tenant's. It keeps no cookie (a host's session
cookie set on tenant A's fetch would be sent on tenant B's, and serve B as A), reads no
credential from the environment or a ``.netrc``, and keeps no connection open after a
fetch (a new one for each: its cost is a handshake per item, against a host that could
otherwise tie fetches together by their connection). A URL's own credentials are
refused before the fetch ([`fetch_media`][pd_policy_vllm.http.media.fetch.fetch_media]).
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.media.address import Address, refused_address

__all__ = [
    "MEDIA_MAX_BYTES",
    "MEDIA_MAX_REDIRECTS",
    "MEDIA_TIMEOUT",
    "GuardedResolver",
    "MediaLimits",
    "RefusedAddress",
    "media_session",
]

#: The most bytes one fetched item may hold, by default (each leg carries it as base64).
MEDIA_MAX_BYTES: Final = 64 * 2**20
#: Redirects one fetch may follow, by default.
MEDIA_MAX_REDIRECTS: Final = 3
#: Seconds one fetch may take in all, redirects included, by default (the worker's
#: time-out for the modality bounds it too).
MEDIA_TIMEOUT: Final = 30.0


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, not {value!r}")


def _not_negative(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be a whole number >= 0, not {value!r}")


def _networks(
    value: Iterable[str | ipaddress.IPv4Network | ipaddress.IPv6Network],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(n) for n in value)


@attrs.frozen(slots=True)
class MediaLimits:
    """The proxy's own caps on a media fetch, beyond the worker's rules (the smaller of
    the two applies): bytes, redirects and seconds in all; and which refused addresses
    may be fetched from all the same: any (``allow_private_hosts``), or those in
    ``allow_networks`` (CIDRs: a lab's media server, and no other). Raises
    ``ValueError`` for a cap that is not positive (``max_redirects``: ``0`` follows
    none), or a network that is not one."""

    max_bytes: int = attrs.field(default=MEDIA_MAX_BYTES, validator=_positive)
    max_redirects: int = attrs.field(default=MEDIA_MAX_REDIRECTS, validator=_not_negative)
    timeout: float = attrs.field(default=MEDIA_TIMEOUT, validator=_positive)
    allow_private_hosts: bool = False
    allow_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = attrs.field(
        default=(), converter=_networks
    )

    def refuses(self, address: str | Address) -> bool:
        """Whether a fetch from ``address`` is refused (``ValueError`` for text that is not
        an IP address)."""
        if self.allow_private_hosts:
            return False
        if isinstance(address, str):
            address = ipaddress.ip_address(address.partition("%")[0])
        if not refused_address(address):
            return False
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        return not any(a in n for n in self.allow_networks for a in (address, mapped) if a)


class RefusedAddress(OSError):
    """A connection to an address the proxy does not fetch from: raised by the resolver
    and the socket factory, it reaches the fetch inside ``aiohttp``'s connection error."""

    def __init__(self) -> None:
        # No address in the message: it may be the fleet's own, and errors are logged.
        super().__init__("the media host is not a public address")


class GuardedResolver(aiohttp.abc.AbstractResolver):
    """``inner``'s answers (the default resolver's unless given) without the addresses
    ``limits`` refuse; raises [`RefusedAddress`][pd_policy_vllm.http.media.guard.RefusedAddress]
    for a name none of whose addresses is left. Made in a running event loop."""

    def __init__(
        self, limits: MediaLimits, inner: aiohttp.abc.AbstractResolver | None = None
    ) -> None:
        self._limits = limits
        self._inner = inner if inner is not None else aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        kept = [answer for answer in answers if not self._limits.refuses(answer["host"])]
        if not kept:
            raise RefusedAddress()
        return kept

    async def close(self) -> None:
        await self._inner.close()


def _guarded_socket(limits: MediaLimits, addr_info: tuple[Any, ...]) -> socket.socket:
    family, type_, proto, _, address = addr_info
    if limits.refuses(address[0]):
        raise RefusedAddress()
    return socket.socket(family=family, type=type_, proto=proto)


def media_session(
    limits: MediaLimits,
    *,
    resolver: aiohttp.abc.AbstractResolver | None = None,
    trace_configs: Sequence[aiohttp.TraceConfig] = (),
) -> aiohttp.ClientSession:
    """A new session for media fetches within ``limits`` (see the module docs): guarded,
    unless ``limits`` allow private hosts. ``resolver`` is the one behind the guard (tests
    give one whose answers they choose). Made in a running event loop; the caller closes
    it."""
    # No connection outlives its fetch.
    if limits.allow_private_hosts:
        connector = aiohttp.TCPConnector(resolver=resolver, force_close=True)
    else:
        connector = aiohttp.TCPConnector(
            resolver=GuardedResolver(limits, resolver),
            socket_factory=functools.partial(_guarded_socket, limits),
            force_close=True,
        )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=limits.timeout),
        headers={"Accept-Encoding": "identity"},
        auto_decompress=False,
        # No credential from the environment or a .netrc, no proxy, and no cookie kept.
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        trace_configs=list(trace_configs) or None,
    )
