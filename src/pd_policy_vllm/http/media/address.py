"""Which addresses the proxy may fetch remote media from: public ones only, by default.

The proxy fetches from its own place in the network, which reaches what a client
cannot: itself (loopback), the fleet's private network, a cloud's metadata service
(169.254.169.254, ``fd00:ec2::254``). A client that names such an address in a media
URL would make the proxy read it for them (server-side request forgery). So an
address is refused when it is in any special-purpose block of IANA's registries, not
only the private ones: loopback, private (RFC 1918, ULA ``fc00::/7``), link-local,
shared (CGNAT ``100.64.0.0/10``), unspecified (``0.0.0.0``, ``::``), multicast,
documentation, benchmarking and reserved blocks. An IPv6 address that carries an IPv4
one (mapped ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is judged
by the IPv4 address, since that is where a packet to it goes.

The blocks are listed here rather than read from ``ipaddress``'s ``is_global``, whose
tables change between Python releases. Pure functions, no I/O.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Final

__all__ = ["Address", "host_address", "refused_address"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_V4: Final = tuple(
    ipaddress.IPv4Network(n)
    for n in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
)
# ::/96 holds ::, ::1 and the deprecated IPv4-compatible addresses; 2001::/23 holds
# Teredo, whose IPv4 address is obfuscated and so cannot be judged.
_V6: Final = tuple(
    ipaddress.IPv6Network(n)
    for n in (
        "::/96",
        "64:ff9b:1::/48",
        "100::/64",
        "2001::/23",
        "2001:db8::/32",
        "3fff::/20",
        "fc00::/7",
        "fe80::/10",
        "fec0::/10",
        "ff00::/8",
    )
)
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR: Final = ipaddress.IPv6Network("2002::/16")


def _carried(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address in _SIX_TO_FOUR:
        return address.sixtofour
    return None


def refused_address(address: str | Address) -> bool:
    """Whether the proxy refuses to fetch from ``address`` (an IP address, an IPv6 one
    with or without its ``%zone``): see the module docs for the blocks. Raises
    ``ValueError`` for text that is not an IP address."""
    if isinstance(address, str):
        address = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(address, ipaddress.IPv6Address):
        carried = _carried(address)
        if carried is None:
            return any(address in network for network in _V6)
        address = carried
    return any(address in network for network in _V4)


def host_address(host: str) -> Address | None:
    """The address a URL's host names without asking a resolver, or ``None`` for a name.

    Beyond the usual forms (``127.0.0.1``, ``[::1]``, ``::ffff:127.0.0.1``), an IPv4
    address may be written in the legacy forms the C library's ``inet_aton`` reads and a
    resolver passes through: ``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``.
    """
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(bare.partition("%")[0])
    except ValueError:
        pass
    if ":" in bare:
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare))
    except OSError:
        return None
