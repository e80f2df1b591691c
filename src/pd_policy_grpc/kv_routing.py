"""KV-event routing for [`FleetPd`][pd_policy_grpc.fleet.FleetPd]'s prefills: each
prefill's prefix cache, followed from its KV events, and each request's leading blocks
counted on each prefill before the request is placed.

An SMG servicer's ``GetServerInfo`` states its block size and its data-parallel size
(read into [`GrpcWorker`][pd_policy_grpc.workers.GrpcWorker]), but not where its engine
publishes its KV events: the operator states that, per prefill, as the servicer was
started with ``--kv-events-config``: a [`KvPublisher`][pd_policy_grpc.kv_routing.KvPublisher].
(Without that flag the servicer turns vLLM's publisher on at a random port on every
interface, which no router can find; ``SMG_VLLM_SERVICER_KV_EVENTS=0`` turns it off.)

[`running`][pd_policy_grpc.kv_routing.KvRouting.running] feeds one
[`PrefixIndex`][pd_policy.cache.prefix_index.PrefixIndex] from each prefill member with a
publisher whose blocks the router can name (a block size stated, one data-parallel rank),
following the roster as it changes, with the proxy's own feeds
([`Feeds`][pd_policy_vllm.kv_events.feeds.Feeds]: in order, lost batches replayed). An
ejected member is not followed: it may come back restarted, and is read again, from its
publisher's replay buffer, when it does.

[`lookup`][pd_policy_grpc.kv_routing.KvRouting.lookup] names the request's blocks as
each prefill's engine does ([`block_prompt`][pd_policy_grpc.blocks.block_prompt],
[`BlockHasher`][pd_policy.cache.kv_blocks.BlockHasher]) and counts the leading ones each
prefill in sync holds, in memory: no call is made on the request's path. A request that
cannot be looked up is placed by the rules without it: no prefill fed and in sync, more
than one sample (no prefill runs), or a prompt the router cannot name as the engine will.

Needs ``pyzmq`` and ``msgspec`` (the ``kv-events`` extra; both come with vLLM) beside the
``grpc`` extra; only this module does (the fleet names it for its types alone): import it
to turn the routing on.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs

from pd_policy import Health, InvalidConfiguration, PolicyError, Roster
from pd_policy.cache.kv_blocks import HashAlgo, block_hasher, external_hash
from pd_policy.cache.prefix_index import PrefixIndex
from pd_policy_grpc.blocks import block_prompt
from pd_policy_grpc.wire import pb
from pd_policy_grpc.workers import GrpcWorker, Member

try:
    from pd_policy_vllm.kv_events.feed import FeedStats
    from pd_policy_vllm.kv_events.feeds import Feeds, following
    from pd_policy_vllm.kv_events.source import KvSource
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        f"KV-event routing needs pyzmq and msgspec ({exc.name} is missing): "
        "pip install 'pd-policy[kv-events]'",
        name=exc.name,
    ) from exc

__all__ = ["KvPublisher", "KvRouting", "Lookup"]

_log = logging.getLogger(__name__)
_WILDCARDS = frozenset({"*", "0.0.0.0", "::", "[::]"})


def _endpoint(_inst: object, attr: attrs.Attribute[Any], value: object) -> None:
    # What the router connects to: a host and port it can reach, or a local socket path.
    if value is None and attr.name == "replay":
        return
    ok = False
    if isinstance(value, str) and value.startswith("ipc://"):
        ok = len(value) > len("ipc://")
    elif isinstance(value, str) and value.startswith("tcp://"):
        host, _, port = value[len("tcp://") :].rpartition(":")
        ok = bool(host) and host not in _WILDCARDS and port.isdigit() and 0 < int(port) < 65536
    if not ok:
        raise InvalidConfiguration(
            f"{attr.name} is a ZeroMQ endpoint to connect to: tcp://HOST:PORT or ipc://PATH",
            param=attr.name,
        )


@attrs.frozen(slots=True)
class KvPublisher:
    """Where a prefill's engine publishes its KV events, and how it names its blocks, as
    its ``--kv-events-config`` and ``--prefix-caching-hash-algo`` set them: its PUB
    ``endpoint`` and its replay socket's (``None``: it keeps none), as the router
    reaches them (``tcp://HOST:PORT`` with the worker's host, or ``ipc://PATH`` on its
    machine), the ``topic`` it publishes on, and its hash ``algo``. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for an endpoint the
    router cannot connect to (a wildcard host is the worker's side of a bind)."""

    endpoint: str = attrs.field(validator=_endpoint)
    replay: str | None = attrs.field(default=None, validator=_endpoint)
    topic: str = ""
    algo: HashAlgo = HashAlgo.SHA256


@attrs.frozen(slots=True)
class Lookup:
    """What a lookup learned, by prefill name: the leading blocks of the request each fed
    prefill in sync holds (``cached``), and how many blocks the request has there."""

    cached: Mapping[str, int]
    blocks: Mapping[str, int]


class KvRouting:
    """KV-event routing for a gRPC fleet's prefills (see the module docs).

    ``publishers`` states each prefill's publisher by member name (its ``host:port``);
    the operator may change the mapping at any time, and the feeds follow within a
    round of ``running``. ``seed`` is the workers' ``PYTHONHASHSEED`` (``None``: unset),
    ``max_blocks`` bounds the hashes kept per prefill, ``timeout`` a feed's replay.

    ``outcomes`` counts each placement: ``hit`` (the prefill chosen held some of the
    request's blocks), ``miss`` (it held none), ``fallback`` (not looked up); ``blocks``
    the prompt blocks of the placements looked up, ``cached`` on the prefill chosen or
    ``computed``. ``unfed`` says, by name, why a prefill with a publisher is not followed.
    """

    def __init__(
        self,
        publishers: Mapping[str, KvPublisher] | None = None,
        *,
        seed: str | None = None,
        max_blocks: int = 1 << 20,
        timeout: float = 2.0,
    ) -> None:
        self.publishers: dict[str, KvPublisher] = dict(publishers or {})
        self.seed, self.timeout = seed, timeout
        self.index = PrefixIndex(max_blocks=max_blocks)
        self.feeds: Feeds | None = None
        self.unfed: dict[str, str] = {}
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.blocks: collections.Counter[str] = collections.Counter()

    def source(self, member: Member) -> tuple[KvSource | None, str]:
        """The KV events of prefill ``member``, and why not when ``None`` (the reason is
        ``""`` when there is a source)."""
        publisher = self.publishers.get(member.name)
        if publisher is None:
            return None, "no publisher is stated for it"
        worker = member.worker
        if worker.block_size < 1:
            return None, "its GetServerInfo states no block size"
        if worker.data_parallel_size != 1:
            return None, "it runs more than one data-parallel rank"
        endpoint, replay, topic = publisher.endpoint, publisher.replay, publisher.topic
        return KvSource(endpoint, replay, topic, worker.block_size, publisher.algo), ""

    def _sources(self, roster: Roster[GrpcWorker]) -> dict[str, KvSource]:
        sources: dict[str, KvSource] = {}
        unfed: dict[str, str] = {}
        for member in roster.of("prefill"):
            if member.name not in self.publishers or member.health.health is Health.EJECTED:
                continue
            source, why = self.source(member)
            if source is None:
                unfed[member.name] = why
                if self.unfed.get(member.name) != why:
                    _log.warning("the KV events of %s are not followed: %s", member.name, why)
            else:
                sources[member.name] = source
        self.unfed = unfed
        return sources

    @contextlib.asynccontextmanager
    async def running(
        self,
        roster: Roster[GrpcWorker],
        *,
        interval: float = 1.0,
        on_batch: Callable[[str, FeedStats], None] | None = None,
    ) -> AsyncIterator[None]:
        """Feed the index from ``roster``'s prefills for the duration of the block,
        following its changes every ``interval`` seconds; ``on_batch`` is called after
        each batch a feed applies."""
        self.feeds = Feeds(self.index, timeout=self.timeout, on_batch=on_batch)
        try:
            async with following(self.feeds, lambda: self._sources(roster), interval):
                yield
        finally:
            self.feeds = None

    def lookup(self, roster: Roster[GrpcWorker], request: pb.GenerateRequest) -> Lookup | None:
        """How many leading blocks of ``request`` (a checked message, or a bytes router's
        skeleton) each of ``roster``'s fed prefills in sync holds; ``None`` when it
        cannot be looked up (see the module docs). Never raises for a request."""
        feeds = self.feeds
        if feeds is None or request.sampling_params.n > 1:
            return None
        sources = feeds.sources
        fed = [m.name for m in roster.of("prefill") if m.name in sources]
        fed = [name for name in fed if self.index.synced(name)]
        if not fed:
            return None
        try:
            prompt = block_prompt(request)
            if prompt is None:
                return None
            chains: dict[tuple[int, HashAlgo], list[int]] = {}
            cached: dict[str, int] = {}
            blocks: dict[str, int] = {}
            for name in fed:
                key = (sources[name].block_size, sources[name].algo)
                chain = chains.get(key)
                if chain is None:
                    hashes = block_hasher(*key, self.seed).hashes(
                        prompt.token_ids, prompt.items, cache_salt=prompt.cache_salt
                    )
                    chain = chains[key] = [external_hash(h) for h in hashes]
                cached[name] = self.index.cached([name], chain)[name]
                blocks[name] = len(chain)
        except PolicyError:  # items the engine would refuse: its answer, not the router's
            return None
        return Lookup(cached, blocks)

    def routed(self, lookup: Lookup | None, prefill: str) -> None:
        """Count a placement on ``prefill`` made with ``lookup`` (``None``: without one)."""
        if lookup is None:
            self.outcomes["fallback"] += 1
            return
        held = lookup.cached.get(prefill, 0)
        self.outcomes["hit" if held else "miss"] += 1
        self.blocks["cached"] += held
        self.blocks["computed"] += lookup.blocks.get(prefill, 0) - held
