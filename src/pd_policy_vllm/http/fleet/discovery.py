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
from typing import Final, Self

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
    "Following",
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
    mine: dict[str, str],
) -> None:
    # ``mine``: member name to URL, of the workers this source found (its owner's).
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
            _leave(fleet, source, name, mine, stated)
            _log.info("%s %s: %s left DNS, drains", source.role, source.name, name)
        await asyncio.sleep(source.interval)


def _leave(
    fleet: Fleet,
    source: DnsSource,
    name: str,
    mine: dict[str, str],
    stated: dict[tuple[str, str], OperatorSays],
) -> None:
    member = fleet.named(name)
    if member is not None:
        fleet.drain(member)
    del mine[name]
    stated.pop((source.role, name), None)


class Following:
    """The names followed now, each in a task of its own, and the workers each found:
    [`follow`][pd_policy_vllm.http.fleet.discovery.Following.follow] sets them (a reload
    gives the configuration's anew); ``stated`` (the prober's descriptions by role and
    member name) learns how each worker found is described. Use as an async context
    manager: leaving it stops every task, the fleet kept as it is."""

    def __init__(
        self,
        fleet: Fleet,
        resolver: Callable[[], dns.asyncresolver.Resolver],
        describe: Describe,
        stated: dict[tuple[str, str], OperatorSays] | None = None,
    ) -> None:
        self.fleet, self.describe = fleet, describe
        self.stated = {} if stated is None else stated
        self._resolver_of = resolver
        self._resolver: dns.asyncresolver.Resolver | None = None
        self._tasks: dict[DnsSource, asyncio.Task[None]] = {}
        self._found: dict[DnsSource, dict[str, str]] = {}

    def follow(self, sources: Sequence[DnsSource]) -> None:
        """Follow ``sources`` from now on: a source followed already goes on as it was
        (what it found kept); a new one starts; one no longer given stops, and the
        workers it found drain (unless a source still followed found them too)."""
        wanted = dict.fromkeys(sources)
        for source in [s for s in self._tasks if s not in wanted]:
            self._tasks.pop(source).cancel()
            mine = self._found.pop(source)
            held = self.found()
            for name in [n for n in mine if (source.role, n) not in held]:
                _leave(self.fleet, source, name, mine, self.stated)
                _log.info("%s %s: no longer followed; %s drains", source.role, source.name,
                          name)  # fmt: skip
        for source in wanted:
            if source in self._tasks:
                continue
            resolver = self._resolver = self._resolver or self._resolver_of()
            mine = self._found[source] = {}
            run = _follow(self.fleet, source, resolver, self.describe, self.stated, mine)
            self._tasks[source] = asyncio.get_running_loop().create_task(run)

    def found(self) -> set[tuple[str, str]]:
        """Every worker a followed name gives now, by role and member name."""
        return {(s.role, name) for s, mine in self._found.items() for name in mine}

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


@contextlib.asynccontextmanager
async def discovering(
    fleet: Fleet,
    sources: Sequence[DnsSource],
    resolver: dns.asyncresolver.Resolver,
    describe: Describe,
    stated: dict[tuple[str, str], OperatorSays] | None = None,
) -> AsyncIterator[Following]:
    """Follow every source in the background for the duration of the block (a
    [`Following`][pd_policy_vllm.http.fleet.discovery.Following] of them)."""
    async with Following(fleet, lambda: resolver, describe, stated) as follower:
        follower.follow(sources)
        yield follower


def following(
    discovery: Discovery | None,
    fleet: Fleet,
    session: aiohttp.ClientSession,
    headers: Mapping[str, str],
    stated: dict[tuple[str, str], OperatorSays] | None = None,
) -> Following:
    """A [`Following`][pd_policy_vllm.http.fleet.discovery.Following] of ``discovery``'s
    names into ``fleet``, followed from now (none without one: a reload may give some),
    each worker found
    described over ``session`` with ``headers`` (and so in ``stated``, the prober's).
    The resolver asked is ``discovery``'s server, else the system's; call in a running
    event loop."""
    server = discovery.server if discovery is not None else None

    async def described(url: str, role: str, says: OperatorSays) -> HttpWorker:
        return await describe(session, url, role, says, headers)

    follower = Following(fleet, lambda: resolver_for(server), described, stated)
    follower.follow(discovery.sources if discovery is not None else ())
    return follower
