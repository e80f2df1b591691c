"""``FleetPd``: sequential P/D over a fleet of gRPC workers, with health and retries.

The roster is the core's ([`pd_policy.Roster`][pd_policy.fleet.roster.Roster]), of
[`GrpcWorker`][pd_policy_grpc.workers.GrpcWorker]s: each one's channel and what its own
``GetModelInfo`` and ``GetServerInfo`` said it is. Each request is an
[`Exchange`][pd_policy.exchange.machine.Exchange] ([`drive`][pd_policy_grpc.driver.drive]), as
every router of this library runs one:

1. each attempt's members come from the core's [`place`][pd_policy.fleet.placement.place],
   which the HTTP proxy uses too: the prefill among the members that can process the
   request's media, by the leading KV blocks of the request each holds when the fleet
   follows their KV events (``kv_routing``:
   [`KvRouting`][pd_policy_grpc.kv_routing.KvRouting]), then by affinity to its items'
   content hashes (its prefix cache holds them), each bounded by load; the decode among
   the members that can serve it (never one that cannot while one that can is listed),
   by load;
2. the pair serves the attempt as [`SequentialPd`][pd_policy_grpc.client.SequentialPd]
   does (or [`SequentialPdBytes`][pd_policy_grpc.raw.client.SequentialPdBytes] on bytes);
3. a worker's failure before the first decode response that may be retried counts
   against that worker (a 5xx status), and the request is planned again without it,
   while the budget lasts. After the first response nothing is retried: the failure
   ends the stream.

[`probe_once`][pd_policy_grpc.fleet.FleetPd.probe_once] checks each member the core's
[`Prober`][pd_policy.fleet.probing.Prober] names with its ``HealthCheck``: a member that fails
is ejected, and one coming back (or whose description is old) is described again, since
it may have come back as another kind (restarted with ``--language-model-only``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
from pd_policy import (
    DecodeCandidate,
    Exchange,
    InvalidConfiguration,
    KvConnectorMode,
    Placement,
    Prober,
    ProbeTimes,
    Request,
    Roster,
    WorkerCapability,
    place,
)
from pd_policy.request_bounds import DEFAULT_MAX_MEDIA_ITEMS
from pd_policy_grpc.admission import admit_message
from pd_policy_grpc.calls import checked_max_media_items
from pd_policy_grpc.client import SequentialPd
from pd_policy_grpc.driver import Pair, drive
from pd_policy_grpc.raw.admission import read_admitted
from pd_policy_grpc.raw.reader import RawRequest
from pd_policy_grpc.view import request_view
from pd_policy_grpc.wire import pb, pb_grpc
from pd_policy_grpc.workers import GrpcWorker, Member, describe_worker

if TYPE_CHECKING:  # the KV events need pyzmq and msgspec, which the fleet alone does not
    from pd_policy_grpc.kv_routing import KvRouting

__all__ = ["FleetPd", "GrpcWorker", "describe_worker"]


#: What makes a pair's router, from SequentialPd's arguments (``SequentialPd``,
#: ``SequentialPdBytes``).
PairRouter = Callable[..., Pair]


def _view(request: Any) -> Request:
    return request.view() if isinstance(request, RawRequest) else request_view(request)


def _capability(member: Member) -> WorkerCapability:
    return member.worker.capability


class FleetPd:
    """Serve requests over the prefill and decode members of ``roster``.

    ``router`` makes a pair's router from SequentialPd's arguments (``SequentialPd``
    for messages, ``SequentialPdBytes`` for bytes); ``attempts`` bounds the attempts of
    a request in all; ``timeout`` is each call's, ``deadline`` a whole request's
    (``None``: no bound; past it, ``pd_request_timeout``); ``max_media_items`` the most
    media items a request may hold (``pd_too_many_media_items`` past it, before any item
    is read: [`admission`][pd_policy_grpc.admission], as the router's fields are checked).
    A roster on the monotonic clock is made when none is given. ``kv_routing`` places each
    prefill by the KV blocks the fleet's prefills hold (run it with its
    [`running`][pd_policy_grpc.kv_routing.KvRouting.running] over this roster); ``None``:
    by the rules without it. See the module docs.
    """

    def __init__(
        self,
        roster: Roster[GrpcWorker] | None = None,
        *,
        router: PairRouter = SequentialPd,
        attempts: int = 2,
        timeout: float | None = None,
        probe_timeout: float = 2.0,
        deadline: float | None = None,
        kv_routing: KvRouting | None = None,
        max_media_items: int = DEFAULT_MAX_MEDIA_ITEMS,
    ) -> None:
        self.max_media_items = checked_max_media_items(max_media_items)
        self.roster = roster if roster is not None else Roster(clock=time.monotonic)
        self.kv_routing = kv_routing
        self.router, self.timeout, self.deadline = router, timeout, deadline
        self.attempts, self.probe_timeout = attempts, probe_timeout
        self.prober = Prober(self.roster, ProbeTimes(timeout=probe_timeout))
        self._pairs: dict[tuple[str, str], tuple[GrpcWorker, GrpcWorker, Any]] = {}
        self._generation = self.roster.generation
        #: Retired pairs' aclose, awaited by this router's.
        self._closing: set[asyncio.Task[None]] = set()

    def add(self, role: str, worker: GrpcWorker, *, healthy: bool = True) -> Member:
        """Add ``worker`` as a ``role`` member, in service at once (it was just described;
        ``healthy=False``: starting until a probe passes). Raises
        [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a prefill
        without its handoff (``kv``), and ``ValueError`` for an unknown role."""
        if role == "prefill" and worker.kv is None:
            raise InvalidConfiguration("a prefill worker needs its KV handoff (kv)", param="kv")
        return self.roster.add_member(role, worker.address, worker, healthy=healthy)

    def choose(self, request: Any, exclude: tuple[str, ...] = ()) -> tuple[Member, Member]:
        """The prefill and decode members for ``request`` (a message, or a read
        ``RawRequest``), leaving out those named in ``exclude``.

        Raises the carve-out that explains why when no listed decode can serve it,
        [`MultimodalNotSupported`][pd_policy.errors.MultimodalNotSupported] (400) when
        no listed prefill can process its media, and
        [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable] (503, retryable)
        when the ones that could are all out of service."""
        placed = self._placer(request)(exclude)
        return placed.prefill, placed.decode

    def _placer(self, request: Any) -> Callable[[tuple[str, ...]], Placement[GrpcWorker]]:
        view = _view(request)  # the policy's refusals first, before any lookup
        routing, lookup = self.kv_routing, None
        if routing is not None:
            message = request.skeleton if isinstance(request, RawRequest) else request
            lookup = routing.lookup(self.roster, message)
        cached = lookup.cached if lookup is not None else None

        def placer(excluded: tuple[str, ...]) -> Placement[GrpcWorker]:
            placed = place(
                self.roster, view, capability=_capability, exclude=excluded, cached=cached
            )
            if routing is not None:
                routing.routed(lookup, placed.prefill.name)
            return placed

        return placer

    def _pair(self, placement: Placement[GrpcWorker]) -> Pair:
        prefill, decode = placement.prefill, placement.decode
        if self._generation != self.roster.generation:
            # Members left or were described anew since: their pairs go now, not at the
            # next pair built, so that the table holds only live pairs however the fleet
            # churns and whichever pairs its traffic reuses.
            self._generation = self.roster.generation
            self._retire_stale()
        key = (prefill.name, decode.name)
        cached = self._pairs.get(key)
        if cached is not None and cached[0] is prefill.worker and cached[1] is decode.worker:
            pair: Pair = cached[2]
            return pair
        # A member described anew gets a router of its own: its capability or handoff may
        # have changed.
        candidate = DecodeCandidate(decode.worker.capability, decode.worker.channel)
        pair = self.router(
            prefill.worker.channel, [candidate], kv=prefill.worker.kv, timeout=self.timeout
        )
        self._pairs[key] = (prefill.worker, decode.worker, pair)
        return pair

    def _retire_stale(self) -> None:
        current = {m.name: m.worker for m in self.roster}
        for key, (p, d, pair) in list(self._pairs.items()):
            if current.get(key[0]) is not p or current.get(key[1]) is not d:
                del self._pairs[key]
                task = asyncio.ensure_future(pair.aclose())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    def generate(
        self, request: Any, *, trace_context: Mapping[str, str] | None = None
    ) -> AsyncGenerator[Any]:
        """Serve ``request`` (a ``GenerateRequest``, or its bytes with a bytes router);
        yields the decode worker's responses. Raises the policy's errors, and the last
        attempt's failure (see the module docs). ``trace_context``: the caller's W3C trace
        headers (its call's ``invocation_metadata()``, or what OpenTelemetry's ``inject``
        wrote), passed on to every leg as gRPC metadata when valid."""
        return drive(
            request,
            self._pair,
            self._exchange,
            self.roster,
            read=self.admit,
            deadline=self.deadline,
            trace_context=trace_context,
        )

    def admit(self, request: Any) -> Any:
        """``request`` (a message, its bytes, or a read ``RawRequest``) read and admitted
        under this fleet's ``max_media_items``: what ``generate`` does first, before any
        placement ([`admission`][pd_policy_grpc.admission])."""
        if isinstance(request, pb.GenerateRequest):
            return admit_message(request, self.max_media_items)
        return read_admitted(request, self.max_media_items)

    def _exchange(self, request: Any) -> Exchange[Any]:
        return Exchange(self._placer(request), attempts=self.attempts)

    async def probe_once(self, *, kv_mode: KvConnectorMode | None = None) -> None:
        """Probe every member the prober names once (see the module docs); ``kv_mode`` as
        for [`describe_worker`][pd_policy_grpc.workers.describe_worker]."""

        async def healthy(member: Member) -> bool:
            stub = pb_grpc.VllmEngineStub(member.worker.channel)
            try:
                answer = await stub.HealthCheck(pb.HealthCheckRequest(), timeout=self.probe_timeout)
            except grpc.aio.AioRpcError:
                return False
            return bool(answer.healthy)

        async def check(member: Member) -> None:
            if not self.prober.checked(member, await healthy(member)):
                return
            worker = member.worker
            try:
                described = await describe_worker(
                    worker.channel,
                    worker.address,
                    member.role,
                    kv_mode=kv_mode,
                    timeout=self.probe_timeout,
                )
            except (grpc.aio.AioRpcError, InvalidConfiguration):
                described = None
            self.prober.described(member, described)

        await asyncio.gather(*(check(m) for m in self.prober.round()))

    async def aclose(self) -> None:
        """Wait for every pair's deferred decode aborts, retired pairs' included."""
        pairs = [pair.aclose() for _, _, pair in self._pairs.values()]
        await asyncio.gather(*pairs, *list(self._closing))
