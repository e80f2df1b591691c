"""Workers found in DNS: a name resolved again at an interval, as a Kubernetes headless
Service answers it.

A source is a ``[[discover]]`` table of the configuration file: a role, a DNS name, and
either ``port`` (each A and AAAA address of the name is a worker on that port) or
``srv = true`` (each SRV record of the name is a worker at its target and port), with
the keys of a ``[[workers]]`` table that describe each worker it finds. At every
resolution, a worker that appeared is described and joins the fleet as starting (it
takes traffic once a probe passes); one that left is drained (its requests in flight
finish), never cut. A resolution that fails (a time-out, no such name, a server
failure) changes nothing: the fleet keeps what the last answer said, so that a DNS blip
never empties it. An answer with no record drains what the source found before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Final

import attrs
import dns.asyncresolver
import dns.exception
import dns.resolver

from pd_policy import Health, InvalidConfiguration
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.members import Fleet, member_name
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = [
    "MAX_FOUND",
    "Discovery",
    "DnsSource",
    "discovering",
    "following",
    "found_urls",
    "resolver_for",
]

_log = logging.getLogger("pd_policy_vllm.http.discovery")

#: The most workers one name may give: an answer past it (a DNS server gone wrong, or
#: hostile) is cut to it, in a stable order, and logged.
MAX_FOUND: Final = 256

#: Describes a worker found: its URL and role, and what the operator says of it.
Describe = Callable[[str, str, OperatorSays], Awaitable[HttpWorker]]


@attrs.frozen(slots=True)
class DnsSource:
    """One name to follow: its ``role``, the DNS ``name``, the ``port`` of its A/AAAA
    workers (``None``: it is read for SRV records), how often it is resolved, and what
    the operator says of each worker it finds."""

    role: str
    name: str
    port: int | None
    interval: float = 10.0
    says: OperatorSays = attrs.field(factory=OperatorSays)
    scheme: str = "http"


@attrs.frozen(slots=True)
class Discovery:
    """The names a proxy follows, and the resolver it asks (``--dns-server``, else the
    system's)."""

    sources: tuple[DnsSource, ...]
    server: str | None = None

    def resolver(self) -> dns.asyncresolver.Resolver:
        return resolver_for(self.server)


def resolver_for(server: str | None) -> dns.asyncresolver.Resolver:
    """A resolver of ``server`` (``HOST:PORT`` or ``HOST``); the system's without one."""
    if server is None:
        return dns.asyncresolver.Resolver()
    resolver = dns.asyncresolver.Resolver(configure=False)
    host, _, port = server.rpartition(":") if server.count(":") == 1 else (server, "", "")
    resolver.nameservers = [host.strip("[]") or server]
    resolver.port = int(port) if port else 53
    return resolver


def _url(scheme: str, host: str, port: int) -> str:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"{scheme}://{host.rstrip('.')}:{port}"
    shown = f"[{address}]" if address.version == 6 else str(address)
    return f"{scheme}://{shown}:{port}"


async def found_urls(source: DnsSource, resolver: dns.asyncresolver.Resolver) -> set[str]:
    """The worker URLs ``source``'s name resolves to now. Raises
    ``dns.exception.DNSException`` when the resolution fails (an answer with no record
    of the type asked for is an empty set, not a failure)."""
    if source.port is None:
        answer = await resolver.resolve(source.name, "SRV", raise_on_no_answer=False)
        return {
            _url(source.scheme, record.target.to_text(), record.port)
            for record in (answer.rrset or ())
        }
    urls = set()
    for kind in ("A", "AAAA"):
        answer = await resolver.resolve(source.name, kind, raise_on_no_answer=False)
        urls |= {
            _url(source.scheme, record.to_text(), source.port) for record in (answer.rrset or ())
        }
    return urls


async def _follow(
    fleet: Fleet,
    source: DnsSource,
    resolver: dns.asyncresolver.Resolver,
    describe: Describe,
    stated: dict[tuple[str, str], OperatorSays],
) -> None:
    mine: dict[str, str] = {}  # member name: URL, of the workers this source found
    while True:
        try:
            urls = await found_urls(source, resolver)
        except (dns.exception.DNSException, OSError) as exc:
            _log.warning("%s %s: not resolved (%s); the fleet is kept", source.role,
                         source.name, type(exc).__name__)  # fmt: skip
            urls = set(mine.values())
        if len(urls) > MAX_FOUND:
            _log.warning("%s %s: %d answers, the first %d taken", source.role, source.name,
                         len(urls), MAX_FOUND)  # fmt: skip
            urls = set(sorted(urls)[:MAX_FOUND])
        names = {}
        for url in urls:
            try:
                names[member_name(url)] = url
            except InvalidConfiguration:  # an answer no worker could be at: hostile, or odd
                _log.warning("%s %s: an answer is no worker's address", source.role,
                             source.name)  # fmt: skip
        for name, url in names.items():
            member = fleet.named(name)
            if name in mine and member is not None and member.health.health is not Health.DRAINING:
                continue
            try:
                worker = await describe(url, source.role, source.says)
            except (aiohttp.ClientError, TimeoutError, InvalidConfiguration) as exc:
                _log.warning("%s %s: %s not described yet (%s)", source.role, source.name,
                             name, type(exc).__name__)  # fmt: skip
                continue
            fleet.add(source.role, worker, healthy=False)  # takes traffic once probed
            stated[(source.role, name)] = source.says  # described so again by the prober
            mine[name] = url
            _log.info("%s %s: %s joins", source.role, source.name, name)
        for name in [n for n in mine if n not in names]:
            member = fleet.named(name)
            if member is not None:
                fleet.drain(member)
            del mine[name]
            stated.pop((source.role, name), None)
            _log.info("%s %s: %s left DNS, drains", source.role, source.name, name)
        await asyncio.sleep(source.interval)


@contextlib.asynccontextmanager
async def discovering(
    fleet: Fleet,
    sources: Sequence[DnsSource],
    resolver: dns.asyncresolver.Resolver,
    describe: Describe,
    stated: dict[tuple[str, str], OperatorSays] | None = None,
) -> AsyncIterator[None]:
    """Follow every source in the background for the duration of the block; ``stated``
    (the prober's descriptions by role and member name) learns how each worker found is
    described."""
    stated = {} if stated is None else stated
    tasks = [asyncio.create_task(_follow(fleet, s, resolver, describe, stated)) for s in sources]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def following(
    discovery: Discovery | None,
    fleet: Fleet,
    session: aiohttp.ClientSession,
    headers: Mapping[str, str],
    stated: dict[tuple[str, str], OperatorSays] | None = None,
) -> contextlib.AbstractAsyncContextManager[None]:
    """Follow ``discovery``'s names into ``fleet`` for the duration of the block, each
    worker found described over ``session`` with ``headers`` (and so in ``stated``, the
    prober's); nothing without one."""
    if discovery is None:
        return contextlib.nullcontext()

    async def described(url: str, role: str, says: OperatorSays) -> HttpWorker:
        return await describe(session, url, role, says, headers)

    return discovering(fleet, discovery.sources, discovery.resolver(), described, stated)
