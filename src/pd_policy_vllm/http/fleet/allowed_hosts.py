"""Which hosts an admin may add a worker on (``--admin-allowed-hosts``): a pure decision,
URL in, yes or no out.

The URL is parsed by ``yarl``, the parser ``aiohttp`` connects with, so the host decided
on is the host called (``http://allowed@evil/`` and ``http://evil#@allowed`` are both
``evil``). A host is allowed when it is a listed name, compared as DNS compares (case,
one trailing dot), or an address literal in a listed network. A network never matches a
name: resolving one to decide would let DNS answer differently when the proxy connects.
A host that only the C resolver reads as an address (``2130706433``, ``0177.0.0.1``,
``127.1``) is neither a listed name nor an address ``ipaddress`` parses, so it is refused.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Final

import attrs
from yarl import URL

from pd_policy import InvalidConfiguration

__all__ = ["AllowedHosts", "allowed_hosts"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_LABEL: Final = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
# The last labels the resolver would read as a number (WHATWG's "ends in a number").
_NUMBER: Final = re.compile(r"[0-9]+|0x[0-9a-f]*")
_BRACKETED: Final = re.compile(r"\[([^\]]*)\](/[0-9]+)?")
_SCHEMES: Final = frozenset({"http", "https"})


def _name(host: str) -> str:
    host = host.lower()
    return host[:-1] if host.endswith(".") else host


@attrs.frozen(slots=True)
class AllowedHosts:
    """Host names (lower case, no trailing dot) and networks a worker may be added on."""

    names: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    def allows(self, url: str) -> bool:
        """Whether a worker at ``url`` may be added: an ``http`` or ``https`` URL whose
        host is a listed name or an address in a listed network. Never raises: a URL
        that does not parse is not allowed."""
        try:
            parsed = URL(url)
        except (ValueError, TypeError):
            return False
        try:
            host, _ = parsed.host, parsed.port  # a port out of range raises here
        except ValueError:
            return False
        if parsed.scheme not in _SCHEMES or not host:
            return False
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return _name(host) in self.names
        # An IPv6 zone ("fe80::1%eth0") names the link, not another address.
        return any(address in network for network in self.networks)


def allowed_hosts(values: Iterable[str]) -> AllowedHosts:
    """The hosts of ``values``, each a name, an address or a network in CIDR form, and
    each value possibly a comma-separated list. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for an entry that is
    none of these (a name whose last label is a number would be read as an address),
    and for a list with no entry."""
    names: set[str] = set()
    networks: list[Network] = []
    entries = [e.strip() for value in values for e in value.split(",") if e.strip()]
    if not entries:
        raise InvalidConfiguration(
            "--admin-allowed-hosts lists no host", param="admin_allowed_hosts"
        )
    for entry in entries:
        # An IPv6 address as a URL writes it ("[fd00::1]", "[fd00::]/8") is the address.
        bracketed = _BRACKETED.fullmatch(entry)
        bare = bracketed[1] + (bracketed[2] or "") if bracketed else entry
        try:
            networks.append(ipaddress.ip_network(bare, strict=False))
            continue
        except ValueError:
            pass
        name = _name(bare)
        labels = name.split(".")
        if not all(_LABEL.fullmatch(label) for label in labels) or _NUMBER.fullmatch(labels[-1]):
            raise InvalidConfiguration(
                f"--admin-allowed-hosts: {entry!r} is not a host name, an address or a network",
                param="admin_allowed_hosts",
            )
        names.add(name)
    return AllowedHosts(frozenset(names), tuple(networks))
