"""A DNS server on 127.0.0.1 for the discovery tests (dnslib's, bound to port 0 and read
back): the records it answers are the test's to change between resolutions, and it can
be made to fail (SERVFAIL) as a DNS server in trouble does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import attrs
from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

__all__ = ["Records", "dns_server"]


@attrs.define
class Records(BaseResolver):  # type: ignore[misc]
    """Names and what they answer: ``a`` (name: addresses, v4 or v6) and ``srv`` (name:
    (target, port) pairs); ``failing``: answer SERVFAIL to everything."""

    a: dict[str, list[str]] = attrs.field(factory=dict)
    srv: dict[str, list[tuple[str, int]]] = attrs.field(factory=dict)
    failing: bool = False

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        if self.failing:
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        name = str(request.q.qname)
        kind = QTYPE[request.q.qtype]
        if kind == "SRV":
            for target, port in self.srv.get(name, []):
                reply.add_answer(RR(name, QTYPE.SRV, ttl=1, rdata=SRV(0, 0, port, target)))
        elif kind in ("A", "AAAA"):
            for address in self.a.get(name, []):
                v6 = ":" in address
                if (kind == "AAAA") == v6:
                    rdata = AAAA(address) if v6 else A(address)
                    reply.add_answer(RR(name, getattr(QTYPE, kind), ttl=1, rdata=rdata))
        if not reply.rr and name not in self.a and name not in self.srv:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


@contextlib.contextmanager
def dns_server(records: Records) -> Iterator[str]:
    """``records`` served over UDP on 127.0.0.1, port 0; ``HOST:PORT`` of the server."""
    quiet = DNSLogger("-request,-reply,-truncated,-error,-recv,-send,-data", prefix=False)
    server = DNSServer(records, address="127.0.0.1", port=0, logger=quiet)
    server.start_thread()
    try:
        host, port = server.server.server_address[:2]
        yield f"{host}:{port}"
    finally:
        server.stop()
